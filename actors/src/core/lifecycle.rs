//! A run's lifecycle as one enum: running, stopping (and why, and whether forced), ended.
//!
//! The supervisor asks the lifecycle what a stop, a pause or a failure means now, and how the
//! run ends; it carries the answer out (halting nodes, arming timers, persisting the end).
//! Nothing here can contradict itself: a run is in exactly one state.

use std::time::Duration;

use crate::model::{RunError, RunStatus, StopMode, StopReason};

/// Why a run is ending before its graph is done.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// A stop (by a user, a cancel, a deadline or a shutdown).
    Stop(StopReason),
    /// A node failed.
    Failure(RunError),
    /// An interactive node waits for an answer.
    Pause,
}

/// Where a run is.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum Lifecycle {
    /// Nodes start as they become ready.
    #[default]
    Running,
    /// No node starts; running ones are finishing (or were aborted, when `forced`).
    Stopping {
        /// Why.
        cause: Ending,
        /// Running nodes were told to abort.
        forced: bool,
    },
    /// The run's end was persisted and published.
    Ended,
}

/// What a stop asks the supervisor to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopStep {
    /// Nothing (the run is ending or ended, or already stopping as asked).
    Ignore,
    /// Begin stopping: no node starts any more; running nodes see their stop flag. With
    /// `force`, abort them at once; otherwise abort them after `escalate_after`, if given.
    Begin {
        /// Abort running nodes now.
        force: bool,
        /// When to abort running nodes that did not finish (graceful stops with nodes
        /// running).
        escalate_after: Option<Duration>,
    },
    /// Abort the nodes still running (a force stop during a graceful one).
    Escalate,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Final {
    /// Every node that could run ran.
    Completed,
    /// A node (or the engine) failed.
    Failed(RunError),
    /// Waiting for an answer.
    Paused,
    /// Stopped; resumable.
    Stopped(StopReason),
}

impl Final {
    /// The status recorded for this end.
    pub(crate) fn status(&self) -> RunStatus {
        match self {
            Final::Completed => RunStatus::Succeeded,
            Final::Failed(_) => RunStatus::Failed,
            Final::Paused => RunStatus::AwaitingInput,
            Final::Stopped(reason) => reason.status(),
        }
    }

    /// The stop reason, for a stopped run.
    pub(crate) fn stop_reason(&self) -> Option<StopReason> {
        match self {
            Final::Stopped(reason) => Some(*reason),
            _ => None,
        }
    }
}

impl Lifecycle {
    /// Whether nodes may start.
    pub(crate) fn is_running(&self) -> bool {
        matches!(self, Lifecycle::Running)
    }

    /// Whether the run has ended.
    pub(crate) fn is_ended(&self) -> bool {
        matches!(self, Lifecycle::Ended)
    }

    /// A stop, a pause or a failure: what to do now. `idle` says whether no node is running.
    pub(crate) fn stop(&mut self, cause: Ending, mode: StopMode, idle: bool) -> StopStep {
        match self {
            Lifecycle::Ended => StopStep::Ignore,
            Lifecycle::Stopping { forced, .. } => {
                if mode == StopMode::Force && !*forced {
                    *forced = true;
                    StopStep::Escalate
                } else {
                    StopStep::Ignore
                }
            }
            Lifecycle::Running => {
                let force = mode == StopMode::Force;
                *self = Lifecycle::Stopping {
                    cause,
                    forced: force,
                };
                let escalate_after = match mode {
                    StopMode::Graceful { timeout } if !idle => Some(timeout),
                    _ => None,
                };
                StopStep::Begin {
                    force,
                    escalate_after,
                }
            }
        }
    }

    /// The graceful timeout passed: whether running nodes must now be aborted.
    pub(crate) fn escalate(&mut self) -> bool {
        match self {
            Lifecycle::Stopping { forced, .. } if !*forced => {
                *forced = true;
                true
            }
            _ => false,
        }
    }

    /// Ends the run: how it ends, given whether its graph is done and whether any node was cut
    /// short. A stop that came while the last nodes were finishing, all of which did, is a
    /// completed run (one final state, never both). A run that is not stopping but whose graph
    /// is not done cannot go on: that is an engine failure, never a hang. `None` if the run had
    /// ended already.
    pub(crate) fn finish(&mut self, graph_done: bool, interrupted: bool) -> Option<Final> {
        let end = match std::mem::replace(self, Lifecycle::Ended) {
            Lifecycle::Ended => return None,
            Lifecycle::Running if graph_done => Final::Completed,
            Lifecycle::Running => Final::Failed(RunError::Supervisor(
                "no node can run, yet the workflow is not done".into(),
            )),
            Lifecycle::Stopping {
                cause: Ending::Stop(_),
                ..
            } if graph_done && !interrupted => Final::Completed,
            Lifecycle::Stopping { cause, .. } => match cause {
                Ending::Stop(reason) => Final::Stopped(reason),
                Ending::Failure(error) => Final::Failed(error),
                Ending::Pause => Final::Paused,
            },
        };
        Some(end)
    }

