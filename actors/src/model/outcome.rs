//! How a run ends ([`RunOutcome`]) and what a stop produced ([`StopResult`]), with what was
//! persisted of the run's history.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::{CheckpointError, StoreError};
use super::ids::{CheckpointId, NodeId, RunId};
use super::interaction::Interaction;
use super::message::Message;
use super::node::NodeError;
use super::path::NodePath;
use super::record::RunRecord;
use super::status::RunStatus;
use super::stop::StopReason;
use super::usage::Usage;
use super::value::{Map, Value, weigh};

/// The outputs of a run's nodes, by id. Shared with the run's state: an outcome holds the
/// outputs, it does not copy them.
pub type Outputs = BTreeMap<NodeId, Arc<Value>>;

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
    /// The run's progress could not be stored, and retrying cannot help (the checkpoint
    /// store refused it for good): the run stops rather than go on unsaved or wait forever.
    #[error("the run's progress could not be stored: {0}")]
    Storage(CheckpointError),
}

/// What became of the messages a run produced when it ended.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct HistoryFlush {
    /// Messages written to the history store.
    pub persisted: Vec<Message>,
    /// Messages the history store refused; they are also recorded in the run store.
    pub not_persisted: Vec<Message>,
    /// The history store's error, when there was one.
    pub error: Option<StoreError>,
}

/// What of a run's end the stores did not take (they kept failing until the store deadline,
/// or refused), and where it went instead. A run whose end is not persisted has not ended as
/// its outcome says until that state is replayed into the stores: it is not a success.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Unpersisted {
    /// How many of the run's messages the history store did not take (they are the outcome's
    /// [`HistoryFlush::not_persisted`], its error the store's).
    pub messages: usize,
    /// Why the final checkpoint was not written, if it was not.
    pub checkpoint: Option<CheckpointError>,
    /// Why the run's final record was not written, if it was not.
    pub record: Option<StoreError>,
    /// Where the state went instead.
    pub spill: Spill,
}

impl Unpersisted {
    /// What was not persisted, as a list: `5 message(s)`, `the final checkpoint`,
    /// `the run record`.
    pub fn parts(&self) -> Vec<String> {
        let mut parts = Vec::new();
        if self.messages > 0 {
            parts.push(format!("{} message(s)", self.messages));
        }
        if self.checkpoint.is_some() {
            parts.push("the final checkpoint".to_owned());
        }
        if self.record.is_some() {
            parts.push("the run record".to_owned());
        }
        parts
    }
}

impl std::fmt::Display for Unpersisted {
    /// `not persisted: 5 message(s), the final checkpoint (store timed out after 1s); kept in
    /// <location>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not persisted: {}", self.parts().join(", "))?;
        let cause = self
            .checkpoint
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| self.record.as_ref().map(ToString::to_string));
        if let Some(cause) = cause {
            write!(f, " ({cause})")?;
        }
        match &self.spill {
            Spill::Kept { location } => write!(f, "; kept in {location}"),
            Spill::Failed { error } => write!(f, "; could not be kept either: {error}"),
            Spill::NoSpillStore => write!(f, "; no spill store is set, so it is lost"),
        }
    }
}

