//! Durability on Redis, asserted on what Redis holds afterwards (never on timings):
//!
//! - a thread continued from an older checkpoint goes on from there and leaves the newer
//!   checkpoints and runs byte for byte as they were;
//! - a run goes on while Redis is killed (`async` durability), and once Redis is back (empty:
//!   the test server keeps nothing) the pending snapshot and the final one land, and the run
//!   record says succeeded;
//! - a run outlasts a Redis frozen (SIGSTOP) for 3 s, in `sync` and `async` durability: calls
//!   time out and are retried, and after the thaw the final state is stored and recorded; so
//!   does a run whose end (one write on Redis) is sent into the frozen server;
//! - a checkpoint whose bytes were damaged in Redis (garbage, one flipped bit) is refused by
//!   resume with `ResumeError::Corrupt` naming it, the run record's `not_resumable` says why,
//!   the CLI prints one error line, and nothing panics; the original bytes resume fine;
//! - every key a real run writes has a TTL.
//!
//! The first resume of a stopped run in a brand-new runtime is in [`super::resume`]; stale
//! sequences are in [`super::checkpoints`].

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use runvisor::redis::RedisStores;
use runvisor::snapshot::{Snapshot, SnapshotError};
use runvisor::store::{RunRecord, StoredCheckpoint};
use runvisor::{
    CheckpointId, Durability, Map, Message, NodeContext, NodeError, NodeHandler, NodeOutput,
    ResumeError, ResumeFrom, ResumeInput, Role, RunHandle, RunId, RunOutcome, RunStatus, Runtime,
    RuntimeConfig, StopMode, StopReply, ThreadId, Value, async_trait,
};
use tokio::sync::watch;

use super::support::{
    RedisServer, checkpoint_payload, cmd, raw, set_checkpoint_payload, stores, thread, within,
};

/// How long a test waits for something a loaded machine may be slow to do before failing.
pub(crate) const SLOW: Duration = Duration::from_secs(30);

/// Polls `check` until it gives a value, failing the test after `limit`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that every key under `prefix` expires (PTTL > 0): nothing a run writes lives
/// forever. Returns how many keys there are.
pub(crate) async fn assert_every_key_expires(
    con: &mut MultiplexedConnection,
    prefix: &str,
) -> usize {
    let pattern = format!("{prefix}:*");
    let mut cursor = "0".to_owned();
    let mut keys = Vec::new();
    loop {
        let (next, batch): (String, Vec<String>) =
            cmd(con, &["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"]).await;
        keys.extend(batch);
        if next == "0" {
            break;
        }
        cursor = next;
    }
    for key in &keys {
        let pttl: i64 = cmd(con, &["PTTL", key]).await;
        assert!(pttl > 0, "{key} has no TTL (PTTL {pttl})");
    }
    keys.len()
}

