//! How a run is stopped and why: [`StopMode`] and [`StopReason`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::status::RunStatus;

/// How to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// No node starts after the stop; running nodes see it and may finish within `timeout`,
    /// then the stop becomes a force stop. Streams are cut at their next chunk.
    Graceful {
        /// How long running nodes may take to finish.
        timeout: Duration,
    },
    /// Running handlers are aborted at once, without being asked to stop first (so one that
    /// would answer the request is still aborted). What they streamed and appended is kept.
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
#[non_exhaustive]
pub enum StopReason {
    /// A person pressed stop.
    UserInterrupted,
    /// The run was cancelled (the run ends as `cancelled`, still resumable).
    Cancelled,
    /// A deadline passed.
    Timeout,
    /// The process is shutting down.
    Shutdown,
    /// The run lost its thread's lease (another worker took the thread over, having found
    /// this run's worker silent for longer than the lease TTL): it stopped at once and wrote
    /// nothing more.
    LeaseLost,
}

impl StopReason {
    /// The name used in records: `user_interrupted`, `cancelled`, `timeout`, `shutdown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::UserInterrupted => "user_interrupted",
            StopReason::Cancelled => "cancelled",
            StopReason::Timeout => "timeout",
            StopReason::Shutdown => "shutdown",
            StopReason::LeaseLost => "lease_lost",
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
            "lease_lost" => StopReason::LeaseLost,
            _ => return None,
        })
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
