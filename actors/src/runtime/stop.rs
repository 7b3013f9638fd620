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

    /// Stops a live run: returns once it has stopped and persisted what it held. Every caller
    /// of a stop gets the same [`StopResult`](crate::StopResult), also one arriving after the
    /// run stopped; a run that ended otherwise (or ends on its own first) answers
    /// [`StopReply::AlreadyFinished`] with its outcome while this process keeps it (the last
    /// [`RuntimeConfig::finished_outcomes`](crate::RuntimeConfig::finished_outcomes) runs),
    /// then with its record alone.
    pub async fn stop_for(
        &self,
        run_id: RunId,
        mode: StopMode,
        reason: StopReason,
    ) -> Result<StopReply, StopError> {
        stop_run(&self.services, run_id, mode, reason).await
    }

    /// Gracefully stops every live run with reason `Shutdown` (each within the configured stop
    /// timeout, then forced), so every run stays resumable, then removes this worker's
    /// heartbeat (a run started later writes it again). Returns each run's answer.
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
        let replies = futures::future::join_all(stops).await;
        self.services.retire().await;
        replies
    }
}

/// Stops a run of this process, or reports how it ended: from its outcome while the registry
/// keeps it, then from its record.
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
            let _ = supervisor.send_message(RunMsg::Stop {
                mode,
                reason,
                by: "api",
            });
        }
        let mut rx = live.outcome.clone();
        let outcome = rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|o| o.as_ref().cloned());
        if let Some(outcome) = outcome {
            return Ok(reply(services, run_id, &outcome).await);
        }
    }
    // Ended already: its outcome is kept before it stops being live, so a caller that missed
    // the live run finds it here (unless enough runs ended since to push it out).
    if let Some(outcome) = services.registry.outcome(&run_id) {
        return Ok(reply(services, run_id, &outcome).await);
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
        Err(e) => Err(StopError::Store(e)),
    }
}

/// What a stop caller learns of a run that ended: the stop result every caller of that stop
/// got, or the run's outcome and record.
async fn reply(services: &Services, run_id: RunId, outcome: &RunOutcome) -> StopReply {
    match outcome {
        RunOutcome::Stopped(result) => StopReply::Stopped(result.clone()),
        other => {
            let record = services.runs.get(run_id).await.ok().flatten();
            StopReply::AlreadyFinished(FinishedRun {
                run_id,
                status: other.status(),
                outcome: Some(other.clone()),
                record,
            })
        }
    }
}
