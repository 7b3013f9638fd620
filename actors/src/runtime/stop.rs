//! Stopping runs of this process: one run (every caller gets the same answer), or all of them
//! at shutdown.

use super::facade::Runtime;
use super::services::Services;
use crate::exec::RunMsg;
use crate::model::{FinishedRun, RunId, RunOutcome, StopError, StopMode, StopReason, StopReply};

impl Runtime {
    /// Stops a live run with reason `UserInterrupted`. See [`stop_for`](Self::stop_for).
    pub async fn stop(&self, run_id: RunId, mode: StopMode) -> Result<StopReply, StopError> {
        stop_run(&self.services, run_id, mode, StopReason::UserInterrupted).await
    }

    /// Stops a live run: returns once it has stopped and persisted what it held. Concurrent
    /// callers all get the same [`StopResult`](crate::StopResult); a run that already ended
    /// (or ends on its own first) answers [`StopReply::AlreadyFinished`] with its final state.
    pub async fn stop_for(
        &self,
        run_id: RunId,
        mode: StopMode,
        reason: StopReason,
    ) -> Result<StopReply, StopError> {
        stop_run(&self.services, run_id, mode, reason).await
    }

    /// Gracefully stops every live run with reason `Shutdown` (each within the configured stop
    /// timeout, then forced), so every run stays resumable. Returns each run's answer.
    pub async fn shutdown(&self) -> Vec<(RunId, Result<StopReply, StopError>)> {
        let mode = StopMode::Graceful {
            timeout: self.services.config.stop_timeout,
        };
        let stops = self
            .services
            .registry
            .ids()
            .into_iter()
            .map(|run_id| async move {
                let reply = stop_run(&self.services, run_id, mode, StopReason::Shutdown).await;
                (run_id, reply)
            });
        futures::future::join_all(stops).await
    }
}

/// Stops a run of this process, or reports its recorded end.
pub(crate) async fn stop_run(
    services: &Services,
    run_id: RunId,
    mode: StopMode,
    reason: StopReason,
) -> Result<StopReply, StopError> {
    if let Some(live) = services.registry.get(&run_id) {
        // A send fails only when the run is ending: its outcome is published regardless.
        // A run waiting for input has no supervisor: its outcome is there already.
        if let Some(supervisor) = &live.supervisor {
            let _ = supervisor.send_message(RunMsg::Stop { mode, reason });
        }
        let mut rx = live.outcome.clone();
        let outcome = rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|o| o.as_deref().cloned());
        match outcome {
            Some(RunOutcome::Stopped(result)) => return Ok(StopReply::Stopped(result)),
            Some(other) => {
                let record = services.runs.get(run_id).await.ok().flatten();
                return Ok(StopReply::AlreadyFinished(FinishedRun {
                    run_id,
                    status: other.status(),
                    outcome: Some(other),
                    record,
                }));
            }
            None => {}
        }
    }
    match services.runs.get(run_id).await {
        Ok(Some(record)) if record.status.is_terminal() => {
            Ok(StopReply::AlreadyFinished(FinishedRun {
                run_id,
                status: record.status,
                outcome: None,
                record: Some(record),
            }))
        }
        Ok(Some(record)) => Err(StopError::NotInThisProcess(run_id, record.status)),
        Ok(None) => Err(StopError::UnknownRun(run_id)),
        Err(e) => Err(StopError::Store(e.to_string())),
    }
}