    /// What the run is doing, as a tree query shows it.
    pub(crate) fn describe(&self) -> Option<&'static str> {
        match self {
            Lifecycle::Stopping { .. } => Some("stopping"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACEFUL: StopMode = StopMode::Graceful {
        timeout: Duration::from_secs(30),
    };

    fn stop() -> Ending {
        Ending::Stop(StopReason::UserInterrupted)
    }

    #[test]
    fn transitions_by_table() {
        // (state before, event, expected step, expected state after)
        let cases: Vec<(Lifecycle, Ending, StopMode, bool, StopStep, Lifecycle)> = vec![
            (
                Lifecycle::Running,
                stop(),
                GRACEFUL,
                false,
                StopStep::Begin {
                    force: false,
                    escalate_after: Some(Duration::from_secs(30)),
                },
                Lifecycle::Stopping {
                    cause: stop(),
                    forced: false,
                },
            ),
            (
                Lifecycle::Running,
                stop(),
                GRACEFUL,
                true,
                StopStep::Begin {
                    force: false,
                    escalate_after: None,
                },
                Lifecycle::Stopping {
                    cause: stop(),
                    forced: false,
                },
            ),
            (
                Lifecycle::Running,
                Ending::Pause,
                StopMode::Force,
                false,
                StopStep::Begin {
                    force: true,
                    escalate_after: None,
                },
                Lifecycle::Stopping {
                    cause: Ending::Pause,
                    forced: true,
                },
            ),
            (
                Lifecycle::Stopping {
                    cause: Ending::Pause,
                    forced: false,
                },
                stop(),
                StopMode::Force,
                false,
                StopStep::Escalate,
                Lifecycle::Stopping {
                    cause: Ending::Pause,
                    forced: true,
                },
            ),
            (
                Lifecycle::Stopping {
                    cause: Ending::Pause,
                    forced: false,
                },
                stop(),
                GRACEFUL,
                false,
                StopStep::Ignore,
                Lifecycle::Stopping {
                    cause: Ending::Pause,
                    forced: false,
                },
            ),
            (
                Lifecycle::Stopping {
                    cause: stop(),
                    forced: true,
                },
                stop(),
                StopMode::Force,
                false,
                StopStep::Ignore,
                Lifecycle::Stopping {
                    cause: stop(),
                    forced: true,
                },
            ),
            (
                Lifecycle::Ended,
                stop(),
                StopMode::Force,
                false,
                StopStep::Ignore,
                Lifecycle::Ended,
            ),
        ];
        for (before, cause, mode, idle, step, after) in cases {
            let mut state = before.clone();
            assert_eq!(state.stop(cause, mode, idle), step, "from {before:?}");
            assert_eq!(state, after, "from {before:?}");
        }
    }

    #[test]
    fn the_first_cause_wins() {
        let mut state = Lifecycle::Running;
        state.stop(Ending::Pause, GRACEFUL, false);
        state.stop(stop(), GRACEFUL, false);
        assert_eq!(state.finish(false, true), Some(Final::Paused));
    }

    #[test]
    fn endings_by_table() {
        let failure = RunError::Supervisor("x".into());
        let cases: Vec<(Lifecycle, bool, bool, Final)> = vec![
            (Lifecycle::Running, true, false, Final::Completed),
            (
                Lifecycle::Running,
                false,
                false,
                Final::Failed(RunError::Supervisor(
                    "no node can run, yet the workflow is not done".into(),
                )),
            ),
            (
                Lifecycle::Stopping {
                    cause: stop(),
                    forced: false,
                },
                true,
                false,
                Final::Completed,
            ),
            (
                Lifecycle::Stopping {
                    cause: stop(),
                    forced: false,
                },
                true,
                true,
                Final::Stopped(StopReason::UserInterrupted),
            ),
            (
                Lifecycle::Stopping {
                    cause: stop(),
                    forced: true,
                },
                false,
                false,
                Final::Stopped(StopReason::UserInterrupted),
            ),
            (
                Lifecycle::Stopping {
                    cause: Ending::Failure(failure.clone()),
                    forced: true,
                },
                true,
                false,
                Final::Failed(failure),
            ),
            (
                Lifecycle::Stopping {
                    cause: Ending::Pause,
                    forced: false,
                },
                true,
                false,
                Final::Paused,
            ),
        ];
        for (before, done, interrupted, end) in cases {
            let mut state = before.clone();
            assert_eq!(
                state.finish(done, interrupted),
                Some(end),
                "from {before:?}"
            );
            assert!(state.is_ended());
            assert_eq!(state.finish(done, interrupted), None);
        }
    }

    #[test]
    fn escalation_happens_once_and_only_while_stopping() {
        let mut state = Lifecycle::Running;
        assert!(!state.escalate());
        state.stop(stop(), GRACEFUL, false);
        assert!(state.escalate());
        assert!(!state.escalate());
        assert_eq!(state.stop(stop(), StopMode::Force, false), StopStep::Ignore);
    }
}
