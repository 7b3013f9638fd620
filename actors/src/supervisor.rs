//! `RunSupervisor`: one actor per run. It owns the run's state (schedule, outputs, variables,
//! messages), spawns a linked [`NodeActor`](crate::node) per ready node, learns of every
//! child's end through supervision, and persists the run's end once.
//!
//! The default ractor supervisor handler stops the parent when any child exits; this one
//! overrides it: a child's normal exit is a node completion, its failure a node failure.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::event::{NodePath, RunEvent};
use crate::handler::{NodeContext, NodeError, RunInfo};
use crate::ids::NodeId;
use crate::message::{Message, now_ms};
use crate::node::{NodeActor, NodeArgs, NodeEnd, NodeMsg, NodeReport, NodeStatus};
use crate::outcome::{HistoryFlush, RunError, RunOutcome};
use crate::reference::{NodeLookup, Scope};
use crate::registry::{ActorTree, LiveState};
use crate::runtime::Services;
use crate::scheduler::{NodeIndex, Schedule};
use crate::store::RunRecord;
use crate::value::{Map, Value};
use crate::workflow::Plan;

/// How long a failing run waits for its other nodes to hand over what they hold.
const HALT_GRACE: Duration = Duration::from_secs(1);

/// Messages a run supervisor handles.
#[derive(Debug)]
pub(crate) enum RunMsg {
    /// Report the run's actor tree, as each actor describes itself.
    Tree(RpcReplyPort<ActorTree>),
}

pub(crate) struct RunSupervisor;

pub(crate) struct RunArgs {
    pub(crate) plan: Arc<Plan>,
    pub(crate) run: Arc<RunInfo>,
    pub(crate) services: Arc<Services>,
    pub(crate) live: Arc<Mutex<LiveState>>,
    pub(crate) history: Vec<Message>,
    pub(crate) produced: Vec<Message>,
    pub(crate) record: RunRecord,
    pub(crate) outcome: watch::Sender<Option<Arc<RunOutcome>>>,
}

struct Child {
    node: NodeIndex,
    actor: ActorRef<NodeMsg>,
    stop: CancellationToken,
    report: oneshot::Receiver<NodeReport>,
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
        _myself: ActorRef<Self::Msg>,
        args: RunArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let plan = args.plan;
        let mut sys = Map::new();
        if let Some(query) = args.run.inputs.get("query") {
            sys.insert("query".into(), query.clone());
        }
        sys.insert("run_id".into(), Value::String(args.run.run_id.to_string()));
        sys.insert(
            "thread_id".into(),
            Value::String(args.run.thread.to_string()),
        );
        sys.insert("workflow_id".into(), Value::String(plan.def.id.clone()));
        let span = tracing::info_span!(
            "run",
            run_id = %args.run.run_id,
            thread = %args.run.thread,
            workflow = %plan.def.id,
        );
        let mut history = args.history;
        history.extend(args.produced.iter().cloned());
        Ok(RunState {
            schedule: Schedule::new(plan.graph.shape.clone()),
            outputs: vec![None; plan.graph.nodes.len()],
            variables: plan.variables.clone(),
            sys,
            history,
            history_view: None,
            produced: args.produced,
            children: HashMap::new(),
            plan,
            run: args.run,
            services: args.services,
            live: args.live,
            record: args.record,
            outcome: args.outcome,
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
        let _ = state.run.events.send(RunEvent::RunStarted {
            run_id: state.run.run_id,
            thread: state.run.thread.clone(),
        });
        let step = state.schedule.start();
        state.launch(&myself, step.ready).await;
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
                        Err(_) => {
                            let error = format!(
                                "node actor of `{}` ended without a report",
                                state.node_id(child.node)
                            );
                            state.fail(&myself, RunError::Supervisor(error)).await;
                        }
                    }
                }
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                if let Some(mut child) = state.children.remove(&cell.get_id()) {
                    let path = NodePath::node(state.node_id(child.node).clone());
                    if let Ok(report) = child.report.try_recv() {
                        state.keep_messages(report.messages);
                    }
                    let error = NodeError::Failed(format!("node actor failed: {error}"));
                    state.node_failed(&myself, path, error).await;
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped from outside (runtime teardown) before the run ended: nodes still running
        // hand over what they hold and the run records its end, so nothing is lost.
        if !state.ended {
            let reports = state.halt_children(true).await;
            for report in reports {
                state.keep_messages(report.messages);
            }
            state
                .finish(RunError::Supervisor("run supervisor was stopped".into()).into())
                .await;
        }
        Ok(())
    }
}

