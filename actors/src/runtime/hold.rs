//! Holding a thread before a run starts on it: a claim in this process (so of concurrent
//! starts and resumes of one thread here exactly one goes on) and the thread's lease in the
//! lease store (so across processes too), with the fencing token every write of the run will
//! carry. A hold that is not handed over to a run gives both back.

use std::sync::Arc;

use super::facade::Runtime;
use crate::model::{
    CheckpointId, Fence, Lease, LeaseError, LeaseHolder, RunId, RunRecord, RunStatus, StopReason,
    StoreError, ThreadId, WorkerId, now_ms,
};
use crate::persist::retry::Backoff;
use crate::persist::{Acquired, Begun, HistoryTail, LeaseStore};
use crate::service::ThreadClaim;

/// Why a thread could not be held.
#[derive(Debug)]
pub(crate) enum HoldError {
    /// A run holds the thread (here, or on another worker).
    Busy {
        run: RunId,
        worker: Option<WorkerId>,
    },
    /// The lease store failed.
    Store(StoreError),
}

/// A thread held for a run that is about to start.
pub(crate) struct ThreadHold {
    claim: Option<ThreadClaim>,
    lease: Lease,
    /// Set when the lease was taken with the run's first record written and the thread's
    /// history read, in one step ([`StartStore`]): the history, or why it could not be read.
    pub(crate) begun: Option<Result<HistoryTail, StoreError>>,
    /// The thread's newest checkpoint id, when that step read it.
    pub(crate) newest_checkpoint: Option<CheckpointId>,
    thread: ThreadId,
    leases: Arc<dyn LeaseStore>,
    handed: bool,
}

impl std::fmt::Debug for ThreadHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadHold")
            .field("thread", &self.thread)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl ThreadHold {
    /// The run's lease.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The start failed: gives the claim and the lease back now.
    pub(crate) async fn give_up(mut self) {
        self.handed = true;
        drop(self.claim.take());
        if let Err(e) = self.leases.release(&self.thread, &self.lease).await {
            tracing::warn!(thread = %self.thread, error = %e, "could not give an unused lease back");
        }
    }

    /// The run is up: it holds the thread and its lease from now on.
    pub(crate) fn hand_over(mut self) {
        self.handed = true;
        if let Some(claim) = self.claim.take() {
            claim.hand_over();
        }
    }
}

impl Drop for ThreadHold {
    /// Not handed over (the start failed): the claim goes with the hold, and the lease is given
    /// back in the background (it would expire by itself otherwise).
    fn drop(&mut self) {
        if self.handed {
            return;
        }
        let (leases, thread, lease) =
            (self.leases.clone(), self.thread.clone(), self.lease.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = leases.release(&thread, &lease).await {
                    tracing::warn!(%thread, error = %e, "could not give an unused lease back");
                }
            });
        }
    }
}

