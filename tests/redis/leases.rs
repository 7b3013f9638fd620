//! Leases and fencing on Redis: a thread's lease is taken by one run at a time, from any
//! process; a dead worker's lease is taken over exactly once; tokens only grow; every write
//! with a stale token is refused and writes nothing; a run that loses its lease stops with
//! reason `lease_lost`; a counter Redis lost is re-seated by its holder.

use std::time::Duration;

use runvisor::redis::RedisStores;
use runvisor::store::StoredCheckpoint;
use runvisor::{
    CheckpointId, Fence, LeaseConfig, LeaseError, LeaseHolder, Map, Message, ResumeError,
    ResumeFrom, ResumeInput, RunId, RunOutcome, Runtime, RuntimeConfig, StartError, StopMode,
    StopReason, StoreError, WorkerId, WorkerInfo, register_standard_kinds,
};

use super::support::{RedisServer, cmd, raw, run_record, stores, thread, within};

const TTL: Duration = Duration::from_secs(10);

fn holder(worker: &str) -> LeaseHolder {
    LeaseHolder {
        worker: WorkerId::new(worker).expect("valid worker id"),
        run: RunId::new(),
    }
}

async fn beat(stores: &RedisStores, holder: &LeaseHolder) {
    stores
        .leases
        .heartbeat(&WorkerInfo::this_process(holder.worker.clone()), TTL)
        .await
        .expect("heartbeat");
}

#[tokio::test]
async fn a_thread_is_leased_to_one_run_at_a_time_and_tokens_only_grow() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("chat:{lease}");
    let (a, b) = (holder("worker-a"), holder("worker-b"));
    beat(&stores, &a).await;
    beat(&stores, &b).await;

    let first = stores.leases.acquire(&t, &a, TTL).await.expect("free");
    assert_eq!(first.took_over, None);
    assert_eq!(first.lease.holder, a);
    assert_eq!(
        stores.leases.acquire(&t, &b, TTL).await,
        Err(LeaseError::Busy { holder: a.clone() })
    );
    // Another run of the same worker is refused too; the same run asking again (its first
    // answer lost) is answered with its own lease, token unchanged.
    let a_again = LeaseHolder {
        run: RunId::new(),
        ..a.clone()
    };
    assert_eq!(
        stores.leases.acquire(&t, &a_again, TTL).await,
        Err(LeaseError::Busy { holder: a.clone() })
    );
    let again = stores.leases.acquire(&t, &a, TTL).await.expect("its own");
    assert_eq!((again.lease, again.took_over), (first.lease.clone(), None));
    assert_eq!(
        stores.leases.lease(&t).await.expect("read"),
        Some(first.lease.clone())
    );

    // The key layout: a hash in the thread's slot, held until `expires` (the server's clock
    // plus the lease TTL), kept as long as the thread's data; the counter holds the token; the
    // heartbeat lives for the TTL.
    let key = "runvisor:lease:{chat:{lease}}";
    let fields: Vec<String> = cmd(&mut con, &["HGETALL", key]).await;
    assert_eq!(
        fields[..6],
        [
            "worker",
            "worker-a",
            "run",
            &a.run.to_string(),
            "token",
            &first.lease.fence.to_string()
        ]
    );
    assert_eq!(fields[6], "expires");
    let expires: u64 = fields[7].parse().expect("ms");
    let time: Vec<String> = cmd(&mut con, &["TIME"]).await;
    let now_ms: u64 = time[0].parse::<u64>().expect("s") * 1000;
    assert!(
        expires > now_ms && expires <= now_ms + 11_000,
        "{expires} vs {now_ms}"
    );
    let pttl: i64 = cmd(&mut con, &["PTTL", key]).await;
    assert!(
        pttl > 10_000,
        "the lease key lives as long as the data: {pttl}"
    );
    let counter: String = cmd(&mut con, &["GET", "runvisor:fence:{chat:{lease}}"]).await;
    assert_eq!(counter, first.lease.fence.to_string());
    let pttl: i64 = cmd(&mut con, &["PTTL", "runvisor:worker:worker-a"]).await;
    assert!(pttl > 0 && pttl <= 10_000, "{pttl}");

    // Released, it goes to the next run with a greater token; the old one cannot renew.
    stores
        .leases
        .release(&t, &first.lease)
        .await
        .expect("release");
    let second = stores
        .leases
        .acquire(&t, &b, TTL)
        .await
        .expect("free again");
    assert!(second.lease.fence > first.lease.fence);
    assert_eq!(
        stores.leases.renew(&t, &first.lease, TTL).await,
        Err(LeaseError::Lost {
            current: Some(b.clone())
        })
    );
    // Releasing a lease that is no longer ours leaves the holder's alone.
    stores
        .leases
        .release(&t, &first.lease)
        .await
        .expect("release");
    assert_eq!(
        stores.leases.lease(&t).await.expect("read"),
        Some(second.lease.clone())
    );
    stores
        .leases
        .renew(&t, &second.lease, TTL)
        .await
        .expect("the holder renews");
}

