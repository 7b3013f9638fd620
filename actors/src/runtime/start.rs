//! Starting a run: inputs checked against the workflow, the run recorded, its supervisor
//! spawned. A resume starts its run the same way, from a checkpoint.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use ractor::Actor;
use tokio::sync::watch;

use super::errors::StartError;
use super::facade::Runtime;
use super::handle::RunHandle;
use super::hold::HoldError;
use super::trace::MAX_TRACEPARENT;
use crate::exec::{LiveState, Restore, RunArgs, RunInfo, RunSupervisor};
use crate::kinds::Kinds;
use crate::kinds::RunScope;
use crate::model::{
    Lease, MAX_DEPTH, Map, Message, NodePath, RunId, RunLabels, RunRecord, RunStatus, StoreError,
    ThreadId, Value, now_ms,
};
use crate::persist::{HistoryTail, WatchedKeys};
use crate::workflow::{GraphPlan, NodeSpec, Plan, Workflow};

impl Runtime {
    /// Starts a run of a validated workflow on a thread.
    ///
    /// `inputs` are checked against the inputs the `begin` node declares (defaults applied);
    /// an input named `query` is also `{{sys.query}}` and is recorded as the user's message.
    pub async fn start(
        &self,
        workflow: &Workflow,
        inputs: Map,
        thread: ThreadId,
    ) -> Result<RunHandle, StartError> {
        self.start_with(workflow, inputs, thread, RunLabels::default())
            .await
    }

    /// Starts a run with labels: the app, chat and task ids its stop and cancel flags are
    /// named by, so any process can stop it (see [`SignalConfig`](crate::SignalConfig)).
    ///
    /// Fails with [`StartError::ThreadBusy`] while another run of the thread is starting or
    /// live in this process, with [`StartError::InputTooDeep`] for an input nested past the
    /// limit (the inputs count as one object nesting at most [`MAX_DEPTH`] levels), and with
    /// [`StartError::History`] when the thread's history cannot be read: it is read while the
    /// run is recorded, so the run's record then says it failed, and why.
    pub async fn start_with(
        &self,
        workflow: &Workflow,
        inputs: Map,
        thread: ThreadId,
        labels: RunLabels,
    ) -> Result<RunHandle, StartError> {
        let inputs = check_depth(inputs)?;
        // Checked before the thread is held: a start refused for its inputs holds nothing.
        let inputs = workflow
            .check_inputs(inputs)
            .map_err(|e| StartError::InvalidInput {
                input: e.input,
                problem: e.problem,
            })?;
        let plan = workflow.plan().clone();
        if let Some(kind) = missing_kind(&plan.graph, &self.kinds) {
            return Err(StartError::UnknownKind(kind));
        }
        let run_id = RunId::new();
        let span = self.run_span(&plan, &thread, run_id, None);
        // The run's first record goes with its lease where a start store takes both at once.
        let mut record = self.first_record(run_id, &thread, &plan, None, &labels, &span);
        // The workflow's definition goes out while the thread is taken (the two share one
        // round trip): it is stored by its hash, the same whatever run writes it, and needs no
        // lease; a start refused for a busy thread leaves it to expire.
        let (workflow_hash, definition) = (plan.def_hash(), plan.def_json());
        let (held, workflow) = tokio::join!(
            self.hold_thread(&thread, run_id, None, Some(&record)),
            self.services
                .checkpoints
                .put_workflow(&thread, &workflow_hash, &definition)
        );
        let mut hold = match held {
            Ok(hold) => hold,
            Err(e) => {
                let error = match e {
                    HoldError::Busy { run, worker } => StartError::ThreadBusy {
                        thread: thread.clone(),
                        run,
                        worker,
                    },
                    HoldError::Store(error) => StartError::Lease {
                        thread: thread.clone(),
                        error,
                    },
                };
                // The span was made before the thread was held (its record names it): a
                // start refused there ends it as an error, saying why.
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_description", error.to_string());
                return Err(error);
            }
        };
        record.fence = Some(hold.lease().fence.0);
        if let Some(newest) = hold.newest_checkpoint {
            self.services.continue_after(run_id, newest);
        }
        let started = Started {
            span,
            record,
            begun: hold.begun.take(),
            workflow,
        };
        let mut produced = Vec::new();
        if let Some(Value::String(query)) = inputs.get("query")
            && !query.is_empty()
        {
            let mut message = Message::user(query.clone());
            message.run_id = Some(run_id);
            produced.push(message);
        }
        // Boxed: a start's future would otherwise carry the launch's inline, and a caller
        // that keeps it on its stack (a `block_on`) carries all of it.
        let result = Box::pin(self.launch(Launch {
            run_id,
            plan,
            inputs,
            thread,
            history: None,
            produced,
            restore: None,
            answers: HashMap::new(),
            labels,
            retry_failed: false,
            lease: hold.lease().clone(),
            started: Some(started),
            answering: None,
        }))
        .await;
        match result {
            Ok(handle) => {
                hold.hand_over();
                Ok(handle)
            }
            Err(e) => {
                self.services.forget_chain(run_id);
                hold.give_up().await;
                Err(e)
            }
        }
    }

