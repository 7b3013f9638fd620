//! Adopting orphans: runs recorded as running whose worker stopped heartbeating are taken
//! over by resuming their threads. [`Runtime::adopt_orphans`] does it once; a runtime built
//! with `adopt_orphans` does it every `adopt_every`, in a task that ends with the runtime.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::errors::StartError;
use super::facade::Runtime;
use super::ops::RunQuery;
use super::resume::{ResumeError, ResumeFrom, ResumeInput, ResumeOptions};
use super::services::Services;
use crate::kinds::{Kinds, Probe};
use crate::model::{RunId, RunStatus, StoreError, ThreadId};

/// What adopting one orphan did.
#[derive(Debug)]
#[non_exhaustive]
pub struct Adoption {
    /// The orphaned run.
    pub orphan: RunId,
    /// Its thread.
    pub thread: ThreadId,
    /// The run that took the thread over, or why none did: [`ResumeError::ThreadBusy`] when
    /// another worker adopted it first.
    pub result: Result<RunId, ResumeError>,
}

/// How many orphans one round resumes at once.
const AT_ONCE: usize = 8;

impl Runtime {
    /// Takes over every orphaned run once: resumes the thread of each run recorded as running
    /// whose worker stopped heartbeating (or restarted since), from its newest checkpoint.
    /// Finished nodes do not run again; a node that was in flight when the worker died runs
    /// again from its start. Workers adopting together take each thread once: the others get
    /// [`ResumeError::ThreadBusy`]. Runs marked not resumable are left alone.
    pub async fn adopt_orphans(&self) -> Result<Vec<Adoption>, StoreError> {
        self.adopt(&HashSet::new()).await
    }

    /// [`Runtime::adopt_orphans`], leaving the runs in `skip` alone.
    async fn adopt(&self, skip: &HashSet<RunId>) -> Result<Vec<Adoption>, StoreError> {
        let query = RunQuery {
            statuses: vec![RunStatus::Orphaned],
            limit: usize::MAX,
            ..RunQuery::default()
        };
        let orphans: Vec<_> = self
            .list_runs(&query)
            .await?
            .into_iter()
            .filter(|view| {
                view.record.not_resumable.is_none() && !skip.contains(&view.record.run_id)
            })
            .map(|view| (view.record.run_id, view.record.thread))
            .collect();
        // One adoption per thread, the newest orphan's (an older one's work is in the thread's
        // checkpoints too).
        let mut threads = HashSet::new();
        let orphans: Vec<_> = orphans
            .into_iter()
            .filter(|(_, thread)| threads.insert(thread.clone()))
            .collect();
        let mut adoptions = Vec::with_capacity(orphans.len());
        for batch in orphans.chunks(AT_ONCE) {
            let resumed = futures::future::join_all(batch.iter().map(|(orphan, thread)| async {
                let options = ResumeOptions {
                    orphan: Some(*orphan),
                    ..ResumeOptions::default()
                };
                let result = self
                    .resume_with(
                        ResumeFrom::Thread(thread.clone()),
                        ResumeInput::Continue,
                        options,
                    )
                    .await
                    .map(|run| run.run_id());
                Adoption {
                    orphan: *orphan,
                    thread: thread.clone(),
                    result,
                }
            }))
            .await;
            adoptions.extend(resumed);
        }
        Ok(adoptions)
    }
}

/// Adopts orphans every `every` while the runtime lives.
pub(crate) fn spawn_adopter(
    services: Weak<Services>,
    kinds: Arc<Kinds>,
    probe: Option<Arc<dyn Probe>>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Orphans whose adoption failed for a reason that does not pass (no checkpoint, a
        // workflow this worker cannot run): logged once, not retried by this worker.
        let mut given_up: HashSet<RunId> = HashSet::new();
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(services) = services.upgrade() else {
                return;
            };
            let runtime = Runtime {
                kinds: kinds.clone(),
                services,
                probe: probe.clone(),
            };
            let adoptions = match runtime.adopt(&given_up).await {
                Ok(adoptions) => adoptions,
                Err(e) => {
                    tracing::warn!(error = %e, "could not look for orphaned runs");
                    continue;
                }
            };
            for adoption in adoptions {
                match &adoption.result {
                    Ok(run) => tracing::info!(
                        orphan = %adoption.orphan,
                        thread = %adoption.thread,
                        %run,
                        "adopted an orphaned run"
                    ),
                    Err(e) if passing(e) => tracing::debug!(
                        orphan = %adoption.orphan,
                        error = %e,
                        "orphan not adopted this time"
                    ),
                    Err(e) => {
                        given_up.insert(adoption.orphan);
                        tracing::warn!(
                            orphan = %adoption.orphan,
                            thread = %adoption.thread,
                            error = %e,
                            "cannot adopt an orphaned run; this worker leaves it alone"
                        );
                    }
                }
            }
        }
    })
}

/// Whether an adoption failed for a reason that may pass: another worker took the thread, or
/// a store failed.
fn passing(error: &ResumeError) -> bool {
    matches!(
        error,
        ResumeError::ThreadBusy { .. }
            | ResumeError::Store(_)
            | ResumeError::Start(
                StartError::ThreadBusy { .. } | StartError::Lease { .. } | StartError::RunStore(_)
            )
    )
}
