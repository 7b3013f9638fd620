//! `RunSupervisor`: one actor per run. It owns the run's state (schedule, outputs, variables,
//! messages), spawns a linked [`NodeActor`](crate::node) per ready node, learns of every
//! child's end through supervision, and persists the run's end once.
//!
//! The default ractor supervisor handler stops the parent when any child exits; this one
//! overrides it: a child's normal exit is a node completion, its failure a node failure.
//!
//! Stopping never blocks the mailbox. A stop (or a node failure) puts the run in *stopping*:
//! no node starts any more, every running node's stop flag is raised (and, when forced, its
//! handler aborted), and each node hands its report over as it ends. When the last child has
//! reported, the run persists once (history, checkpoint, run record) and publishes its
//! outcome. Meanwhile a second stop can escalate graceful to force, and timers bound both.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::event::{NodePath, RunEvent};
use crate::handler::{NodeContext, NodeError, RunInfo};
use crate::ids::{CheckpointId, NodeId, RunId};
use crate::message::{Message, now_ms};
use crate::node::{NodeActor, NodeArgs, NodeEnd, NodeMsg, NodeReport, NodeStatus};
use crate::outcome::{HistoryFlush, RunError, RunOutcome};
use crate::probe::ProbeStop;
use crate::reference::{NodeLookup, Scope};
use crate::registry::{ActorTree, LiveRun, LiveState};
use crate::runtime::Services;
use crate::scheduler::{NodeIndex, Schedule};
use crate::snapshot::{CompletedNode, Snapshot};
use crate::stop::{Interrupted, StopMode, StopReason, StopResult};
use crate::store::{RunRecord, StoredCheckpoint};
use crate::value::{Map, Value};
use crate::workflow::Plan;

/// How long aborted nodes get to hand over their reports before they are given up on.
const FORCE_GRACE: Duration = Duration::from_secs(2);

/// Messages a run supervisor handles.
#[derive(Debug)]
pub(crate) enum RunMsg {
    /// Report the run's actor tree, as each actor describes itself.
    Tree(RpcReplyPort<ActorTree>),
    /// Stop the run.
    Stop {
        /// Graceful or force.
        mode: StopMode,
        /// Why.
        reason: StopReason,
    },
    /// The graceful timeout passed: force the nodes still running.
    Escalate,
    /// Aborted nodes did not all report in time: give up on the rest.
    Deadline,
}

pub(crate) struct RunSupervisor;

/// A run continued from a snapshot.
pub(crate) struct Restore {
    pub(crate) schedule: Schedule,
    pub(crate) outputs: Vec<Option<Arc<Value>>>,
    pub(crate) variables: Map,
    pub(crate) query: Option<Value>,
    pub(crate) parent_run_id: RunId,
}

pub(crate) struct RunArgs {
    pub(crate) plan: Arc<Plan>,
    pub(crate) run: Arc<RunInfo>,
    pub(crate) services: Arc<Services>,
    pub(crate) history: Vec<Message>,
    pub(crate) produced: Vec<Message>,
    pub(crate) record: RunRecord,
    pub(crate) outcome: watch::Sender<Option<Arc<RunOutcome>>>,
    pub(crate) restore: Option<Restore>,
}

struct Child {
    node: NodeIndex,
    actor: ActorRef<NodeMsg>,
    stop: CancellationToken,
    report: oneshot::Receiver<NodeReport>,
}

/// Why the run is ending early.
enum Cause {
    Stop(StopReason),
    Failure(RunError),
}

/// A run on its way down.
struct Stopping {
    cause: Cause,
    /// Running nodes have been told to abort.
    forced: bool,
    interrupted: Vec<Interrupted>,
}

