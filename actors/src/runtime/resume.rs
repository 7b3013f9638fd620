//! Resume: a new run that continues from a checkpoint's frontier, on the same thread or, for a
//! fork, on a new one.
//!
//! Completed nodes never run again (their outputs come from the snapshot); interrupted nodes
//! and ready nodes that had not started run from their start. The resumed run sees the thread's
//! history, which holds every message persisted at the stop exactly once (history appends are
//! idempotent by message id, and messages the store refused at the stop travel in the snapshot
//! and are persisted first). A fork (`fork.rs`) first gives its new thread the source thread's
//! history as of the checkpoint, the checkpoint and the workflow definition; the source thread
//! is only read.
//!
//! A resume claims its thread before it reads the checkpoint: of concurrent resumes (or a
//! resume and a start) of one thread in one process, exactly one goes on. Everything the
//! checkpoint says is checked against its workflow before the run starts: nodes, completions,
//! and every index and count of loop and parallel progress.

use std::collections::HashMap;

use tracing::Instrument;

use super::errors::StartError;
use super::facade::Runtime;
use super::handle::RunHandle;
use super::hold::HoldError;
use super::start::Launch;
use crate::exec::Restore;
use crate::model::{
    AnswerError, CheckpointId, Fence, Interaction, InteractionId, InvalidId, Message, RunId,
    RunLabels, RunRecord, RunStatus, StopReason, StoreError, ThreadId, TooDeep, Value, WorkerId,
};
use crate::persist::delta::{MaterializeError, materialize, materialize_chain};
use crate::persist::retry;
use crate::persist::snapshot::SnapshotError;
use crate::persist::{Snapshot, check_graph};
use crate::service::checkpointer::ChainSeed;
use crate::workflow::ValidationErrors;

/// How long the record of a paused run a resume answered is tried on in the background when
/// the run store still failed at the store deadline (see `Runtime::close_answered`).
pub(crate) const ANSWERED_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// Where to resume from, and on which thread the run goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResumeFrom {
    /// The newest checkpoint of a thread; the run continues the thread.
    Thread(ThreadId),
    /// A named checkpoint of a thread, continued on that same thread. The run sees the
    /// thread's whole history as stored now (messages persisted after the checkpoint
    /// included) and writes its checkpoints into the thread, after the newer ones. This is
    /// how a run is recovered from a progress snapshot after a crash, or retried from a chosen
    /// point of its own thread. To branch off without touching the thread, use
    /// [`ResumeFrom::Fork`].
    Checkpoint {
        /// The thread.
        thread: ThreadId,
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
    /// A fork: a new thread that starts from a checkpoint of another. Before the run starts,
    /// the new thread gets the source thread's history as it stood at the checkpoint (the
    /// messages persisted up to it, then those it carried as pending, and nothing after), a
    /// copy of the checkpoint (same id, re-encoded for the new thread, so
    /// `ResumeFrom::Checkpoint` works on the fork too) and the workflow definition. The run
    /// then continues from the checkpoint on the new thread, which its
    /// [`RunHandle::thread`] names.
    ///
    /// The source thread, its history and its checkpoints are only read, so a thread a run is
    /// live on may be forked. The new thread must be new: no checkpoint and no history
    /// ([`ResumeError::ForkTargetExists`]), no live run ([`ResumeError::ThreadBusy`]). The
    /// fork's run keeps the checkpoint's labels (app, chat, task), so the flags named after
    /// them stop it too.
    ///
    /// A checkpoint written before snapshot schema 2 did not record where the history stood
    /// ([`Snapshot::history_len`](crate::snapshot::Snapshot::history_len) is `None`): its fork
    /// gets the source thread's whole history as stored when it forks.
    Fork {
        /// The source thread.
        thread: ThreadId,
        /// The checkpoint of the source thread to fork from.
        checkpoint: CheckpointId,
        /// The new thread; a fresh one ([`ThreadId::generate`]) when `None`.
        into: Option<ThreadId>,
    },
}