#[tokio::test]
async fn an_expired_lease_is_free_and_its_taker_learns_whose_it_was() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let t = thread("expired");
    let (a, b) = (holder("a"), holder("b"));
    beat(&stores, &a).await;
    beat(&stores, &b).await;
    let short = Duration::from_millis(50);
    let first = stores.leases.acquire(&t, &a, short).await.expect("free");
    within("the lease to expire", async {
        while stores.leases.lease(&t).await.expect("read").is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // `a` still heartbeats, but its lease ran out: `b` takes it and is told it was `a`'s.
    let taken = stores.leases.acquire(&t, &b, TTL).await.expect("expired");
    assert_eq!(taken.took_over, Some(a.clone()));
    assert!(taken.lease.fence > first.lease.fence);
    // `b` asking again (its answer lost) is told the same: its lease, taken from `a`.
    let again = stores.leases.acquire(&t, &b, TTL).await.expect("its own");
    assert_eq!(
        (&again.lease, &again.took_over),
        (&taken.lease, &Some(a.clone()))
    );
    assert!(matches!(
        stores.leases.renew(&t, &first.lease, TTL).await,
        Err(LeaseError::Lost { .. })
    ));
}

#[tokio::test]
async fn a_dead_workers_lease_is_taken_over_by_exactly_one_worker() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let t = thread("orphan");
    let dead = holder("dead");
    beat(&stores, &dead).await;
    let held = stores.leases.acquire(&t, &dead, TTL).await.expect("free");
    stores.leases.retire(&dead.worker).await.expect("retire");
    assert_eq!(
        stores
            .leases
            .workers(std::slice::from_ref(&dead.worker))
            .await
            .expect("workers"),
        [None]
    );

    let contenders: Vec<LeaseHolder> = (0..8).map(|i| holder(&format!("live-{i}"))).collect();
    for c in &contenders {
        beat(&stores, c).await;
    }
    let attempts =
        futures::future::join_all(contenders.iter().map(|c| stores.leases.acquire(&t, c, TTL)))
            .await;
    let won: Vec<_> = attempts.iter().filter_map(|a| a.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "{attempts:?}");
    assert_eq!(won[0].took_over.as_ref(), Some(&dead));
    assert!(won[0].lease.fence > held.lease.fence);
    for attempt in &attempts {
        if let Err(e) = attempt {
            assert_eq!(
                e,
                &LeaseError::Busy {
                    holder: won[0].lease.holder.clone()
                }
            );
        }
    }
    assert_eq!(
        stores.leases.renew(&t, &held.lease, TTL).await,
        Err(LeaseError::Lost {
            current: Some(won[0].lease.holder.clone())
        })
    );
}

