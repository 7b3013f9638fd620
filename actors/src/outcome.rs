//! How a run ends: [`RunOutcome`], with what was persisted of its history.

use std::collections::BTreeMap;

use crate::event::NodePath;
use crate::handler::NodeError;
use crate::handler::Usage;
use crate::ids::CheckpointId;
use crate::ids::{NodeId, RunId};
use crate::interaction::Interaction;
use crate::message::Message;
use crate::stop::StopResult;
use crate::store::RunStatus;
use crate::value::{Map, Value};

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A node failed (returned an error, panicked, or its parameters did not resolve).
    #[error("node `{path}` failed: {error}")]
    Node {
        /// Where.
        path: NodePath,
        /// What it said.
        error: NodeError,
    },
    /// The engine itself failed (an actor could not be spawned, or ended without a result).
    #[error("run supervisor failed: {0}")]
    Supervisor(String),
}

/// What became of the messages a run produced when it ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HistoryFlush {
    /// Messages written to the history store.
    pub persisted: Vec<Message>,
    /// Messages the history store refused; they are also recorded in the run store.
    pub not_persisted: Vec<Message>,
    /// The history store's error, when there was one.
    pub error: Option<String>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RunOutcome {
    /// Every node that could run has run.
    Completed {
        /// The run.
        run_id: RunId,
        /// The output of every node that ran (skipped nodes have none).
        outputs: BTreeMap<NodeId, Value>,
        /// The workflow variables at the end.
        variables: Map,
        /// The run's messages.
        history: HistoryFlush,
        /// What the nodes that ran in this run consumed (nodes restored from a checkpoint
        /// are not counted again).
        usage: Usage,
        /// How long the run waited for the checkpoint store (it was failing and nothing went
        /// on unsaved); zero when it never did.
        storage_wait: std::time::Duration,
    },
    /// A node failed; nodes still running were stopped.
    Failed {
        /// The run.
        run_id: RunId,
        /// What failed.
        error: RunError,
        /// The outputs of the nodes that completed before the failure.
        outputs: BTreeMap<NodeId, Value>,
        /// The run's messages (kept even though the run failed).
        history: HistoryFlush,
        /// What the nodes that ran in this run consumed.
        usage: Usage,
        /// How long the run waited for the checkpoint store (it was failing and nothing went
        /// on unsaved); zero when it never did.
        storage_wait: std::time::Duration,
    },
    /// The run reached an interactive node: it is checkpointed with the pending interaction
    /// and holds no actors until `resume` brings the answer.
    AwaitingInput {
        /// The run.
        run_id: RunId,
        /// The interactions waiting for an answer (usually one), each with its full path.
        interactions: Vec<Interaction>,
        /// The outputs of the nodes that completed so far.
        outputs: BTreeMap<NodeId, Value>,
        /// The run's messages.
        history: HistoryFlush,
        /// The checkpoint holding the pause.
        checkpoint_id: Option<CheckpointId>,
        /// Why the checkpoint could not be written, if it could not.
        checkpoint_error: Option<String>,
        /// What the nodes that ran in this run consumed.
        usage: Usage,
        /// How long the run waited for the checkpoint store (it was failing and nothing went
        /// on unsaved); zero when it never did.
        storage_wait: std::time::Duration,
    },
    /// The run was stopped; it can be resumed from its checkpoint.
    Stopped(StopResult),
}

impl RunOutcome {
    /// The run's final status.
    pub fn status(&self) -> RunStatus {
        match self {
            RunOutcome::Completed { .. } => RunStatus::Succeeded,
            RunOutcome::Failed { .. } => RunStatus::Failed,
            RunOutcome::Stopped(stop) => stop.reason.status(),
            RunOutcome::AwaitingInput { .. } => RunStatus::AwaitingInput,
        }
    }

    /// The run.
    pub fn run_id(&self) -> RunId {
        match self {
            RunOutcome::Completed { run_id, .. }
            | RunOutcome::Failed { run_id, .. }
            | RunOutcome::AwaitingInput { run_id, .. } => *run_id,
            RunOutcome::Stopped(stop) => stop.run_id,
        }
    }

    /// The node outputs.
    pub fn outputs(&self) -> &BTreeMap<NodeId, Value> {
        match self {
            RunOutcome::Completed { outputs, .. }
            | RunOutcome::Failed { outputs, .. }
            | RunOutcome::AwaitingInput { outputs, .. } => outputs,
            RunOutcome::Stopped(stop) => &stop.outputs,
        }
    }

    /// The output of one node, looked up by id text.
    pub fn output(&self, node: &str) -> Option<&Value> {
        self.outputs().get(node)
    }

    /// What became of the run's messages.
    pub fn history(&self) -> &HistoryFlush {
        match self {
            RunOutcome::Completed { history, .. }
            | RunOutcome::Failed { history, .. }
            | RunOutcome::AwaitingInput { history, .. } => history,
            RunOutcome::Stopped(stop) => &stop.messages,
        }
    }

    /// The error, if the run failed.
    pub fn error(&self) -> Option<&RunError> {
        match self {
            RunOutcome::Failed { error, .. } => Some(error),
            _ => None,
        }
    }

    /// What the nodes that ran in this run consumed.
    pub fn usage(&self) -> &Usage {
        match self {
            RunOutcome::Completed { usage, .. }
            | RunOutcome::Failed { usage, .. }
            | RunOutcome::AwaitingInput { usage, .. } => usage,
            RunOutcome::Stopped(stop) => &stop.usage,
        }
    }

    /// How long the run waited for a failing checkpoint store (nothing went on unsaved).
    pub fn storage_wait(&self) -> std::time::Duration {
        match self {
            RunOutcome::Completed { storage_wait, .. }
            | RunOutcome::Failed { storage_wait, .. }
            | RunOutcome::AwaitingInput { storage_wait, .. } => *storage_wait,
            RunOutcome::Stopped(stop) => stop.storage_wait,
        }
    }

    /// The first interaction waiting for an answer, if the run paused.
    pub fn interaction(&self) -> Option<&Interaction> {
        match self {
            RunOutcome::AwaitingInput { interactions, .. } => interactions.first(),
            _ => None,
        }
    }

    /// The stop result, if the run was stopped.
    pub fn stop_result(&self) -> Option<&StopResult> {
        match self {
            RunOutcome::Stopped(stop) => Some(stop),
            _ => None,
        }
    }
}