impl From<ThreadId> for ResumeFrom {
    fn from(thread: ThreadId) -> Self {
        ResumeFrom::Thread(thread)
    }
}

/// What to resume with.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum ResumeInput {
    /// Continue as is.
    #[default]
    Continue,
    /// Continue with a new instruction from the user: it is appended to history as a user
    /// message and becomes `{{sys.query}}`.
    Instruction(String),
    /// Answer the interaction a run paused at: a form's values (an object) or a selection's
    /// value. It is checked against the form or the options; a wrong answer changes nothing.
    Answer {
        /// The interaction, as the paused run reported it.
        interaction_id: InteractionId,
        /// The answer.
        value: Value,
    },
}

/// Why a run could not be resumed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The thread has no checkpoint.
    #[error("thread `{0}` has no checkpoint to resume from")]
    NoCheckpoint(ThreadId),
    /// The named checkpoint does not exist.
    #[error("thread `{thread}` has no checkpoint {checkpoint}")]
    CheckpointNotFound {
        /// The thread.
        thread: ThreadId,
        /// The checkpoint asked for.
        checkpoint: CheckpointId,
    },
    /// A run of the thread is starting or live in this process (a concurrent resume or start
    /// claimed it first).
    #[error("thread `{thread}` has a live run {run}{}; stop it before resuming", worker.as_ref().map(|w| format!(" on worker {w}")).unwrap_or_default())]
    ThreadBusy {
        /// The thread.
        thread: ThreadId,
        /// The run holding it.
        run: RunId,
        /// The worker running it.
        worker: Option<WorkerId>,
    },
    /// The checkpoint's run completed: there is nothing left to run.
    #[error("checkpoint {checkpoint} is of run {run}, which {status}; nothing to resume")]
    NothingToResume {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Its run.
        run: RunId,
        /// That run's status.
        status: RunStatus,
    },
    /// The checkpoint cannot be decoded.
    #[error("checkpoint {checkpoint} is not resumable: {error}")]
    Corrupt {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// What is wrong with it.
        error: SnapshotError,
    },
    /// The checkpoint's workflow does not validate on this runtime (a kind is missing).
    #[error("the workflow of checkpoint {checkpoint} does not validate here: {errors}")]
    Workflow {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The problems.
        errors: ValidationErrors,
    },
    /// The checkpoint does not fit its workflow or thread.
    #[error("checkpoint {checkpoint} is inconsistent: {reason}")]
    Inconsistent {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// What does not fit.
        reason: String,
    },
    /// The answer names an interaction the checkpoint is not waiting for (stale or unknown).
    #[error("checkpoint {checkpoint} is not waiting for interaction {interaction} (waiting for: {})", pending.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    UnknownInteraction {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The interaction named.
        interaction: InteractionId,
        /// The interactions it waits for.
        pending: Vec<InteractionId>,
    },
    /// The answer does not fit the form or the options; the run stays resumable.
    #[error("answer to interaction {interaction} refused: {error}")]
    InvalidAnswer {
        /// The interaction.
        interaction: InteractionId,
        /// What is wrong with the answer.
        error: AnswerError,
    },
    /// The answer nests deeper than [`MAX_DEPTH`](crate::MAX_DEPTH); the run stays resumable.
    #[error("answer to interaction {interaction} refused: {error}")]
    AnswerTooDeep {
        /// The interaction.
        interaction: InteractionId,
        /// The limit it passed.
        #[source]
        error: TooDeep,
    },
    /// The run waits for an answer; resume with `ResumeInput::Answer`.
    #[error("checkpoint {checkpoint} waits for an answer to interaction {} at `{}`", interaction.id, interaction.path)]
    AnswerRequired {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The interaction to answer.
        interaction: Box<Interaction>,
    },
    /// The thread a fork would create already has checkpoints or history: a fork never
    /// writes into an existing thread.
    #[error(
        "thread `{thread}` already has {checkpoints} checkpoint(s) and {messages} message(s) of history; a fork needs a new thread"
    )]
    ForkTargetExists {
        /// The thread named as the fork's.
        thread: ThreadId,
        /// How many checkpoints it has.
        checkpoints: usize,
        /// How many messages its history holds.
        messages: usize,
    },
    /// The source thread's history holds fewer messages than the checkpoint says it had
    /// (they expired or were deleted): the history as of the checkpoint cannot be rebuilt.
    #[error(
        "checkpoint {checkpoint} of thread `{thread}` records {recorded} message(s) of history, but the thread holds {stored}; it cannot be forked"
    )]
    HistoryMissing {
        /// The source thread.
        thread: ThreadId,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// How many messages the checkpoint says the history held.
        recorded: u64,
        /// How many the history store holds now.
        stored: usize,
    },
    /// A store failed.
    #[error("store error while resuming: {0}")]
    Store(StoreError),
    /// The new run could not start.
    #[error(transparent)]
    Start(#[from] StartError),
}