#[tokio::test]
async fn every_write_with_a_stale_token_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("fenced");
    let (old, new) = (holder("old"), holder("new"));
    beat(&stores, &new).await;
    let stale = stores
        .leases
        .acquire(&t, &old, TTL)
        .await
        .expect("free")
        .lease
        .fence;
    // `old` never heartbeat: its lease is taken over at once.
    let current = stores
        .leases
        .acquire(&t, &new, TTL)
        .await
        .expect("take over")
        .lease
        .fence;
    let refused = |result: Result<(), StoreError>| {
        assert_eq!(
            result,
            Err(StoreError::Fenced {
                thread: t.clone(),
                token: stale.0,
                current: current.0
            })
        );
    };
    let checkpoint = StoredCheckpoint {
        id: CheckpointId::new(),
        run: old.run,
        sequence: 1,
        bytes: b"late".to_vec(),
        link: None,
    };
    refused(
        stores
            .checkpoints
            .put(&t, checkpoint.clone(), Some(stale))
            .await,
    );
    refused(
        stores
            .history
            .append(&t, &[Message::user("late")], Some(stale))
            .await,
    );
    refused(stores.runs.put(&run_record(old.run, &t), Some(stale)).await);
    let flag = "agent_runtime_stopping:app:chat";
    stores
        .signals
        .raise(flag, Duration::from_secs(60))
        .await
        .expect("raise");
    refused(
        stores
            .signals
            .clear(&[flag.to_owned()], Some((&t, stale)))
            .await,
    );
    // Nothing landed.
    assert_eq!(stores.checkpoints.list(&t).await, Ok(vec![]));
    assert_eq!(stores.history.load(&t).await, Ok(vec![]));
    assert_eq!(stores.runs.list_thread(&t).await, Ok(vec![]));
    // The run's index entries go out beside its record's script, refused or not; a refused
    // record is still found nowhere an operator looks, and listing drops its entry.
    let hinted: i64 = cmd(&mut con, &["ZCARD", "runvisor:open"]).await;
    assert_eq!(hinted, 1, "the entry sent beside the refused script");
    assert_eq!(stores.runs.get(old.run).await, Ok(None));
    assert_eq!(stores.runs.list_open().await, Ok(vec![]));
    let hinted: i64 = cmd(&mut con, &["ZCARD", "runvisor:open"]).await;
    assert_eq!(
        hinted, 0,
        "listing dropped the entry of a run without a record"
    );
    assert_eq!(stores.runs.list_recent(10).await, Ok(vec![]));
    let exists: i64 = cmd(&mut con, &["EXISTS", flag]).await;
    assert_eq!(exists, 1, "the new holder's flag stays");

    // The holder's token writes.
    stores
        .checkpoints
        .put(&t, checkpoint, Some(current))
        .await
        .expect("put");
    stores
        .history
        .append(&t, &[Message::user("on time")], Some(current))
        .await
        .expect("append");
    stores
        .runs
        .put(&run_record(new.run, &t), Some(current))
        .await
        .expect("run put");
    stores
        .signals
        .clear(&[flag.to_owned()], Some((&t, current)))
        .await
        .expect("clear");
    let exists: i64 = cmd(&mut con, &["EXISTS", flag]).await;
    assert_eq!(exists, 0);
    assert_eq!(stores.checkpoints.list(&t).await.expect("list").len(), 1);
}

#[tokio::test]
async fn a_counter_redis_lost_is_reseated_by_its_holder_and_later_tokens_are_greater() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("amnesia");
    let a = holder("a");
    beat(&stores, &a).await;
    let lease = stores
        .leases
        .acquire(&t, &a, TTL)
        .await
        .expect("free")
        .lease;
    // Redis forgets everything of the thread (a restart without persistence).
    let _: i64 = cmd(
        &mut con,
        &[
            "DEL",
            "runvisor:fence:{amnesia}",
            "runvisor:lease:{amnesia}",
        ],
    )
    .await;
    // The holder's write goes on and makes its token the counter again; so does a renewal.
    stores
        .history
        .append(&t, &[Message::user("kept")], Some(lease.fence))
        .await
        .expect("a write with the only token there is");
    let counter: String = cmd(&mut con, &["GET", "runvisor:fence:{amnesia}"]).await;
    assert_eq!(counter, lease.fence.to_string());
    stores.leases.renew(&t, &lease, TTL).await.expect("renewed");
    assert_eq!(
        stores.leases.lease(&t).await.expect("read"),
        Some(lease.clone())
    );
    // Lost again, and this time another worker takes the thread first: its token is greater
    // than every token issued before, so the old holder is fenced off.
    let _: i64 = cmd(
        &mut con,
        &[
            "DEL",
            "runvisor:fence:{amnesia}",
            "runvisor:lease:{amnesia}",
        ],
    )
    .await;
    let b = holder("b");
    let taken = stores
        .leases
        .acquire(&t, &b, TTL)
        .await
        .expect("free")
        .lease;
    assert!(taken.fence > lease.fence);
    assert!(matches!(
        stores
            .history
            .append(&t, &[Message::user("late")], Some(lease.fence))
            .await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        stores.leases.renew(&t, &lease, TTL).await,
        Err(LeaseError::Lost { .. })
    ));
}

