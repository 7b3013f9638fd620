//! Durability modes on the embedded stores: `sync` stores a node's result before its
//! dependents start; `async` coalesces; `exit` writes only at the end; a failing checkpoint
//! store makes a `sync` run wait (nothing goes on unsaved) and go on when the store is back.

use runvisor_actors::store::MemoryLeaseStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use runvisor_actors::delta::materialize;
use runvisor_actors::snapshot::Snapshot;
use runvisor_actors::store::memory::MemoryCheckpointStore;
use runvisor_actors::store::{CheckpointStore, HistoryStore, StoredCheckpoint};
use runvisor_actors::testkit::{PutWatch, WatchedCheckpoints};
use runvisor_actors::{
    Durability, NodeContext, NodeError, NodeHandler, NodeOutput, RunEvent, RunStatus, Runtime,
    RuntimeConfig, StoreError, ThreadId, Value, async_trait,
};
use serde_json::json;

use super::support::*;

/// What the writes of a [`Flaky`] store meet: they fail while `broken` is set, and wait
/// (saying so through `entered`) until `release` while `hold` is set; it counts the writes it
/// was asked for.
#[derive(Debug, Default)]
struct Flakiness {
    broken: AtomicBool,
    hold: AtomicBool,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
    puts: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl PutWatch for Flakiness {
    async fn before(&self, _: &ThreadId, _: &StoredCheckpoint) -> Result<(), StoreError> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        if self.hold.load(Ordering::SeqCst) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        if self.broken.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("checkpoint store down".into()));
        }
        Ok(())
    }
}

/// A memory checkpoint store with [`Flakiness`] around its writes.
type Flaky = WatchedCheckpoints<Flakiness>;

fn flaky() -> Arc<Flaky> {
    Arc::new(WatchedCheckpoints::new(
        Arc::new(MemoryCheckpointStore::default()),
        Flakiness::default(),
    ))
}

/// Records, when it runs, which nodes the thread's newest checkpoint holds as completed.
struct SeesCheckpoint(Arc<dyn CheckpointStore>);

#[async_trait]
impl NodeHandler for SeesCheckpoint {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let stored = self
            .0
            .latest(ctx.thread())
            .await
            .map_err(NodeError::failed)?
            .ok_or_else(|| NodeError::failed("no checkpoint yet"))?;
        let snapshot = materialize(&*self.0, ctx.thread(), &stored)
            .await
            .map_err(NodeError::failed)?;
        let done: Vec<Value> = snapshot
            .graph
            .completed
            .iter()
            .map(|c| Value::from(c.node.as_str()))
            .collect();
        Ok(NodeOutput::new(Value::from_iter([(
            "saw",
            Value::Array(done),
        )])))
    }
}

fn runtime(store: Arc<dyn CheckpointStore>, durability: Durability) -> Runtime {
    Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .checkpoint_store(store.clone())
        .handler("sees", SeesCheckpoint(store))
        .config(RuntimeConfig {
            durability,
            store_deadline: Duration::from_millis(200),
            ..RuntimeConfig::default()
        })
        .build()
}

fn chain(rt: &Runtime) -> runvisor_actors::Workflow {
    load(
        rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "message", "params": {"template": "a"}},
            {"id": "b", "kind": "sees"},
            {"id": "c", "kind": "sees"}
        ], "edges": [
            {"from": "start", "to": "a"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"}
        ]}),
    )
}

#[tokio::test]
async fn sync_stores_each_result_before_its_dependents_start() {
    let store: Arc<dyn CheckpointStore> = Arc::new(MemoryCheckpointStore::new());
    let rt = runtime(store, Durability::Sync);
    let run = rt
        .start(&chain(&rt), inputs([]), thread("sync"))
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("b"),
        Some(&val(json!({"saw": ["start", "a"]})))
    );
    assert_eq!(
        outcome.output("c"),
        Some(&val(json!({"saw": ["start", "a", "b"]})))
    );
    assert_eq!(outcome.storage_wait(), Duration::ZERO);
}

#[tokio::test]
async fn exit_writes_only_the_final_checkpoint() {
    let store: Arc<dyn CheckpointStore> = Arc::new(MemoryCheckpointStore::new());
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .checkpoint_store(store.clone())
        .config(RuntimeConfig {
            durability: Durability::Exit,
            ..RuntimeConfig::default()
        })
        .build();
    let wf = load(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "message", "params": {"template": "a"}},
            {"id": "b", "kind": "message", "params": {"template": "b"}}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]}),
    );
    let t = thread("exit");
    let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    assert_eq!(finish(&run).await.status(), RunStatus::Succeeded);
    assert_eq!(store.list(&t).await.expect("list").len(), 1);
}

