//! Replaying a spilled run: the end of a run that the stores did not take (see
//! [`SpilledRun`]) is written into them, exactly once, and only if the thread has not moved on.
//!
//! The replay gives up the ended run's lease (if the store still has it), takes the thread's
//! lease itself (a run or another replay holding it makes it wait for another time), and
//! checks that no later run has used the thread: a run recorded with a greater fencing token
//! or a later id, or a checkpoint of another run newer than the spilled one. If one has, the
//! thread went on from an older state and the spilled state would contradict it: nothing is
//! written, and the replay says why. Otherwise it writes, with its own fencing token, the
//! workflow definition, the messages (idempotent by id), the final checkpoint (a checkpoint
//! already stored by an earlier, interrupted replay is recognised) and the run record, then
//! gives the lease back. Every write is retried while the store fails transiently, until the
//! store deadline; a replay that fails can be made again.

use super::facade::Runtime;
use super::hold::HoldError;
use crate::model::{CheckpointId, RunId, StoreError, WorkerId};
use crate::persist::SpilledRun;
use crate::persist::retry;

/// What a replay of a spilled run did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Replayed {
    /// Why nothing was written: the thread moved on after the run (a later run took it).
    /// The spilled state is left to the operator; the thread's own state is untouched.
    pub skipped: Option<String>,
    /// How many messages were handed to the history store (those already there are not
    /// appended twice).
    pub messages: usize,
    /// The final checkpoint, now in the checkpoint store.
    pub checkpoint: Option<CheckpointId>,
    /// Whether that checkpoint was already there (an earlier replay wrote it).
    pub checkpoint_was_stored: bool,
    /// Whether the run's final record was written.
    pub record: bool,
}

/// Why a spilled run could not be replayed now; the spilled state stays where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// A run (or another replay) holds the thread: replay once it has ended.
    #[error("thread `{thread}` is busy: run {run}{} holds it", worker.as_ref().map(|w| format!(" on worker {w}")).unwrap_or_default())]
    ThreadBusy {
        /// The thread.
        thread: crate::model::ThreadId,
        /// The run holding it.
        run: RunId,
        /// Its worker.
        worker: Option<WorkerId>,
    },
    /// A store failed (transiently until the deadline, or for good).
    #[error("could not replay run {run} of thread `{thread}`: {error}")]
    Store {
        /// The run.
        run: RunId,
        /// Its thread.
        thread: crate::model::ThreadId,
        /// The store's error.
        error: StoreError,
    },
}

impl Runtime {
    /// Writes a spilled run's end into this runtime's stores, once; see the module docs. Safe
    /// to call again for the same spilled run (after an error, or even after a success: it
    /// then writes nothing new).
    pub async fn replay_spilled(&self, spilled: &SpilledRun) -> Result<Replayed, ReplayError> {
        let thread = &spilled.thread;
        let failed = |error: StoreError| ReplayError::Store {
            run: spilled.run_id,
            thread: thread.clone(),
            error,
        };
        let deadline = || tokio::time::Instant::now() + self.config().store_deadline;
        let services = &self.services;
        // The run has ended: its lease, if the store still has it, is given up (nothing
        // happens if it is not the thread's any more).
        retry::until(deadline(), || {
            services.leases.release(thread, &spilled.lease)
        })
        .await
        .map_err(|g| failed(g.error))?;
        let hold = match self.hold_thread(thread, spilled.run_id, None, None).await {
            Ok(hold) => hold,
            Err(HoldError::Busy { run, worker }) => {
                return Err(ReplayError::ThreadBusy {
                    thread: thread.clone(),
                    run,
                    worker,
                });
            }
            Err(HoldError::Store(e)) => return Err(failed(e)),
        };
        let result = self.replay_held(spilled, hold.lease().fence).await;
        hold.give_up().await;
        let replayed = result.map_err(failed)?;
        match &replayed.skipped {
            Some(why) => {
                tracing::warn!(run = %spilled.run_id, %thread, why, "spilled run not replayed: the thread moved on")
            }
            None => {
                tracing::info!(run = %spilled.run_id, %thread, messages = replayed.messages, checkpoint = ?replayed.checkpoint, "spilled run replayed")
            }
        }
        Ok(replayed)
    }

    /// The replay, once the thread is held with `fence`.
    async fn replay_held(
        &self,
        spilled: &SpilledRun,
        fence: crate::model::Fence,
    ) -> Result<Replayed, StoreError> {
        let thread = &spilled.thread;
        let services = &self.services;
        let deadline = || tokio::time::Instant::now() + self.config().store_deadline;
        if let Some(why) = self.moved_on(spilled).await? {
            return Ok(Replayed {
                skipped: Some(why),
                ..Replayed::default()
            });
        }
        let fence = Some(fence);
        let mut replayed = Replayed::default();
        if let Some((hash, definition)) = &spilled.workflow {
            retry::until(deadline(), || {
                services.checkpoints.put_workflow(thread, hash, definition)
            })
            .await
            .map_err(|g| g.error)?;
        }
        if !spilled.messages.is_empty() {
            retry::until(deadline(), || {
                services.history.append(thread, &spilled.messages, fence)
            })
            .await
            .map_err(|g| g.error)?;
            replayed.messages = spilled.messages.len();
        }
        if let Some(checkpoint) = &spilled.checkpoint {
            let put = retry::until(deadline(), || {
                services.checkpoints.put(thread, checkpoint.clone(), fence)
            })
            .await
            .map_err(|g| g.error);
            match put {
                Ok(()) => {}
                // An earlier replay stored this very checkpoint (same id, same sequence).
                Err(StoreError::StaleSequence { stored, .. })
                    if stored == checkpoint.sequence
                        && services
                            .checkpoints
                            .get(thread, checkpoint.id)
                            .await?
                            .as_ref()
                            == Some(checkpoint) =>
                {
                    replayed.checkpoint_was_stored = true;
                }
                Err(e) => return Err(e),
            }
            replayed.checkpoint = Some(checkpoint.id);
        }
        retry::until(deadline(), || services.runs.put(&spilled.record, fence))
            .await
            .map_err(|g| g.error)?;
        replayed.record = true;
        Ok(replayed)
    }

    /// Why the spilled state would contradict the thread's, if it would: a later run used the
    /// thread (recorded with a greater fencing token or a later id), or another run stored a
    /// newer checkpoint.
    async fn moved_on(&self, spilled: &SpilledRun) -> Result<Option<String>, StoreError> {
        let thread = &spilled.thread;
        let token = spilled.lease.fence.0;
        let records = self.services.runs.list_thread(thread).await?;
        if let Some(later) = records.iter().find(|r| {
            r.run_id != spilled.run_id
                && (r.run_id > spilled.run_id || r.fence.is_some_and(|f| f > token))
        }) {
            return Ok(Some(format!(
                "run {} ({}) used the thread after run {}",
                later.run_id, later.status, spilled.run_id
            )));
        }
        if let Some(ours) = &spilled.checkpoint
            && let Some(latest) = self.services.checkpoints.latest(thread).await?
            && latest.run != spilled.run_id
            && latest.id > ours.id
        {
            return Ok(Some(format!(
                "checkpoint {} of run {} is newer than the spilled one",
                latest.id, latest.run
            )));
        }
        Ok(None)
    }
}