/// Where a run's unpersisted end went.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Spill {
    /// Kept by the runtime's spill store, at this location (a file), until it is replayed
    /// into the stores.
    Kept {
        /// Where (a path, for a file spill).
        location: String,
    },
    /// The spill store failed too: the state is only in this outcome.
    Failed {
        /// What the spill store said.
        error: String,
    },
    /// The runtime has no spill store: the state is only in this outcome.
    NoSpillStore,
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
        outputs: Outputs,
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
        /// What of the run's end the stores did not take; `None` when everything was stored.
        unpersisted: Option<Unpersisted>,
    },
    /// A node failed; nodes still running were stopped.
    Failed {
        /// The run.
        run_id: RunId,
        /// What failed.
        error: RunError,
        /// The outputs of the nodes that completed before the failure.
        outputs: Outputs,
        /// The run's messages (kept even though the run failed).
        history: HistoryFlush,
        /// What the nodes that ran in this run consumed.
        usage: Usage,
        /// How long the run waited for the checkpoint store (it was failing and nothing went
        /// on unsaved); zero when it never did.
        storage_wait: std::time::Duration,
        /// What of the run's end the stores did not take; `None` when everything was stored.
        unpersisted: Option<Unpersisted>,
    },
    /// The run reached an interactive node: it is checkpointed with the pending interaction
    /// and holds no actors until `resume` brings the answer.
    AwaitingInput {
        /// The run.
        run_id: RunId,
        /// The interactions waiting for an answer (usually one), each with its full path.
        interactions: Vec<Interaction>,
        /// The outputs of the nodes that completed so far.
        outputs: Outputs,
        /// The run's messages.
        history: HistoryFlush,
        /// The checkpoint holding the pause.
        checkpoint_id: Option<CheckpointId>,
        /// Why the checkpoint could not be written, if it could not.
        checkpoint_error: Option<CheckpointError>,
        /// What the nodes that ran in this run consumed.
        usage: Usage,
        /// How long the run waited for the checkpoint store (it was failing and nothing went
        /// on unsaved); zero when it never did.
        storage_wait: std::time::Duration,
        /// What of the run's end the stores did not take; `None` when everything was stored.
        unpersisted: Option<Unpersisted>,
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
    pub fn outputs(&self) -> &Outputs {
        match self {
            RunOutcome::Completed { outputs, .. }
            | RunOutcome::Failed { outputs, .. }
            | RunOutcome::AwaitingInput { outputs, .. } => outputs,
            RunOutcome::Stopped(stop) => &stop.outputs,
        }
    }

    /// The output of one node, looked up by id text.
    pub fn output(&self, node: &str) -> Option<&Value> {
        self.outputs().get(node).map(|v| &**v)
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

    /// About how many bytes the outcome holds in memory: its outputs, variables, messages
    /// and streamed text (values as [`weigh`] counts them), what the bound on the outcomes a
    /// runtime keeps counts.
    pub(crate) fn weight(&self) -> usize {
        let flush = self.history();
        let messages = flush
            .persisted
            .iter()
            .chain(&flush.not_persisted)
            .map(|m| std::mem::size_of::<Message>() + m.content.len())
            .fold(0usize, usize::saturating_add);
        let outputs = self
            .outputs()
            .keys()
            .map(|node| std::mem::size_of::<(NodeId, Arc<Value>)>() + node.as_ref().len())
            .fold(0usize, usize::saturating_add)
            .saturating_add(weigh(self.outputs().values().map(|value| &**value)));
        let own = match self {
            RunOutcome::Completed { variables, .. } => variables
                .iter()
                .map(|(key, _)| std::mem::size_of::<String>() + key.len())
                .fold(0usize, usize::saturating_add)
                .saturating_add(weigh(variables.iter().map(|(_, value)| value))),
            RunOutcome::Stopped(stop) => stop
                .interrupted
                .iter()
                .filter_map(|i| i.partial.as_ref())
                .chain(&stop.partial_response)
                .map(String::len)
                .fold(0usize, usize::saturating_add),
            RunOutcome::Failed { .. } | RunOutcome::AwaitingInput { .. } => 0,
        };
        std::mem::size_of::<Self>()
            .saturating_add(messages)
            .saturating_add(outputs)
            .saturating_add(own)
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

    /// What of the run's end the stores did not take, and where it went; `None` when the
    /// history, the final checkpoint and the run record were all stored. A completed run with
    /// something unpersisted is not a success yet: see [`is_persisted`](Self::is_persisted).
    pub fn unpersisted(&self) -> Option<&Unpersisted> {
        match self {
            RunOutcome::Completed { unpersisted, .. }
            | RunOutcome::Failed { unpersisted, .. }
            | RunOutcome::AwaitingInput { unpersisted, .. } => unpersisted.as_ref(),
            RunOutcome::Stopped(stop) => stop.unpersisted.as_ref(),
        }
    }

    /// Whether the run's end (history, final checkpoint, run record) is in the stores. Hosts
    /// that report success check this as well as [`status`](Self::status).
    pub fn is_persisted(&self) -> bool {
        self.unpersisted().is_none()
    }

    /// Records what the stores did not take.
    pub(crate) fn set_unpersisted(&mut self, what: Option<Unpersisted>) {
        match self {
            RunOutcome::Completed { unpersisted, .. }
            | RunOutcome::Failed { unpersisted, .. }
            | RunOutcome::AwaitingInput { unpersisted, .. } => *unpersisted = what,
            RunOutcome::Stopped(stop) => stop.unpersisted = what,
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

/// A node cut short by the stop.
#[derive(Debug, Clone, PartialEq)]
pub struct Interrupted {
    /// Where.
    pub path: NodePath,
    /// Whether its handler was aborted (force, or the graceful timeout passed) rather than
    /// returning by itself.
    pub forced: bool,
    /// What it had streamed, if anything (kept in history as a truncated message).
    pub partial: Option<String>,
    /// How many chunks it had streamed.
    pub chunks: u64,
    /// The error it returned while stopping (it failed instead of stopping), or why what it
    /// held was lost.
    pub error: Option<NodeError>,
}

/// Everything a stop produced and persisted. Every caller of a stop of the same run gets the
/// same value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StopResult {
    /// The run.
    pub run_id: RunId,
    /// Why it stopped.
    pub reason: StopReason,
    /// The nodes running at the stop, now interrupted; a resume runs them again from the start.
    pub interrupted: Vec<Interrupted>,
    /// Every node finished as of the stop, in completion order: nodes restored from the
    /// checkpoint this run resumed come first, then those that finished in this run (before or
    /// during the stop).
    pub finished: Vec<NodeId>,
    /// The nodes whose handlers were aborted.
    pub forced: Vec<NodeId>,
    /// The nodes a resume will start: the interrupted ones and the ready ones not yet started.
    pub frontier: Vec<NodeId>,
    /// The outputs of the finished nodes.
    pub outputs: Outputs,
    /// The streamed text of the interrupted node(s), marked truncated in history.
    pub partial_response: Option<String>,
    /// What became of the run's messages: persisted (count and content) or not (and why).
    pub messages: HistoryFlush,
    /// The checkpoint written at the stop; `None` if writing it failed (see
    /// `checkpoint_error`).
    pub checkpoint_id: Option<CheckpointId>,
    /// Why the checkpoint could not be written, if it could not.
    pub checkpoint_error: Option<CheckpointError>,
    /// What the nodes that ran in this run consumed.
    pub usage: Usage,
    /// How long the run waited for a failing checkpoint store; zero when it never did.
    pub storage_wait: std::time::Duration,
    /// What of the run's end the stores did not take; `None` when everything was stored.
    pub unpersisted: Option<Unpersisted>,
}

impl StopResult {
    /// The paths where the run stopped: the interrupted nodes, or, when none was running, the
    /// nodes that were about to start.
    pub fn stopped_at(&self) -> Vec<NodePath> {
        if self.interrupted.is_empty() {
            self.frontier.iter().cloned().map(NodePath::node).collect()
        } else {
            self.interrupted.iter().map(|i| i.path.clone()).collect()
        }
    }
}

/// What a stop request answers.
#[derive(Debug, Clone, PartialEq)]
// Answered once per stop request, never stored in bulk: boxing would only burden callers.
#[allow(clippy::large_enum_variant)]
#[non_exhaustive]
pub enum StopReply {
    /// The run stopped (by this request or a concurrent one).
    Stopped(StopResult),
    /// The run had already ended (or ended on its own before the stop took effect).
    AlreadyFinished(FinishedRun),
}

/// The final state of a run that ended before a stop could take effect.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FinishedRun {
    /// The run.
    pub run_id: RunId,
    /// Its final status.
    pub status: RunStatus,
    /// Its outcome, when this process ran it and still holds it.
    pub outcome: Option<RunOutcome>,
    /// Its record in the run store, when it could be read.
    pub record: Option<RunRecord>,
}

/// Why a stop request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StopError {
    /// No run with this id is known, live or recorded.
    #[error("unknown run {0}")]
    UnknownRun(RunId),
    /// The run is recorded as running, but not in this process.
    #[error("run {0} is not running in this process (status {1})")]
    NotInThisProcess(RunId, RunStatus),
    /// The run store could not be read to learn the run's state.
    #[error("could not read the run store: {0}")]
    Store(#[source] StoreError),
}