/// The `work` kind: counts its calls per node, optionally hangs (until a forced stop aborts
/// it) or waits at a gate, sleeps its `ms` param, appends "<node> done" and outputs
/// `{"node": <id>}`.
#[derive(Debug, Clone, Default)]
struct Work {
    calls: Arc<Mutex<BTreeMap<String, usize>>>,
    hang: Arc<HashSet<&'static str>>,
    gate: Option<(&'static str, watch::Receiver<bool>)>,
}

impl Work {
    fn hanging(nodes: &[&'static str]) -> Self {
        Self {
            hang: Arc::new(nodes.iter().copied().collect()),
            ..Self::default()
        }
    }

    /// `node` waits until the returned sender sends `true`.
    fn gated(node: &'static str) -> (Self, watch::Sender<bool>) {
        let (open, rx) = watch::channel(false);
        let work = Self {
            gate: Some((node, rx)),
            ..Self::default()
        };
        (work, open)
    }

    fn calls(&self, node: &str) -> usize {
        self.calls
            .lock()
            .expect("calls")
            .get(node)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl NodeHandler for Work {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let node = ctx.node_id().as_str().to_owned();
        *self
            .calls
            .lock()
            .expect("calls")
            .entry(node.clone())
            .or_default() += 1;
        if self.hang.contains(node.as_str()) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if let Some((gated, rx)) = &self.gate
            && *gated == node
        {
            let mut rx = rx.clone();
            let _ = rx.wait_for(|open| *open).await;
        }
        let ms = input.get("ms").and_then(Value::as_i64).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(u64::try_from(ms).unwrap_or(0))).await;
        ctx.append_message(Message::assistant(format!("{node} done")));
        let output: Map = [("node".to_owned(), Value::from(node))]
            .into_iter()
            .collect();
        Ok(NodeOutput::new(Value::from(output)))
    }
}

/// `start -> n[0] -> n[1] -> ...`, every node of kind `work` sleeping `ms`.
fn chain(id: &str, nodes: &[&str], ms: u64) -> String {
    let mut defs = vec![serde_json::json!({"id": "start", "kind": "begin"})];
    let mut edges = Vec::new();
    let mut prev = "start";
    for node in nodes {
        defs.push(serde_json::json!({"id": node, "kind": "work", "params": {"ms": ms}}));
        edges.push(serde_json::json!({"from": prev, "to": node}));
        prev = node;
    }
    serde_json::json!({"id": id, "nodes": defs, "edges": edges}).to_string()
}

fn runtime(stores: &RedisStores, work: &Work, durability: Durability) -> Runtime {
    runtime_with(
        stores,
        work,
        RuntimeConfig {
            durability,
            ..RuntimeConfig::default()
        },
    )
}

fn runtime_with(stores: &RedisStores, work: &Work, config: RuntimeConfig) -> Runtime {
    stores
        .install(
            Runtime::builder()
                .handler("work", work.clone())
                .config(config),
        )
        .build()
}

/// A stored checkpoint read back whole (a delta on top of its chain).
async fn whole(stores: &RedisStores, t: &ThreadId, stored: &StoredCheckpoint) -> Snapshot {
    runvisor::delta::materialize(&*stores.checkpoints, t, stored)
        .await
        .expect("the checkpoint reads back whole")
}

async fn start(rt: &Runtime, workflow: &str, t: &ThreadId, query: &str) -> RunHandle {
    let workflow = rt.load_json(workflow).expect("valid workflow");
    let inputs: Map = [("query".to_owned(), Value::from(query))]
        .into_iter()
        .collect();
    within("start", rt.start(&workflow, inputs, t.clone()))
        .await
        .expect("the run starts")
}

async fn wait_until_called(work: &Work, node: &str) {
    eventually(&format!("`{node}` to start"), SLOW, || async {
        (work.calls(node) > 0).then_some(())
    })
    .await;
}

async fn force_stop(run: &RunHandle) -> CheckpointId {
    match within("force stop", run.stop(StopMode::Force)).await {
        Ok(StopReply::Stopped(result)) => result.checkpoint_id.expect("the stop checkpointed"),
        other => panic!("expected the run to stop: {other:?}"),
    }
}

async fn finish(run: &RunHandle) -> RunOutcome {
    tokio::time::timeout(SLOW, run.wait())
        .await
        .unwrap_or_else(|_| panic!("run {} did not end within {SLOW:?}", run.run_id()))
}

async fn record(stores: &RedisStores, run: RunId) -> RunRecord {
    stores
        .runs
        .get(run)
        .await
        .expect("run store")
        .unwrap_or_else(|| panic!("no record of run {run}"))
}

/// The raw value of a checkpoint, as another tool reads it.
async fn raw_checkpoint(
    con: &mut MultiplexedConnection,
    t: &ThreadId,
    id: CheckpointId,
) -> Vec<u8> {
    cmd(con, &["GET", &format!("runvisor:cp:{{{t}}}:{id}")]).await
}

async fn set_bytes(con: &mut MultiplexedConnection, t: &ThreadId, id: CheckpointId, bytes: &[u8]) {
    set_checkpoint_payload(con, &format!("runvisor:cp:{{{t}}}:{id}"), bytes).await;
}

fn node_ids(snapshot: &Snapshot) -> Vec<&str> {
    snapshot
        .graph
        .completed
        .iter()
        .map(|c| c.node.as_str())
        .collect()
}

/// The assistant messages per node in a list of messages.
fn per_node(messages: &[Message]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for m in messages.iter().filter(|m| m.role == Role::Assistant) {
        let node = m
            .node_id
            .as_ref()
            .map(|n| n.to_string())
            .unwrap_or_default();
        *counts.entry(node).or_default() += 1;
    }
    counts
}

/// `ResumeFrom::Checkpoint` continues the same thread from an older checkpoint (a fork into a
/// new thread is `ResumeFrom::Fork`, in `fork.rs`).
#[tokio::test]
async fn continuing_a_thread_on_redis_from_an_older_checkpoint_leaves_the_newer_untouched() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    let t = thread("chat:fork");
    let workflow = chain("forks", &["a", "b", "c"], 0);

