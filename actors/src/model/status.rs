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
    /// Recorded as running, but its worker stopped heartbeating (or restarted since): nobody
    /// runs it. A resume (or a worker adopting orphans) takes it over, and the record of the
    /// orphaned run then says `stopped` with reason `lease_lost`. Never written: readers
    /// derive it.
    Orphaned,
}

impl RunStatus {
    /// Whether the run has ended (anything but running or orphaned).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, RunStatus::Running | RunStatus::Orphaned)
    }

    /// Whether the run is open: running (or orphaned) or waiting for an answer. Open runs are
    /// what operators list by default.
    pub fn is_open(&self) -> bool {
        matches!(
            self,
            RunStatus::Running | RunStatus::AwaitingInput | RunStatus::Orphaned
        )
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
            RunStatus::Orphaned => "orphaned",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
