//! What the run store keeps about a run.

use serde::{Deserialize, Serialize};

use super::ids::{CheckpointId, RunId, ThreadId, WorkerId};
use super::labels::RunLabels;
use super::status::RunStatus;

/// What the run store keeps about a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub run_id: RunId,
    /// Its thread.
    pub thread: ThreadId,
    /// The workflow's id.
    pub workflow_id: String,
    /// Current status.
    pub status: RunStatus,
    /// The run this one resumed, if any.
    pub parent_run_id: Option<RunId>,
    /// The newest checkpoint written for it.
    pub checkpoint_id: Option<CheckpointId>,
    /// Milliseconds since the epoch.
    pub started_at_ms: u64,
    /// Milliseconds since the epoch, once ended.
    pub finished_at_ms: Option<u64>,
    /// Why it failed (node and error), if it did.
    pub failure_reason: Option<String>,
    /// Why it stopped, if it did.
    pub stop_reason: Option<String>,
    /// Messages that could not be persisted when it ended, with the error.
    pub unpersisted: Option<String>,
    /// The ids other processes name its stop and cancel flags by.
    #[serde(default)]
    pub labels: RunLabels,
    /// Why the run cannot be resumed (its checkpoint is unreadable), once a resume found out.
    #[serde(default)]
    pub not_resumable: Option<String>,
    /// The worker that runs (or ran) it.
    #[serde(default)]
    pub worker: Option<WorkerId>,
    /// The fencing token of its thread's lease it ran with.
    #[serde(default)]
    pub fence: Option<u64>,
    /// The run's place in its trace (a W3C `traceparent`), when the host's tracing backend
    /// named it: a resumed run links back to it.
    #[serde(default)]
    pub traceparent: Option<String>,
}