/// On the paused clock the store's retries and the awaited write's timeout are timers: the
/// run waits through any number of them.
#[tokio::test(start_paused = true)]
async fn a_failing_store_makes_a_sync_run_wait_and_go_on_when_it_is_back() {
    let flaky = flaky();
    flaky.watch().broken.store(true, Ordering::SeqCst);
    let store: Arc<dyn CheckpointStore> = flaky.clone();
    let rt = runtime(store, Durability::Sync);
    let t = thread("outage");
    let run = rt
        .start(&chain(&rt), inputs([]), t.clone())
        .await
        .expect("start");
    let mut events = run.events();
    // The run waits: `b` does not start while `a`'s result cannot be stored.
    within("the run to wait for storage", async {
        loop {
            match events.next().await {
                Some(RunEvent::StorageWait {
                    waiting: true,
                    error,
                }) => {
                    assert!(error.is_some_and(|e| e.to_string().contains("checkpoint store down")));
                    break;
                }
                Some(RunEvent::NodeStarted { path, .. }) => {
                    assert_ne!(path.to_string(), "b", "b started unsaved");
                }
                Some(_) => {}
                None => panic!("the run ended instead of waiting"),
            }
        }
    })
    .await;
    let summary = rt.registry().summary(&run.run_id()).expect("live");
    assert!(summary.waiting_for_storage);
    assert_eq!(summary.status, RunStatus::Running);
    // The store comes back: the run goes on and completes, every step stored.
    flaky.watch().broken.store(false, Ordering::SeqCst);
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("b"),
        Some(&val(json!({"saw": ["start", "a"]})))
    );
    assert!(!rt.registry().contains(&run.run_id()));
    // The result says the run waited for the store.
    assert_ne!(outcome.storage_wait(), Duration::ZERO);
}

/// A run's actor waits for its own `sync` write only briefly before handing it to a task: while
/// a write is slow the run still answers (here a tree query, which would time out if the actor
/// waited for the write), and the write's answer, when it comes, starts the next node.
#[tokio::test(start_paused = true)]
async fn a_sync_run_answers_queries_while_its_write_is_slow() {
    let slow = flaky();
    slow.watch().hold.store(true, Ordering::SeqCst);
    let store: Arc<dyn CheckpointStore> = slow.clone();
    // A store deadline longer than the query's wait: the write neither fails nor gives up
    // while the query waits for the run.
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .checkpoint_store(store.clone())
        .handler("sees", SeesCheckpoint(store))
        .config(RuntimeConfig {
            durability: Durability::Sync,
            store_deadline: Duration::from_secs(60),
            ..RuntimeConfig::default()
        })
        .build();
    let run = rt
        .start(&chain(&rt), inputs([]), thread("slow"))
        .await
        .expect("start");
    within("a write to begin", slow.watch().entered.notified()).await;
    let tree = within("the tree", rt.tree(run.run_id()))
        .await
        .expect("the run answers while its write waits");
    assert_eq!(tree.kind, "run_supervisor");
    assert_eq!(tree.status, "running");
    slow.watch().hold.store(false, Ordering::SeqCst);
    slow.watch().release.notify_one();
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("b"),
        Some(&val(json!({"saw": ["start", "a"]})))
    );
}

#[tokio::test]
async fn messages_refused_at_a_successful_end_are_persisted_by_the_next_resume() {
    use runvisor_actors::store::memory::MemoryHistoryStore;
    use runvisor_actors::{ResumeError, ResumeInput};
    let history = Arc::new(MemoryHistoryStore::new());
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .history_store(history.clone())
        .config(short_store_deadline())
        .build();
    let wf = load(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "message", "params": {"template": "kept"}}
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    let t = thread("refused");
    history.fail_appends(true);
    let run = rt
        .start(&wf, inputs([("query", "hi".into())]), t.clone())
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded);
    assert_eq!(outcome.history().not_persisted.len(), 2);
    history.fail_appends(false);
    // Nothing is left to run, but the refused messages land now, once.
    let refused = rt.resume(t.clone(), ResumeInput::Continue).await;
    assert!(
        matches!(refused, Err(ResumeError::NothingToResume { .. })),
        "{refused:?}"
    );
    let texts: Vec<String> = history
        .load(&t)
        .await
        .expect("load")
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(texts, ["hi", "kept"]);
    let again = rt.resume(t.clone(), ResumeInput::Continue).await;
    assert!(again.is_err());
    assert_eq!(history.load(&t).await.expect("load").len(), 2);
}