/// `start -> nap`: a run that sleeps until stopped.
const NAP: &str = r#"{"id": "nap", "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "nap", "kind": "sleep", "params": {"duration": "60s"}}
], "edges": [{"from": "start", "to": "nap"}]}"#;

fn worker(stores: &RedisStores, id: &str, lease: LeaseConfig) -> Runtime {
    let config = RuntimeConfig {
        worker_id: Some(id.to_owned()),
        lease,
        ..RuntimeConfig::default()
    };
    stores
        .install(register_standard_kinds(Runtime::builder().config(config)))
        .try_build()
        .expect("runtime")
}

#[tokio::test]
async fn a_busy_thread_refuses_starts_and_resumes_from_other_workers_and_one_resume_wins() {
    let server = RedisServer::start();
    let one = worker(&stores(&server).await, "one", LeaseConfig::default());
    let two = worker(&stores(&server).await, "two", LeaseConfig::default());
    let t = thread("busy");
    let workflow = one.load_json(NAP).expect("valid");
    let run = one
        .start(&workflow, Map::new(), t.clone())
        .await
        .expect("start");
    let busy_worker = Some(WorkerId::new("one").expect("id"));
    match two.start(&workflow, Map::new(), t.clone()).await {
        Err(StartError::ThreadBusy {
            thread,
            run: r,
            worker,
            ..
        }) => {
            assert_eq!(
                (thread, r, worker),
                (t.clone(), run.run_id(), busy_worker.clone())
            );
        }
        other => panic!("expected ThreadBusy, got {:?}", other.map(|r| r.run_id())),
    }
    match two
        .resume(ResumeFrom::Thread(t.clone()), ResumeInput::Continue)
        .await
    {
        Err(ResumeError::ThreadBusy { run: r, worker, .. }) => {
            assert_eq!((r, worker), (run.run_id(), busy_worker));
        }
        other => panic!("expected ThreadBusy, got {:?}", other.map(|r| r.run_id())),
    }
    one.stop(run.run_id(), StopMode::Force).await.expect("stop");
    let outcome = run.wait().await;
    assert!(matches!(outcome, RunOutcome::Stopped(_)), "{outcome:?}");

    // Both workers resume the stopped thread at once: one run, one ThreadBusy.
    let (a, b) = tokio::join!(
        one.resume(ResumeFrom::Thread(t.clone()), ResumeInput::Continue),
        two.resume(ResumeFrom::Thread(t.clone()), ResumeInput::Continue),
    );
    let (winner, loser) = match (a, b) {
        (Ok(run), Err(e)) => ((&one, run), e),
        (Err(e), Ok(run)) => ((&two, run), e),
        (a, b) => panic!(
            "exactly one resume should win: {:?} / {:?}",
            a.map(|r| r.run_id()),
            b.map(|r| r.run_id())
        ),
    };
    assert!(
        matches!(loser, ResumeError::ThreadBusy { run, .. } if run == winner.1.run_id()),
        "{loser:?}"
    );
    winner
        .0
        .stop(winner.1.run_id(), StopMode::Force)
        .await
        .expect("stop");
    winner.1.wait().await;
}

