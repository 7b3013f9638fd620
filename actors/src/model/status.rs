//! The status of a run, as records, registries and outcomes name it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The status of a run, as recorded in the run store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// Executing.
    Running,
    /// Paused at an interactive node, waiting for an answer.
    AwaitingInput,
    /// Stopped by a user or a shutdown; resumable.
    Stopped,
    /// Finished normally.
    Succeeded,
    /// A node failed.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl RunStatus {
    /// Whether the run has ended (anything but running).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, RunStatus::Running)
    }

    /// The lower-case name used in records and output.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::AwaitingInput => "awaiting_input",
            RunStatus::Stopped => "stopped",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
