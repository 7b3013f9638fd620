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
    // New statuses go last: snapshots encode a status by its place in this list.
    /// Paused at an interactive node, then answered: the run of its thread whose
    /// `parent_run_id` names it continues from its checkpoint. Not open: nothing waits for it
    /// any more. A resume that answers it writes this once its own run is started.
    Answered,
}

impl RunStatus {
    /// Every status, in the order operators read them (open ones first).
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Running,
        RunStatus::AwaitingInput,
        RunStatus::Orphaned,
        RunStatus::Answered,
        RunStatus::Stopped,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// The status named `name` (as [`RunStatus::as_str`] writes it), or an error listing
    /// every name.
    pub fn parse(name: &str) -> Result<RunStatus, UnknownStatus> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == name)
            .ok_or_else(|| UnknownStatus(name.to_owned()))
    }

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
            RunStatus::Answered => "answered",
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

/// A status name no [`RunStatus`] has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown status {:?}: ", self.0)?;
        let names: Vec<&str> = RunStatus::ALL.iter().map(RunStatus::as_str).collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        write!(f, "{} or {last}", rest.join(", "))
    }
}

impl std::error::Error for UnknownStatus {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_parsed_from_its_name_as_serde_writes_it() {
        for status in RunStatus::ALL {
            assert_eq!(RunStatus::parse(status.as_str()), Ok(status));
            let json = serde_json::to_value(status).expect("a status serializes");
            assert_eq!(json, serde_json::Value::String(status.as_str().to_owned()));
        }
        let error = RunStatus::parse("paused").expect_err("no such status");
        assert_eq!(
            error.to_string(),
            "unknown status \"paused\": running, awaiting_input, orphaned, answered, stopped, \
             succeeded, failed or cancelled"
        );
    }
}