/// Counts calls per `i`; blocks (until stopped) the first time it sees `i == hold`.
struct HoldAt {
    hold: i64,
    calls: Arc<std::sync::Mutex<Vec<i64>>>,
}

#[async_trait]
impl NodeHandler for HoldAt {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let i = input.get("i").and_then(Value::as_i64).unwrap_or(-1);
        let first = {
            let mut calls = self.calls.lock().expect("calls");
            calls.push(i);
            calls.iter().filter(|c| **c == i).count() == 1
        };
        if i == self.hold && first {
            ctx.stopped().await;
            return Err(NodeError::Stopped);
        }
        Ok(NodeOutput::new(Value::from_iter([("i", i)])))
    }
}

#[tokio::test]
async fn a_progress_snapshot_keeps_a_loops_finished_iterations() {
    use runvisor_actors::snapshot::FrameState;
    use runvisor_actors::{ResumeFrom, ResumeInput, StopMode};
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store: Arc<dyn CheckpointStore> = Arc::new(MemoryCheckpointStore::new());
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .checkpoint_store(store.clone())
        .handler(
            "hold_at",
            HoldAt {
                hold: 2,
                calls: calls.clone(),
            },
        )
        .config(RuntimeConfig {
            durability: Durability::Async,
            checkpoint_coalesce: Duration::from_millis(1),
            ..RuntimeConfig::default()
        })
        .build();
    let wf = load(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "array", "items": [0, 1, 2, 3, 4], "output": "{{step.i}}"
            }, "body": {
                "nodes": [
                    {"id": "say", "kind": "message", "params": {"template": "iteration {{l.index}}"}},
                    {"id": "step", "kind": "hold_at", "params": {"i": "{{l.item}}"}}
                ],
                "edges": [{"from": "say", "to": "step"}]
            }}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let t = thread("loop-progress");
    let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    // Wait until a progress snapshot holds the two finished iterations (as a crash would
    // leave it: the run is still in iteration 2).
    let progress = within("a progress snapshot with two iterations", async {
        loop {
            if let Some(stored) = store.latest(&t).await.expect("latest") {
                let snapshot = materialize(&*store, &t, &stored).await.expect("decodes");
                let two_done = snapshot.graph.frames.iter().any(|f| {
                    matches!(&f.state, FrameState::Loop(l) if l.iteration == 2 && l.history.len() == 2)
                });
                if two_done {
                    assert_eq!(snapshot.status, RunStatus::Running);
                    // The finished iterations' messages travel in it.
                    let texts: Vec<&str> = snapshot
                        .pending_messages
                        .iter()
                        .map(|m| m.content.as_str())
                        .collect();
                    assert!(texts.contains(&"iteration 0") && texts.contains(&"iteration 1"), "{texts:?}");
                    return stored.id;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let _ = rt.stop(run.run_id(), StopMode::Force).await;
    finish(&run).await;
    // Resume from the progress snapshot, as another process would after a crash.
    let resumed = rt
        .resume(
            ResumeFrom::Checkpoint {
                thread: t.clone(),
                checkpoint: progress,
            },
            ResumeInput::Continue,
        )
        .await
        .expect("resumes");
    let outcome = finish(&resumed).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("l").and_then(|o| o.get("history")),
        Some(&val(json!([0, 1, 2, 3, 4])))
    );
    // Iterations 0 and 1 never ran again; 2 ran twice (held, then again); 3 and 4 once.
    let mut seen = calls.lock().expect("calls").clone();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 2, 3, 4]);
}

/// On the paused clock: the run is live just before its deadline and stopped at it, long
/// before its node (50 words, 10 ms apart) would have finished.
#[tokio::test(start_paused = true)]
async fn a_run_past_its_deadline_stops_with_reason_timeout_and_stays_resumable() {
    use runvisor_actors::testkit::Streamer;
    use runvisor_actors::{ResumeInput, StopReason};
    const DEADLINE: Duration = Duration::from_millis(60);
    let streamer = Streamer::new(&"word ".repeat(50), Duration::from_millis(10));
    let rt = Runtime::builder()
        .handler("llm", streamer.clone())
        .config(RuntimeConfig {
            run_timeout: Some(DEADLINE),
            ..RuntimeConfig::default()
        })
        .build();
    let wf = load(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "llm", "kind": "llm"}
        ], "edges": [{"from": "start", "to": "llm"}]}),
    );
    let t = thread("deadline");
    let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    tokio::time::sleep(DEADLINE - Duration::from_millis(1)).await;
    assert!(run.outcome().is_none(), "stopped before its deadline");
    let outcome = finish(&run).await;
    let stop = outcome.stop_result().expect("stopped by its deadline");
    assert_eq!(stop.reason, StopReason::Timeout);
    assert_eq!(outcome.status(), RunStatus::Stopped);
    // What it streamed until then is kept; the rest never came.
    let words = stop.partial_response.as_deref().map(str::split_whitespace);
    assert!(
        words.is_some_and(|w| (1..50).contains(&w.count())),
        "{stop:#?}"
    );
    assert!(outcome.output("llm").is_none());
    // Resumable: the resumed run has the same deadline, so it is cut again, from the start of
    // the interrupted node.
    let resumed = rt.resume(t, ResumeInput::Continue).await.expect("resumes");
    let again = finish(&resumed).await;
    assert_eq!(
        again.stop_result().map(|s| s.reason),
        Some(StopReason::Timeout)
    );
    assert_eq!(streamer.calls(), 2);
}

