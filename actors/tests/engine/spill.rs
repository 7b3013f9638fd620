//! A run whose end the stores do not take does not pass for a success: its outcome says what
//! was not stored and where it went, the spill store keeps it, and a replay writes it into
//! the stores exactly once, never over a thread that moved on and never while a run holds it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use runvisor_actors::snapshot::Snapshot;
use runvisor_actors::store::memory::{MemoryHistoryStore, MemoryRunStore};
use runvisor_actors::store::{HistoryStore, MemoryLeaseStore, RunStore, SpillStore, SpilledRun};
use runvisor_actors::{
    CheckpointError, Durability, NodeContext, NodeError, NodeHandler, NodeOutput, ReplayError,
    RunError, RunStatus, Runtime, RuntimeConfig, Spill, StopMode, StoreError, Value, async_trait,
};
use serde_json::json;

use super::store_failures::{
    Failing, FailingCheckpoints, FailingHistory, Faults, failing_checkpoints,
};
use super::support::*;

/// Keeps spilled runs in memory; fails when told.
#[derive(Debug, Default)]
struct Kept {
    runs: Mutex<Vec<SpilledRun>>,
    broken: bool,
}

#[async_trait]
impl SpillStore for Kept {
    async fn spill(&self, run: &SpilledRun) -> Result<String, StoreError> {
        if self.broken {
            return Err(StoreError::Unavailable("disk full".into()));
        }
        let mut runs = self.runs.lock().expect("runs");
        runs.push(run.clone());
        Ok(format!("memory:{}", runs.len()))
    }
}

impl Kept {
    fn only(&self) -> SpilledRun {
        let runs = self.runs.lock().expect("runs");
        assert_eq!(runs.len(), 1, "{runs:#?}");
        runs[0].clone()
    }
}

/// Waits until stopped.
struct Block;

#[async_trait]
impl NodeHandler for Block {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        ctx.stopped().await;
        Err(NodeError::Stopped)
    }
}

/// A runtime whose history and checkpoint stores fail as told, with a run store that works.
struct Rig {
    rt: Runtime,
    history: Arc<FailingHistory>,
    checkpoints: Arc<FailingCheckpoints>,
    runs: Arc<MemoryRunStore>,
    spill: Arc<Kept>,
}

fn rig(mode: Failing, durability: Durability, spill: Kept) -> Rig {
    rig_with(
        mode,
        RuntimeConfig {
            durability,
            store_deadline: Duration::from_secs(1),
            ..RuntimeConfig::default()
        },
        spill,
    )
}

fn rig_with(mode: Failing, config: RuntimeConfig, spill: Kept) -> Rig {
    let history = Arc::new(FailingHistory {
        inner: MemoryHistoryStore::new(),
        faults: Faults::new(mode),
    });
    let checkpoints = failing_checkpoints(mode);
    let runs = Arc::new(MemoryRunStore::new());
    let spill = Arc::new(spill);
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .history_store(history.clone())
        .checkpoint_store(checkpoints.clone())
        .run_store(runs.clone())
        .spill_store(spill.clone())
        .handler("block", Block)
        .config(config)
        .build();
    Rig {
        rt,
        history,
        checkpoints,
        runs,
        spill,
    }
}

impl Rig {
    fn heal(&self) {
        self.history.faults.set(Failing::No);
        self.checkpoints.watch().set(Failing::No);
    }

    async fn texts(&self, t: &str) -> Vec<String> {
        self.history
            .inner
            .load(&thread(t))
            .await
            .expect("load")
            .into_iter()
            .map(|m| m.content)
            .collect()
    }
}

fn two_messages(rt: &Runtime) -> runvisor_actors::Workflow {
    load(
        rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "message", "params": {"template": "a"}},
            {"id": "b", "kind": "message", "params": {"template": "b"}}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]}),
    )
}