/// Two workers start a new thread at once, twenty times: each time one run starts, the other
/// start is refused as busy naming it, and the thread holds the winner's record only, fenced
/// by the lease it holds.
#[tokio::test]
async fn two_workers_starting_one_new_thread_at_once_start_one_run_and_record_only_it() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let one = worker(&stores, "one", LeaseConfig::default());
    let two = worker(
        &super::support::stores(&server).await,
        "two",
        LeaseConfig::default(),
    );
    let workflow = one.load_json(NAP).expect("valid");
    for i in 0..20 {
        let t = thread(&format!("race-{i}"));
        let (a, b) = tokio::join!(
            one.start(&workflow, Map::new(), t.clone()),
            two.start(&workflow, Map::new(), t.clone()),
        );
        let (winner, run, loser) = match (a, b) {
            (Ok(run), Err(e)) => (&one, run, e),
            (Err(e), Ok(run)) => (&two, run, e),
            (a, b) => panic!(
                "exactly one start should win: {:?} / {:?}",
                a.map(|r| r.run_id()),
                b.map(|r| r.run_id())
            ),
        };
        assert!(
            matches!(loser, StartError::ThreadBusy { run: r, .. } if r == run.run_id()),
            "{loser:?}"
        );
        let records = stores.runs.list_thread(&t).await.expect("list");
        assert_eq!(
            records.iter().map(|r| r.run_id).collect::<Vec<_>>(),
            vec![run.run_id()],
            "race {i}"
        );
        let held = stores.leases.lease(&t).await.expect("lease").expect("held");
        assert_eq!(held.holder.run, run.run_id());
        assert_eq!(records[0].fence, Some(held.fence.0));
        winner
            .stop(run.run_id(), StopMode::Force)
            .await
            .expect("stop");
        run.wait().await;
    }
}

/// A start on a thread an orphaned run holds takes it over, whether the lease is still held
/// by a worker with no heartbeat (the start asks the lease store after its one-step start
/// found it held) or expired (the one-step start takes it): the new run records itself,
/// fenced by its lease, and the orphan's record is closed as stopped, `lease_lost`.
#[tokio::test]
async fn a_start_takes_an_orphaned_thread_over_and_closes_the_orphans_record() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let live = worker(&stores, "live", LeaseConfig::default());
    let workflow = live.load_json(NAP).expect("valid");
    for (name, ttl) in [("held-by-dead", TTL), ("expired", Duration::from_millis(1))] {
        let t = thread(name);
        let dead = holder("dead");
        let held = stores.leases.acquire(&t, &dead, ttl).await.expect("free");
        let orphan = runvisor::store::RunRecord {
            fence: Some(held.lease.fence.0),
            ..run_record(dead.run, &t)
        };
        stores
            .runs
            .put(&orphan, Some(held.lease.fence))
            .await
            .expect("the orphan's record");
        tokio::time::sleep(Duration::from_millis(20)).await;

        let run = live
            .start(&workflow, Map::new(), t.clone())
            .await
            .unwrap_or_else(|e| panic!("{name}: the orphaned thread is taken over: {e}"));
        let lease = stores.leases.lease(&t).await.expect("lease").expect("held");
        assert_eq!(lease.holder.run, run.run_id(), "{name}");
        assert!(lease.fence > held.lease.fence, "{name}");
        let mine = stores
            .runs
            .get(run.run_id())
            .await
            .expect("get")
            .expect("recorded");
        assert_eq!(mine.fence, Some(lease.fence.0), "{name}");
        let closed = stores.runs.get(dead.run).await.expect("get").expect("kept");
        assert_eq!(
            closed.status,
            runvisor::RunStatus::Stopped,
            "{name}: {closed:?}"
        );
        assert_eq!(closed.stop_reason.as_deref(), Some("lease_lost"), "{name}");
        live.stop(run.run_id(), StopMode::Force)
            .await
            .expect("stop");
        run.wait().await;
    }
}