/// How a run is ending, before its messages are persisted.
enum Ending {
    Completed,
    Failed(RunError),
}

impl From<RunError> for Ending {
    fn from(e: RunError) -> Self {
        Ending::Failed(e)
    }
}

impl RunState {
    fn node_id(&self, node: NodeIndex) -> &NodeId {
        &self.plan.graph.nodes[node].id
    }

    fn live(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: RunEvent) {
        // No subscriber is fine.
        let _ = self.run.events.send(event);
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

    /// Starts the given ready nodes.
    async fn launch(&mut self, myself: &ActorRef<RunMsg>, ready: Vec<NodeIndex>) {
        for node in ready {
            if self.ended {
                return;
            }
            if let Err(error) = self.spawn_node(myself, node).await {
                let path = NodePath::node(self.node_id(node).clone());
                self.node_failed(myself, path, error).await;
                return;
            }
        }
    }

    async fn spawn_node(
        &mut self,
        myself: &ActorRef<RunMsg>,
        node: NodeIndex,
    ) -> Result<(), NodeError> {
        let input = self.plan.graph.nodes[node].params.resolve(self)?;
        let planned = &self.plan.graph.nodes[node];
        let (id, kind, handler) = (
            planned.id.clone(),
            planned.kind.clone(),
            planned.handler.clone(),
        );
        let path = NodePath::node(id.clone());
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
        let (actor, _) = Actor::spawn_linked(None, NodeActor, args, myself.get_cell())
            .await
            .map_err(|e| NodeError::Failed(format!("could not spawn node actor: {e}")))?;
        self.children.insert(
            actor.get_id(),
            Child {
                node,
                actor,
                stop,
                report: report_rx,
            },
        );
        self.live().running.insert(id);
        self.emit(RunEvent::NodeStarted { path, kind });
        Ok(())
    }

    /// A child ended normally and handed over its report.
    async fn on_report(&mut self, myself: &ActorRef<RunMsg>, report: NodeReport) {
        let node = report.node;
        let id = self.node_id(node).clone();
        self.live().running.remove(&id);
        self.keep_messages(report.messages);
        let path = NodePath::node(id);
        match report.end {
            NodeEnd::Completed(output) => {
                let value = Arc::new(output.value);
                self.outputs[node] = Some(value.clone());
                for (name, v) in output.variables {
                    self.variables.insert(name, v);
                }
                self.emit(RunEvent::NodeFinished {
                    path,
                    output: value,
                });
                let step = match self.schedule.complete(node, &output.route) {
                    Ok(step) => step,
                    Err(e) => {
                        self.fail(myself, RunError::Supervisor(format!("scheduler: {e}")))
                            .await;
                        return;
                    }
                };
                for skipped in step.skipped {
                    let path = NodePath::node(self.node_id(skipped).clone());
                    self.emit(RunEvent::NodeSkipped { path });
                }
                self.launch(myself, step.ready).await;
                if !self.ended && self.schedule.is_done() && self.children.is_empty() {
                    self.finish(Ending::Completed).await;
                    myself.stop(None);
                }
            }
            NodeEnd::Failed(error) => self.node_failed(myself, path, error).await,
            NodeEnd::Interrupted { .. } => {
                let error = NodeError::Failed("interrupted without a stop request".into());
                self.node_failed(myself, path, error).await;
            }
        }
    }

    async fn node_failed(&mut self, myself: &ActorRef<RunMsg>, path: NodePath, error: NodeError) {
        if let Some(id) = path.leaf() {
            self.live().running.remove(id);
        }
        tracing::warn!(parent: &self.span, node = %path, %error, "node failed");
        self.emit(RunEvent::NodeFailed {
            path: path.clone(),
            error: error.to_string(),
        });
        self.fail(myself, RunError::Node { path, error }).await;
    }

    /// Ends the run as failed: other running nodes are stopped and hand over their messages.
    async fn fail(&mut self, myself: &ActorRef<RunMsg>, error: RunError) {
        if self.ended {
            return;
        }
        for report in self.halt_children(true).await {
            self.keep_messages(report.messages);
        }
        self.finish(error.into()).await;
        myself.stop(None);
    }

    /// Asks every running node to stop (aborting its handler if `force`), and collects what
    /// each hands over. A node that does not answer within the grace period is aborted; one
    /// that still does not answer is killed and reported as lost.
    async fn halt_children(&mut self, force: bool) -> Vec<NodeReport> {
        let children: Vec<Child> = self.children.drain().map(|(_, c)| c).collect();
        for child in &children {
            child.stop.cancel();
            if force {
                let _ = child.actor.send_message(NodeMsg::Abort);
            }
        }
        let deadline = tokio::time::Instant::now() + HALT_GRACE;
        let mut reports = Vec::with_capacity(children.len());
        for mut child in children {
            let report = match tokio::time::timeout_at(deadline, &mut child.report).await {
                Ok(result) => result.ok(),
                Err(_) => {
                    let _ = child.actor.send_message(NodeMsg::Abort);
                    tokio::time::timeout(HALT_GRACE, &mut child.report)
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
            };
            match report {
                Some(report) => reports.push(report),
                None => {
                    child.actor.kill();
                    tracing::error!(
                        parent: &self.span,
                        node = %self.node_id(child.node),
                        "node did not hand over its state; its unflushed output is lost"
                    );
                }
            }
        }
        self.live().running.clear();
        reports
    }

    /// Persists the run's end once: history, then the run record; publishes the outcome.
    async fn finish(&mut self, ending: Ending) {
        if self.ended {
            return;
        }
        self.ended = true;
        let history = self.persist_history().await;
        let outputs: BTreeMap<NodeId, Value> = self
            .outputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((self.node_id(i).clone(), Value::clone(v.as_ref()?))))
            .collect();
        let outcome = match ending {
            Ending::Completed => RunOutcome::Completed {
                run_id: self.run.run_id,
                outputs,
                variables: self.variables.clone(),
                history,
            },
            Ending::Failed(error) => RunOutcome::Failed {
                run_id: self.run.run_id,
                error,
                outputs,
                history,
            },
        };
        let status = outcome.status();
        self.record.status = status;
        self.record.finished_at_ms = Some(now_ms());
        self.record.failure_reason = outcome.error().map(ToString::to_string);
        self.record.unpersisted = outcome.history().error.as_ref().map(|e| {
            format!(
                "{} message(s) not persisted: {e}",
                outcome.history().not_persisted.len()
            )
        });
        if let Err(e) = self.services.runs.put(&self.record).await {
            tracing::error!(parent: &self.span, error = %e, "could not record the run's end");
        }
        self.live().status = status;
        tracing::info!(parent: &self.span, %status, "run ended");
        self.outcome.send_replace(Some(Arc::new(outcome)));
        self.emit(RunEvent::RunFinished {
            run_id: self.run.run_id,
            status,
        });
        self.services.registry.remove(&self.run.run_id);
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

    /// Answers a tree query without blocking the run: each node actor is asked in a task.
    fn answer_tree(&self, myself: &ActorRef<RunMsg>, reply: RpcReplyPort<ActorTree>) {
        let children: Vec<(NodeId, ActorRef<NodeMsg>)> = self
            .children
            .values()
            .map(|c| (self.node_id(c.node).clone(), c.actor.clone()))
            .collect();
        let timeout = self.services.config.query_timeout;
        let me = ActorTree {
            actor_id: myself.get_id().to_string(),
            kind: "run_supervisor",
            node_id: None,
            status: self.live().status.to_string(),
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