impl Runtime {
    /// Holds `thread` for `run`: claims it in this process, then takes its lease. The record
    /// of the run the lease was taken from (its worker died), and `orphan` if given, are
    /// closed: they cannot be running any more.
    ///
    /// With `record` (the run's first, its fence to be set to the new token), a start store
    /// (if the runtime has one) takes a free lease, writes the record and reads the thread's
    /// history in one step ([`ThreadHold::begun`]); when it did not, the lease is asked for
    /// again as without one (and the caller writes the record).
    pub(crate) async fn hold_thread(
        &self,
        thread: &ThreadId,
        run: RunId,
        orphan: Option<RunId>,
        record: Option<&RunRecord>,
    ) -> Result<ThreadHold, HoldError> {
        let claim = self
            .registry()
            .claim(thread, run)
            .map_err(|holder| HoldError::Busy {
                run: holder,
                worker: Some(self.services.worker.id.clone()),
            })?;
        let holder = LeaseHolder {
            worker: self.services.worker.id.clone(),
            run,
        };
        // A store failing for a moment (a timeout whose request may have landed) is tried
        // again until the store deadline: the holder's own lease answers as taken, so the
        // start neither fails for a blip nor leaves a lease nobody uses.
        let deadline = tokio::time::Instant::now() + self.config().store_deadline;
        let mut backoff = Backoff::until(deadline);
        let (acquired, begun) = loop {
            // A lease whose worker has no heartbeat may be taken over at once.
            let attempt = match self.services.ensure_heartbeat().await {
                // Boxed: the callers' futures (a start's, a resume's) stay small.
                Ok(()) => Box::pin(self.take_lease(thread, &holder, record)).await,
                Err(e) => (Err(LeaseError::Store(e)), None),
            };
            match &attempt.0 {
                Err(LeaseError::Store(e)) if e.is_transient() && backoff.wait().await => {
                    tracing::warn!(%thread, %run, error = %e, "taking the thread's lease failed; trying again");
                }
                _ => break attempt,
            }
        };
        match acquired {
            Ok(acquired) => {
                if let Some(previous) = &acquired.took_over {
                    tracing::info!(%thread, %previous, %run, "took an orphaned thread over");
                }
                // Never this run's own record: an attempt that landed unanswered, retried
                // after its lease expired, takes that lease over from itself.
                let orphans = acquired.took_over.iter().map(|p| p.run).chain(orphan);
                let orphans = orphans.filter(|previous| *previous != run);
                for previous in orphans.collect::<std::collections::BTreeSet<_>>() {
                    self.close_orphan(thread, previous, acquired.lease.fence)
                        .await;
                }
                let (begun, mut newest_checkpoint) = begun.unzip();
                if record.is_some() && begun.is_none() {
                    // A start that held its thread step by step: its checkpoints sort after
                    // the thread's newest, which the run before it (ended, or of a dead
                    // worker taken over) may have written moments ago in a process whose
                    // clock runs ahead (a start store's step reads it).
                    newest_checkpoint = Some(self.newest_checkpoint(thread).await);
                }
                Ok(ThreadHold {
                    claim: Some(claim),
                    lease: acquired.lease,
                    begun,
                    newest_checkpoint: newest_checkpoint.flatten(),
                    thread: thread.clone(),
                    leases: self.services.leases.clone(),
                    handed: false,
                })
            }
            Err(LeaseError::Busy { holder }) => Err(HoldError::Busy {
                run: holder.run,
                worker: Some(holder.worker),
            }),
            Err(LeaseError::Store(e)) => Err(HoldError::Store(e)),
            Err(other) => Err(HoldError::Store(StoreError::Unavailable(format!(
                "lease store: {other}"
            )))),
        }
    }

    /// Takes `thread`'s lease for `holder`; with `record`, through the start store if the
    /// runtime has one (see [`Self::hold_thread`]), which also answers the history it read.
    async fn take_lease(
        &self,
        thread: &ThreadId,
        holder: &LeaseHolder,
        record: Option<&RunRecord>,
    ) -> (
        Result<Acquired, LeaseError>,
        Option<(Result<HistoryTail, StoreError>, Option<CheckpointId>)>,
    ) {
        let ttl = self.config().lease.ttl;
        if let Some((record, starts)) = record.zip(self.services.starts.as_ref()) {
            let window = self.config().history_window;
            match starts.begin(record, holder, ttl, window).await {
                Ok(Begun::Started {
                    acquired,
                    history,
                    newest_checkpoint,
                }) => return (Ok(acquired), Some((history, newest_checkpoint))),
                Ok(Begun::NotStarted) => {}
                Err(e) => return (Err(e), None),
            }
        }
        (
            self.services.leases.acquire(thread, holder, ttl).await,
            None,
        )
    }

    /// The id of `thread`'s newest checkpoint; `None` when it has none, or when it cannot be
    /// read (the run then goes on, its ids ordered by this process's clock alone).
    async fn newest_checkpoint(&self, thread: &ThreadId) -> Option<CheckpointId> {
        match self.checkpoint_store().newest_id(thread).await {
            Ok(newest) => newest,
            Err(e) => {
                tracing::warn!(%thread, error = %e, "could not read the thread's newest checkpoint");
                None
            }
        }
    }

    /// The record of a run whose thread was just taken over from its dead worker: still
    /// `running`, it becomes `stopped` with reason `lease_lost`, written with the new holder's
    /// token. A failure only costs the record (readers derive `orphaned` meanwhile).
    async fn close_orphan(&self, thread: &ThreadId, previous: RunId, fence: Fence) {
        let runs = &self.services.runs;
        let mut record = match runs.get(previous).await {
            Ok(Some(record)) if record.status == RunStatus::Running && &record.thread == thread => {
                record
            }
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(run = %previous, error = %e, "could not read the orphaned run's record");
                return;
            }
        };
        record.status = RunStatus::Stopped;
        record.stop_reason = Some(StopReason::LeaseLost.as_str().to_owned());
        record.finished_at_ms = Some(now_ms());
        if let Err(e) = runs.put(&record, Some(fence)).await {
            tracing::warn!(run = %previous, error = %e, "could not record the orphaned run's end");
        }
    }
}