impl ResumeError {
    /// The store error behind this one, when a store failed (reading the checkpoint or the
    /// history, taking the thread's lease, recording the run).
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Store(error) => Some(error),
            Self::Start(start) => start.store_error(),
            _ => None,
        }
    }
}

/// How to resume, beyond where from and with what.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ResumeOptions {
    /// Run failed parallel items (`on_error: collect`) again. By default an item that failed
    /// stays failed on resume: only items that were interrupted, or had not started, run.
    /// With this set, every failed item of a parallel still in progress at the checkpoint (at
    /// any depth) runs again from its start. A parallel that had completed is not rerun.
    pub retry_failed: bool,
    /// An orphaned run of the thread this resume takes over (adoption): its record, still
    /// `running`, is closed once the thread is held.
    pub(crate) orphan: Option<RunId>,
    /// The user the resumed run is for, replacing the checkpoint's (checked when set, see
    /// [`ResumeOptions::user`]). By default the run keeps the checkpoint's labels, user
    /// included.
    pub(crate) user: Option<String>,
}

impl ResumeOptions {
    /// Whether failed parallel items run again (see [`ResumeOptions::retry_failed`]).
    pub fn retry_failed(mut self, retry: bool) -> Self {
        self.retry_failed = retry;
        self
    }

    /// The user the resumed run is for (its user label), in place of the checkpoint's.
    /// Refused like any label that is not a valid id.
    pub fn user(mut self, user: impl Into<String>) -> Result<Self, InvalidId> {
        let user = user.into();
        RunLabels::default().with_user(user.as_str())?;
        self.user = Some(user);
        Ok(self)
    }
}

impl Runtime {
    /// Resumes a thread from its newest checkpoint, or from a named one, or forks a new thread
    /// from a checkpoint (see [`ResumeFrom`]), with the default [`ResumeOptions`].
    pub async fn resume(
        &self,
        from: impl Into<ResumeFrom>,
        input: ResumeInput,
    ) -> Result<RunHandle, ResumeError> {
        self.resume_with(from, input, ResumeOptions::default())
            .await
    }