/// The finished items of the parallel nested in the loop's current iteration, as a stored
/// snapshot says.
fn nested_items_done(snapshot: &Snapshot) -> usize {
    use runvisor_actors::snapshot::FrameState;
    snapshot
        .graph
        .frames
        .iter()
        .filter_map(|f| match &f.state {
            FrameState::Loop(l) => Some(l),
            _ => None,
        })
        .flat_map(|l| l.body.frames.iter())
        .filter_map(|f| match &f.state {
            FrameState::Parallel(p) => Some(p.done.iter().filter(|d| **d).count()),
            _ => None,
        })
        .sum()
}

#[tokio::test]
async fn progress_inside_nested_bodies_is_stored_while_running_so_a_crash_costs_only_what_ran() {
    for durability in [Durability::Sync, Durability::Async] {
        let config = RuntimeConfig {
            durability,
            checkpoint_coalesce: Duration::from_millis(20),
            ..RuntimeConfig::default()
        };
        let first = host_with(|b, _| b.config(config.clone()));
        let wf = load(
            &first.rt,
            json!({"id": "nested", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "l", "kind": "loop", "params": {"mode": "array", "items": [1, 2]},
                 "body": {"nodes": [
                    {"id": "p", "kind": "parallel", "params": {
                        "items": [5, 5, 60000], "max_concurrency": 3
                    }, "body": {"nodes": [
                        {"id": "w", "kind": "sleep", "params": {
                            "ms": "{{p.item}}", "message": "item {{p.index}} of {{l.index}}"
                        }}
                    ]}}
                 ]}}
            ], "edges": [{"from": "start", "to": "l"}]}),
        );
        let t = thread("nested-crash");
        let run = first
            .rt
            .start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
        // Wait, with the run still going, for a stored snapshot that knows items 0 and 1 of
        // the current iteration finished.
        let stored = within("a snapshot with the nested progress", async {
            loop {
                if let Some(latest) = first
                    .rt
                    .checkpoint_store()
                    .latest(&t)
                    .await
                    .expect("latest")
                    && nested_items_done(
                        &materialize(&**first.rt.checkpoint_store(), &t, &latest)
                            .await
                            .expect("decodes"),
                    ) == 2
                {
                    return latest;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let snapshot = materialize(&**first.rt.checkpoint_store(), &t, &stored)
            .await
            .expect("decodes");
        let pending: Vec<&str> = snapshot
            .pending_messages
            .iter()
            .map(|m| m.content.as_str())
            .collect();
        assert!(
            pending.contains(&"item 0 of 0") && pending.contains(&"item 1 of 0"),
            "{durability:?}: the finished items' messages travel with their progress: {pending:?}"
        );

        // The process dies here: another one, with only what was stored, resumes the thread.
        let second = host_with(|b, _| b.config(config.clone()));
        let definition = first
            .rt
            .checkpoint_store()
            .get_workflow(&t, &snapshot.workflow_hash)
            .await
            .expect("read")
            .expect("the workflow is stored");
        let copy = second.rt.checkpoint_store();
        copy.put_workflow(&t, &snapshot.workflow_hash, &definition)
            .await
            .expect("copy the workflow");
        // The stored checkpoint, read back whole (it may be a delta of earlier ones).
        let whole = StoredCheckpoint {
            bytes: snapshot.encode().expect("encodes"),
            link: None,
            ..stored
        };
        copy.put(&t, whole, None)
            .await
            .expect("copy the stored checkpoint");
        let resumed = second
            .rt
            .resume(
                runvisor_actors::ResumeFrom::Thread(t.clone()),
                runvisor_actors::ResumeInput::Continue,
            )
            .await
            .expect("resume");
        assert!(second.log.wait_mark("w:started", PATIENCE).await);
        let first_items: Vec<i64> = second
            .log
            .inputs("w")
            .iter()
            .filter_map(|input| input.get("ms").and_then(Value::as_i64))
            .collect();
        assert_eq!(
            first_items,
            [60000],
            "{durability:?}: only the item that was running runs again"
        );
        resumed
            .stop(runvisor_actors::StopMode::Force)
            .await
            .expect("stop");
        run.stop(runvisor_actors::StopMode::Force)
            .await
            .expect("stop");
    }
}

/// Tells the test each checkpoint write as it ends: its mode and whether it was stored.
#[derive(Debug, Default)]
struct Writes(std::sync::Mutex<Vec<(&'static str, bool)>>);

impl runvisor_actors::CheckpointObserver for Writes {
    fn written(&self, mode: &'static str, _bytes: usize, _took: Duration, stored: bool) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((mode, stored));
    }
}

impl Writes {
    /// The writes that ended so far, in the order they ended.
    fn ended(&self) -> Vec<(&'static str, bool)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Finishes once told to.
struct Gate(Arc<tokio::sync::Notify>);

/// An `async` run of `begin -> gate` on a checkpoint store that starts down: what a test of its
/// background writes needs at hand.
struct GatedRun {
    flaky: Arc<Flaky>,
    writes: Arc<Writes>,
    gate: Arc<tokio::sync::Notify>,
    run: runvisor_actors::RunHandle,
    thread: ThreadId,
    _runtime: Runtime,
}

/// Starts a [`GatedRun`] on thread `id`; its `start` snapshot waits for the store.
async fn gated_async_run(id: &str) -> GatedRun {
    let flaky = flaky();
    flaky.watch().broken.store(true, Ordering::SeqCst);
    let writes = Arc::new(Writes::default());
    let gate = Arc::new(tokio::sync::Notify::new());
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .checkpoint_store(flaky.clone())
        .checkpoint_observer(writes.clone())
        .handler("gate", Gate(gate.clone()))
        .config(RuntimeConfig {
            durability: Durability::Async,
            store_deadline: Duration::from_millis(200),
            ..RuntimeConfig::default()
        })
        .build();
    let workflow = load(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "wait", "kind": "gate"}
        ], "edges": [{"from": "start", "to": "wait"}]}),
    );
    let thread = thread(id);
    let run = rt
        .start(&workflow, inputs([]), thread.clone())
        .await
        .expect("start");
    GatedRun {
        flaky,
        writes,
        gate,
        run,
        thread,
        _runtime: rt,
    }
}

#[async_trait]
impl NodeHandler for Gate {
    async fn run(&self, _input: Value, _ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.notified().await;
        Ok(NodeOutput::new(Value::from("open")))
    }
}

#[tokio::test(start_paused = true)]
async fn a_background_write_retried_over_many_flushes_is_one_write() {
    let GatedRun {
        flaky,
        writes,
        gate,
        run,
        _runtime,
        ..
    } = gated_async_run("retried").await;
    // `start`'s snapshot waits in the background while the store is down: it is attempted
    // again and again (backing off from 50 ms), over several seconds.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        writes.ended(),
        [],
        "a write still being retried has not ended"
    );
    flaky.watch().broken.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        writes.ended(),
        [("async", true)],
        "one write, stored, however many attempts it took"
    );
    gate.notify_one();
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
}

#[tokio::test(start_paused = true)]
async fn a_final_write_supersedes_a_background_write_still_waiting() {
    let GatedRun {
        flaky,
        writes,
        gate,
        run,
        thread: t,
        _runtime,
    } = gated_async_run("superseded").await;
    // `start`'s snapshot waits in the background, retried while the store is down.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(writes.ended(), []);
    // The store is back and the run ends before that write's next attempt: the run's final
    // snapshot is newer, so the waiting one is dropped rather than written after it.
    flaky.watch().broken.store(false, Ordering::SeqCst);
    let attempts_while_down = flaky.watch().puts.load(Ordering::SeqCst);
    gate.notify_one();
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        flaky.watch().puts.load(Ordering::SeqCst) - attempts_while_down,
        1,
        "only the final snapshot is written once the store is back"
    );
    let mut ended = writes.ended();
    ended.sort_unstable();
    assert_eq!(ended, [("async", false), ("final", true)]);
    assert_eq!(flaky.inner().list(&t).await.map(|ids| ids.len()), Ok(1));
}
