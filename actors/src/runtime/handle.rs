//! `RunHandle`: what `start` and `resume` return: the run's id, its event stream, its outcome,
//! and a way to stop it.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::services::Services;
use super::stop::stop_run;
use crate::kinds::events::{EventReceiver, EventSender, Received};
use crate::model::{
    FinishedRun, RunError, RunEvent, RunId, RunOutcome, StopError, StopMode, StopReason, StopReply,
    ThreadId,
};
/// A started run: its id, its events, and its outcome.
pub struct RunHandle {
    run_id: RunId,
    thread: ThreadId,
    workflow_id: String,
    events: EventSender,
    first: Mutex<Option<EventReceiver>>,
    outcome: watch::Receiver<Option<Arc<RunOutcome>>>,
    services: Arc<Services>,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle")
            .field("run_id", &self.run_id)
            .field("thread", &self.thread)
            .field("ended", &self.outcome.borrow().is_some())
            .finish_non_exhaustive()
    }
}

impl RunHandle {
    pub(super) fn new(
        run_id: RunId,
        thread: ThreadId,
        workflow_id: String,
        events: EventSender,
        first: EventReceiver,
        outcome: watch::Receiver<Option<Arc<RunOutcome>>>,
        services: Arc<Services>,
    ) -> Self {
        Self {
            run_id,
            thread,
            workflow_id,
            events,
            first: Mutex::new(Some(first)),
            outcome,
            services,
        }
    }

    /// Stops the run with reason `UserInterrupted` (see [`Runtime::stop_for`](crate::Runtime::stop_for)).
    pub async fn stop(&self, mode: StopMode) -> Result<StopReply, StopError> {
        self.stop_for(mode, StopReason::UserInterrupted).await
    }

    /// Stops the run for a reason. A run that already ended answers
    /// [`StopReply::AlreadyFinished`] with its outcome.
    pub async fn stop_for(
        &self,
        mode: StopMode,
        reason: StopReason,
    ) -> Result<StopReply, StopError> {
        match stop_run(&self.services, self.run_id, mode, reason).await {
            Ok(StopReply::AlreadyFinished(mut finished)) => {
                finished.outcome = finished.outcome.or_else(|| self.outcome());
                Ok(StopReply::AlreadyFinished(finished))
            }
            Err(StopError::UnknownRun(_)) => match self.outcome() {
                // The run store forgot the run (a store without persistence restarted): the
                // handle still knows how it ended.
                Some(outcome) => Ok(StopReply::AlreadyFinished(FinishedRun {
                    run_id: self.run_id,
                    status: outcome.status(),
                    outcome: Some(outcome),
                    record: None,
                })),
                None => Err(StopError::UnknownRun(self.run_id)),
            },
            other => other,
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// The id of the workflow the run executes.
    pub fn workflow_id(&self) -> &str {
        &self.workflow_id
    }

    /// The run's thread.
    pub fn thread(&self) -> &ThreadId {
        &self.thread
    }

    /// The run's events. The first call sees every event from the start of the run; later
    /// calls see events from the moment of the call.
    pub fn events(&self) -> EventStream {
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).take();
        EventStream {
            rx: first.unwrap_or_else(|| self.events.subscribe()),
            done: false,
        }
    }

    /// The outcome, if the run has ended.
    pub fn outcome(&self) -> Option<RunOutcome> {
        self.outcome.borrow().as_deref().cloned()
    }

    /// Waits until the run ends and returns its outcome.
    pub async fn wait(&self) -> RunOutcome {
        let mut rx = self.outcome.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(outcome) => match outcome.as_deref() {
                Some(outcome) => outcome.clone(),
                None => self.lost(),
            },
            Err(_) => self.lost(),
        }
    }

    /// The supervisor ended without publishing an outcome (it cannot, short of a bug or a
    /// kill): report that instead of hanging.
    fn lost(&self) -> RunOutcome {
        RunOutcome::Failed {
            run_id: self.run_id,
            error: RunError::Supervisor("run supervisor ended without an outcome".into()),
            outputs: Default::default(),
            history: Default::default(),
            usage: Default::default(),
            storage_wait: Default::default(),
            unpersisted: None,
        }
    }
}

/// A run's events, in order.
#[derive(Debug)]
pub struct EventStream {
    rx: EventReceiver,
    done: bool,
}

impl EventStream {
    /// The next event; `None` after the run finished. A subscriber too slow to keep up with
    /// the event buffer gets [`RunEvent::EventsMissed`] in place of the events it missed.
    pub async fn next(&mut self) -> Option<RunEvent> {
        if self.done {
            return None;
        }
        match self.rx.recv().await {
            Received::Event(event) => {
                if matches!(event, RunEvent::RunFinished { .. }) {
                    self.done = true;
                }
                Some(event)
            }
            Received::Missed(count) => Some(RunEvent::EventsMissed { count }),
            Received::Closed => {
                self.done = true;
                None
            }
        }
    }
}