    /// The thread's history as a run reads it at its start: its newest messages, within the
    /// runtime's [`history_window`](crate::RuntimeConfig::history_window).
    pub(crate) async fn load_history(&self, thread: &ThreadId) -> Result<HistoryTail, StartError> {
        self.services
            .history
            .load_tail(thread, self.services.config.history_window)
            .await
            .map_err(|error| StartError::History {
                thread: thread.clone(),
                error,
            })
    }

    /// The span of a run: a child of the span current here (a request's, a resume's), so a
    /// run started within a trace joins it. Its lease's token is recorded once it is held.
    fn run_span(
        &self,
        plan: &Plan,
        thread: &ThreadId,
        run_id: RunId,
        parent: Option<RunId>,
    ) -> tracing::Span {
        let workflow_id = &plan.def.id;
        tracing::info_span!(
            "run",
            otel.name = format!("invoke_workflow {workflow_id}"),
            gen_ai.operation.name = "invoke_workflow",
            gen_ai.conversation.id = %thread,
            runvisor.run.id = %run_id,
            runvisor.thread.id = %thread,
            runvisor.workflow.id = %workflow_id,
            runvisor.worker.id = %self.services.worker.id,
            runvisor.lease.fence = tracing::field::Empty,
            runvisor.run.resumed_from = parent.map(|p| p.to_string()),
            runvisor.run.status = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        )
    }

    /// A run's first record: running, started now, on this worker, naming `span` as its
    /// trace; its fence is set once its lease is held.
    fn first_record(
        &self,
        run_id: RunId,
        thread: &ThreadId,
        plan: &Plan,
        parent: Option<RunId>,
        labels: &RunLabels,
        span: &tracing::Span,
    ) -> RunRecord {
        let traceparent = self
            .services
            .trace
            .as_ref()
            .and_then(|trace| trace.traceparent(span))
            .filter(|t| t.len() <= MAX_TRACEPARENT);
        RunRecord {
            run_id,
            thread: thread.clone(),
            workflow_id: plan.def.id.clone(),
            status: RunStatus::Running,
            parent_run_id: parent,
            checkpoint_id: None,
            started_at_ms: now_ms(),
            finished_at_ms: None,
            failure_reason: None,
            stop_reason: None,
            unpersisted: None,
            labels: labels.clone(),
            not_resumable: None,
            worker: Some(self.services.worker.id.clone()),
            fence: None,
            traceparent,
        }
    }