    /// Resumes a thread from its newest checkpoint, or from a named one, or forks a new thread
    /// from a checkpoint (see [`ResumeFrom`]).
    ///
    /// Fails with [`ResumeError::ThreadBusy`] while another run of the thread the run would go
    /// on (for a fork: the new thread) is starting or live in this process, and with
    /// [`ResumeError::Inconsistent`] when the checkpoint does not fit its workflow (a node it
    /// names, an index or count of its loop or parallel progress); neither changes anything.
    /// A fork is checked entirely (target, checkpoint, workflow, answer) before it copies
    /// anything into its new thread.
    pub async fn resume_with(
        &self,
        from: impl Into<ResumeFrom>,
        input: ResumeInput,
        options: ResumeOptions,
    ) -> Result<RunHandle, ResumeError> {
        let from = from.into();
        // `source`: the thread the checkpoint is read from; `thread`: the one the run goes on.
        let (source, thread) = match &from {
            ResumeFrom::Thread(t) | ResumeFrom::Checkpoint { thread: t, .. } => {
                (t.clone(), t.clone())
            }
            ResumeFrom::Fork { thread, into, .. } => (
                thread.clone(),
                into.clone().unwrap_or_else(ThreadId::generate),
            ),
        };
        let fork = matches!(from, ResumeFrom::Fork { .. });
        let input = match input {
            ResumeInput::Answer {
                interaction_id,
                value,
            } => match value.check_depth() {
                Ok(()) => ResumeInput::Answer {
                    interaction_id,
                    value,
                },
                Err(error) => {
                    value.dismantle();
                    return Err(ResumeError::AnswerTooDeep {
                        interaction: interaction_id,
                        error,
                    });
                }
            },
            other => other,
        };
        let answering = matches!(input, ResumeInput::Answer { .. });
        let run_id = RunId::new();
        let hold = self
            .hold_thread(&thread, run_id, options.orphan, None)
            .await
            .map_err(|e| match e {
                HoldError::Busy { run, worker } => ResumeError::ThreadBusy {
                    thread: thread.clone(),
                    run,
                    worker,
                },
                HoldError::Store(e) => ResumeError::Store(e),
            })?;
        let fence = Some(hold.lease().fence);
        let result: Result<RunHandle, ResumeError> = async {
        if fork {
            self.check_fork_target(&thread).await?;
        }
        let stored = match &from {
            ResumeFrom::Thread(_) => self
                .checkpoint_store()
                .latest(&source)
                .await
                .map_err(ResumeError::Store)?
                .ok_or_else(|| ResumeError::NoCheckpoint(source.clone()))?,
            ResumeFrom::Checkpoint { checkpoint, .. } | ResumeFrom::Fork { checkpoint, .. } => self
                .checkpoint_store()
                .get(&source, *checkpoint)
                .await
                .map_err(ResumeError::Store)?
                .ok_or_else(|| ResumeError::CheckpointNotFound {
                    thread: source.clone(),
                    checkpoint: *checkpoint,
                })?,
        };
        let checkpoint = stored.id;
        let whole = materialize_chain(self.checkpoint_store().as_ref(), &source, &stored).await;
        let (snapshot, chain) = match whole {
            Ok(read) => read,
            Err(MaterializeError::Store(e)) => return Err(ResumeError::Store(e)),
            Err(MaterializeError::Snapshot(error)) => {
                // Record it on the run that wrote the checkpoint, for whoever looks next.
                if let Ok(Some(mut record)) = self.run_store().get(stored.run).await {
                    record.not_resumable = Some(format!("checkpoint {checkpoint}: {error}"));
                    if let Err(e) = self.run_store().put(&record, None).await {
                        tracing::warn!(run = %stored.run, error = %e, "could not record that the run is not resumable");
                    }
                }
                return Err(ResumeError::Corrupt { checkpoint, error });
            }
        };
        let inconsistent = |reason: String| ResumeError::Inconsistent { checkpoint, reason };
        if snapshot.thread != source {
            return Err(inconsistent(format!(
                "it belongs to thread `{}`",
                snapshot.thread
            )));
        }
        if snapshot.status == RunStatus::Succeeded {
            // Nothing to run, but messages the history store refused when the run ended are
            // persisted now (idempotent), so none is lost. A fork leaves its source alone.
            if !fork && !snapshot.pending_messages.is_empty() {
                self.history_store()
                    .append(
                        &thread,
                        &Vec::from_iter(snapshot.pending_messages.iter().cloned()),
                        fence,
                    )
                    .await
                    .map_err(ResumeError::Store)?;
            }
            if !fork {
                self.close_ended_record(&snapshot, checkpoint, fence).await;
            }
            return Err(ResumeError::NothingToResume {
                checkpoint,
                run: snapshot.run_id,
                status: snapshot.status,
            });
        }
        let definition = match &snapshot.workflow {
            Some(inline) => inline.to_string(),
            None => self
                .checkpoint_store()
                .get_workflow(&source, &snapshot.workflow_hash)
                .await
                .map_err(ResumeError::Store)?
                .ok_or_else(|| {
                    inconsistent(format!(
                        "its workflow definition {} is no longer stored",
                        snapshot.workflow_hash
                    ))
                })?,
        };
        let workflow = self
            .load_json(&definition)
            .map_err(|errors| ResumeError::Workflow { checkpoint, errors })?;
        let plan = workflow.plan().clone();
        check_graph(&plan.graph, &snapshot.graph, "").map_err(inconsistent)?;

        let mut answers = HashMap::new();
        match &input {
            ResumeInput::Answer {
                interaction_id,
                value,
            } => {
                let interaction = snapshot
                    .interactions
                    .iter()
                    .find(|i| i.id == *interaction_id)
                    .ok_or_else(|| ResumeError::UnknownInteraction {
                        checkpoint,
                        interaction: *interaction_id,
                        pending: snapshot.interactions.iter().map(|i| i.id).collect(),
                    })?;
                let output =
                    interaction
                        .kind
                        .accept(value)
                        .map_err(|error| ResumeError::InvalidAnswer {
                            interaction: *interaction_id,
                            error,
                        })?;
                answers.insert(interaction.path.clone(), output);
            }
            _ => {
                if let Some(interaction) = snapshot.interactions.first()
                    && snapshot.status == RunStatus::AwaitingInput
                {
                    return Err(ResumeError::AnswerRequired {
                        checkpoint,
                        interaction: Box::new(interaction.clone()),
                    });
                }
            }
        }

        if fork {
            self.copy_for_fork(&source, &thread, &stored, &snapshot, &definition, fence)
                .await?;
        }
        // Resumed from the thread's newest checkpoint, the run's checkpoints continue its chain
        // (a delta per stop and resume rather than a whole snapshot); see below.
        let seed = (!fork && matches!(from, ResumeFrom::Thread(_))).then(|| {
            Box::new(ChainSeed {
                thread: thread.clone(),
                chain,
                snapshot: snapshot.clone(),
            })
        });
        let mut history = self.load_history(&thread).await?;
        let mut produced = Vec::new();
        if !snapshot.pending_messages.is_empty() {
            // Messages the store refused at the stop: persist them now (idempotent), or keep
            // them with this run's messages so its end retries.
            match self
                .history_store()
                .append(
                    &thread,
                    &Vec::from_iter(snapshot.pending_messages.iter().cloned()),
                    fence,
                )
                .await
            {
                Ok(()) => history = self.load_history(&thread).await?,
                Err(e) => {
                    tracing::warn!(%thread, error = %e, "pending messages still not persisted");
                    produced.extend(snapshot.pending_messages);
                }
            }
        }
        let mut query = snapshot.query;
        if let ResumeInput::Instruction(text) = input {
            let mut message = Message::user(text.clone());
            message.run_id = Some(run_id);
            produced.push(message);
            query = Some(Value::String(text));
        }
        self.registry().forget_waiting(&thread);
        // The resume's span, parent of the new run's, links to the run it continues (whose
        // record keeps its place in its trace, even from another process).
        let span = tracing::info_span!(
            "resume",
            otel.name = "resume",
            runvisor.checkpoint.id = %checkpoint,
            runvisor.resumed_run.id = %snapshot.run_id,
            runvisor.run.id = %run_id,
            runvisor.thread.id = %thread,
            runvisor.worker.id = %self.services.worker.id,
            runvisor.resume.fork = fork,
        );
        // The run this resume answers (one paused at the thread's checkpoint, which the
        // resume continues in its thread): its record stops saying it waits once this run is
        // started.
        let answers_paused = !fork
            && snapshot.status == RunStatus::AwaitingInput
            && answering;
        let traced = self.services.trace.as_ref().filter(|_| !span.is_disabled());
        let resumed_record = if traced.is_some() || answers_paused {
            match self.services.runs.get(snapshot.run_id).await {
                Ok(record) => record,
                Err(e) => {
                    tracing::debug!(run = %snapshot.run_id, error = %e, "could not read the record of the run resumed");
                    None
                }
            }
        } else {
            None
        };
        if let Some((trace, traceparent)) = traced.zip(
            resumed_record
                .as_ref()
                .and_then(|record| record.traceparent.as_ref()),
        ) {
            trace.link(&span, traceparent);
        }
        let answered = resumed_record.filter(|record| {
            answers_paused
                && record.status == RunStatus::AwaitingInput
                && record.thread == thread
        });
        // The run's checkpoints sort after the one it continues and, on its own thread, after
        // the thread's newest, whatever the clock of the process that wrote those.
        let floor = match &from {
            ResumeFrom::Checkpoint { .. } => self
                .checkpoint_store()
                .latest(&thread)
                .await
                .map_err(ResumeError::Store)?
                .map_or(checkpoint, |newest| newest.id.max(checkpoint)),
            ResumeFrom::Thread(_) | ResumeFrom::Fork { .. } => checkpoint,
        };
        self.services.continue_after(run_id, floor);
        // The run's checkpoints continue the chain of the thread's newest checkpoint when it
        // resumed from that one. Not from an older one:
        // the chain would then interleave with newer checkpoints, which retention keeps only
        // from the oldest kept one's base on.
        if let Some(seed) = seed {
            self.services.continue_chain(run_id, seed);
        }
        let launching = span.clone();
        let launch = Launch {
            run_id,
            plan,
            inputs: snapshot.inputs,
            thread,
            history: Some(history),
            produced,
            restore: Some(Restore {
                graph: snapshot.graph,
                variables: snapshot.variables,
                query,
                parent_run_id: snapshot.run_id,
            }),
            answers,
            labels: match options.user {
                // Checked when it was set.
                Some(user) => snapshot
                    .labels
                    .clone()
                    .with_user(user)
                    .unwrap_or(snapshot.labels),
                None => snapshot.labels,
            },
            retry_failed: options.retry_failed,
            lease: hold.lease().clone(),
            started: None,
            answering: answered,
        };
        // Boxed, as a start's: the resume's future stays small.
        let launched = Box::pin(self.launch(launch))
            .instrument(launching)
            .await;
        if launched.is_err() {
            self.services.forget_chain(run_id);
        }
        let handle = launched?;
        Ok(handle)
        }
        .await;
        match result {
            Ok(handle) => {
                hold.hand_over();
                Ok(handle)
            }
            Err(e) => {
                hold.give_up().await;
                Err(e)
            }
        }
    }
}