    // Process one stops at `b`: cp1. Process two resumes and stops at `c`: cp2.
    let first_stores = stores(&server).await;
    let first_work = Work::hanging(&["b"]);
    let first_rt = runtime(&first_stores, &first_work, Durability::Sync);
    let run1 = start(&first_rt, &workflow, &t, "fork me").await;
    wait_until_called(&first_work, "b").await;
    let cp1 = force_stop(&run1).await;
    drop(first_rt);

    let second_stores = stores(&server).await;
    let second_work = Work::hanging(&["c"]);
    let second_rt = runtime(&second_stores, &second_work, Durability::Sync);
    let run2 = within("resume", second_rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumable");
    wait_until_called(&second_work, "c").await;
    let cp2 = force_stop(&run2).await;
    assert_eq!(
        (second_work.calls("a"), second_work.calls("b")),
        (0, 1),
        "the resume did not repeat `a`"
    );
    drop(second_rt);

    let listed_before = second_stores.checkpoints.list(&t).await.expect("list");
    let cp1_raw = raw_checkpoint(&mut con, &t, cp1).await;
    let cp2_raw = raw_checkpoint(&mut con, &t, cp2).await;
    let run2_before = record(&second_stores, run2.run_id()).await;
    assert_eq!(run2_before.status, RunStatus::Stopped);
    assert_eq!(run2_before.checkpoint_id, Some(cp2));

    // Process three forks from cp1: `b` and `c` run again, `a` does not.
    let third_stores = stores(&server).await;
    let third_work = Work::default();
    let third_rt = runtime(&third_stores, &third_work, Durability::Sync);
    let fork = within(
        "fork",
        third_rt.resume(
            ResumeFrom::Checkpoint {
                thread: t.clone(),
                checkpoint: cp1,
            },
            ResumeInput::Continue,
        ),
    )
    .await
    .expect("forkable");
    let outcome = finish(&fork).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        (
            third_work.calls("a"),
            third_work.calls("b"),
            third_work.calls("c")
        ),
        (0, 1, 1)
    );

    // The older and newer checkpoints are byte for byte what they were, still listed in
    // order, and the fork's own checkpoints come after them.
    assert_eq!(raw_checkpoint(&mut con, &t, cp1).await, cp1_raw, "cp1");
    assert_eq!(raw_checkpoint(&mut con, &t, cp2).await, cp2_raw, "cp2");
    let listed = third_stores.checkpoints.list(&t).await.expect("list");
    assert_eq!(
        &listed[..listed_before.len()],
        &listed_before[..],
        "no checkpoint of the first two runs was touched"
    );
    let at = |id: CheckpointId| listed.iter().position(|c| *c == id).expect("listed");
    assert!(at(cp1) < at(cp2));
    let fork_record = record(&third_stores, fork.run_id()).await;
    assert_eq!(fork_record.status, RunStatus::Succeeded);
    assert_eq!(fork_record.parent_run_id, Some(run1.run_id()));
    assert_eq!(listed.last(), fork_record.checkpoint_id.as_ref());
    let latest = third_stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("a checkpoint");
    let snapshot = whole(&third_stores, &t, &latest).await;
    assert_eq!(snapshot.run_id, fork.run_id());
    assert_eq!(snapshot.parent_run_id, Some(run1.run_id()));
    assert_eq!(node_ids(&snapshot), ["start", "a", "b", "c"]);
    // The second run is as it was.
    assert_eq!(record(&third_stores, run2.run_id()).await, run2_before);