    /// Records and spawns a run.
    pub(crate) async fn launch(&self, launch: Launch) -> Result<RunHandle, StartError> {
        let Launch {
            run_id,
            plan,
            inputs,
            thread,
            history,
            produced,
            restore,
            answers,
            labels,
            retry_failed,
            lease,
            started,
            answering,
        } = launch;
        if let Some(kind) = missing_kind(&plan.graph, &self.kinds) {
            return Err(StartError::UnknownKind(kind));
        }
        let parent = restore.as_ref().map(|r| r.parent_run_id);
        let (span, mut record, begun, workflow) = match started {
            Some(Started {
                span,
                record,
                begun,
                workflow,
            }) => (span, record, begun, Some(workflow)),
            None => {
                let span = self.run_span(&plan, &thread, run_id, parent);
                let record = self.first_record(run_id, &thread, &plan, parent, &labels, &span);
                (span, record, None, None)
            }
        };
        record.fence = Some(lease.fence.0);
        let fence = lease.fence;
        span.record("runvisor.lease.fence", lease.fence.0);
        let workflow_id = record.workflow_id.clone();
        // The record and, for a new run, the thread's history (unless both went with the
        // lease), and the workflow's definition (unless it went beside the lease) go at once
        // (the definition is stored once per thread, by hash; if it cannot be stored, each
        // snapshot carries it instead). The history is read under the lease, as every write to
        // it is fenced by it.
        let workflow_hash = plan.def_hash();
        let recorded = begun.is_some();
        let (recorded, workflow_stored, history) = tokio::join!(
            async {
                if recorded {
                    return Ok(None);
                }
                match &answering {
                    None => self
                        .services
                        .runs
                        .put(&record, Some(lease.fence))
                        .await
                        .map(|()| None),
                    Some(paused) => {
                        let answered = RunRecord {
                            status: RunStatus::Answered,
                            ..paused.clone()
                        };
                        let written = self
                            .services
                            .runs
                            .put_answering(&record, &answered, Some(lease.fence))
                            .await?;
                        Ok(written.err().map(|e| (answered, e)))
                    }
                }
            },
            async {
                match workflow {
                    Some(stored) => stored,
                    None => {
                        let definition = plan.def_json();
                        self.services
                            .checkpoints
                            .put_workflow(&thread, &workflow_hash, &definition)
                            .await
                    }
                }
            },
            async {
                match (begun, history) {
                    (Some(read), _) => read.map_err(|error| StartError::History {
                        thread: thread.clone(),
                        error,
                    }),
                    (None, Some(history)) => Ok(history),
                    (None, None) => self.load_history(&thread).await,
                }
            }
        );
        // The paused run's `answered`, when it did not go with the record, is written on its
        // own (in the background past the store deadline) once the run is up.
        let unanswered = recorded.map_err(StartError::RunStore)?;
        let history = match history {
            Ok(history) => history,
            Err(error) => {
                // The record went out beside the read: it says the run failed before its first
                // node, and why. Should that write fail too, the record says running under a
                // lease about to be released, as after a crash before the first checkpoint.
                let failed = RunRecord {
                    status: RunStatus::Failed,
                    finished_at_ms: Some(now_ms()),
                    failure_reason: Some(error.to_string()),
                    ..record
                };
                if let Err(e) = self.services.runs.put(&failed, Some(lease.fence)).await {
                    tracing::warn!(%thread, %run_id, error = %e, "could not record that the run failed to start");
                }
                return Err(error);
            }
        };
        let workflow_stored = match workflow_stored {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%thread, error = %e, "workflow definition not stored apart; snapshots will carry it");
                false
            }
        };
        // A stop or cancel meant for an earlier run of these labels (set while none ran) must
        // not stop this one: the flags named after the labels alone are cleared first, as
        // FastGPT does. A failure only leaves them (the request would have timed out anyway).
        let stale = WatchedKeys::by_labels(&self.services.config.signals, &labels);
        if !stale.is_empty()
            && let Err(e) = self
                .services
                .signals
                .clear(&stale, Some((&thread, lease.fence)))
                .await
        {
            tracing::warn!(%thread, %run_id, error = %e, "could not clear stale stop flags");
        }
        let (events, first_rx) = crate::kinds::events::channel(self.services.config.event_buffer);
        let (outcome_tx, outcome_rx) = watch::channel(None);
        let run = Arc::new(RunInfo {
            run_id,
            thread: thread.clone(),
            scope: Arc::new(RunScope {
                run_id,
                thread: thread.clone(),
                inputs: Arc::new(inputs),
                events: events.clone(),
                probe: self.probe.clone(),
                stop: OnceLock::new(),
            }),
            supervisor: OnceLock::new(),
            answers,
            kinds: self.kinds.clone(),
            live: Arc::new(std::sync::Mutex::new(LiveState {
                status: RunStatus::Running,
                running: Default::default(),
                waiting_for_storage: false,
            })),
            signal_keys: WatchedKeys::for_run(
                &self.services.config.signals,
                &labels,
                &thread,
                run_id,
            ),
            labels,
            services: self.services.clone(),
            retry_failed,
            lease,
        });
        let args = RunArgs {
            plan,
            run,
            history,
            produced,
            record,
            outcome: outcome_tx,
            restore,
            workflow_hash,
            workflow_stored,
            span,
        };
        Actor::spawn(None, RunSupervisor, args)
            .await
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        if let Some((answered, error)) = unanswered {
            tracing::debug!(%thread, %run_id, paused = %answered.run_id, error = %error, "the paused run's `answered` did not go with the record; writing it on its own");
            self.close_answered(answered, run_id, Some(fence)).await;
        }
        Ok(RunHandle::new(
            run_id,
            thread,
            workflow_id,
            events,
            first_rx,
            outcome_rx,
            self.services.clone(),
        ))
    }
}