#[tokio::test(start_paused = true)]
async fn an_end_the_stores_do_not_take_is_reported_spilled_and_replayed_once() {
    let rig = rig(Failing::Always, Durability::Exit, Kept::default());
    let t = thread("spilled");
    let run = rig
        .rt
        .start(&two_messages(&rig.rt), inputs([]), t.clone())
        .await
        .expect("start");
    let outcome = finish(&run).await;
    // Every node ran, but the run is not a success while its end is not stored.
    assert_eq!(outcome.status(), RunStatus::Succeeded);
    assert!(!outcome.is_persisted());
    let unpersisted = outcome.unpersisted().expect("reported").clone();
    assert_eq!(unpersisted.messages, 2);
    assert!(
        matches!(
            unpersisted.checkpoint,
            Some(CheckpointError::StoreFailed { .. })
        ),
        "{unpersisted:?}"
    );
    assert_eq!(unpersisted.record, None, "the run store works");
    assert_eq!(
        unpersisted.spill,
        Spill::Kept {
            location: "memory:1".into()
        }
    );
    let text = unpersisted.to_string();
    assert!(
        text.starts_with("not persisted: 2 message(s), the final checkpoint (")
            && text.ends_with("; kept in memory:1"),
        "{text}"
    );

    // What was kept: the messages, the final checkpoint, the record as a success would
    // have written it, and the workflow its checkpoint names.
    let spilled = rig.spill.only();
    assert_eq!(spilled.run_id, outcome.run_id());
    let texts: Vec<&str> = spilled
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(texts, ["a", "b"]);
    let checkpoint = spilled.checkpoint.clone().expect("the final checkpoint");
    assert_eq!(spilled.record.status, RunStatus::Succeeded);
    assert_eq!(spilled.record.checkpoint_id, Some(checkpoint.id));
    assert_eq!(spilled.record.unpersisted, None);
    assert!(spilled.workflow.is_some());
    assert_eq!(spilled.reasons.len(), 2, "{:?}", spilled.reasons);
    // The run store, which worked, says what is missing meanwhile.
    let stored = rig
        .runs
        .get(outcome.run_id())
        .await
        .expect("get")
        .expect("recorded");
    assert!(stored.unpersisted.is_some());

    // The stores are back: the replay writes it all.
    rig.heal();
    let replayed = rig.rt.replay_spilled(&spilled).await.expect("replay");
    assert_eq!(replayed.skipped, None);
    assert_eq!(replayed.messages, 2);
    assert_eq!(replayed.checkpoint, Some(checkpoint.id));
    assert!(!replayed.checkpoint_was_stored && replayed.record);
    assert_eq!(rig.texts("spilled").await, ["a", "b"]);
    let latest = rig.checkpoints.inner().latest(&t).await.expect("latest");
    assert_eq!(latest, Some(checkpoint.clone()));
    let record = rig
        .runs
        .get(outcome.run_id())
        .await
        .expect("get")
        .expect("recorded");
    assert_eq!(record, spilled.record);

    // Again (a replay interrupted before its file was removed): nothing is written twice.
    let again = rig.rt.replay_spilled(&spilled).await.expect("replay again");
    assert!(again.checkpoint_was_stored, "{again:?}");
    assert_eq!(rig.texts("spilled").await, ["a", "b"]);
    assert_eq!(
        rig.checkpoints.inner().list(&t).await.expect("list"),
        [checkpoint.id]
    );
}

#[tokio::test(start_paused = true)]
async fn a_replay_leaves_a_thread_that_moved_on_alone_and_says_why() {
    let rig = rig(Failing::Always, Durability::Exit, Kept::default());
    let t = thread("moved-on");
    let wf = two_messages(&rig.rt);
    let run = rig
        .rt
        .start(&wf, inputs([]), t.clone())
        .await
        .expect("start");
    assert!(!finish(&run).await.is_persisted());
    let spilled = rig.spill.only();
    // Before any replay, the thread goes on: a later run starts from what was stored.
    rig.heal();
    let later = rig
        .rt
        .start(&wf, inputs([]), t.clone())
        .await
        .expect("start later");
    let later = finish(&later).await;
    assert!(later.is_persisted());
    let before = (
        rig.texts("moved-on").await,
        rig.checkpoints.inner().list(&t).await.expect("list"),
    );
    let replayed = rig.rt.replay_spilled(&spilled).await.expect("replay");
    let why = replayed.skipped.expect("skipped");
    assert!(why.contains(&later.run_id().to_string()), "{why}");
    assert_eq!((replayed.messages, replayed.record), (0, false));
    let after = (
        rig.texts("moved-on").await,
        rig.checkpoints.inner().list(&t).await.expect("list"),
    );
    assert_eq!(before, after, "nothing written");
}