    // History: the query and `a` once; `b` twice (run two and the fork each produced it),
    // `c` once (run two was stopped in it); no message stored twice.
    let history = third_stores.history.load(&t).await.expect("history");
    let ids: HashSet<_> = history.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), history.len(), "no message stored twice");
    assert_eq!(
        per_node(&history),
        BTreeMap::from([("a".into(), 1), ("b".into(), 2), ("c".into(), 1)])
    );

    // Every key those runs wrote expires.
    assert!(assert_every_key_expires(&mut con, "runvisor").await >= 7);
}

#[tokio::test]
async fn a_run_goes_on_while_redis_is_killed_and_its_state_lands_after_the_restart() {
    let mut server = RedisServer::start();
    let t = thread("chat:killed");
    let nodes = ["a", "b", "c", "d", "e"];
    let stores = stores(&server).await;
    let (work, open) = Work::gated("e");
    let rt = runtime(&stores, &work, Durability::Async);
    let run = start(&rt, &chain("outage", &nodes, 200), &t, "survive").await;

    // Redis dies while `b` runs; `c` and `d` run during the outage.
    wait_until_called(&work, "b").await;
    server.kill9();
    wait_until_called(&work, "d").await;
    wait_until_called(&work, "e").await;
    assert!(
        run.outcome().is_none(),
        "the run waits at `e`'s gate, still running"
    );

    // A fresh, empty Redis on the same port. The snapshot that waited during the outage
    // (everything up to `d` done) lands on its own, retried by the checkpointer.
    server.restart();
    let mut con = raw(&server).await;
    let progress = eventually("the pending snapshot to land", SLOW, || async {
        let latest = stores.checkpoints.latest(&t).await.ok().flatten()?;
        Some((latest.id, Snapshot::decode(&latest.bytes).expect("decodes")))
    })
    .await;
    let (progress_id, progress) = progress;
    assert_eq!(progress.run_id, run.run_id());
    assert_eq!(progress.status, RunStatus::Running);
    assert_eq!(node_ids(&progress), ["start", "a", "b", "c", "d"]);
    assert_eq!(progress.graph.frontier.len(), 1);
    assert_eq!(progress.graph.frontier[0].as_str(), "e");
    // The messages produced so far travel in it.
    assert_eq!(
        per_node(&Vec::from_iter(progress.pending_messages.iter().cloned())),
        BTreeMap::from([
            ("a".into(), 1),
            ("b".into(), 1),
            ("c".into(), 1),
            ("d".into(), 1)
        ])
    );

    open.send(true).expect("the gate is watched");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(nodes.map(|n| work.calls(n)), [1; 5], "no node ran twice");

    // The final checkpoint and the run record were written to the new server.
    let latest = stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("the final checkpoint");
    assert_ne!(latest.id, progress_id);
    assert!(latest.sequence > progress.sequence);
    let last = whole(&stores, &t, &latest).await;
    assert_eq!(last.run_id, run.run_id());
    assert_eq!(last.status, RunStatus::Succeeded);
    assert_eq!(node_ids(&last), ["start", "a", "b", "c", "d", "e"]);
    let rec = record(&stores, run.run_id()).await;
    assert_eq!(rec.status, RunStatus::Succeeded);
    assert_eq!(rec.checkpoint_id, Some(latest.id));
    assert!(rec.finished_at_ms.is_some());
    assert!(
        !rec.unpersisted
            .as_deref()
            .unwrap_or("")
            .contains("checkpoint"),
        "{rec:#?}"
    );
    let listed = stores.runs.list_thread(&t).await.expect("runs");
    assert_eq!(
        listed.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        [run.run_id()]
    );

    // Every message is stored: in the history, or (if the first call after the restart still
    // met the outage) in the final checkpoint, which a resume would persist first.
    let history = stores.history.load(&t).await.expect("history");
    assert_messages_kept(&history, &last, &nodes, &rec);
    assert!(assert_every_key_expires(&mut con, "runvisor").await >= 5);
}