pub(crate) struct RunState {
    plan: Arc<Plan>,
    run: Arc<RunInfo>,
    services: Arc<Services>,
    live: Arc<Mutex<LiveState>>,
    schedule: Schedule,
    outputs: Vec<Option<Arc<Value>>>,
    variables: Map,
    sys: Map,
    /// The thread's history before this run, then this run's messages.
    history: Vec<Message>,
    /// The history as handed to nodes; rebuilt only when messages were added.
    history_view: Option<Arc<[Message]>>,
    /// This run's messages, persisted when it ends.
    produced: Vec<Message>,
    children: HashMap<ActorId, Child>,
    record: RunRecord,
    outcome: watch::Sender<Option<Arc<RunOutcome>>>,
    stopping: Option<Stopping>,
    /// Stop timers (escalation, deadline), cancelled when the run ends.
    timers: Vec<tokio::task::JoinHandle<()>>,
    sequence: u64,
    span: tracing::Span,
    ended: bool,
}

impl Scope for RunState {
    fn node_output(&self, node: &NodeId) -> NodeLookup<'_> {
        match self
            .plan
            .graph
            .index
            .get(node)
            .and_then(|&i| self.outputs[i].as_deref())
        {
            Some(v) => NodeLookup::Output(v),
            None => NodeLookup::DidNotRun,
        }
    }

    fn sys(&self, key: &str) -> Option<&Value> {
        self.sys.get(key)
    }

    fn env(&self, key: &str) -> Option<&Value> {
        self.variables.get(key)
    }
}

impl Actor for RunSupervisor {
    type Msg = RunMsg;
    type State = RunState;
    type Arguments = RunArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: RunArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let plan = args.plan;
        let run = args.run;
        let _ = run.supervisor.set(myself.clone());
        let (schedule, outputs, variables, query) = match args.restore {
            Some(r) => (r.schedule, r.outputs, r.variables, r.query),
            None => (
                Schedule::new(plan.graph.shape.clone()),
                vec![None; plan.graph.nodes.len()],
                plan.variables.clone(),
                run.inputs.get("query").cloned(),
            ),
        };
        let mut sys = Map::new();
        if let Some(query) = query {
            sys.insert("query".into(), query);
        }
        sys.insert("run_id".into(), Value::String(run.run_id.to_string()));
        sys.insert("thread_id".into(), Value::String(run.thread.to_string()));
        sys.insert("workflow_id".into(), Value::String(plan.def.id.clone()));
        let span = tracing::info_span!(
            "run",
            run_id = %run.run_id,
            thread = %run.thread,
            workflow = %plan.def.id,
        );
        let live = Arc::new(Mutex::new(LiveState {
            status: crate::store::RunStatus::Running,
            running: Default::default(),
        }));
        args.services.registry.insert(
            run.run_id,
            LiveRun {
                thread: run.thread.clone(),
                workflow_id: plan.def.id.clone(),
                started_at_ms: args.record.started_at_ms,
                state: live.clone(),
                supervisor: myself,
                outcome: args.outcome.subscribe(),
            },
        );
        let mut history = args.history;
        history.extend(args.produced.iter().cloned());
        Ok(RunState {
            schedule,
            outputs,
            variables,
            sys,
            history,
            history_view: None,
            produced: args.produced,
            children: HashMap::new(),
            plan,
            run,
            services: args.services,
            live,
            record: args.record,
            outcome: args.outcome,
            stopping: None,
            timers: Vec::new(),
            sequence: 0,
            span,
            ended: false,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        tracing::debug!(parent: &state.span, "run started");
        state.emit(RunEvent::RunStarted {
            run_id: state.run.run_id,
            thread: state.run.thread.clone(),
        });
        let ready: Vec<NodeIndex> = if state.record.parent_run_id.is_some() {
            state.schedule.ready().collect()
        } else {
            state.schedule.start().ready
        };
        state.launch(&myself, ready).await;
        state.settle(&myself).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RunMsg::Tree(reply) => state.answer_tree(&myself, reply),
            RunMsg::Stop { mode, reason } => {
                state.begin_stop(&myself, Cause::Stop(reason), mode);
                state.settle(&myself).await;
            }
            RunMsg::Escalate => state.escalate(&myself),
            RunMsg::Deadline => {
                state.abandon_children();
                state.settle(&myself).await;
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(mut child) = state.children.remove(&cell.get_id()) {
                    match child.report.try_recv() {
                        Ok(report) => state.on_report(&myself, report).await,
                        Err(_) => state.on_lost(&myself, child.node, "ended without a report"),
                    }
                }
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                if let Some(mut child) = state.children.remove(&cell.get_id()) {
                    if let Ok(report) = child.report.try_recv() {
                        state.keep_messages(report.messages);
                    }
                    state.on_lost(&myself, child.node, &format!("node actor failed: {error}"));
                }
            }
            _ => {}
        }
        state.settle(&myself).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped from outside (runtime teardown) before the run ended: nodes still running
        // are aborted and hand over what they hold, and the run records its end.
        if !state.ended {
            state.begin_stop(&myself, Cause::Stop(StopReason::Shutdown), StopMode::Force);
            let children: Vec<Child> = state.children.drain().map(|(_, c)| c).collect();
            for mut child in children {
                match tokio::time::timeout(FORCE_GRACE, &mut child.report).await {
                    Ok(Ok(report)) => state.absorb(report),
                    _ => {
                        child.actor.kill();
                        state.record_lost(child.node, "did not hand over its state in time");
                    }
                }
            }
            state.end_run().await;
        }
        Ok(())
    }
}