#[tokio::test]
async fn a_run_whose_thread_is_taken_over_stops_with_lease_lost_and_writes_nothing_more() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let short = LeaseConfig {
        ttl: Duration::from_secs(2),
        renew: Duration::from_millis(100),
    };
    let one = worker(&stores, "one", short);
    let t = thread("taken");
    let workflow = one.load_json(NAP).expect("valid");
    let run = one
        .start(&workflow, Map::new(), t.clone())
        .await
        .expect("start");
    let record = within("the run's record", async {
        loop {
            if let Some(record) = stores.runs.get(run.run_id()).await.expect("get") {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(record.worker, Some(WorkerId::new("one").expect("id")));
    let checkpoints = stores.checkpoints.list(&t).await.expect("list");
    let history = stores.history.load(&t).await.expect("history");

    // Another worker takes the thread (as it would after finding `one` silent).
    let _: i64 = cmd(&mut con, &["DEL", "runvisor:lease:{taken}"]).await;
    let intruder = holder("two");
    let taken = stores
        .leases
        .acquire(&t, &intruder, TTL)
        .await
        .expect("taken");
    assert!(taken.lease.fence > Fence(record.fence.expect("a fenced record")));

    let outcome = within("the run to stop", run.wait()).await;
    match &outcome {
        RunOutcome::Stopped(stop) => assert_eq!(stop.reason, StopReason::LeaseLost),
        other => panic!("expected a lease_lost stop, got {other:?}"),
    }
    // Nothing more was written for the run: no checkpoint, no message, the record as it was,
    // and the intruder's lease stands.
    assert_eq!(
        stores.checkpoints.list(&t).await.expect("list"),
        checkpoints
    );
    assert_eq!(stores.history.load(&t).await.expect("history"), history);
    assert_eq!(
        stores.runs.get(run.run_id()).await.expect("get"),
        Some(record)
    );
    assert_eq!(
        stores.leases.lease(&t).await.expect("lease"),
        Some(taken.lease)
    );
}

/// `start -> m0 -> s0 -> m1 -> s1 -> ...`: `pairs` messages, each followed by a short sleep.
fn chain_of_messages(pairs: usize) -> String {
    let mut nodes = vec![r#"{"id": "start", "kind": "begin"}"#.to_owned()];
    let mut edges = Vec::new();
    let mut previous = "start".to_owned();
    for i in 0..pairs {
        nodes.push(format!(
            r#"{{"id": "m{i}", "kind": "stream_text", "params": {{"text": "m{i}", "interval": "0s"}}}}"#
        ));
        nodes.push(format!(
            r#"{{"id": "s{i}", "kind": "sleep", "params": {{"duration": "40ms"}}}}"#
        ));
        edges.push(format!(r#"{{"from": "{previous}", "to": "m{i}"}}"#));
        edges.push(format!(r#"{{"from": "m{i}", "to": "s{i}"}}"#));
        previous = format!("s{i}");
    }
    format!(
        r#"{{"id": "chain", "nodes": [{}], "edges": [{}]}}"#,
        nodes.join(","),
        edges.join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_of_the_old_holder_lands_after_a_takeover_across_a_redis_frozen_past_the_ttl() {
    let server = RedisServer::start();
    let short = LeaseConfig {
        ttl: Duration::from_secs(1),
        renew: Duration::from_millis(200),
    };
    let durable = |id: &str, stores: &RedisStores| {
        let config = RuntimeConfig {
            worker_id: Some(id.to_owned()),
            lease: short.clone(),
            durability: runvisor::Durability::Sync,
            ..RuntimeConfig::default()
        };
        stores
            .install(register_standard_kinds(Runtime::builder().config(config)))
            .try_build()
            .expect("runtime")
    };
    // Every checkpoint is kept, so the old holder's can be compared with the new one's.
    let stores = super::support::stores_keeping_all(&server).await;
    let one = durable("one", &stores);
    let two = durable("two", &super::support::stores_keeping_all(&server).await);
    let t = thread("frozen");
    const PAIRS: usize = 40;
    let workflow = one.load_json(&chain_of_messages(PAIRS)).expect("valid");
    let first = one
        .start(&workflow, Map::new(), t.clone())
        .await
        .expect("start");
    within("the first checkpoints", async {
        while stores.checkpoints.list(&t).await.map_or(0, |c| c.len()) < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // Redis freezes for longer than the lease TTL. The old holder cannot confirm its lease
    // meanwhile and stops; a renewal it sent during the freeze may still land when Redis
    // answers again, so the other worker tries until the thread is free, then takes it over.
    // (Three seconds: the heartbeat and the renewal each time out after one second, so the
    // old holder has given up before Redis answers again.)
    server.freeze();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.thaw();
    let second = within("the takeover", async {
        loop {
            match two
                .resume_with(
                    ResumeFrom::Thread(t.clone()),
                    ResumeInput::Continue,
                    runvisor::ResumeOptions::default(),
                )
                .await
            {
                Ok(run) => return run,
                Err(ResumeError::ThreadBusy { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("resume after the freeze: {e}"),
            }
        }
    })
    .await;

    // The old holder learns it lost the lease and stops; the new one finishes the thread.
    match within("the old holder to stop", first.wait()).await {
        RunOutcome::Stopped(stop) => assert_eq!(stop.reason, StopReason::LeaseLost),
        other => panic!("the old holder ended {:?}", other.status()),
    }
    let outcome = within("the new holder to finish", second.wait()).await;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "the new holder ended {:?}",
        outcome.status()
    );

    // Nothing the old holder wrote landed after the takeover: in the history every message of
    // the first run comes before every message of the second, and each message is there once;
    // every checkpoint of the first run is older than every checkpoint of the second.
    let history = stores.history.load(&t).await.expect("history");
    let texts: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
    let expected: Vec<String> = (0..PAIRS).map(|i| format!("m{i}")).collect();
    assert_eq!(texts, expected, "messages lost, repeated or out of order");
    let runs: Vec<RunId> = history.iter().filter_map(|m| m.run_id).collect();
    let first_of_second = runs
        .iter()
        .position(|r| *r == second.run_id())
        .expect("the new holder wrote messages");
    assert!(
        runs[first_of_second..]
            .iter()
            .all(|r| *r == second.run_id()),
        "a message of the old holder landed after the new holder's first"
    );
    let mut by_run: std::collections::HashMap<RunId, Vec<CheckpointId>> =
        std::collections::HashMap::new();
    for id in stores.checkpoints.list(&t).await.expect("list") {
        let stored = stores
            .checkpoints
            .get(&t, id)
            .await
            .expect("get")
            .expect("listed checkpoints exist");
        by_run.entry(stored.run).or_default().push(id);
    }
    let old_newest = by_run[&first.run_id()].iter().max().copied();
    let new_oldest = by_run[&second.run_id()].iter().min().copied();
    assert!(
        old_newest < new_oldest,
        "a checkpoint of the old holder ({old_newest:?}) is newer than the new holder's first ({new_oldest:?})"
    );
}

/// A lease or a fencing counter that is junk (of another type, or a hash of other fields, or
/// a counter that is not a number) refuses the acquire with an error naming the key, and
/// nothing is written; with the junk gone the thread is taken. A release leaves junk alone.
#[tokio::test]
async fn junk_lease_or_counter_refuses_the_acquire_naming_the_key_and_writes_nothing() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("junk-lease");
    let lease = "runvisor:lease:{junk-lease}";
    let counter = "runvisor:fence:{junk-lease}";
    let holder = LeaseHolder {
        worker: WorkerId::new("w").expect("id"),
        run: RunId::new(),
    };
    let ttl = Duration::from_secs(30);
    let refused_at = |result: Result<runvisor::store::Acquired, LeaseError>, key: &str| match result
    {
        Err(LeaseError::Store(StoreError::Corrupt { key: at, .. })) => assert_eq!(at, key),
        other => panic!("expected corrupt data at {key}, got {other:?}"),
    };
    let junk: [(&str, &[&str]); 4] = [
        (lease, &["SET", lease, "not a hash"]),
        (lease, &["HSET", lease, "owner", "someone"]),
        (counter, &["HSET", counter, "token", "1"]),
        (counter, &["SET", counter, "seven"]),
    ];
    for (key, write) in junk {
        let _: () = cmd(&mut con, write).await;
        refused_at(stores.leases.acquire(&t, &holder, ttl).await, key);
        let other = if key == lease { counter } else { lease };
        let exists: i64 = cmd(&mut con, &["EXISTS", other]).await;
        assert_eq!(exists, 0, "{other} was not written ({write:?})");
        let _: i64 = cmd(&mut con, &["DEL", key]).await;
    }
    let taken = stores
        .leases
        .acquire(&t, &holder, ttl)
        .await
        .expect("the junk is gone");
    assert_eq!(
        stores.leases.lease(&t).await.expect("read"),
        Some(taken.lease.clone())
    );
    // A lease key that turned to junk meanwhile is left alone by the release.
    let _: () = cmd(&mut con, &["SET", lease, "not a hash"]).await;
    stores
        .leases
        .release(&t, &taken.lease)
        .await
        .expect("a release over junk deletes nothing and fails nothing");
    let value: String = cmd(&mut con, &["GET", lease]).await;
    assert_eq!(value, "not a hash");
}
