//! Stopping a run: modes, reasons, and the [`StopResult`] every stop caller receives.
//!
//! A stop travels top-down: the run supervisor stops starting nodes, asks its running nodes to
//! stop (graceful: they see the flag and may finish; force: their handler tasks are aborted),
//! waits until each has handed over what it holds, then persists once (history, checkpoint,
//! run record) and publishes one `StopResult` to every caller.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::event::NodePath;
use crate::ids::{CheckpointId, NodeId, RunId};
use crate::outcome::{HistoryFlush, RunOutcome};
use crate::store::{RunRecord, RunStatus};
use crate::value::Value;

/// How to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// No node starts after the stop; running nodes see it and may finish within `timeout`,
    /// then the stop becomes a force stop. Streams are cut at their next chunk.
    Graceful {
        /// How long running nodes may take to finish.
        timeout: Duration,
    },
    /// Running handlers are aborted at once. What they streamed and appended is still kept.
    Force,
}

impl StopMode {
    /// A graceful stop with the default timeout (30 s).
    pub fn graceful() -> Self {
        StopMode::Graceful {
            timeout: Duration::from_secs(30),
        }
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A person pressed stop.
    UserInterrupted,
    /// The run was cancelled (the run ends as `cancelled`, still resumable).
    Cancelled,
    /// A deadline passed.
    Timeout,
    /// The process is shutting down.
    Shutdown,
}

impl StopReason {
    /// The name used in records: `user_interrupted`, `cancelled`, `timeout`, `shutdown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::UserInterrupted => "user_interrupted",
            StopReason::Cancelled => "cancelled",
            StopReason::Timeout => "timeout",
            StopReason::Shutdown => "shutdown",
        }
    }

    /// The status a run stopped for this reason ends with.
    pub fn status(&self) -> RunStatus {
        match self {
            StopReason::Cancelled => RunStatus::Cancelled,
            _ => RunStatus::Stopped,
        }
    }

    /// Parses a record's reason name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "user_interrupted" => StopReason::UserInterrupted,
            "cancelled" => StopReason::Cancelled,
            "timeout" => StopReason::Timeout,
            "shutdown" => StopReason::Shutdown,
            _ => return None,
        })
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node cut short by the stop.
#[derive(Debug, Clone, PartialEq)]
pub struct Interrupted {
    /// Where.
    pub path: NodePath,
    /// Whether its handler was aborted (force, or the graceful timeout passed) rather than
    /// returning by itself.
    pub forced: bool,
    /// What it had streamed, if anything (kept in history as a truncated message).
    pub partial: Option<String>,
    /// How many chunks it had streamed.
    pub chunks: u64,
    /// The error it returned while stopping, if it failed instead of stopping.
    pub error: Option<String>,
}

/// Everything a stop produced and persisted. Every caller of a stop of the same run gets the
/// same value.
#[derive(Debug, Clone, PartialEq)]
pub struct StopResult {
    /// The run.
    pub run_id: RunId,
    /// Why it stopped.
    pub reason: StopReason,
    /// The nodes running at the stop, now interrupted; a resume runs them again from the start.
    pub interrupted: Vec<Interrupted>,
    /// Every node finished as of the stop, in completion order: nodes restored from the
    /// checkpoint this run resumed come first, then those that finished in this run (before or
    /// during the stop).
    pub finished: Vec<NodeId>,
    /// The nodes whose handlers were aborted.
    pub forced: Vec<NodeId>,
    /// The nodes a resume will start: the interrupted ones and the ready ones not yet started.
    pub frontier: Vec<NodeId>,
    /// The outputs of the finished nodes.
    pub outputs: BTreeMap<NodeId, Value>,
    /// The streamed text of the interrupted node(s), marked truncated in history.
    pub partial_response: Option<String>,
    /// What became of the run's messages: persisted (count and content) or not (and why).
    pub messages: HistoryFlush,
    /// The checkpoint written at the stop; `None` if writing it failed (see
    /// `checkpoint_error`).
    pub checkpoint_id: Option<CheckpointId>,
    /// Why the checkpoint could not be written, if it could not.
    pub checkpoint_error: Option<String>,
    /// What the nodes that ran in this run consumed.
    pub usage: crate::handler::Usage,
    /// How long the run waited for a failing checkpoint store; zero when it never did.
    pub storage_wait: std::time::Duration,
}

impl StopResult {
    /// The paths where the run stopped: the interrupted nodes, or, when none was running, the
    /// nodes that were about to start.
    pub fn stopped_at(&self) -> Vec<NodePath> {
        if self.interrupted.is_empty() {
            self.frontier.iter().cloned().map(NodePath::node).collect()
        } else {
            self.interrupted.iter().map(|i| i.path.clone()).collect()
        }
    }
}

/// What a stop request answers.
#[derive(Debug, Clone, PartialEq)]
// Answered once per stop request, never stored in bulk: boxing would only burden callers.
#[allow(clippy::large_enum_variant)]
pub enum StopReply {
    /// The run stopped (by this request or a concurrent one).
    Stopped(StopResult),
    /// The run had already ended (or ended on its own before the stop took effect).
    AlreadyFinished(FinishedRun),
}

/// The final state of a run that ended before a stop could take effect.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRun {
    /// The run.
    pub run_id: RunId,
    /// Its final status.
    pub status: RunStatus,
    /// Its outcome, when this process ran it and still holds it.
    pub outcome: Option<RunOutcome>,
    /// Its record in the run store, when it could be read.
    pub record: Option<RunRecord>,
}

/// Why a stop request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StopError {
    /// No run with this id is known, live or recorded.
    #[error("unknown run {0}")]
    UnknownRun(RunId),
    /// The run is recorded as running, but not in this process.
    #[error("run {0} is not running in this process (status {1})")]
    NotInThisProcess(RunId, RunStatus),
    /// The run store could not be read to learn the run's state.
    #[error("could not read the run store: {0}")]
    Store(String),
}
