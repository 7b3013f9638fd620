//! What a run reports while it runs: the event stream. Every node event carries its path.

use std::sync::Arc;

use super::error::CheckpointError;
use super::ids::{RunId, ThreadId};
use super::node::NodeError;
use super::path::NodePath;
use super::status::RunStatus;
use super::stop::StopReason;
use super::value::Value;

/// Something that happened in a run. Every node event carries the node's path.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RunEvent {
    /// The run's supervisor is up and its entry node is about to start.
    RunStarted {
        /// The run.
        run_id: RunId,
        /// Its thread.
        thread: ThreadId,
    },
    /// A node's handler started.
    NodeStarted {
        /// Where.
        path: NodePath,
        /// The node's kind.
        kind: Arc<str>,
    },
    /// A node streamed a piece of output.
    NodeChunk {
        /// Where.
        path: NodePath,
        /// The piece.
        text: Arc<str>,
    },
    /// A node finished with an output.
    NodeFinished {
        /// Where.
        path: NodePath,
        /// Its output.
        output: Arc<Value>,
    },
    /// A node will not run: no active branch leads to it.
    NodeSkipped {
        /// Where.
        path: NodePath,
    },
    /// A node failed.
    NodeFailed {
        /// Where.
        path: NodePath,
        /// Why.
        error: NodeError,
    },
    /// A node was cut short by a stop or by another node's failure; what it held is kept,
    /// and a resume runs it again.
    NodeInterrupted {
        /// Where.
        path: NodePath,
        /// Whether its handler was aborted rather than returning by itself.
        forced: bool,
    },
    /// An interactive node has no answer: the run pauses (it ends as `AwaitingInput`).
    Paused {
        /// The interactive node.
        path: NodePath,
    },
    /// A stop was requested: no node starts any more; running nodes are finishing or being
    /// aborted, then the run persists what it holds.
    Stopping {
        /// Why.
        reason: StopReason,
    },
    /// The checkpoint store failed to take the run's progress (`waiting`), or took it again:
    /// while waiting, no node starts unsaved.
    StorageWait {
        /// Whether the run waits for the store.
        waiting: bool,
        /// The store's error, when it started waiting.
        error: Option<CheckpointError>,
    },
    /// A subscriber fell behind the event buffer and missed this many events.
    EventsMissed {
        /// How many.
        count: u64,
    },
    /// The run ended; [`RunHandle::wait`](crate::RunHandle::wait) has the outcome.
    RunFinished {
        /// The run.
        run_id: RunId,
        /// `succeeded`, `failed`, `stopped`, ...
        status: RunStatus,
        /// Whether its end (history, final checkpoint, run record) is in the stores; when it
        /// is not, the outcome says what is missing and where it went
        /// ([`RunOutcome::unpersisted`](crate::RunOutcome::unpersisted)).
        persisted: bool,
    },
}
