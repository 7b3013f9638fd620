//! A run's whole end through an end store (final checkpoint, messages, record, flags and
//! lease in one step, as Redis writes it): where a step fails, the run writes the rest step by
//! step, and nothing is lost, stored twice or left held. On the paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use runvisor_actors::store::memory::{MemoryCheckpointStore, MemoryHistoryStore, MemoryRunStore};
use runvisor_actors::store::{
    CheckpointStore, EndFailed, EndStep, EndStore, EndWritten, HistoryStore, LeaseStore,
    MemoryLeaseStore, RunStore, WholeEnd,
};
use runvisor_actors::{
    Durability, LeaseHolder, RunId, RunStatus, Runtime, RuntimeConfig, StoreError, WorkerId,
    async_trait,
};
use serde_json::json;

use super::support::*;

/// Where the whole end stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Nowhere: every step is written.
    Never,
    /// At this step, with a timeout (the steps before it written, none after).
    At(EndStep),
    /// After every step, with a timeout: all of it landed, the answer was lost.
    AnswerLost,
    /// As `AnswerLost`, the lease given up as the end does, and another run takes the thread
    /// before the end is tried again (the retry is refused as fenced).
    AnswerLostThenTaken,
}

/// An end store over the in-memory stores, step after step, that stops where told.
struct SteppedEnd {
    leases: Arc<MemoryLeaseStore>,
    checkpoints: Arc<MemoryCheckpointStore>,
    history: Arc<MemoryHistoryStore>,
    runs: Arc<MemoryRunStore>,
    stop: Stop,
    calls: AtomicU64,
}

#[async_trait]
impl EndStore for SteppedEnd {
    async fn put_whole_end(&self, end: &WholeEnd<'_>) -> Result<EndWritten, EndFailed> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let timeout = |step| EndFailed {
            step,
            error: StoreError::Timeout(Duration::from_millis(100)),
        };
        let failed = |step| move |error| EndFailed { step, error };
        let thread = &end.record.thread;
        let fence = Some(end.lease.fence);
        if self.stop == Stop::At(EndStep::Checkpoint) {
            return Err(timeout(EndStep::Checkpoint));
        }
        self.checkpoints
            .put(thread, end.checkpoint.clone(), fence)
            .await
            .map_err(failed(EndStep::Checkpoint))?;
        if self.stop == Stop::At(EndStep::History) {
            return Err(timeout(EndStep::History));
        }
        self.history
            .append(thread, end.messages, fence)
            .await
            .map_err(failed(EndStep::History))?;
        if self.stop == Stop::At(EndStep::Record) {
            return Err(timeout(EndStep::Record));
        }
        let written = self
            .runs
            .put_end(end.record, end.lease, end.flags)
            .await
            .map_err(failed(EndStep::Record))?;
        if self.stop == Stop::AnswerLostThenTaken {
            self.leases
                .release(thread, end.lease)
                .await
                .map_err(failed(EndStep::Record))?;
            self.leases
                .acquire(thread, &next_holder(), Duration::from_secs(10))
                .await
                .expect("the released thread is free");
        }
        if let Stop::AnswerLost | Stop::AnswerLostThenTaken = self.stop {
            return Err(timeout(EndStep::Checkpoint));
        }
        Ok(written)
    }
}

/// The run that takes the thread in [`Stop::AnswerLostThenTaken`].
fn next_holder() -> LeaseHolder {
    static RUN: std::sync::OnceLock<RunId> = std::sync::OnceLock::new();
    LeaseHolder {
        worker: WorkerId::new("next-worker").expect("id"),
        run: *RUN.get_or_init(RunId::new),
    }
}

#[tokio::test(start_paused = true)]
async fn a_whole_end_that_stops_at_any_step_is_finished_step_by_step() {
    for stop in [
        Stop::Never,
        Stop::At(EndStep::Checkpoint),
        Stop::At(EndStep::History),
        Stop::At(EndStep::Record),
        Stop::AnswerLost,
        Stop::AnswerLostThenTaken,
    ] {
        let leases = Arc::new(MemoryLeaseStore::new());
        let end = Arc::new(SteppedEnd {
            leases: leases.clone(),
            checkpoints: Arc::new(MemoryCheckpointStore::new().fenced_by(leases.clone())),
            history: Arc::new(MemoryHistoryStore::new().fenced_by(leases.clone())),
            runs: Arc::new(MemoryRunStore::new().fenced_by(leases.clone())),
            stop,
            calls: AtomicU64::new(0),
        });
        let rt = Runtime::builder()
            .lease_store(leases.clone())
            .checkpoint_store(end.checkpoints.clone())
            .history_store(end.history.clone())
            .run_store(end.runs.clone())
            .end_store(end.clone())
            .config(RuntimeConfig {
                durability: Durability::Exit,
                store_deadline: Duration::from_secs(30),
                ..RuntimeConfig::default()
            })
            .build();
        let workflow = load(
            &rt,
            json!({"id": "w", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "a", "kind": "message", "params": {"template": "a"}},
                {"id": "b", "kind": "message", "params": {"template": "b"}}
            ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]}),
        );
        let t = thread("whole");
        let run = rt
            .start(&workflow, inputs([]), t.clone())
            .await
            .expect("start");
        let outcome = finish(&run).await;
        assert_eq!(
            outcome.status(),
            RunStatus::Succeeded,
            "{stop:?}: {outcome:#?}"
        );
        assert!(outcome.is_persisted(), "{stop:?}: {outcome:#?}");
        // The outcome says the messages were stored, as they were.
        let flushed = outcome.history();
        assert_eq!(
            (flushed.persisted.len(), flushed.not_persisted.len()),
            (2, 0),
            "{stop:?}: {outcome:#?}"
        );
        assert_eq!(flushed.error, None, "{stop:?}: {outcome:#?}");
        assert_eq!(
            end.calls.load(Ordering::SeqCst),
            1,
            "{stop:?}: one whole end"
        );
        let texts: Vec<String> = end
            .history
            .load(&t)
            .await
            .expect("load")
            .into_iter()
            .map(|m| m.content)
            .collect();
        assert_eq!(texts, ["a", "b"], "{stop:?}");
        let stored = end.checkpoints.list(&t).await.expect("list");
        assert_eq!(stored.len(), 1, "{stop:?}: the final checkpoint, once");
        let record = end
            .runs
            .get(outcome.run_id())
            .await
            .expect("get")
            .expect("recorded");
        assert_eq!(record.status, RunStatus::Succeeded, "{stop:?}");
        assert_eq!(record.checkpoint_id, stored.first().copied(), "{stop:?}");
        assert_eq!(record.unpersisted, None, "{stop:?}");
        let holder = leases.lease(&t).await.expect("lease").map(|l| l.holder);
        let taken = (stop == Stop::AnswerLostThenTaken).then(next_holder);
        assert_eq!(holder, taken, "{stop:?}: the lease is given up");
    }
}
