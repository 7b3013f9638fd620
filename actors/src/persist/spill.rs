//! Spilling: when a run's end cannot be stored (the stores kept failing until the store
//! deadline, or refused), what they did not take is handed to a [`SpillStore`], which keeps it
//! where it survives the process (the `runvisor` crate writes a file), until a replay
//! (`Runtime::replay_spilled`) writes it into the stores, once.

use async_trait::async_trait;

use super::ports::StoredCheckpoint;
use crate::model::{Lease, Message, RunId, RunRecord, StoreError, ThreadId};

/// The end of a run that the stores did not take: what a spill store keeps and a replay
/// writes. Everything a successful end would have written is here, except what was stored.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SpilledRun {
    /// The run.
    pub run_id: RunId,
    /// Its thread.
    pub thread: ThreadId,
    /// The lease the run held (with its fencing token): the replay gives it up, since the run
    /// has ended, before it takes the thread itself.
    pub lease: Lease,
    /// What the stores did not take and why, a line each, for operators.
    pub reasons: Vec<String>,
    /// Messages the history store did not take, in order.
    pub messages: Vec<Message>,
    /// The final checkpoint, when it was not written.
    pub checkpoint: Option<StoredCheckpoint>,
    /// The workflow definition the run's snapshots name by content hash, as `(hash, JSON)`:
    /// written again (idempotent), so the checkpoint resumes even where the store lost it.
    pub workflow: Option<(String, String)>,
    /// The run's final record, as a successful end would have written it.
    pub record: RunRecord,
}

impl SpilledRun {
    /// A spilled end holding only the run's final record; the other parts are set on it.
    pub fn new(record: RunRecord, lease: Lease) -> Self {
        Self {
            run_id: record.run_id,
            thread: record.thread.clone(),
            lease,
            reasons: Vec::new(),
            messages: Vec::new(),
            checkpoint: None,
            workflow: None,
            record,
        }
    }
}

/// Keeps the ends of runs the stores did not take, where they survive the process.
///
/// Contract: `spill` returns only once the spilled run is durably kept (a file written and
/// synced, then renamed into place), and never keeps a partial one. It is called once per run
/// end, only when something was not stored.
#[async_trait]
pub trait SpillStore: Send + Sync + 'static {
    /// Keeps a run's unpersisted end; returns where it went (a path), for messages.
    async fn spill(&self, run: &SpilledRun) -> Result<String, StoreError>;
}