impl RunState {
    fn node_id(&self, node: NodeIndex) -> &NodeId {
        &self.plan.graph.nodes[node].id
    }

    fn path(&self, node: NodeIndex) -> NodePath {
        NodePath::node(self.node_id(node).clone())
    }

    fn live(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: RunEvent) {
        // No subscriber is fine.
        let _ = self.run.events.send(event);
    }

    fn probe(&self, ask: impl FnOnce(&dyn crate::probe::Probe) -> ProbeStop) -> ProbeStop {
        self.run.probe.as_deref().and_then(ask)
    }

    fn history_view(&mut self) -> Arc<[Message]> {
        self.history_view
            .get_or_insert_with(|| Arc::from(self.history.as_slice()))
            .clone()
    }

    fn keep_messages(&mut self, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        self.history.extend(messages.iter().cloned());
        self.produced.extend(messages);
        self.history_view = None;
    }

    /// Starts the given ready nodes, unless the run is stopping.
    async fn launch(&mut self, myself: &ActorRef<RunMsg>, ready: Vec<NodeIndex>) {
        for node in ready {
            if self.stopping.is_some() || self.ended {
                return;
            }
            let path = self.path(node);
            if let Some((mode, reason)) = self.probe(|p| p.before_node(self.run.run_id, &path)) {
                self.begin_stop(myself, Cause::Stop(reason), mode);
                return;
            }
            if let Err(error) = self.spawn_node(myself, node, path.clone()).await {
                self.node_failed(myself, path, error);
                return;
            }
            if let Some((mode, reason)) = self.probe(|p| p.node_started(self.run.run_id, &path)) {
                self.begin_stop(myself, Cause::Stop(reason), mode);
                return;
            }
        }
    }

