//! JSON documents of how runs ended: what `runvisor run --json` and `resume --json` print and
//! what the service (`runvisor serve`) answers for a run that ended, was stopped or waits for
//! input. One renderer, so the command line and the HTTP API describe an outcome alike.

use runvisor_actors::{
    CheckpointId, Interaction, Map, Message, NodeId, RunId, RunOutcome, RunStatus, StopReason,
    StopResult, ThreadId,
};
use serde::Serialize;

/// The outcome document: the run, its status, outputs, variables, messages and error.
#[derive(Debug, Serialize)]
pub struct OutcomeDocument<'a> {
    run_id: RunId,
    thread: &'a ThreadId,
    workflow: &'a str,
    status: RunStatus,
    /// `null` when the run failed.
    error: Option<String>,
    outputs: &'a runvisor_actors::Outputs,
    /// The workflow variables at the end; `null` when the run failed.
    variables: Option<&'a Map>,
    /// The messages the run persisted to the thread's history.
    messages: &'a [Message],
    /// Messages the history store refused, if any.
    messages_not_persisted: &'a [Message],
    /// What a stop kept; `null` unless the run was stopped.
    stop: Option<StopDocument<'a>>,
    /// What the run waits for; empty unless it paused for input.
    interactions: &'a [Interaction],
    /// What of the run's end the store did not take and where it went; `null` when it was
    /// all stored.
    unpersisted: Option<String>,
}

/// The `stop` part of the outcome document: what a stop kept.
#[derive(Debug, Serialize)]
pub struct StopDocument<'a> {
    reason: StopReason,
    /// Where it stopped: the interrupted nodes, or the nodes that would have run next.
    stopped_at: Vec<String>,
    /// Text a stop cut short, if a stream was running.
    partial_response: Option<&'a str>,
    /// Every node that finished (before or during the stop).
    finished: &'a [NodeId],
    /// The nodes a resume would start.
    frontier: &'a [NodeId],
    /// Nodes whose handlers were aborted.
    forced: &'a [NodeId],
    checkpoint_id: Option<CheckpointId>,
    checkpoint_error: Option<String>,
}

impl<'a> StopDocument<'a> {
    /// The document of a stop result.
    pub fn new(stop: &'a StopResult) -> Self {
        Self {
            reason: stop.reason,
            stopped_at: stop.stopped_at().iter().map(ToString::to_string).collect(),
            partial_response: stop.partial_response.as_deref(),
            finished: &stop.finished,
            frontier: &stop.frontier,
            forced: &stop.forced,
            checkpoint_id: stop.checkpoint_id,
            checkpoint_error: stop.checkpoint_error.as_ref().map(ToString::to_string),
        }
    }
}

impl<'a> OutcomeDocument<'a> {
    /// The document of a run's outcome; `workflow` is its workflow's id.
    pub fn new(workflow: &'a str, thread: &'a ThreadId, outcome: &'a RunOutcome) -> Self {
        let variables = match outcome {
            RunOutcome::Completed { variables, .. } => Some(variables),
            _ => None,
        };
        let history = outcome.history();
        Self {
            run_id: outcome.run_id(),
            thread,
            workflow,
            status: outcome.status(),
            error: outcome.error().map(ToString::to_string),
            outputs: outcome.outputs(),
            variables,
            messages: &history.persisted,
            messages_not_persisted: &history.not_persisted,
            stop: match outcome {
                RunOutcome::Stopped(stop) => Some(StopDocument::new(stop)),
                _ => None,
            },
            interactions: match outcome {
                RunOutcome::AwaitingInput { interactions, .. } => interactions,
                _ => &[],
            },
            unpersisted: outcome.unpersisted().map(ToString::to_string),
        }
    }
}