#[tokio::test(start_paused = true)]
async fn a_replay_waits_for_a_run_that_holds_the_thread() {
    let rig = rig(Failing::Always, Durability::Exit, Kept::default());
    let t = thread("held");
    let run = rig
        .rt
        .start(&two_messages(&rig.rt), inputs([]), t.clone())
        .await
        .expect("start");
    assert!(!finish(&run).await.is_persisted());
    let spilled = rig.spill.only();
    rig.heal();
    let blocking = load(
        &rig.rt,
        json!({"id": "b", "nodes": [
            {"id": "start", "kind": "begin"}, {"id": "wait", "kind": "block"}
        ], "edges": [{"from": "start", "to": "wait"}]}),
    );
    let live = rig
        .rt
        .start(&blocking, inputs([]), t.clone())
        .await
        .expect("start");
    match rig.rt.replay_spilled(&spilled).await {
        Err(ReplayError::ThreadBusy { run, .. }) => assert_eq!(run, live.run_id()),
        other => panic!("expected the thread to be busy, got {other:?}"),
    }
    assert!(rig.texts("held").await.is_empty(), "nothing written");
    live.stop(runvisor_actors::StopMode::Force)
        .await
        .expect("stop");
    finish(&live).await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_sync_run_is_spilled_and_one_without_a_spill_store_says_it_is_lost() {
    // Refused for good: the sync run fails at its first save, and its end is spilled.
    let rig = rig(Failing::Refused, Durability::Sync, Kept::default());
    let run = rig
        .rt
        .start(&two_messages(&rig.rt), inputs([]), thread("refused"))
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert!(
        matches!(outcome.error(), Some(RunError::Storage(_))),
        "{outcome:#?}"
    );
    let unpersisted = outcome.unpersisted().expect("reported");
    assert!(matches!(unpersisted.spill, Spill::Kept { .. }));
    assert_eq!(rig.spill.only().record.status, RunStatus::Failed);

    // The spill store fails too: the outcome says so.
    let rig = rig_broken_spill();
    let run = rig
        .rt
        .start(&two_messages(&rig.rt), inputs([]), thread("lost"))
        .await
        .expect("start");
    let outcome = finish(&run).await;
    let unpersisted = outcome.unpersisted().expect("reported");
    assert!(
        matches!(&unpersisted.spill, Spill::Failed { error } if error.contains("disk full")),
        "{unpersisted:?}"
    );

    // No spill store at all.
    let history = Arc::new(FailingHistory {
        inner: MemoryHistoryStore::new(),
        faults: Faults::new(Failing::Refused),
    });
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .history_store(history)
        .build();
    let run = rt
        .start(&two_messages(&rt), inputs([]), thread("nowhere"))
        .await
        .expect("start");
    let outcome = finish(&run).await;
    let unpersisted = outcome.unpersisted().expect("reported");
    assert_eq!(unpersisted.spill, Spill::NoSpillStore);
    assert_eq!(unpersisted.parts(), ["2 message(s)"]);
}

fn rig_broken_spill() -> Rig {
    rig(
        Failing::Refused,
        Durability::Exit,
        Kept {
            broken: true,
            ..Kept::default()
        },
    )
}

/// A run's final checkpoint is a delta of its chain; one the store does not take is spilled
/// whole, so a replay never depends on a chain that may be gone by then.
#[tokio::test(start_paused = true)]
async fn a_final_checkpoint_not_stored_is_spilled_whole_though_written_as_a_delta() {
    // Deltas are never compacted here (this run's are larger than its tiny base).
    let config = RuntimeConfig {
        durability: Durability::Sync,
        store_deadline: Duration::from_secs(1),
        checkpoint_compact_percent: 100_000,
        ..RuntimeConfig::default()
    };
    let rig = rig_with(Failing::No, config, Kept::default());
    let t = thread("spilled-delta");
    let wf = load(
        &rig.rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "message", "params": {"template": "a"}},
            {"id": "b", "kind": "block"}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]}),
    );
    let run = rig
        .rt
        .start(&wf, inputs([]), t.clone())
        .await
        .expect("start");
    // `sync`: a base, then a delta once `a` finished, before `b` starts.
    let written = within("two checkpoints", async {
        loop {
            let ids = rig.checkpoints.inner().list(&t).await.expect("list");
            if ids.len() >= 2 {
                break ids;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let last = rig
        .checkpoints
        .inner()
        .get(&t, written[written.len() - 1])
        .await
        .expect("get")
        .expect("listed");
    assert!(last.link.is_some(), "progress after the first is a delta");

    rig.checkpoints.watch().set(Failing::Always);
    run.stop(StopMode::graceful()).await.expect("stop");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Stopped);
    assert!(!outcome.is_persisted());
    let spilled = rig.spill.only();
    let checkpoint = spilled.checkpoint.clone().expect("the final checkpoint");
    assert_eq!(checkpoint.link, None, "spilled whole");
    let snapshot = Snapshot::decode(&checkpoint.bytes).expect("a whole snapshot");
    assert_eq!(snapshot.status, RunStatus::Stopped);
    assert_eq!(snapshot.run_id, outcome.run_id());

    // Replayed once the store is back, it is the thread's latest and resumes on its own.
    rig.heal();
    let replayed = rig.rt.replay_spilled(&spilled).await.expect("replay");
    assert_eq!(replayed.checkpoint, Some(checkpoint.id));
    let latest = rig.checkpoints.inner().latest(&t).await.expect("latest");
    assert_eq!(latest, Some(checkpoint));
}