    async fn spawn_node(
        &mut self,
        myself: &ActorRef<RunMsg>,
        node: NodeIndex,
        path: NodePath,
    ) -> Result<(), NodeError> {
        let input = self.plan.graph.nodes[node].params.resolve(self)?;
        let planned = &self.plan.graph.nodes[node];
        let (id, kind, handler) = (
            planned.id.clone(),
            planned.kind.clone(),
            planned.handler.clone(),
        );
        let stop = CancellationToken::new();
        let history = self.history_view();
        let ctx = NodeContext::new(
            self.run.clone(),
            id.clone(),
            path.clone(),
            stop.clone(),
            history,
        );
        let span = tracing::info_span!(parent: &self.span, "node", node_id = %id, kind = %kind);
        let (report_tx, report_rx) = oneshot::channel();
        let args = NodeArgs {
            node,
            handler,
            input,
            ctx,
            report: report_tx,
            span,
        };
        self.schedule
            .mark_running(node)
            .map_err(|e| NodeError::Failed(format!("scheduler: {e}")))?;
        // Announced before the spawn: the handler may stream as soon as it is spawned.
        self.live().running.insert(id);
        self.emit(RunEvent::NodeStarted { path, kind });
        let spawned = Actor::spawn_linked(None, NodeActor, args, myself.get_cell()).await;
        let (actor, _) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                let _ = self.schedule.requeue(node);
                return Err(NodeError::Failed(format!(
                    "could not spawn node actor: {e}"
                )));
            }
        };
        self.children.insert(
            actor.get_id(),
            Child {
                node,
                actor,
                stop,
                report: report_rx,
            },
        );
        Ok(())
    }

    /// A child ended and handed over its report.
    async fn on_report(&mut self, myself: &ActorRef<RunMsg>, report: NodeReport) {
        let node = report.node;
        let path = self.path(node);
        if let (None, Some((mode, reason))) = (&self.stopping, report.requested_stop) {
            // A probe stopped this node at a chunk and sent the run a stop that is still in
            // the mailbox (ractor hands over supervision events before messages): apply it
            // first, as if it had arrived first.
            self.begin_stop(myself, Cause::Stop(reason), mode);
        }
        match report.end {
            NodeEnd::Completed(output) => {
                self.live().running.remove(self.node_id(node));
                self.keep_messages(report.messages);
                let value = Arc::new(output.value);
                self.outputs[node] = Some(value.clone());
                for (name, v) in output.variables {
                    self.variables.insert(name, v);
                }
                self.emit(RunEvent::NodeFinished {
                    path: path.clone(),
                    output: value,
                });
                let step = match self.schedule.complete(node, &output.route) {
                    Ok(step) => step,
                    Err(e) => {
                        let error = RunError::Supervisor(format!("scheduler: {e}"));
                        self.begin_stop(myself, Cause::Failure(error), StopMode::Force);
                        return;
                    }
                };
                for skipped in step.skipped {
                    let path = self.path(skipped);
                    self.emit(RunEvent::NodeSkipped { path });
                }
                if self.stopping.is_none() {
                    if let Some((mode, reason)) =
                        self.probe(|p| p.node_completed(self.run.run_id, &path))
                    {
                        self.begin_stop(myself, Cause::Stop(reason), mode);
                    }
                }
                self.launch(myself, step.ready).await;
            }
            NodeEnd::Failed(error) if self.stopping.is_none() => {
                self.live().running.remove(self.node_id(node));
                self.keep_messages(report.messages);
                self.keep_partial(node, &report.partial);
                let _ = self.schedule.requeue(node);
                self.node_failed(myself, path, error);
            }
            NodeEnd::Interrupted { .. } if self.stopping.is_none() => {
                let error = NodeError::Failed("interrupted without a stop request".into());
                self.absorb(NodeReport {
                    end: NodeEnd::Failed(error.clone()),
                    ..report
                });
                self.node_failed(myself, path, error);
            }
            _ => self.absorb(report),
        }
    }

    /// Records the report of a node cut short by the stop: its messages and partial text are
    /// kept and it goes back to the frontier, to run again on resume.
    fn absorb(&mut self, report: NodeReport) {
        let node = report.node;
        self.live().running.remove(self.node_id(node));
        self.keep_messages(report.messages);
        let partial = self.keep_partial(node, &report.partial);
        let (forced, error) = match report.end {
            NodeEnd::Interrupted { forced } => (forced, None),
            NodeEnd::Failed(e) => (false, Some(e.to_string())),
            NodeEnd::Completed(_) => (false, None),
        };
        let _ = self.schedule.requeue(node);
        let path = self.path(node);
        self.emit(RunEvent::NodeInterrupted {
            path: path.clone(),
            forced,
        });
        if let Some(stopping) = &mut self.stopping {
            stopping.interrupted.push(Interrupted {
                path,
                forced,
                partial,
                chunks: report.chunks,
                error,
            });
        }
    }

    /// Keeps streamed text of a node that did not complete as a truncated assistant message.
    fn keep_partial(&mut self, node: NodeIndex, partial: &str) -> Option<String> {
        if partial.is_empty() {
            return None;
        }
        let mut message = Message::assistant(partial);
        message.truncated = true;
        message.run_id = Some(self.run.run_id);
        message.node_id = Some(self.node_id(node).clone());
        self.keep_messages(vec![message]);
        Some(partial.to_owned())
    }

    /// A child ended without handing over a report (killed or crashed): what it held is lost,
    /// which is recorded and fails the run unless it is stopping anyway.
    fn on_lost(&mut self, myself: &ActorRef<RunMsg>, node: NodeIndex, why: &str) {
        if self.stopping.is_some() {
            self.record_lost(node, why);
            return;
        }
        self.live().running.remove(self.node_id(node));
        let _ = self.schedule.requeue(node);
        let path = self.path(node);
        self.node_failed(myself, path, NodeError::Failed(why.to_owned()));
    }

    fn record_lost(&mut self, node: NodeIndex, why: &str) {
        tracing::error!(parent: &self.span, node = %self.node_id(node), why, "node output lost");
        self.live().running.remove(self.node_id(node));
        let _ = self.schedule.requeue(node);
        let path = self.path(node);
        self.emit(RunEvent::NodeInterrupted {
            path: path.clone(),
            forced: true,
        });
        if let Some(stopping) = &mut self.stopping {
            stopping.interrupted.push(Interrupted {
                path,
                forced: true,
                partial: None,
                chunks: 0,
                error: Some(format!("node {why}; what it held is lost")),
            });
        }
    }

    fn node_failed(&mut self, myself: &ActorRef<RunMsg>, path: NodePath, error: NodeError) {
        tracing::warn!(parent: &self.span, node = %path, %error, "node failed");
        self.emit(RunEvent::NodeFailed {
            path: path.clone(),
            error: error.to_string(),
        });
        self.begin_stop(
            myself,
            Cause::Failure(RunError::Node { path, error }),
            StopMode::Force,
        );
    }

    /// Puts the run into stopping (or escalates a graceful stop in progress to force).
    fn begin_stop(&mut self, myself: &ActorRef<RunMsg>, cause: Cause, mode: StopMode) {
        if self.ended {
            return;
        }
        if self.stopping.is_some() {
            if mode == StopMode::Force {
                self.escalate(myself);
            }
            return;
        }
        if let Cause::Stop(reason) = &cause {
            tracing::info!(parent: &self.span, %reason, ?mode, "stopping");
            self.emit(RunEvent::Stopping { reason: *reason });
        }
        self.stopping = Some(Stopping {
            cause,
            forced: false,
            interrupted: Vec::new(),
        });
        for child in self.children.values() {
            child.stop.cancel();
        }
        match mode {
            StopMode::Force => self.escalate(myself),
            StopMode::Graceful { timeout } if !self.children.is_empty() => {
                self.timer(myself, timeout, || RunMsg::Escalate);
            }
            StopMode::Graceful { .. } => {}
        }
    }

    /// Aborts every node still running.
    fn escalate(&mut self, myself: &ActorRef<RunMsg>) {
        let Some(stopping) = &mut self.stopping else {
            return;
        };
        if stopping.forced || self.ended {
            return;
        }
        stopping.forced = true;
        for child in self.children.values() {
            child.stop.cancel();
            let _ = child.actor.send_message(NodeMsg::Abort);
        }
        if !self.children.is_empty() {
            self.timer(myself, FORCE_GRACE, || RunMsg::Deadline);
        }
    }

    /// Sends a message to this run after a delay, unless the run has ended by then.
    fn timer(&mut self, myself: &ActorRef<RunMsg>, after: Duration, msg: fn() -> RunMsg) {
        let me = myself.clone();
        self.timers.push(tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = me.send_message(msg());
        }));
    }

    /// Gives up on children that did not report after being aborted.
    fn abandon_children(&mut self) {
        let children: Vec<Child> = self.children.drain().map(|(_, c)| c).collect();
        for mut child in children {
            match child.report.try_recv() {
                Ok(report) => self.absorb(report),
                Err(_) => {
                    child.actor.kill();
                    self.record_lost(child.node, "did not hand over its state after an abort");
                }
            }
        }
    }

    /// Ends the run when there is nothing left to wait for.
    async fn settle(&mut self, myself: &ActorRef<RunMsg>) {
        if self.ended || !self.children.is_empty() {
            return;
        }
        if self.stopping.is_some() || self.schedule.is_done() {
            self.end_run().await;
            myself.stop(None);
        }
    }

    /// Persists the run's end once: history, checkpoint, run record; publishes the outcome.
    async fn end_run(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        for timer in self.timers.drain(..) {
            timer.abort();
        }
        let stopping = self.stopping.take();
        let history = self.persist_history().await;
        let (status, stop_reason) = match stopping.as_ref().map(|s| &s.cause) {
            None => (crate::store::RunStatus::Succeeded, None),
            Some(Cause::Failure(_)) => (crate::store::RunStatus::Failed, None),
            Some(Cause::Stop(reason)) => (reason.status(), Some(*reason)),
        };
        let (checkpoint_id, checkpoint_error) = match self
            .write_checkpoint(status, stop_reason, &history)
            .await
        {
            Ok(id) => (Some(id), None),
            Err(e) => {
                tracing::error!(parent: &self.span, error = %e, "could not write the final checkpoint");
                (None, Some(e))
            }
        };
        let outputs: BTreeMap<NodeId, Value> = self
            .outputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((self.node_id(i).clone(), Value::clone(v.as_ref()?))))
            .collect();
        let run_id = self.run.run_id;
        let outcome = match stopping {
            None => RunOutcome::Completed {
                run_id,
                outputs,
                variables: self.variables.clone(),
                history,
            },
            Some(Stopping {
                cause: Cause::Failure(error),
                ..
            }) => RunOutcome::Failed {
                run_id,
                error,
                outputs,
                history,
            },
            Some(Stopping {
                cause: Cause::Stop(reason),
                interrupted,
                ..
            }) => {
                let partial: Vec<&str> = interrupted
                    .iter()
                    .filter_map(|i| i.partial.as_deref())
                    .collect();
                let partial_response = (!partial.is_empty()).then(|| partial.join("\n"));
                RunOutcome::Stopped(StopResult {
                    run_id,
                    reason,
                    forced: interrupted
                        .iter()
                        .filter(|i| i.forced)
                        .filter_map(|i| i.path.leaf().cloned())
                        .collect(),
                    finished: self
                        .schedule
                        .completions()
                        .iter()
                        .map(|(n, _)| self.node_id(*n).clone())
                        .collect(),
                    frontier: self.frontier(),
                    interrupted,
                    outputs,
                    partial_response,
                    messages: history,
                    checkpoint_id,
                    checkpoint_error: checkpoint_error.clone(),
                })
            }
        };
        self.record.status = status;
        self.record.finished_at_ms = Some(now_ms());
        self.record.checkpoint_id = checkpoint_id.or(self.record.checkpoint_id);
        self.record.stop_reason = stop_reason.map(|r| r.as_str().to_owned());
        self.record.failure_reason = outcome.error().map(ToString::to_string);
        self.record.unpersisted = outcome.history().error.as_ref().map(|e| {
            format!(
                "{} message(s) not persisted: {e}",
                outcome.history().not_persisted.len()
            )
        });
        if let Some(e) = checkpoint_error {
            let note = format!("checkpoint not written: {e}");
            self.record.unpersisted = Some(match self.record.unpersisted.take() {
                Some(prev) => format!("{prev}; {note}"),
                None => note,
            });
        }
        if let Err(e) = self.services.runs.put(&self.record).await {
            tracing::error!(parent: &self.span, error = %e, "could not record the run's end");
        }
        self.live().status = status;
        self.live().running.clear();
        tracing::info!(parent: &self.span, %status, "run ended");
        self.services.registry.remove(&run_id);
        self.outcome.send_replace(Some(Arc::new(outcome)));
        self.emit(RunEvent::RunFinished { run_id, status });
    }

    fn frontier(&self) -> Vec<NodeId> {
        self.schedule
            .ready()
            .map(|n| self.node_id(n).clone())
            .collect()
    }

    async fn persist_history(&mut self) -> HistoryFlush {
        let messages = std::mem::take(&mut self.produced);
        if messages.is_empty() {
            return HistoryFlush::default();
        }
        match self
            .services
            .history
            .append(&self.run.thread, &messages)
            .await
        {
            Ok(()) => HistoryFlush {
                persisted: messages,
                ..HistoryFlush::default()
            },
            Err(e) => {
                tracing::error!(
                    parent: &self.span,
                    error = %e,
                    count = messages.len(),
                    "history store refused the run's messages"
                );
                HistoryFlush {
                    persisted: Vec::new(),
                    not_persisted: messages,
                    error: Some(e.to_string()),
                }
            }
        }
    }

    /// Writes a snapshot of the run; messages the history store refused travel in it, so a
    /// resume persists them.
    async fn write_checkpoint(
        &mut self,
        status: crate::store::RunStatus,
        stop_reason: Option<StopReason>,
        history: &HistoryFlush,
    ) -> Result<CheckpointId, String> {
        self.sequence += 1;
        let snapshot = Snapshot {
            run_id: self.run.run_id,
            parent_run_id: self.record.parent_run_id,
            thread: self.run.thread.clone(),
            sequence: self.sequence,
            created_at_ms: now_ms(),
            status,
            stop_reason,
            workflow: self.plan.def_json(),
            inputs: Map::clone(&self.run.inputs),
            query: self.sys.get("query").cloned(),
            variables: self.variables.clone(),
            completed: self
                .schedule
                .completions()
                .iter()
                .map(|(n, route)| CompletedNode {
                    node: self.node_id(*n).clone(),
                    route: route.clone(),
                    output: self.outputs[*n].as_deref().cloned().unwrap_or_default(),
                })
                .collect(),
            frontier: self.frontier(),
            pending_messages: history.not_persisted.clone(),
        };
        let bytes = snapshot.encode().map_err(|e| e.to_string())?;
        let id = CheckpointId::new();
        self.services
            .checkpoints
            .put(
                &self.run.thread,
                StoredCheckpoint {
                    id,
                    run: self.run.run_id,
                    sequence: self.sequence,
                    bytes,
                },
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(id)
    }

    /// Answers a tree query without blocking the run: each node actor is asked in a task.
    fn answer_tree(&self, myself: &ActorRef<RunMsg>, reply: RpcReplyPort<ActorTree>) {
        let children: Vec<(NodeId, ActorRef<NodeMsg>)> = self
            .children
            .values()
            .map(|c| (self.node_id(c.node).clone(), c.actor.clone()))
            .collect();
        let timeout = self.services.config.query_timeout;
        let status = if self.stopping.is_some() {
            "stopping".to_owned()
        } else {
            self.live().status.to_string()
        };
        let me = ActorTree {
            actor_id: myself.get_id().to_string(),
            kind: "run_supervisor",
            node_id: None,
            status,
            children: Vec::new(),
        };
        tokio::spawn(async move {
            let mut tree = me;
            for (node_id, actor) in children {
                let status = match actor.call(NodeMsg::Describe, Some(timeout)).await {
                    Ok(ractor::rpc::CallResult::Success(NodeStatus::Running)) => "running",
                    Ok(ractor::rpc::CallResult::Success(NodeStatus::Stopping)) => "stopping",
                    _ => "unresponsive",
                };
                tree.children.push(ActorTree {
                    actor_id: actor.get_id().to_string(),
                    kind: "node",
                    node_id: Some(node_id),
                    status: status.to_owned(),
                    children: Vec::new(),
                });
            }
            tree.children.sort_by(|a, b| a.node_id.cmp(&b.node_id));
            let _ = reply.send(tree);
        });
    }
}