/// Every node's message is in the history or in the final snapshot's pending messages; the
/// history holds each at most once; pending messages are reported on the record.
#[track_caller]
fn assert_messages_kept(history: &[Message], last: &Snapshot, nodes: &[&str], rec: &RunRecord) {
    let ids: HashSet<_> = history.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), history.len(), "no message stored twice");
    let stored = per_node(history);
    for node in nodes {
        assert!(
            stored.get(*node).copied().unwrap_or(0) <= 1,
            "{node} in history {stored:?}"
        );
    }
    // The final checkpoint carries the run's messages as pending (it is written before the
    // history): the record says some were not persisted exactly when the history lacks one.
    let missing = last.pending_messages.iter().any(|m| !ids.contains(&m.id));
    let mut kept: HashSet<_> = ids;
    kept.extend(last.pending_messages.iter().map(|m| m.id));
    let all: Vec<&Message> = history.iter().chain(&last.pending_messages).collect();
    for node in nodes {
        let mine: HashSet<_> = all
            .iter()
            .filter(|m| m.node_id.as_ref().is_some_and(|n| n.as_str() == *node))
            .map(|m| m.id)
            .collect();
        assert_eq!(mine.len(), 1, "`{node}`'s message, once: {all:#?}");
        assert!(mine.iter().all(|id| kept.contains(id)));
    }
    if missing {
        assert!(rec.unpersisted.is_some(), "{rec:#?}");
    }
}

async fn run_through_a_frozen_redis(durability: Durability, t: ThreadId) {
    let server = RedisServer::start();
    let nodes = ["a", "b", "c", "d"];
    let stores = stores(&server).await;
    let work = Work::default();
    let rt = runtime(&stores, &work, durability);
    let run = start(&rt, &chain("frozen", &nodes, 150), &t, "freeze").await;

    wait_until_called(&work, "b").await;
    server.freeze();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.thaw();

    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(nodes.map(|n| work.calls(n)), [1; 4], "no node ran twice");

    let latest = within("latest", stores.checkpoints.latest(&t))
        .await
        .expect("latest")
        .expect("the final checkpoint");
    let last = whole(&stores, &t, &latest).await;
    assert_eq!(last.run_id, run.run_id());
    assert_eq!(last.status, RunStatus::Succeeded);
    assert_eq!(node_ids(&last), ["start", "a", "b", "c", "d"]);
    let rec = record(&stores, run.run_id()).await;
    assert_eq!(rec.status, RunStatus::Succeeded, "{rec:#?}");
    // The record names the checkpoint that is stored: a write that timed out while Redis was
    // frozen, yet landed at the thaw, is the run's checkpoint, not a failure.
    assert_eq!(rec.checkpoint_id, Some(latest.id), "{rec:#?}");
    assert!(
        !rec.unpersisted
            .as_deref()
            .unwrap_or("")
            .contains("checkpoint"),
        "{rec:#?}"
    );
    let history = stores.history.load(&t).await.expect("history");
    assert_messages_kept(&history, &last, &nodes, &rec);
    // Sequences of the run's checkpoints increase with their ids.
    let mut previous = 0;
    for id in stores.checkpoints.list(&t).await.expect("list") {
        let cp = stores
            .checkpoints
            .get(&t, id)
            .await
            .expect("get")
            .expect("listed checkpoints exist");
        assert!(
            cp.sequence > previous,
            "{id}: {} after {previous}",
            cp.sequence
        );
        previous = cp.sequence;
    }
}

