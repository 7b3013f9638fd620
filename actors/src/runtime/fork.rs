//! Forks: what a new thread gets before a run continues a checkpoint of another thread on it.
//!
//! The new thread must be new (no checkpoint, no history). It gets, in this order: the
//! workflow definition (by its content hash), the source thread's history as it stood at the
//! checkpoint (the first [`Snapshot::history_len`] messages of the source's history; the
//! checkpoint's pending messages follow when the run starts, as for any resume), and the
//! checkpoint itself, re-encoded with the new thread's id under the same checkpoint id. The
//! source thread is only read.
//!
//! Everything that can refuse a fork (the target, the checkpoint, its workflow, an answer) is
//! checked before the first write. A store failing between the writes leaves a partial copy
//! in the new thread; forking into it again is then refused as
//! [`ResumeError::ForkTargetExists`], and a fork into another thread starts clean.

use super::facade::Runtime;
use super::resume::ResumeError;
use crate::model::{Fence, ThreadId};
use crate::persist::{Snapshot, StoredCheckpoint};

impl Runtime {
    /// Refuses a fork into a thread that already has checkpoints or history.
    pub(super) async fn check_fork_target(&self, into: &ThreadId) -> Result<(), ResumeError> {
        let checkpoints = self
            .checkpoint_store()
            .list(into)
            .await
            .map_err(ResumeError::Store)?
            .len();
        let messages = self
            .history_store()
            .load(into)
            .await
            .map_err(ResumeError::Store)?
            .len();
        if checkpoints > 0 || messages > 0 {
            return Err(ResumeError::ForkTargetExists {
                thread: into.clone(),
                checkpoints,
                messages,
            });
        }
        Ok(())
    }

    /// Gives the new thread `into` the workflow definition, the history of `source` as of the
    /// checkpoint, and the checkpoint, re-encoded for `into`.
    pub(super) async fn copy_for_fork(
        &self,
        source: &ThreadId,
        into: &ThreadId,
        stored: &StoredCheckpoint,
        snapshot: &Snapshot,
        definition: &str,
        fence: Option<Fence>,
    ) -> Result<(), ResumeError> {
        let checkpoint = stored.id;
        let mut history = self
            .history_store()
            .load(source)
            .await
            .map_err(ResumeError::Store)?;
        if let Some(recorded) = snapshot.history_len {
            let stored_len = history.len();
            match usize::try_from(recorded) {
                Ok(len) if len <= stored_len => history.truncate(len),
                _ => {
                    return Err(ResumeError::HistoryMissing {
                        thread: source.clone(),
                        checkpoint,
                        recorded,
                        stored: stored_len,
                    });
                }
            }
        }
        self.checkpoint_store()
            .put_workflow(into, &snapshot.workflow_hash, definition)
            .await
            .map_err(ResumeError::Store)?;
        if !history.is_empty() {
            self.history_store()
                .append(into, &history, fence)
                .await
                .map_err(ResumeError::Store)?;
        }
        // The copy names its thread, and says where the new thread's history stands: exactly
        // the messages just copied (for a checkpoint that did not record it, too).
        let mut copy = snapshot.clone();
        copy.thread = into.clone();
        copy.history_len = Some(u64::try_from(history.len()).unwrap_or(u64::MAX));
        let bytes = copy
            .encode()
            .map_err(|error| ResumeError::Corrupt { checkpoint, error })?;
        self.checkpoint_store()
            .put(
                into,
                StoredCheckpoint {
                    id: checkpoint,
                    run: stored.run,
                    sequence: stored.sequence,
                    bytes,
                    link: None,
                },
                fence,
            )
            .await
            .map_err(ResumeError::Store)?;
        Ok(())
    }
}