impl Runtime {
    /// A run whose final checkpoint is stored but whose record was not (its worker died in
    /// between) still reads `running`, or `stopped (lease_lost)` once its thread was taken
    /// over: its record is set to how the checkpoint says it ended. A failure only leaves the
    /// record as it was.
    async fn close_ended_record(
        &self,
        snapshot: &Snapshot,
        checkpoint: CheckpointId,
        fence: Option<Fence>,
    ) {
        let run = snapshot.run_id;
        let mut record = match self.run_store().get(run).await {
            Ok(Some(record)) => record,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(%run, error = %e, "could not read the record of a run that ended");
                return;
            }
        };
        let unfinished = record.status == RunStatus::Running
            || (record.status == RunStatus::Stopped
                && record.stop_reason.as_deref() == Some(StopReason::LeaseLost.as_str()));
        if !unfinished {
            return;
        }
        record.status = snapshot.status;
        record.stop_reason = snapshot.stop_reason.map(|r| r.as_str().to_owned());
        record.checkpoint_id = Some(checkpoint);
        record.finished_at_ms = Some(record.finished_at_ms.unwrap_or(snapshot.created_at_ms));
        if let Err(e) = self.run_store().put(&record, fence).await {
            tracing::warn!(%run, error = %e, "could not record how a run that ended ended");
        }
    }

    /// The record of a paused run a resume answered, when it did not go with the resumed run's
    /// (`by`) first record ([`RunStore::put_answering`](crate::store::RunStore::put_answering)):
    /// `awaiting_input` becomes `answered`, written with the resumed run's token. A store
    /// failing for a moment is tried again until the store deadline; one still failing then
    /// is tried on in the background (the resumed run goes on meanwhile) for up to
    /// [`ANSWERED_RETRY_FOR`], so the paused run is not left listed as waiting once the store
    /// is back. A refusal (another run took the thread since) ends the trying: the record
    /// then keeps saying it waits.
    pub(super) async fn close_answered(
        &self,
        mut record: RunRecord,
        by: RunId,
        fence: Option<Fence>,
    ) {
        let run = record.run_id;
        record.status = RunStatus::Answered;
        let deadline = tokio::time::Instant::now() + self.config().store_deadline;
        let runs = self.run_store();
        let gave_up = match retry::until(deadline, || runs.put(&record, fence)).await {
            Ok(()) => return,
            Err(gave_up) => gave_up,
        };
        if !gave_up.error.is_transient() {
            tracing::warn!(%run, resumed_by = %by, error = %gave_up.error, "could not record that the paused run was answered");
            return;
        }
        tracing::warn!(%run, resumed_by = %by, error = %gave_up.error, "could not record yet that the paused run was answered; trying on in the background");
        let runs = runs.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + ANSWERED_RETRY_FOR;
            match retry::until(deadline, || runs.put(&record, fence)).await {
                Ok(()) => {
                    tracing::info!(%run, resumed_by = %by, "recorded that the paused run was answered");
                }
                Err(gave_up) => {
                    tracing::warn!(%run, resumed_by = %by, error = %gave_up.error, attempts = gave_up.attempts, "could not record that the paused run was answered");
                }
            }
        });
    }

    /// The interactions the checkpoint a resume would start from waits for (the newest of the
    /// thread, or the named one; for a fork, the named one of the source thread): what an
    /// answer must quote. Empty when it waits for none.
    pub async fn pending_interactions(
        &self,
        from: impl Into<ResumeFrom>,
    ) -> Result<Vec<Interaction>, ResumeError> {
        let from = from.into();
        let (thread, stored) = match &from {
            ResumeFrom::Thread(thread) => (
                thread,
                self.checkpoint_store()
                    .latest(thread)
                    .await
                    .map_err(ResumeError::Store)?,
            ),
            ResumeFrom::Checkpoint { thread, checkpoint }
            | ResumeFrom::Fork {
                thread, checkpoint, ..
            } => (
                thread,
                self.checkpoint_store()
                    .get(thread, *checkpoint)
                    .await
                    .map_err(ResumeError::Store)?,
            ),
        };
        let stored = match (stored, &from) {
            (Some(stored), _) => stored,
            (
                None,
                ResumeFrom::Checkpoint { checkpoint, .. } | ResumeFrom::Fork { checkpoint, .. },
            ) => {
                return Err(ResumeError::CheckpointNotFound {
                    thread: thread.clone(),
                    checkpoint: *checkpoint,
                });
            }
            (None, _) => return Err(ResumeError::NoCheckpoint(thread.clone())),
        };
        let snapshot = materialize(self.checkpoint_store().as_ref(), thread, &stored)
            .await
            .map_err(|e| match e {
                MaterializeError::Store(e) => ResumeError::Store(e),
                MaterializeError::Snapshot(error) => ResumeError::Corrupt {
                    checkpoint: stored.id,
                    error,
                },
            })?;
        Ok(snapshot.interactions)
    }
}