/// A run's end sent into a frozen Redis: its one write (checkpoint, messages, record, lease)
/// times out and is tried again step by step while Redis stays frozen; at the thaw the first
/// write lands, then the retries find it there. Everything is stored once and the thread is
/// free.
#[tokio::test]
async fn a_run_end_sent_into_a_frozen_redis_lands_once_at_the_thaw() {
    let server = RedisServer::start();
    let t = thread("chat:frozen-end");
    let nodes = ["a", "b", "c"];
    let stores = stores(&server).await;
    let (work, open) = Work::gated("c");
    let rt = runtime(&stores, &work, Durability::Async);
    let run = start(
        &rt,
        &chain("frozen-end", &nodes, 0),
        &t,
        "end into a freeze",
    )
    .await;

    wait_until_called(&work, "c").await;
    server.freeze();
    open.send_replace(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.thaw();

    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert!(outcome.is_persisted(), "{outcome:#?}");
    assert_eq!(nodes.map(|n| work.calls(n)), [1; 3], "no node ran twice");
    let latest = within("latest", stores.checkpoints.latest(&t))
        .await
        .expect("latest")
        .expect("the final checkpoint");
    let last = whole(&stores, &t, &latest).await;
    assert_eq!(last.status, RunStatus::Succeeded);
    assert_eq!(node_ids(&last), ["start", "a", "b", "c"]);
    let rec = record(&stores, run.run_id()).await;
    assert_eq!(rec.status, RunStatus::Succeeded, "{rec:#?}");
    assert_eq!(rec.checkpoint_id, Some(latest.id), "{rec:#?}");
    assert_eq!(rec.unpersisted, None, "{rec:#?}");
    let history = stores.history.load(&t).await.expect("history");
    assert_messages_kept(&history, &last, &nodes, &rec);
    assert_eq!(
        history.len(),
        4,
        "the query and one message per node: {history:#?}"
    );
    assert_eq!(
        stores.leases.lease(&t).await.expect("lease"),
        None,
        "the thread is free"
    );
}

/// A start sent into a frozen Redis: its one write (lease, record, history read) times out and
/// is tried again while Redis stays frozen; at the thaw the first attempt lands and the
/// retries find the run's own lease there. The run starts once, with the one token its lease
/// got, and the thread is free after it (no lease left behind for a start that failed).
#[tokio::test]
async fn a_start_sent_into_a_frozen_redis_starts_once_at_the_thaw() {
    let server = RedisServer::start();
    let t = thread("chat:frozen-start");
    let nodes = ["a", "b"];
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let (work, open) = Work::gated("hold");
    let rt = runtime(&stores, &work, Durability::Sync);
    let workflow = chain("frozen-start", &nodes, 0);
    // A run of another thread holds its lease meanwhile, so this worker's heartbeat is known
    // to be up and the start's first call is its one write.
    let other = start(
        &rt,
        &chain("other", &["hold"], 0),
        &thread("chat:other"),
        "hold on",
    )
    .await;
    wait_until_called(&work, "hold").await;

    server.freeze();
    let starting = {
        let rt = rt.clone();
        let t = t.clone();
        tokio::spawn(async move { start(&rt, &workflow, &t, "start into a freeze").await })
    };
    // Several attempts time out (300 ms each) while Redis is frozen.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!starting.is_finished(), "the start waits for the store");
    server.thaw();
    let run = within("the start", starting).await.expect("start task");
    open.send_replace(true);
    let outcome = finish(&other).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");

    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(nodes.map(|n| work.calls(n)), [1; 2], "no node ran twice");
    let rec = record(&stores, run.run_id()).await;
    assert_eq!(rec.status, RunStatus::Succeeded, "{rec:#?}");
    // One token was issued: the retries took no lease of their own.
    let counter: String = cmd(&mut con, &["GET", &format!("runvisor:fence:{{{t}}}")]).await;
    assert_eq!(rec.fence.map(|f| f.to_string()), Some(counter), "{rec:#?}");
    let runs = within("runs", stores.runs.list_thread(&t))
        .await
        .expect("runs of the thread");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(
        stores.leases.lease(&t).await.expect("lease"),
        None,
        "the thread is free"
    );
}

#[tokio::test]
async fn a_sync_run_waits_out_a_frozen_redis_and_stores_its_final_state_after_the_thaw() {
    run_through_a_frozen_redis(Durability::Sync, thread("chat:frozen-sync")).await;
}

#[tokio::test]
async fn an_async_run_outlasts_a_frozen_redis_and_stores_its_final_state_after_the_thaw() {
    run_through_a_frozen_redis(Durability::Async, thread("chat:frozen-async")).await;
}

#[tokio::test]
async fn a_damaged_checkpoint_is_refused_by_resume_named_and_recorded_on_its_run() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    let t = thread("chat:damaged");
    let stores = stores(&server).await;
    let first = Work::hanging(&["b"]);
    // Whole checkpoints only: this is about a damaged envelope (a damaged delta is in
    // deltas.rs).
    let whole_only = RuntimeConfig {
        durability: Durability::Sync,
        checkpoint_compact_every: 0,
        ..RuntimeConfig::default()
    };
    let rt = runtime_with(&stores, &first, whole_only);
    let run = start(&rt, &chain("damaged", &["a", "b"], 0), &t, "break me").await;
    wait_until_called(&first, "b").await;
    let cp = force_stop(&run).await;
    drop(rt);
    let original = checkpoint_payload(&mut con, &format!("runvisor:cp:{{{t}}}:{cp}")).await;
    assert!(Snapshot::decode(&original).is_ok());

    let work = Work::default();
    let rt = runtime(&stores, &work, Durability::Sync);
    let garbage: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let mut flipped = original.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x10;
    let cases: [(&str, &[u8]); 3] = [
        ("garbage", &garbage),
        ("short garbage", b"garbage"),
        ("one flipped bit", &flipped),
    ];
    for (case, bytes) in cases {
        set_bytes(&mut con, &t, cp, bytes).await;
        let expected_error = Snapshot::decode(bytes).expect_err("damaged");
        for from in [
            ResumeFrom::Thread(t.clone()),
            ResumeFrom::Checkpoint {
                thread: t.clone(),
                checkpoint: cp,
            },
        ] {
            let refused = within("resume", rt.resume(from, ResumeInput::Continue)).await;
            match refused {
                Err(ResumeError::Corrupt { checkpoint, error }) => {
                    assert_eq!(checkpoint, cp, "{case}");
                    assert_eq!(error, expected_error, "{case}");
                }
                other => panic!(
                    "{case}: expected Corrupt, got {:?}",
                    other.map(|r| r.run_id())
                ),
            }
        }
        let rec = record(&stores, run.run_id()).await;
        assert_eq!(
            rec.not_resumable,
            Some(format!("checkpoint {cp}: {expected_error}")),
            "{case}"
        );
        // The record is otherwise the stopped run's.
        assert_eq!(rec.status, RunStatus::Stopped);
        assert_eq!(rec.checkpoint_id, Some(cp));
    }
    assert!(matches!(
        Snapshot::decode(&flipped),
        Err(SnapshotError::Checksum { .. })
    ));
    assert_eq!(work.calls("a") + work.calls("b"), 0, "nothing ran");
    assert!(rt.registry().is_empty());
    assert_eq!(
        stores.runs.list_thread(&t).await.expect("runs").len(),
        1,
        "no run was recorded for the refused resumes"
    );

    // The CLI says the same in one line, with the usage error code, and does not panic.
    let args = [
        "--redis".to_owned(),
        server.url(),
        "resume".into(),
        "--thread".into(),
        t.to_string(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_runvisor"))
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("RUNVISOR_REDIS_URL")
            .output()
    });
    let output = tokio::time::timeout(SLOW, output)
        .await
        .expect("the CLI answers")
        .expect("joined")
        .expect("the CLI runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&format!("checkpoint {cp} is not resumable"))
            && stderr.contains("checksum"),
        "{stderr}"
    );

    // The original bytes back: the same checkpoint resumes and completes.
    set_bytes(&mut con, &t, cp, &original).await;
    let resumed = within("resume", rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumable again");
    let outcome = finish(&resumed).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!((work.calls("a"), work.calls("b")), (0, 1));
}