/// What `launch` needs to start a run.
pub(crate) struct Launch {
    pub(crate) run_id: RunId,
    pub(crate) plan: Arc<Plan>,
    pub(crate) inputs: Map,
    pub(crate) thread: ThreadId,
    /// The thread's history as read (within the runtime's window); `None`: read it while
    /// the run is recorded.
    pub(crate) history: Option<HistoryTail>,
    pub(crate) produced: Vec<Message>,
    pub(crate) restore: Option<Restore>,
    /// Answers to interactions, by the path of their node.
    pub(crate) answers: HashMap<NodePath, Value>,
    pub(crate) labels: RunLabels,
    /// Failed parallel items run again (a resume asked to retry failures).
    pub(crate) retry_failed: bool,
    /// The run's lease on its thread.
    pub(crate) lease: Lease,
    /// The run's span and first record, made before its thread was held; `None`: made here.
    pub(crate) started: Option<Started>,
    /// The record of the paused run this run answers (a resume's): written `answered` with
    /// the run's first record, in the same step where the run store can.
    pub(crate) answering: Option<RunRecord>,
}

/// A run's span and first record, made before its thread is held (a start store writes the
/// record with the lease).
pub(crate) struct Started {
    /// The run's span, which the record names.
    pub(crate) span: tracing::Span,
    /// The run's first record.
    pub(crate) record: RunRecord,
    /// Set when the record was written with the lease and the thread's history read, in one
    /// step ([`ThreadHold`]'s `begun`): the history, or why it could not be read.
    ///
    /// [`ThreadHold`]: super::hold::ThreadHold
    pub(crate) begun: Option<Result<HistoryTail, StoreError>>,
    /// Whether the workflow's definition was stored while the thread was taken, or why not.
    pub(crate) workflow: Result<(), StoreError>,
}

/// Refuses inputs that nest too deep: the inputs are one object (the `begin` node's output),
/// so each may nest one level less than [`MAX_DEPTH`]. Refused inputs are dismantled without
/// recursion.
fn check_depth(inputs: Map) -> Result<Map, StartError> {
    let limit = MAX_DEPTH - 1;
    let Some(input) = inputs
        .iter()
        .find(|(_, v)| v.check_depth_within(limit).is_err())
        .map(|(name, _)| name.clone())
    else {
        return Ok(inputs);
    };
    Value::Object(inputs).dismantle();
    Err(StartError::InputTooDeep { input, limit })
}

/// The first kind of a graph (bodies included) this runtime has no handler for.
fn missing_kind(graph: &GraphPlan, kinds: &Kinds) -> Option<String> {
    graph.nodes.iter().find_map(|node| {
        if kinds.get(&node.kind).is_none() {
            return Some(node.kind.to_string());
        }
        match &node.spec {
            NodeSpec::Loop(l) => missing_kind(&l.body, kinds),
            NodeSpec::Parallel(p) => missing_kind(&p.body, kinds),
            _ => None,
        }
    })
}
