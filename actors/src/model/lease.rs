//! Leases: which worker runs a thread. A run takes its thread's lease when it starts and gets
//! a fencing token that only grows; every write it makes carries the token, and a store
//! refuses a write whose token is no longer the thread's. A worker proves it is alive by a
//! heartbeat; a run whose worker stopped heartbeating is orphaned, and a resume takes it over
//! with a new token.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ids::{RunId, WorkerId};

/// A fencing token: the number a run got when it took its thread's lease. Tokens of a thread
/// only grow, so a write with an older token comes from a run that lost the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Who holds a thread's lease: a run of a worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseHolder {
    /// The worker running the run.
    pub worker: WorkerId,
    /// The run.
    pub run: RunId,
}

impl fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run {} on worker {}", self.run, self.worker)
    }
}

/// A thread's lease as a store holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Who holds it.
    pub holder: LeaseHolder,
    /// The holder's fencing token.
    pub fence: Fence,
}

/// What a worker says about itself in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker.
    pub id: WorkerId,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// When it started, in milliseconds since the epoch.
    pub started_at_ms: u64,
    /// The runvisor version it runs.
    pub version: String,
}

impl WorkerInfo {
    /// A worker as a heartbeat describes it.
    pub fn new(id: WorkerId, host: String, pid: u32, started_at_ms: u64, version: String) -> Self {
        Self {
            id,
            host,
            pid,
            started_at_ms,
            version,
        }
    }

    /// This process, as a worker with the given id.
    pub fn this_process(id: WorkerId) -> Self {
        Self {
            id,
            host: hostname(),
            pid: std::process::id(),
            started_at_ms: super::message::now_ms(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// This host's name, as the environment or the kernel tells it; `localhost` if neither does.
pub(crate) fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Why a lease could not be taken or kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A live run holds the thread.
    #[error("the thread is busy: {holder} holds it")]
    Busy {
        /// Who holds it.
        holder: LeaseHolder,
    },
    /// The lease is no longer ours: another run took the thread, or it expired.
    #[error("the lease is lost (now held by {})", current.as_ref().map_or("nobody".to_owned(), ToString::to_string))]
    Lost {
        /// Who holds it now, if anyone.
        current: Option<LeaseHolder>,
    },
    /// The lease store failed.
    #[error(transparent)]
    Store(#[from] super::error::StoreError),
}
