//! Bounded storage on a real `redis-server`: 200 stop+resume cycles of one thread leave its
//! newest 20 checkpoints (and the base and deltas the oldest of them builds on) and at most 20
//! sequence keys (and the in-memory stores keep the same bound) and the records of its newest
//! 20 ended runs (every open run's); ended runs' records get the shorter TTL while running ones
//! are kept alive by their lease; run indexes drop entries whose record expired; the user label files threads per user;
//! checkpoint stats and cleanup on the native layout go through the indexes (no `SCAN` is
//! issued) and on the `checkpoint:<user>:<timestamp>:<id>` layout by `SCAN` with escaped
//! patterns; and `runvisor checkpoints` prints and exits as documented.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use runvisor::redis::retention::{Layout, RetentionError, Scope, Stats};
use runvisor::redis::{Keep, RedisConfig, RedisStores};
use runvisor::store::{CheckpointStore, RunRecord, RunStatus, StoredCheckpoint};
use runvisor::{
    CheckpointId, Lease, LeaseHolder, Map, NodeContext, NodeError, NodeHandler, NodeOutput,
    ResumeInput, ResumeOptions, RunId, RunLabels, Runtime, StopMode, StopReply, ThreadId, Value,
    WorkerId, async_trait,
};

use super::support::{
    RedisServer, cmd, config, free_port, raw, run_record, stores, stores_keeping_all, thread,
    within,
};

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// `work` counts its calls and finishes; `wait` waits for the stop, unless told to finish.
#[derive(Debug, Clone, Default)]
struct Kinds {
    waits: Arc<AtomicUsize>,
    finish: Arc<AtomicBool>,
}

#[async_trait]
impl NodeHandler for Kinds {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        if ctx.node_id().as_str() == "wait" {
            self.waits.fetch_add(1, Ordering::SeqCst);
            if !self.finish.load(Ordering::SeqCst) {
                ctx.stopped().await;
                return Err(NodeError::Stopped);
            }
        }
        Ok(NodeOutput::new(Value::from("done")))
    }
}

const WORKFLOW: &str = r#"{
  "id": "cycles",
  "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "work", "kind": "step"},
    {"id": "wait", "kind": "step"}
  ],
  "edges": [{"from": "start", "to": "work"}, {"from": "work", "to": "wait"}]
}"#;

/// Starts a run of the thread, then `cycles` times: waits for `wait` to run, stops the run
/// and resumes the thread; finally lets the last run finish.
async fn stop_and_resume(runtime: &Runtime, kinds: &Kinds, t: &ThreadId, cycles: usize) {
    stop_and_resume_of(WORKFLOW, runtime, kinds, t, cycles).await;
}

