//! Errors shared across layers: a store that failed, a snapshot that could not be stored, a
//! reference that did not resolve.

use std::time::Duration;

use super::ids::{CheckpointId, RunId, ThreadId};

/// A store operation that failed.
///
/// Errors are either transient ([`is_transient`](Self::is_transient): the service could not
/// be reached, did not answer in time, or said to try again later), worth retrying until a
/// deadline, or permanent: trying again gives the same answer, so callers fail at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backing service could not be reached, or answered that it cannot serve now
    /// (loading, busy, failing over). Transient.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backing service did not answer in time. Transient.
    #[error("store timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The backing service refused the command for a reason that retrying cannot fix: an
    /// authentication or permission error, a command spanning keys of several cluster slots,
    /// a script error, or an endpoint that does not speak the store's protocol. Permanent.
    #[error("store refused {command} on {key}: {reason}")]
    Rejected {
        /// The command (or script) refused.
        command: String,
        /// The key it was about.
        key: String,
        /// What the service said.
        reason: String,
    },
    /// A checkpoint write was older than what is stored (a retried or late write).
    #[error(
        "stale checkpoint write for run {run}: sequence {sequence} is not newer than stored {stored}"
    )]
    StaleSequence {
        /// The run.
        run: RunId,
        /// The sequence of the refused write.
        sequence: u64,
        /// The sequence already stored.
        stored: u64,
    },
    /// A write carried a fencing token that is no longer the thread's: the writer lost the
    /// thread's lease (another run holds it now). Nothing was written.
    #[error(
        "write refused for thread `{thread}`: fencing token {token} is stale (the thread's is {current})"
    )]
    Fenced {
        /// The thread.
        thread: ThreadId,
        /// The writer's token.
        token: u64,
        /// The thread's current token.
        current: u64,
    },
    /// A checkpoint delta was refused because a checkpoint it builds on (its base or its
    /// parent) is not stored (pruned, or expired): nothing was written. The writer writes the
    /// checkpoint whole instead.
    #[error("checkpoint {checkpoint}, which the delta builds on, is not stored")]
    MissingParent {
        /// The missing checkpoint.
        checkpoint: CheckpointId,
    },
    /// Stored data could not be read.
    #[error("corrupt data at {key}: {reason}")]
    Corrupt {
        /// What was being read.
        key: String,
        /// Why it is unreadable.
        reason: String,
    },
}

impl StoreError {
    /// Whether trying again later may succeed: the service was out of reach, slow, or asked
    /// to try again ([`Unavailable`](Self::Unavailable), [`Timeout`](Self::Timeout)). Every
    /// other error is permanent: the same call gets the same answer (refused, fenced, stale,
    /// corrupt data), so it is reported at once instead of retried.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Timeout(_))
    }
}

/// Why a snapshot of a run could not be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The checkpoint store kept failing (transiently) until the store deadline.
    #[error("checkpoint store kept failing for {waited:?} ({attempts} attempts): {last}")]
    StoreFailed {
        /// How many writes were tried.
        attempts: u64,
        /// How long they were tried for.
        waited: Duration,
        /// The store's last error.
        #[source]
        last: StoreError,
    },
    /// The checkpoint store refused the write for good: a newer snapshot of the run is
    /// stored, the run lost its thread, or the store gave a permanent error
    /// (`!StoreError::is_transient`).
    #[error("checkpoint store refused the snapshot: {0}")]
    Refused(#[source] StoreError),
    /// The snapshot cannot be encoded (it is larger than a snapshot may be).
    #[error("snapshot does not encode: {reason}")]
    Encode {
        /// What is wrong with it.
        reason: String,
    },
    /// The runtime's checkpointer did not take or answer the write.
    #[error("the checkpointer did not answer: {reason}")]
    Unreachable {
        /// What happened.
        reason: String,
    },
}

impl CheckpointError {
    /// Whether the store merely failed for a while ([`StoreFailed`](Self::StoreFailed), or
    /// the checkpointer did not answer): a later write may succeed. A refusal or a snapshot
    /// that does not encode stays so.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::StoreFailed { .. } | Self::Unreachable { .. })
    }
}

/// A reference that cannot be resolved at run time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot resolve {reference}: {reason}")]
pub struct ResolveError {
    /// The reference, as written.
    pub reference: String,
    /// Why it failed.
    pub reason: String,
}