/// [`stop_and_resume`] with another workflow whose `wait` node is a `step`.
async fn stop_and_resume_of(
    workflow: &str,
    runtime: &Runtime,
    kinds: &Kinds,
    t: &ThreadId,
    cycles: usize,
) {
    let workflow = runtime.load_json(workflow).expect("valid workflow");
    let mut run = within("start", runtime.start(&workflow, Map::new(), t.clone()))
        .await
        .expect("start");
    for cycle in 0..=cycles {
        within("`wait` to run", async {
            while kinds.waits.load(Ordering::SeqCst) <= cycle {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        if cycle == cycles {
            break;
        }
        let graceful = StopMode::Graceful {
            timeout: Duration::from_secs(5),
        };
        match within("stop", run.stop(graceful)).await {
            Ok(StopReply::Stopped(stop)) => assert!(stop.checkpoint_id.is_some(), "{stop:?}"),
            other => panic!("cycle {cycle}: the run did not stop: {other:?}"),
        }
        within("the stopped run", run.wait()).await;
        if cycle + 1 == cycles {
            kinds.finish.store(true, Ordering::SeqCst);
        }
        run = within("resume", runtime.resume(t.clone(), ResumeInput::Continue))
            .await
            .expect("resume");
    }
    let outcome = within("the last run", run.wait()).await;
    assert_eq!(
        outcome.status(),
        runvisor::RunStatus::Succeeded,
        "{outcome:?}"
    );
}

async fn keys(con: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
    cmd(con, &["KEYS", pattern]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_stop_and_resume_cycles_keep_twenty_checkpoints_and_sequence_keys() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let kinds = Kinds::default();
    let runtime = stores
        .install(Runtime::builder().handler("step", kinds.clone()))
        .build();
    let t = thread("cycles");
    stop_and_resume(&runtime, &kinds, &t, 200).await;

    let mut con = raw(&server).await;
    let index: Vec<String> = cmd(&mut con, &["ZRANGE", "runvisor:cpidx:{cycles}", "0", "-1"]).await;
    let payloads = keys(&mut con, "runvisor:cp:{cycles}:*").await;
    let sequences = keys(&mut con, "runvisor:cpseq:{cycles}:*").await;
    let ids: Vec<CheckpointId> = index.iter().map(|id| id.parse().expect("an id")).collect();
    assert_eq!(
        kept_from(&*stores.checkpoints, &t, &ids, 20).await,
        0,
        "the index holds the newest 20 and what they build on: {index:?}"
    );
    assert_eq!(payloads.len(), index.len(), "{payloads:?}");
    // Only runs with a kept checkpoint keep their sequence key (a chain's base and the deltas
    // before the newest 20 are kept too, and were written by other runs).
    assert!(
        sequences.len() <= index.len(),
        "{} sequence keys for {} checkpoints: {sequences:?}",
        sequences.len(),
        index.len()
    );
    for id in &index {
        let payload = format!("runvisor:cp:{{cycles}}:{id}");
        assert!(
            payloads.contains(&payload),
            "{id} is indexed without its payload"
        );
    }
    // The newest ones: the last run's final checkpoint is the thread's latest, and a resume
    // still finds it.
    let latest = stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("a checkpoint");
    assert_eq!(index.last(), Some(&latest.id.to_string()));
    assert_eq!(stores.checkpoints.list(&t).await, Ok(ids));
    // 201 runs: the thread keeps the records of its newest 20 ended runs, and of any open one.
    let runs = stores.runs.list_thread(&t).await.expect("thread runs");
    let ended = runs.iter().filter(|r| !r.status.is_open()).count();
    assert_eq!(ended, 20, "{runs:#?}");
    assert!(runs.len() <= 21, "{} records", runs.len());
    let records = keys(&mut con, "runvisor:run:{cycles}:*").await;
    assert_eq!(records.len(), runs.len(), "{records:?}");

    // The in-memory stores keep the same bound.
    let kinds = Kinds::default();
    let memory = Runtime::builder().handler("step", kinds.clone()).build();
    stop_and_resume(&memory, &kinds, &t, 200).await;
    let ids = memory.checkpoint_store().list(&t).await.expect("list");
    assert_eq!(
        kept_from(&**memory.checkpoint_store(), &t, &ids, 20).await,
        0
    );
}

/// A chain longer than what one write may prune (1,000 entries) is still pruned once a newer
/// base is kept: the bound is the base of the oldest checkpoint the thread keeps, not of the
/// one just past the write's budget (which would sit in the old chain and stop every prune).
#[tokio::test]
async fn a_chain_longer_than_one_writes_prune_budget_is_pruned_once_a_newer_base_is_kept() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let t = thread("long-chain");
    let run = RunId::new();
    let mut sequence = 0;
    let mut chain = |base: Option<CheckpointId>, parent: CheckpointId| {
        sequence += 1;
        StoredCheckpoint {
            link: base.map(|base| runvisor::store::DeltaLink { base, parent }),
            ..checkpoint(run, sequence)
        }
    };
    let mut put_chain = Vec::new();
    let first = chain(None, CheckpointId::new());
    let mut last = first.id;
    put_chain.push(first.clone());
    for _ in 0..1100 {
        let delta = chain(Some(first.id), last);
        last = delta.id;
        put_chain.push(delta);
    }
    let second = chain(None, CheckpointId::new());
    last = second.id;
    put_chain.push(second.clone());
    for _ in 0..30 {
        let delta = chain(Some(second.id), last);
        last = delta.id;
        put_chain.push(delta);
    }
    for checkpoint in put_chain {
        stores
            .checkpoints
            .put(&t, checkpoint, None)
            .await
            .expect("put");
    }
    let ids = stores.checkpoints.list(&t).await.expect("list");
    assert_eq!(
        ids.len(),
        31,
        "the newer base and its 30 deltas: the newest 20 need nothing older"
    );
    assert_eq!(ids.first(), Some(&second.id));
    let mut con = raw(&server).await;
    let payloads = keys(&mut con, "runvisor:cp:{long-chain}:*").await;
    assert_eq!(payloads.len(), 31, "the old chain's payloads went with it");
}

/// A thread stopped and resumed again and again keeps one chain of checkpoints: a resumed
/// run's checkpoints continue the chain of the checkpoint it resumed from, and a run's final
/// checkpoint is a delta too, so a stop costs a delta rather than a whole snapshot; a new
/// base comes only when the chain's deltas outweigh its base. Every checkpoint reads back
/// whole, and the last one resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_and_resumes_continue_one_chain_of_deltas() {
    let server = RedisServer::start();
    let stores = stores_keeping_all(&server).await;
    let kinds = Kinds::default();
    let runtime = stores
        .install(Runtime::builder().handler("step", kinds.clone()))
        .build();
    let t = thread("one-chain");
    // The state the runs carry on: a 4 KB output, from before the first stop.
    let workflow = serde_json::json!({
        "id": "one-chain",
        "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "work", "kind": "template", "params": {"template": "x".repeat(4096)}},
            {"id": "wait", "kind": "step"}
        ],
        "edges": [{"from": "start", "to": "work"}, {"from": "work", "to": "wait"}]
    })
    .to_string();
    stop_and_resume_of(&workflow, &runtime, &kinds, &t, 40).await;

    let mut written = Vec::new();
    for id in stores.checkpoints.list(&t).await.expect("list") {
        let stored = stores
            .checkpoints
            .get(&t, id)
            .await
            .expect("get")
            .expect("listed");
        let whole = runvisor::delta::materialize(&*stores.checkpoints, &t, &stored)
            .await
            .expect("every checkpoint reads back whole");
        assert_eq!(whole.run_id, stored.run);
        written.push(stored);
    }
    let runs: std::collections::HashSet<RunId> = written.iter().map(|c| c.run).collect();
    assert_eq!(runs.len(), 41, "every run wrote a checkpoint");
    let bases = written.iter().filter(|c| c.link.is_none()).count();
    // A run's first checkpoint continues the checkpoint before it (the one it resumed from).
    let continued = written
        .windows(2)
        .filter(|pair| {
            pair[0].run != pair[1].run && pair[1].link.is_some_and(|l| l.parent == pair[0].id)
        })
        .count();
    let finals_as_deltas = written
        .windows(2)
        .filter(|pair| pair[0].run != pair[1].run && pair[0].link.is_some())
        .count();
    assert!(
        continued >= 20 && finals_as_deltas >= 20,
        "{continued} runs continued the chain and {finals_as_deltas} ended with a delta, of 40"
    );
    // Each delta is small beside the base, which holds the 4 KB output: few bases.
    assert!(
        bases * 4 <= written.len(),
        "{bases} bases of {} checkpoints",
        written.len()
    );
}

/// Where, in a thread's checkpoint ids (oldest first), what its newest `keep` need begins:
/// the base of the oldest of them when it is a delta, else that oldest one. A store within its
/// retention holds nothing before it (0).
async fn kept_from(
    store: &dyn CheckpointStore,
    t: &ThreadId,
    ids: &[CheckpointId],
    keep: usize,
) -> usize {
    let first = ids
        .len()
        .checked_sub(keep)
        .expect("at least `keep` checkpoints");
    let oldest = store
        .get(t, ids[first])
        .await
        .expect("get")
        .expect("listed");
    match oldest.link {
        Some(link) => ids
            .iter()
            .position(|id| *id == link.base)
            .expect("the base of a kept delta is kept"),
        None => first,
    }
}

fn checkpoint(run: RunId, sequence: u64) -> StoredCheckpoint {
    StoredCheckpoint {
        id: CheckpointId::new(),
        run,
        sequence,
        bytes: b"snapshot".to_vec(),
        link: None,
    }
}

fn labelled(run: RunId, t: &ThreadId, user: Option<&str>, status: RunStatus) -> RunRecord {
    let labels = RunLabels::default();
    RunRecord {
        status,
        labels: match user {
            Some(user) => labels.with_user(user).expect("valid user"),
            None => labels,
        },
        ..run_record(run, t)
    }
}

async fn pttl(con: &mut MultiplexedConnection, key: &str) -> i64 {
    cmd(con, &["PTTL", key]).await
}

#[tokio::test]
async fn ended_runs_records_expire_sooner_and_running_ones_live_with_their_lease() {
    let server = RedisServer::start();
    let day = Duration::from_secs(86_400);
    let stores = within(
        "connect",
        RedisStores::connect(RedisConfig {
            checkpoint_ttl: day * 30,
            finished_run_ttl: day,
            ..config(&server)
        }),
    )
    .await
    .expect("connect");
    let mut con = raw(&server).await;
    let t = thread("ttl");
    let (running, ended) = (RunId::new(), RunId::new());
    let key = |run: RunId| format!("runvisor:run:{{ttl}}:{run}");
    let pointer = |run: RunId| format!("runvisor:runthread:{run}");
    let day_ms = 86_400_000i64;
    for (run, status) in [(running, RunStatus::Running), (ended, RunStatus::Succeeded)] {
        stores
            .runs
            .put(&labelled(run, &t, None, status), None)
            .await
            .expect("put");
    }
    for k in [key(running), pointer(running)] {
        let left = pttl(&mut con, &k).await;
        assert!(
            left > 29 * day_ms,
            "{k}: an open run's record lives the data TTL ({left}ms)"
        );
    }
    for k in [key(ended), pointer(ended)] {
        let left = pttl(&mut con, &k).await;
        assert!(
            left > day_ms - 60_000 && left <= day_ms,
            "{k}: an ended run's record lives the finished-run TTL ({left}ms)"
        );
    }
    // The running run ends: its record gets the shorter TTL.
    stores
        .runs
        .put(&labelled(running, &t, None, RunStatus::Stopped), None)
        .await
        .expect("put");
    assert!(pttl(&mut con, &key(running)).await <= day_ms);

    // A running record is kept alive by its lease's renewals; an ended one is not.
    let lease_thread = thread("leased");
    let live = RunId::new();
    stores
        .runs
        .put(
            &labelled(live, &lease_thread, None, RunStatus::Running),
            None,
        )
        .await
        .expect("put");
    let holder = LeaseHolder {
        worker: WorkerId::new("w-1").expect("valid worker"),
        run: live,
    };
    let acquired = stores
        .leases
        .acquire(&lease_thread, &holder, Duration::from_secs(15))
        .await
        .expect("acquire");
    let lease: Lease = acquired.lease;
    let live_key = format!("runvisor:run:{{leased}}:{live}");
    let _: i64 = cmd(&mut con, &["PEXPIRE", &live_key, "5000"]).await;
    stores
        .leases
        .renew(&lease_thread, &lease, Duration::from_secs(15))
        .await
        .expect("renew");
    assert!(
        pttl(&mut con, &live_key).await > 29 * day_ms,
        "renewed with the lease"
    );
    stores
        .runs
        .put(
            &labelled(live, &lease_thread, None, RunStatus::Succeeded),
            Some(lease.fence),
        )
        .await
        .expect("put");
    stores
        .leases
        .renew(&lease_thread, &lease, Duration::from_secs(15))
        .await
        .expect("renew");
    assert!(
        pttl(&mut con, &live_key).await <= day_ms,
        "an ended record is not renewed"
    );

    // Index entries of records that expired are dropped when read.
    let _: i64 = cmd(&mut con, &["DEL", &key(ended)]).await;
    let recent = stores.runs.list_recent(10).await.expect("recent");
    assert!(recent.iter().all(|r| r.run_id != ended));
    let members: Vec<String> = cmd(&mut con, &["ZRANGE", "runvisor:recent", "0", "-1"]).await;
    assert!(
        members.iter().all(|m| !m.starts_with(&ended.to_string())),
        "{members:?}"
    );
    let listed = stores.runs.list_thread(&t).await.expect("thread runs");
    assert_eq!(
        listed.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        [running]
    );
    let members: Vec<String> = cmd(&mut con, &["ZRANGE", "runvisor:runs:{ttl}", "0", "-1"]).await;
    assert_eq!(members, [running.to_string()]);
}

#[tokio::test]
async fn a_thread_keeps_the_records_of_its_newest_ended_runs_and_every_open_one() {
    let server = RedisServer::start();
    let stores = within(
        "connect",
        RedisStores::connect(RedisConfig {
            keep_ended_runs: Keep::Newest(3),
            ..config(&server)
        }),
    )
    .await
    .expect("connect");
    let mut con = raw(&server).await;
    let t = thread("kept");
    // Ids in start order (UUIDv7 is ordered to the millisecond; sorted to be sure).
    let mut ids: Vec<RunId> = (0..8).map(|_| RunId::new()).collect();
    ids.sort();
    let (open, waiting, ended) = (ids[0], ids[1], &ids[2..]);
    // Started now: the recent runs keep only those of the data TTL.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64;
    let labelled = |run: RunId, t: &ThreadId, user: Option<&str>, status: RunStatus| RunRecord {
        started_at_ms: now_ms,
        ..labelled(run, t, user, status)
    };
    for (run, status) in [
        (open, RunStatus::Running),
        (waiting, RunStatus::AwaitingInput),
    ] {
        stores
            .runs
            .put(&labelled(run, &t, None, status), None)
            .await
            .expect("put open");
    }
    for (i, run) in ended.iter().enumerate() {
        // Each ended run is first recorded running, as a run is.
        stores
            .runs
            .put(&labelled(*run, &t, None, RunStatus::Running), None)
            .await
            .expect("put running");
        let status = if i % 2 == 0 {
            RunStatus::Succeeded
        } else {
            RunStatus::Stopped
        };
        stores
            .runs
            .put(&labelled(*run, &t, None, status), None)
            .await
            .expect("put ended");
    }

    let listed = async || {
        let mut ids: Vec<RunId> = stores
            .runs
            .list_thread(&t)
            .await
            .expect("thread runs")
            .iter()
            .map(|r| r.run_id)
            .collect();
        ids.sort();
        ids
    };
    let (pruned, kept) = ended.split_at(ended.len() - 3);
    let mut expected = vec![open, waiting];
    expected.extend(kept);
    assert_eq!(
        listed().await,
        expected,
        "the open runs and the newest three ended"
    );
    for run in pruned {
        assert_eq!(stores.runs.get(*run).await.expect("get"), None, "{run}");
        let exists: i64 = cmd(
            &mut con,
            &[
                "EXISTS",
                &format!("runvisor:run:{{kept}}:{run}"),
                &format!("runvisor:runthread:{run}"),
            ],
        )
        .await;
        assert_eq!(exists, 0, "the record of {run} and its pointer are gone");
    }
    let recent: Vec<String> = cmd(&mut con, &["ZRANGE", "runvisor:recent", "0", "-1"]).await;
    for run in pruned {
        assert!(
            recent.iter().all(|m| !m.starts_with(&run.to_string())),
            "{run} left the recent runs: {recent:?}"
        );
    }
    assert_eq!(recent.len(), 5, "{recent:?}");
    for run in kept.iter().chain([&open, &waiting]) {
        assert!(stores.runs.get(*run).await.expect("get").is_some(), "{run}");
    }
    // The oldest run ends now: it is the oldest ended run, past the three kept, yet its own
    // write never prunes it.
    stores
        .runs
        .put(&labelled(open, &t, None, RunStatus::Succeeded), None)
        .await
        .expect("end the oldest");
    let after = listed().await;
    assert!(
        after.contains(&open),
        "the run written is never pruned by its own write: {after:?}"
    );
    assert!(after.contains(&waiting), "an open run is never pruned");

    let bad = RedisConfig {
        keep_ended_runs: Keep::Newest(0),
        ..config(&server)
    };
    let Err(e) = RedisStores::connect(bad).await else {
        panic!("keeping no ended run is refused");
    };
    assert!(e.to_string().contains("keep_ended_runs"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_carry_their_user_into_records_and_the_thread_indexes() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let kinds = Kinds::default();
    let runtime = stores
        .install(Runtime::builder().handler("step", kinds.clone()))
        .build();
    let workflow = runtime.load_json(WORKFLOW).expect("valid workflow");
    let t = thread("chat-u");
    let labels = RunLabels::app_chat("app", "chat")
        .and_then(|l| l.with_user("wang1"))
        .expect("valid labels");
    // Each run waits at `wait` until it is stopped; the last one finishes.
    let stopped = |run: runvisor::RunHandle, waits: usize| {
        let kinds = kinds.clone();
        async move {
            within("`wait` to run", async {
                while kinds.waits.load(Ordering::SeqCst) < waits {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
            let graceful = StopMode::Graceful {
                timeout: Duration::from_secs(5),
            };
            assert!(matches!(
                within("stop", run.stop(graceful)).await,
                Ok(StopReply::Stopped(_))
            ));
            within("the stopped run", run.wait()).await;
            run.run_id()
        }
    };
    let record_of = |run: RunId| {
        let stores = stores.clone();
        async move { stores.runs.get(run).await.expect("get").expect("a record") }
    };
    let run = runtime
        .start_with(&workflow, Map::new(), t.clone(), labels)
        .await
        .expect("start");
    let first = stopped(run, 1).await;
    assert_eq!(record_of(first).await.labels.user_id(), Some("wang1"));
    let field: Option<String> = cmd(
        &mut con,
        &[
            "HGET",
            &format!("runvisor:run:{{chat-u}}:{first}"),
            "user_id",
        ],
    )
    .await;
    assert_eq!(field.as_deref(), Some("wang1"));
    let threads: Vec<String> = cmd(&mut con, &["SMEMBERS", "runvisor:threads:wang1"]).await;
    assert_eq!(threads, ["chat-u"]);
    let users: Vec<String> = cmd(&mut con, &["SMEMBERS", "runvisor:users"]).await;
    assert_eq!(users, ["wang1"]);

    // A resume keeps the checkpoint's user, or takes the one it is given.
    let kept = runtime
        .resume(t.clone(), ResumeInput::Continue)
        .await
        .expect("resume");
    let kept = stopped(kept, 2).await;
    let record = record_of(kept).await;
    assert_eq!(record.labels.user_id(), Some("wang1"));
    assert_eq!(record.labels.app_id(), Some("app"));
    kinds.finish.store(true, Ordering::SeqCst);
    let options = ResumeOptions::default().user("wang2").expect("valid user");
    let moved = runtime
        .resume_with(t.clone(), ResumeInput::Continue, options)
        .await
        .expect("resume");
    within("run", moved.wait()).await;
    let record = record_of(moved.run_id()).await;
    assert_eq!(record.labels.user_id(), Some("wang2"));
    assert_eq!(record.status, RunStatus::Succeeded);
    let threads: Vec<String> = cmd(&mut con, &["SMEMBERS", "runvisor:threads:wang2"]).await;
    assert_eq!(threads, ["chat-u"]);
    assert!(ResumeOptions::default().user("a b").is_err());
}

/// Native data: threads of users `wang1` (two threads) and `w*` (one), and a thread of no user;
/// `count` checkpoints each, in `runs` runs.
async fn native_threads(stores: &RedisStores, count: usize, runs: usize) -> Vec<ThreadId> {
    let layout = [
        ("wang1-a", Some("wang1")),
        ("wang1-b", Some("wang1")),
        ("star", Some("w*")),
        ("plain", None),
    ];
    let mut threads = Vec::new();
    for (id, user) in layout {
        let t = thread(id);
        for r in 0..runs {
            let run = RunId::new();
            stores
                .runs
                .put(&labelled(run, &t, user, RunStatus::Stopped), None)
                .await
                .expect("record");
            for sequence in 0..count / runs + usize::from(r < count % runs) {
                stores
                    .checkpoints
                    .put(&t, checkpoint(run, sequence as u64 + 1), None)
                    .await
                    .expect("checkpoint");
            }
        }
        threads.push(t);
    }
    threads
}

/// How many times Redis ran each command since the last `CONFIG RESETSTAT`.
async fn command_calls(con: &mut MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = cmd(con, &["INFO", "commandstats"]).await;
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

fn counts(stats: &Stats) -> BTreeMap<String, u64> {
    let threads = match stats {
        Stats::System(system) => system
            .users
            .iter()
            .flat_map(|u| u.threads.clone())
            .collect(),
        Stats::User(user) => user.threads.clone(),
    };
    threads
        .into_iter()
        .map(|t| (t.thread_id, t.checkpoint_count))
        .collect()
}

#[tokio::test]
async fn native_stats_and_cleanup_go_through_the_indexes() {
    let server = RedisServer::start();
    let stores = stores_keeping_all(&server).await;
    let mut con = raw(&server).await;
    let threads = native_threads(&stores, 30, 3).await;
    let ops = stores.checkpoint_ops();
    let _: () = cmd(&mut con, &["CONFIG", "RESETSTAT"]).await;

    let stats = ops.stats(Layout::Native, None).await.expect("stats");
    let Stats::System(system) = &stats else {
        panic!("system stats expected: {stats:?}");
    };
    assert_eq!(
        (
            system.total_users,
            system.total_threads,
            system.total_checkpoints
        ),
        (2, 4, 120)
    );
    let users: Vec<Option<&str>> = system.users.iter().map(|u| u.user_id.as_deref()).collect();
    assert_eq!(users, [Some("w*"), Some("wang1"), None]);
    let json = serde_json::to_value(&stats).expect("json");
    assert_eq!(json["operation_type"], "system_stats");
    assert_eq!(json["users"][1]["thread_count"], 2);
    assert_eq!(json["users"][1]["total_checkpoints"], 60);

    // A user id with glob characters is only itself.
    let star = ops.stats(Layout::Native, Some("w*")).await.expect("stats");
    assert_eq!(counts(&star), BTreeMap::from([("star".to_owned(), 30)]));
    assert!(matches!(
        ops.stats(Layout::Native, Some("a b")).await,
        Err(RetentionError::InvalidUser { .. })
    ));

    // An expired payload is not counted, and leaves the index.
    let oldest = stores.checkpoints.list(&threads[3]).await.expect("list")[0];
    let _: i64 = cmd(
        &mut con,
        &["DEL", &format!("runvisor:cp:{{plain}}:{oldest}")],
    )
    .await;
    let stats = ops.stats(Layout::Native, None).await.expect("stats");
    assert_eq!(counts(&stats)["plain"], 29);

    // One thread. The oldest checkpoint it would keep has expired: its entry goes too.
    let first_kept = stores.checkpoints.list(&threads[0]).await.expect("list")[20];
    let payload = format!("runvisor:cp:{{wang1-a}}:{first_kept}");
    let _: i64 = cmd(&mut con, &["DEL", &payload]).await;
    let report = ops
        .cleanup(Layout::Native, &Scope::Thread("wang1-a".into()), 10)
        .await
        .expect("cleanup");
    assert_eq!(report.operation_type, "cleanup_thread");
    assert_eq!((report.total_processed, report.total_deleted), (1, 21));
    let detail = &report.details["wang1-a"];
    assert_eq!(
        (
            detail.original_count,
            detail.deleted_count,
            detail.remaining_count
        ),
        (30, 21, 9)
    );
    assert_eq!(detail.status, "success");
    let payloads: Vec<String> = cmd(&mut con, &["KEYS", "runvisor:cp:{wang1-a}:*"]).await;
    assert_eq!(payloads.len(), 9);
    assert_eq!(
        stores.checkpoints.list(&threads[0]).await.map(|l| l.len()),
        Ok(9)
    );
    // The first two runs' checkpoints went, and their sequence keys with them.
    let sequences: Vec<String> = cmd(&mut con, &["KEYS", "runvisor:cpseq:{wang1-a}:*"]).await;
    assert_eq!(sequences.len(), 1, "{sequences:?}");

    // One user: both of wang1's threads, nothing of the others.
    let report = ops
        .cleanup(Layout::Native, &Scope::User("wang1".into()), 5)
        .await
        .expect("cleanup");
    assert_eq!(report.target, "wang1");
    assert_eq!(report.total_deleted, 4 + 25);
    let stats = ops.stats(Layout::Native, None).await.expect("stats");
    assert_eq!(
        counts(&stats),
        BTreeMap::from([
            ("plain".to_owned(), 29),
            ("star".to_owned(), 30),
            ("wang1-a".to_owned(), 5),
            ("wang1-b".to_owned(), 5),
        ])
    );

    // Everything; the sequence of the run holding a thread's lease stays.
    let holder = LeaseHolder {
        worker: WorkerId::new("w-1").expect("valid worker"),
        run: RunId::new(),
    };
    let lease = stores
        .leases
        .acquire(&threads[2], &holder, Duration::from_secs(15))
        .await
        .expect("acquire")
        .lease;
    stores
        .checkpoints
        .put(&threads[2], checkpoint(holder.run, 1), Some(lease.fence))
        .await
        .expect("the holder writes");
    let report = ops
        .cleanup(Layout::Native, &Scope::All, 1)
        .await
        .expect("cleanup");
    assert_eq!(report.operation_type, "cleanup_all");
    assert_eq!(report.total_processed, 4);
    assert_eq!(report.total_deleted, 28 + 30 + 4 + 4);
    for t in ["wang1-a", "wang1-b", "star", "plain"] {
        let payloads: Vec<String> =
            cmd(&mut con, &["KEYS", &format!("runvisor:cp:{{{t}}}:*")]).await;
        assert_eq!(payloads.len(), 1, "{t}");
    }
    let sequences: Vec<String> = cmd(&mut con, &["KEYS", "runvisor:cpseq:{star}:*"]).await;
    assert_eq!(
        sequences,
        [format!("runvisor:cpseq:{{star}}:{}", holder.run)]
    );

    // No keyspace scan on the native layout.
    let calls = command_calls(&mut con).await;
    assert!(!calls.contains_key("scan"), "{calls:?}");
    assert!(
        calls.contains_key("sscan"),
        "threads come from the indexes: {calls:?}"
    );
}

/// Compat data: `checkpoint:<user>:<timestamp>:<id>` keys, `n` per thread, ids in time order.
async fn compat_keys(con: &mut MultiplexedConnection, threads: &[(&str, usize)]) {
    for (thread, n) in threads {
        for i in 0..*n {
            let key = format!("checkpoint:{thread}:{:04}-{}", i, CheckpointId::new());
            let _: () = cmd(con, &["SET", &key, "{}"]).await;
        }
    }
}

#[tokio::test]
async fn compat_stats_and_cleanup_scan_with_escaped_patterns() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    compat_keys(
        &mut con,
        &[
            ("wang1:20250729235038043", 36),
            ("wang1:20250731141657916", 16),
            ("wang2:20250731141659949", 16),
            ("w*:1", 3),
            ("w?x:1", 2),
        ],
    )
    .await;
    // Keys of other shapes are neither counted nor deleted.
    for other in [
        "checkpoint:wang1",
        "checkpoint_write:wang1:1:x",
        "unrelated",
    ] {
        let _: () = cmd(&mut con, &["SET", other, "1"]).await;
    }
    let ops = stores.checkpoint_ops().scan_count(10);

    let stats = ops.stats(Layout::Compat, None).await.expect("stats");
    let Stats::System(system) = &stats else {
        panic!("system stats expected: {stats:?}");
    };
    assert_eq!(
        (
            system.total_users,
            system.total_threads,
            system.total_checkpoints
        ),
        (4, 5, 73)
    );
    let json = serde_json::to_value(&stats).expect("json");
    assert_eq!(json["layout"], "compat");
    let wang1 = ops
        .stats(Layout::Compat, Some("wang1"))
        .await
        .expect("stats");
    assert_eq!(
        counts(&wang1),
        BTreeMap::from([
            ("wang1:20250729235038043".to_owned(), 36),
            ("wang1:20250731141657916".to_owned(), 16),
        ])
    );
    // `w*` and `w?x` are escaped: each matches only its own keys.
    let star = ops.stats(Layout::Compat, Some("w*")).await.expect("stats");
    assert_eq!(counts(&star), BTreeMap::from([("w*:1".to_owned(), 3)]));
    let question = ops.stats(Layout::Compat, Some("w?x")).await.expect("stats");
    assert_eq!(counts(&question), BTreeMap::from([("w?x:1".to_owned(), 2)]));
    assert!(matches!(
        ops.stats(Layout::Compat, Some("a:b")).await,
        Err(RetentionError::InvalidUser { .. })
    ));

    let report = ops
        .cleanup(
            Layout::Compat,
            &Scope::Thread("wang1:20250729235038043".into()),
            10,
        )
        .await
        .expect("cleanup");
    assert_eq!((report.total_processed, report.total_deleted), (1, 26));
    let left: Vec<String> = cmd(&mut con, &["KEYS", "checkpoint:wang1:20250729235038043:*"]).await;
    let mut left: Vec<&str> = left.iter().map(String::as_str).collect();
    left.sort_unstable();
    assert_eq!(left.len(), 10);
    assert!(
        left[0].starts_with("checkpoint:wang1:20250729235038043:0026-"),
        "the newest stay"
    );

    let report = ops
        .cleanup(Layout::Compat, &Scope::User("w*".into()), 1)
        .await
        .expect("cleanup");
    assert_eq!(report.total_deleted, 2, "only w*'s thread");
    let report = ops
        .cleanup(Layout::Compat, &Scope::All, 5)
        .await
        .expect("cleanup");
    assert_eq!(report.operation_type, "cleanup_all");
    assert_eq!(report.total_deleted, 5 + 11 + 11);
    assert_eq!(report.details["wang2:20250731141659949"].remaining_count, 5);
    for other in [
        "checkpoint:wang1",
        "checkpoint_write:wang1:1:x",
        "unrelated",
    ] {
        assert_eq!(cmd::<i64>(&mut con, &["EXISTS", other]).await, 1, "{other}");
    }
    assert!(matches!(
        ops.cleanup(Layout::Compat, &Scope::Thread("no-timestamp".into()), 1)
            .await,
        Err(e) if e.error_type() == "INVALID_THREAD_ID"
    ));
}

/// Runs the binary; `(exit code, stdout, stderr)`.
fn runvisor(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("RUNVISOR_REDIS_URL")
        .output()
        .expect("run runvisor");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn runvisor_checkpoints_prints_stats_cleans_up_and_exits_by_kind_of_error() {
    let server = RedisServer::start();
    let stores = stores_keeping_all(&server).await;
    native_threads(&stores, 8, 2).await;
    let mut con = raw(&server).await;
    compat_keys(&mut con, &[("wang1:1", 4)]).await;
    let url = server.url();

    let (code, out, err) = runvisor(&["--redis", &url, "checkpoints", "stats", "--json"]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["total_checkpoints"], 32);
    assert_eq!(json["total_users"], 2);

    let (code, out, err) = runvisor(&["--redis", &url, "checkpoints", "stats", "--user", "wang1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("user wang1: 2 threads, 16 checkpoints"),
        "{out}"
    );

    let (code, out, err) = runvisor(&[
        "--redis",
        &url,
        "checkpoints",
        "cleanup",
        "--keep",
        "3",
        "--user",
        "wang1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["operation_type"], "cleanup_user");
    assert_eq!(json["total_deleted"], 10);
    assert_eq!(json["details"]["wang1-a"]["remaining_count"], 3);

    let (code, out, err) = runvisor(&[
        "--redis",
        &url,
        "checkpoints",
        "cleanup",
        "--keep",
        "1",
        "--all",
        "--layout",
        "compat",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("thread wang1:1: 4 -> 1 (3 deleted)"), "{out}");

    // Bad flags: 2, one line.
    for args in [
        &["checkpoints", "cleanup", "--keep", "1"][..],
        &[
            "checkpoints",
            "cleanup",
            "--keep",
            "1",
            "--all",
            "--thread",
            "t",
        ],
        &["checkpoints", "cleanup", "--keep", "x", "--all"],
        &[
            "checkpoints",
            "stats",
            "--user",
            "a:b",
            "--layout",
            "compat",
        ],
        &["checkpoints", "cleanup", "--keep", "1", "--thread", "a b"],
    ] {
        let mut all = vec!["--redis", url.as_str()];
        all.extend_from_slice(args);
        let (code, _, err) = runvisor(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("error:"), "{args:?}: {err}");
    }
    let (code, _, err) = runvisor(&["checkpoints", "stats"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // Storage: 3, one line.
    drop(con);
    drop(server);
    let closed = format!("redis://127.0.0.1:{}/", free_port());
    let (code, _, err) = runvisor(&["--redis", &closed, "checkpoints", "stats"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.starts_with("error:") && err.trim().lines().count() == 1,
        "{err}"
    );
}
