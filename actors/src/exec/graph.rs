//! `GraphExec`: one execution of a graph. The run's supervisor has one for the workflow; a
//! loop actor has one per iteration; a parallel actor has one per item in flight.
//!
//! It is the shell around the pure scheduler shared by every host: it resolves each ready
//! node's parameters against its scope, spawns the node's actor (a `NodeActor`, or a
//! `BodyActor` for loops and parallels) linked to the host, completes interactive nodes from
//! their answers or reports the pause, applies each child's report, and saves its progress as
//! a [`GraphState`]. It never decides how the host ends: it reports [`ExecEvent`]s.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use imbl::Vector;
use ractor::{Actor, ActorCell, ActorId, ActorRef};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

mod child;

use super::body::{BodyActor, BodyArgs, BodyMsg};
use super::node::{
    NodeActor, NodeArgs, NodeEnd, NodeMsg, NodeReport, NodeStart, handler_run, run_inline,
};
use super::run::RunInfo;
use crate::core::{NodeIndex, Schedule};
use crate::kinds::{NodeContext, ProbeStop};
use crate::model::{
    ActorTree, Frame, Interaction, InteractionId, Interrupted, Map, Message, NodeError, NodeId,
    NodeOutput, NodePath, RunEvent, StopMode, StopReason, Usage, Value, add_usage,
};
use crate::persist::snapshot::{CompletedNode, FrameState, GraphState, SavedFrame};
use crate::workflow::{GraphPlan, NodeLookup, NodeSpec, Scope};
pub(crate) use child::{Child, ChildRef, Ended};

/// What a body sees of the graphs around it: outputs of the nodes upstream of its node,
/// the frames of the enclosing loops and parallels, and the run's `sys` values.
#[derive(Debug, Default, Clone)]
pub(crate) struct Outer {
    pub(crate) nodes: HashMap<NodeId, Arc<Value>>,
    /// Enclosing frames, outermost first: (loop or parallel node, its frame object).
    pub(crate) frames: Vec<(NodeId, Value)>,
    pub(crate) sys: Map,
}

impl Outer {
    /// Applies an assignment to a variable of an enclosing loop (`loop_id.NAME`) to that
    /// loop's frame as seen from here, so later reads in this body see it (its owner gets it
    /// upward, at the end of the body). Other names are left alone.
    pub(crate) fn assign(outer: &mut Arc<Outer>, name: &str, value: &Value) {
        let Some((owner, var)) = name.split_once('.') else {
            return;
        };
        if !outer.frames.iter().any(|(n, _)| n.as_str() == owner) {
            return;
        }
        let frames = &mut Arc::make_mut(outer).frames;
        if let Some((_, Value::Object(frame))) =
            frames.iter_mut().rev().find(|(n, _)| n.as_str() == owner)
        {
            frame.insert(var.to_owned(), value.clone());
        }
    }
}

/// What a host learns from its graph.
#[derive(Debug)]
pub(crate) enum ExecEvent {
    /// A node failed; `path` is where (inside a body for loop and parallel nodes).
    Failed { path: NodePath, error: NodeError },
    /// An interactive node has no answer: the run must pause.
    Paused(Interaction),
    /// A probe asked for a stop.
    Stop(StopMode, StopReason),
    /// A node completed and these nodes are ready; the host launches them (after saving the
    /// run's progress) because it asked to defer launches.
    Ready(Vec<NodeIndex>),
}

/// The host's side of launching: where children link, the run, and the history they see.
pub(crate) struct Host<'a> {
    pub(crate) cell: &'a ActorCell,
    pub(crate) run: &'a Arc<RunInfo>,
    /// Until when a node whose kind never blocks may run on the host's own task (polled once
    /// there, with no actor and no task, when the run has no probe); `None`: never. The host
    /// (a run's supervisor, a loop's or parallel's actor) begins a slice of
    /// [`INLINE_SLICE`] as each of its messages begins, so a chain of such nodes still lets
    /// it answer stops and queries between slices.
    pub(crate) inline_until: Option<std::time::Instant>,
}

/// How long one message of a host may go on running nodes whose kind never blocks on the
/// host itself: past it, the next such node starts in an actor, whose end is a message of its
/// own.
pub(crate) const INLINE_SLICE: std::time::Duration = std::time::Duration::from_millis(2);

/// One execution of a graph.
pub(crate) struct GraphExec {
    graph: Arc<GraphPlan>,
    /// The path of this execution's frame (empty for the workflow's graph).
    prefix: NodePath,
    outer: Arc<Outer>,
    /// This execution's own frame (loop iteration or parallel item): node and frame object
    /// (`index`, `item`, loop variables).
    frame: Option<(NodeId, Value)>,
    /// Workflow variables as this execution sees them.
    pub(crate) env: Map,
    schedule: Schedule,
    outputs: Vec<Option<Arc<Value>>>,
    /// The completed nodes as snapshots hold them, extended as nodes complete (at the next
    /// snapshot): a snapshot shares it instead of building the list again.
    completed: std::sync::Mutex<Vector<CompletedNode>>,
    children: HashMap<ActorId, Child>,
    /// Saved progress of loop and parallel nodes, handed to them when they start again.
    restore_frames: HashMap<NodeIndex, FrameState>,
    /// Saved progress of loop and parallel nodes cut short in this execution.
    saved_frames: Vec<SavedFrame>,
    /// What running loop and parallel nodes reported they have finished, for progress
    /// snapshots (a crash reruns only what was in flight).
    running_frames: HashMap<NodeIndex, FrameState>,
    /// The messages running loop and parallel nodes produced so far (with their progress).
    running_messages: HashMap<NodeIndex, Vector<Message>>,
    /// Assignments to variables this execution does not own, in order (for the host).
    pub(crate) up: Vec<(String, Value)>,
    /// The history this execution's nodes see: what it started with, then the messages of
    /// the nodes that completed here (a persistent vector: handing it out copies nothing).
    history: Vector<Message>,
    /// Messages produced here (completed, failed and interrupted nodes alike).
    pub(crate) produced: Vector<Message>,
    /// Nodes cut short here.
    pub(crate) interrupted: Vec<Interrupted>,
    /// What the nodes that ran here consumed.
    pub(crate) usage: Usage,
    halted: bool,
    forced: bool,
    /// Hand ready nodes to the host instead of launching them (the run saves its progress
    /// between a node's completion and its dependents' start).
    pub(crate) defer_launch: bool,
    /// The span this execution's nodes are children of: the run's, an iteration's or an
    /// item's.
    span: tracing::Span,
}

impl Scope for GraphExec {
    fn node_output(&self, node: &NodeId) -> NodeLookup<'_> {
        if let Some(&i) = self.graph.index.get(node) {
            return match self.outputs[i].as_deref() {
                Some(v) => NodeLookup::Output(v),
                None => NodeLookup::DidNotRun,
            };
        }
        if let Some((owner, frame)) = &self.frame
            && owner == node
        {
            return NodeLookup::Output(frame);
        }
        if let Some((_, frame)) = self.outer.frames.iter().rev().find(|(n, _)| n == node) {
            return NodeLookup::Output(frame);
        }
        match self.outer.nodes.get(node) {
            Some(v) => NodeLookup::Output(v),
            None => NodeLookup::DidNotRun,
        }
    }

    fn sys(&self, key: &str) -> Option<&Value> {
        self.outer.sys.get(key)
    }

    fn env(&self, key: &str) -> Option<&Value> {
        self.env.get(key)
    }
}

impl GraphExec {
    pub(crate) fn new(
        graph: Arc<GraphPlan>,
        prefix: NodePath,
        outer: Arc<Outer>,
        frame: Option<(NodeId, Value)>,
        env: Map,
        history: Vector<Message>,
    ) -> Self {
        let n = graph.nodes.len();
        Self {
            schedule: Schedule::new(graph.shape.clone()),
            outputs: vec![None; n],
            completed: std::sync::Mutex::default(),
            graph,
            prefix,
            outer,
            frame,
            env,
            children: HashMap::new(),
            restore_frames: HashMap::new(),
            saved_frames: Vec::new(),
            running_frames: HashMap::new(),
            running_messages: HashMap::new(),
            up: Vec::new(),
            history,
            produced: Vector::new(),
            interrupted: Vec::new(),
            usage: Usage::new(),
            halted: false,
            forced: false,
            defer_launch: false,
            span: tracing::Span::none(),
        }
    }

    /// Makes the nodes of this execution children of `span` (the run's, an iteration's or an
    /// item's).
    pub(crate) fn within(mut self, span: tracing::Span) -> Self {
        self.span = span;
        self
    }

    /// A node's span, a child of this execution's: its kind, id and path, and, for the kinds
    /// the GenAI conventions name, their operation. The outcome is recorded when it ends. The
    /// run, thread and fencing token are the run span's: every node span descends from it, and
    /// a node's span is made once per execution, so each field here costs every node.
    fn node_span(&self, node: NodeIndex, path: &NodePath) -> tracing::Span {
        let planned = &self.graph.nodes[node];
        let (id, kind, operation) = (planned.id.as_ref(), &*planned.kind, planned.operation);
        // Field values are computed only when the span is enabled: nothing is formatted for a
        // span no subscriber wants.
        tracing::info_span!(
            parent: &self.span,
            "node",
            otel.name = &*planned.span_name,
            gen_ai.operation.name = operation,
            gen_ai.tool.name = (operation == Some("execute_tool")).then_some(id),
            gen_ai.agent.name = (operation == Some("invoke_agent")).then_some(id),
            runvisor.node.id = id,
            runvisor.node.kind = kind,
            runvisor.node.path = %path,
            runvisor.node.outcome = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            gen_ai.request.model = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
        )
    }

    /// Continues a saved execution: completed nodes keep their outputs and never run again;
    /// the frontier is ready; saved loop and parallel progress waits for its node to start.
    pub(crate) fn restore(mut self, state: GraphState) -> Result<Self, String> {
        let mut completions = Vec::with_capacity(state.completed.len());
        for done in state.completed {
            let i = self.index_of(&done.node)?;
            self.outputs[i] = Some(done.output);
            completions.push((i, done.route));
        }
        self.schedule = Schedule::restore(self.graph.shape.clone(), &completions)
            .map_err(|e| format!("completions do not replay: {e}"))?;
        for saved in state.frames {
            let i = self.index_of(&saved.node)?;
            self.restore_frames.insert(i, saved.state);
        }
        Ok(self)
    }

    fn index_of(&self, node: &NodeId) -> Result<NodeIndex, String> {
        self.graph
            .index
            .get(node)
            .copied()
            .ok_or_else(|| format!("no node `{node}` in this graph"))
    }

    /// The nodes to start first: the entry, or a restored frontier.
    pub(crate) fn first_ready(&mut self, restored: bool) -> Vec<NodeIndex> {
        if restored {
            self.schedule.ready().collect()
        } else {
            self.schedule.start().ready
        }
    }

    pub(crate) fn node_id(&self, node: NodeIndex) -> &NodeId {
        &self.graph.nodes[node].id
    }

    fn path(&self, node: NodeIndex) -> NodePath {
        self.prefix.child(Frame::Node(self.node_id(node).clone()))
    }

    /// This execution's frame object (`index`, `item`, loop variables).
    pub(crate) fn frame(&self) -> Option<&Value> {
        self.frame.as_ref().map(|(_, f)| f)
    }

    /// Whether every node that can run has run and no child is left.
    pub(crate) fn is_done(&self) -> bool {
        self.children.is_empty() && self.schedule.is_done()
    }

    /// Whether no child is running.
    pub(crate) fn is_idle(&self) -> bool {
        self.children.is_empty()
    }

    /// The completed nodes, in completion order.
    pub(crate) fn completed(&self) -> Vec<NodeId> {
        self.schedule
            .completions()
            .iter()
            .map(|(n, _)| self.node_id(*n).clone())
            .collect()
    }

    /// The outputs of the nodes that completed, shared (nothing is copied).
    pub(crate) fn shared_outputs(&self) -> crate::model::Outputs {
        self.outputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((self.node_id(i).clone(), v.clone()?)))
            .collect()
    }

    /// The outputs of the graph's sink nodes (no outgoing edges) that ran, as an object.
    pub(crate) fn sink_outputs(&self) -> Value {
        let mut out = Map::new();
        for (i, v) in self.outputs.iter().enumerate() {
            if let Some(v) = v
                && self.graph.shape.out_edges(i).is_empty()
            {
                out.insert(self.node_id(i).to_string(), Value::clone(v));
            }
        }
        Value::Object(out)
    }

    /// The nodes a resume would start: ready ones, and running ones (which a resume runs
    /// again from their start).
    pub(crate) fn frontier(&self) -> Vec<NodeId> {
        let mut nodes: Vec<NodeIndex> = self
            .schedule
            .ready()
            .chain(self.schedule.running())
            .collect();
        nodes.sort_unstable();
        nodes.into_iter().map(|n| self.node_id(n).clone()).collect()
    }

    /// The outer scope a body of a node of this graph sees.
    fn outer_for_body(&self) -> Arc<Outer> {
        let mut nodes = self.outer.nodes.clone();
        for (id, v) in self
            .outputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((self.node_id(i), v.as_ref()?)))
        {
            nodes.insert(id.clone(), v.clone());
        }
        let mut frames = self.outer.frames.clone();
        if let Some(frame) = &self.frame {
            frames.push(frame.clone());
        }
        Arc::new(Outer {
            nodes,
            frames,
            sys: self.outer.sys.clone(),
        })
    }

    fn keep_messages(&mut self, messages: Vec<Message>) {
        for message in messages {
            self.history.push_back(message.clone());
            self.produced.push_back(message);
        }
    }

    /// Keeps streamed text of a node that did not complete as a truncated assistant message.
    fn keep_partial(&mut self, run: &RunInfo, node: NodeIndex, partial: &str) -> Option<String> {
        if partial.is_empty() {
            return None;
        }
        let mut message = Message::assistant(partial);
        message.truncated = true;
        message.run_id = Some(run.run_id);
        message.node_id = Some(self.node_id(node).clone());
        self.keep_messages(vec![message]);
        Some(partial.to_owned())
    }

    /// Applies assignments: loop variables of this execution's own frame here; everything
    /// else (workflow variables, outer loops) locally where visible and upward for its owner.
    pub(crate) fn assign(&mut self, assignments: Vec<(String, Value)>, top: bool) {
        for (name, value) in assignments {
            match name.split_once('.') {
                Some((owner, var)) => {
                    if let Some((frame_node, Value::Object(frame))) = &mut self.frame
                        && frame_node.as_str() == owner
                    {
                        frame.insert(var.to_owned(), value);
                        continue;
                    }
                    Outer::assign(&mut self.outer, &name, &value);
                    self.up.push((name, value));
                }
                None => {
                    self.env.insert(name.clone(), value.clone());
                    if !top {
                        self.up.push((name, value));
                    }
                }
            }
        }
    }

    /// Starts ready nodes (and completes answered interactive nodes, which may make more
    /// ready), until none is left or the execution halts.
    pub(crate) async fn launch(
        &mut self,
        host: &Host<'_>,
        ready: Vec<NodeIndex>,
    ) -> Vec<ExecEvent> {
        let mut events = Vec::new();
        let mut queue: VecDeque<NodeIndex> = ready.into();
        while let Some(node) = queue.pop_front() {
            if self.halted {
                break;
            }
            let path = self.path(node);
            if let Some((mode, reason)) = probe(host.run, |p| p.before_node(host.run.run_id, &path))
            {
                self.halted = true;
                events.push(ExecEvent::Stop(mode, reason));
                break;
            }
            let spec = self.graph.nodes[node].spec.clone();
            match spec {
                NodeSpec::Interactive(kind) => {
                    if let Some(answer) = host.run.answers.get(&path) {
                        let output = NodeOutput::new(answer.clone());
                        match self.complete(host, node, path, output) {
                            Ok(ready) => queue.extend(ready),
                            Err(e) => {
                                events.push(e);
                                break;
                            }
                        }
                        continue;
                    }
                    let prompt = match self.graph.nodes[node].params.resolve(self) {
                        Ok(params) => params.get("prompt").map(Value::render),
                        Err(e) => {
                            let error = NodeError::from(e);
                            host.run.emit(RunEvent::NodeFailed {
                                path: path.clone(),
                                error: error.clone(),
                            });
                            events.push(ExecEvent::Failed { path, error });
                            break;
                        }
                    };
                    self.halted = true;
                    let span = self.node_span(node, &path);
                    span.record("runvisor.node.outcome", "paused");
                    host.run.emit(RunEvent::Paused { path: path.clone() });
                    events.push(ExecEvent::Paused(Interaction {
                        id: InteractionId::new(),
                        node: self.node_id(node).clone(),
                        path,
                        prompt,
                        kind: (*kind).clone(),
                    }));
                    break;
                }
                spec => match self.spawn(host, node, &path, spec).await {
                    Err(error) => {
                        host.run.emit(RunEvent::NodeFailed {
                            path: path.clone(),
                            error: error.clone(),
                        });
                        events.push(ExecEvent::Failed { path, error });
                        break;
                    }
                    Ok(None) => {}
                    Ok(Some(report)) => {
                        // It finished on this task: its report is applied here, and its
                        // dependents queued here (or handed to the host), so a chain of such
                        // nodes loops instead of nesting.
                        let mut failed = false;
                        for event in self.apply_report(host, report) {
                            match event {
                                ExecEvent::Ready(ready) if !self.defer_launch => {
                                    queue.extend(ready)
                                }
                                other => {
                                    failed |= matches!(other, ExecEvent::Failed { .. });
                                    events.push(other);
                                }
                            }
                        }
                        if failed {
                            // As a node that cannot start: nothing more starts from here.
                            break;
                        }
                        continue;
                    }
                },
            }
            if let Some((mode, reason)) =
                probe(host.run, |p| p.node_started(host.run.run_id, &path))
            {
                self.halted = true;
                events.push(ExecEvent::Stop(mode, reason));
                break;
            }
        }
        events
    }

    /// Starts a node: a loop or parallel in a body actor, any other kind in a node actor, or,
    /// for a kind that never blocks while the host's slice ([`Host::inline_until`]) allows,
    /// first on the host's task: `Some(report)` when it finished there.
    async fn spawn(
        &mut self,
        host: &Host<'_>,
        node: NodeIndex,
        path: &NodePath,
        spec: NodeSpec,
    ) -> Result<Option<NodeReport>, NodeError> {
        let input = self.graph.nodes[node].params.resolve(self)?;
        let planned = &self.graph.nodes[node];
        let (id, kind) = (planned.id.clone(), planned.kind.clone());
        let handler = match host.run.kinds.get(&kind) {
            Some(handler) => handler.clone(),
            None => {
                return Err(NodeError::Failed(format!(
                    "node kind `{kind}` is not registered on this runtime"
                )));
            }
        };
        self.schedule
            .mark_running(node)
            .map_err(|e| NodeError::Failed(format!("scheduler: {e}")))?;
        let stop = CancellationToken::new();
        let history = self.history.clone();
        let (report_tx, report_rx) = oneshot::channel();
        // Announced before the spawn: the node may stream as soon as it is spawned.
        host.run.live().running.insert(path.clone());
        host.run.emit(RunEvent::NodeStarted {
            path: path.clone(),
            kind: kind.clone(),
        });
        let spawned = match spec {
            NodeSpec::Loop(_) | NodeSpec::Parallel(_) => {
                let args = BodyArgs {
                    node,
                    id: id.clone(),
                    path: path.clone(),
                    spec,
                    input,
                    outer: self.outer_for_body(),
                    env: self.env.clone(),
                    history,
                    run: host.run.clone(),
                    report: report_tx,
                    restore: self.restore_frames.remove(&node),
                    // The workflow's graph runs in the run's supervisor; a body's in its actor.
                    parent: (!self.prefix.frames().is_empty())
                        .then(|| ActorRef::<BodyMsg>::from(host.cell.clone())),
                    span: self.node_span(node, path),
                };
                // Boxed: a body's start is a large future that most nodes never need.
                Box::pin(Actor::spawn_linked(
                    None,
                    BodyActor,
                    args,
                    host.cell.clone(),
                ))
                .await
                .map(|(a, _)| ChildRef::Body(a))
            }
            _ => {
                let ctx = NodeContext::new(
                    host.run.scope.clone(),
                    id.clone(),
                    path.clone(),
                    stop.clone(),
                    history,
                );
                let span = self.node_span(node, path);
                let start = if handler.never_blocks() && may_inline(host) {
                    let run = handler_run(handler, input, ctx.clone());
                    match run_inline(node, run, &ctx, &span).await {
                        Ok(report) => return Ok(Some(report)),
                        Err(waiting) => NodeStart::Polled(waiting),
                    }
                } else {
                    NodeStart::Fresh { handler, input }
                };
                let args = NodeArgs {
                    node,
                    start,
                    ctx,
                    report: report_tx,
                    span,
                };
                Actor::spawn_linked(None, NodeActor, args, host.cell.clone())
                    .await
                    .map(|(a, _)| ChildRef::Node(a))
            }
        };
        let actor = match spawned {
            Ok(actor) => actor,
            Err(e) => {
                let _ = self.schedule.requeue(node);
                host.run.live().running.remove(path);
                return Err(NodeError::Failed(format!(
                    "could not spawn the node's actor: {e}"
                )));
            }
        };
        self.children.insert(
            actor.id(),
            Child {
                node,
                actor,
                stop,
                report: report_rx,
            },
        );
        Ok(None)
    }

    /// Records a node's completion; returns the nodes it made ready.
    fn complete(
        &mut self,
        host: &Host<'_>,
        node: NodeIndex,
        path: NodePath,
        output: NodeOutput,
    ) -> Result<Vec<NodeIndex>, ExecEvent> {
        let value = Arc::new(output.value);
        self.outputs[node] = Some(value.clone());
        self.assign(output.variables, self.prefix.frames().is_empty());
        add_usage(&mut self.usage, &output.usage);
        host.run.emit(RunEvent::NodeFinished {
            path: path.clone(),
            output: value,
        });
        let step = self
            .schedule
            .complete(node, &output.route)
            .map_err(|e| ExecEvent::Failed {
                path: path.clone(),
                error: NodeError::Failed(format!("scheduler: {e}")),
            })?;
        for skipped in step.skipped {
            let path = self.path(skipped);
            host.run.emit(RunEvent::NodeSkipped { path });
        }
        Ok(step.ready)
    }

    /// A child of this execution ended (per a supervision event): applies its report, or
    /// records it as lost when it ended without one. `None` if it is not this execution's.
    pub(crate) async fn child_ended(
        &mut self,
        host: &Host<'_>,
        ended: &Ended,
    ) -> Option<Vec<ExecEvent>> {
        let mut child = self.children.remove(&ended.id)?;
        Some(match (child.report.try_recv(), &ended.failure) {
            (Ok(report), _) => self.on_report(host, report).await,
            (Err(_), why) => {
                let why = why.as_deref().unwrap_or("ended without a report");
                self.on_lost(host, child, why)
            }
        })
    }

    /// Records what a running loop or parallel node has finished; `false` if the node is not
    /// running any more (its report came first).
    pub(crate) fn note_progress(&mut self, node: NodeIndex, frame: FrameState) -> bool {
        if self.schedule.state(node) != crate::core::NodeState::Running {
            return false;
        }
        self.running_frames.insert(node, frame);
        true
    }

    /// [`note_progress`](Self::note_progress) of a loop or parallel nested in a body, with the
    /// messages it produced so far (they travel up with the body's own progress).
    pub(crate) fn note_nested_progress(
        &mut self,
        node: NodeIndex,
        frame: FrameState,
        messages: Vector<Message>,
    ) -> bool {
        if !self.note_progress(node, frame) {
            return false;
        }
        self.running_messages.insert(node, messages);
        true
    }

    /// The messages this execution's finished nodes produced, then those its running loops
    /// and parallels produced so far: what a progress report of its body carries. Joined as
    /// persistent vectors, so the cost does not grow with what nested bodies produced.
    pub(crate) fn progress_messages(&self) -> Vector<Message> {
        let mut running: Vec<_> = self.running_messages.iter().collect();
        running.sort_by_key(|(node, _)| **node);
        let mut messages = self.produced.clone();
        for (_, more) in running {
            messages.append(more.clone());
        }
        messages
    }

    /// The nodes running now.
    pub(crate) fn running_nodes(&self) -> Vec<NodeIndex> {
        self.schedule.running().collect()
    }

    /// Whether a child with this actor id is one of this execution's.
    pub(crate) fn has_child(&self, id: &ActorId) -> bool {
        self.children.contains_key(id)
    }

    /// Applies a child's report, and launches the nodes it made ready unless the host
    /// launches them itself ([`defer_launch`](Self::defer_launch)).
    pub(crate) async fn on_report(
        &mut self,
        host: &Host<'_>,
        report: NodeReport,
    ) -> Vec<ExecEvent> {
        let applied = self.apply_report(host, report);
        if self.defer_launch {
            return applied;
        }
        let mut events = Vec::with_capacity(applied.len());
        for event in applied {
            match event {
                ExecEvent::Ready(ready) => events.extend(self.launch(host, ready).await),
                other => events.push(other),
            }
        }
        events
    }

    /// Applies a child's report; the nodes it made ready come back as [`ExecEvent::Ready`].
    fn apply_report(&mut self, host: &Host<'_>, report: NodeReport) -> Vec<ExecEvent> {
        let node = report.node;
        let path = self.path(node);
        host.run.live().running.remove(&path);
        self.running_frames.remove(&node);
        self.running_messages.remove(&node);
        self.keep_messages(report.messages);
        let mut events = Vec::new();
        if let Some((mode, reason)) = report.requested_stop {
            // A probe stopped this node at a chunk; the stop message may still be queued
            // behind this report (ractor hands over supervision events first).
            events.push(ExecEvent::Stop(mode, reason));
        }
        match report.end {
            NodeEnd::Completed(output) => {
                // Usage of a task node is in its output; a body's is in the report.
                add_usage(&mut self.usage, &report.usage);
                let mut output = output;
                output.usage.clear();
                match self.complete(host, node, path.clone(), output) {
                    Ok(ready) => {
                        if !self.halted
                            && let Some((mode, reason)) =
                                probe(host.run, |p| p.node_completed(host.run.run_id, &path))
                        {
                            self.halted = true;
                            events.push(ExecEvent::Stop(mode, reason));
                        }
                        if !ready.is_empty() {
                            events.push(ExecEvent::Ready(ready));
                        }
                    }
                    Err(e) => events.push(e),
                }
            }
            NodeEnd::Failed {
                path: inner,
                error,
                frame,
            } => {
                add_usage(&mut self.usage, &report.usage);
                let partial = self.keep_partial(host.run, node, &report.partial);
                let _ = self.schedule.requeue(node);
                if let Some(state) = frame {
                    // What a failed loop or parallel finished stays finished.
                    self.saved_frames.push(SavedFrame {
                        node: self.node_id(node).clone(),
                        state,
                    });
                }
                let at = inner.unwrap_or_else(|| path.clone());
                host.run.emit(RunEvent::NodeFailed {
                    path: at.clone(),
                    error: error.clone(),
                });
                if self.halted {
                    // Cut short while the run was already ending: kept, to run again.
                    self.interrupted.push(Interrupted {
                        path,
                        forced: false,
                        partial,
                        chunks: report.chunks,
                        error: Some(error.clone()),
                    });
                } else {
                    events.push(ExecEvent::Failed { path: at, error });
                }
            }
            NodeEnd::Interrupted {
                forced,
                frame,
                interactions,
                inner,
            } => {
                add_usage(&mut self.usage, &report.usage);
                let partial = self.keep_partial(host.run, node, &report.partial);
                let _ = self.schedule.requeue(node);
                host.run.emit(RunEvent::NodeInterrupted {
                    path: path.clone(),
                    forced,
                });
                if let Some(state) = frame {
                    self.saved_frames.push(SavedFrame {
                        node: self.node_id(node).clone(),
                        state,
                    });
                }
                let paused = !interactions.is_empty();
                events.extend(interactions.into_iter().map(ExecEvent::Paused));
                if !self.halted && !paused && report.requested_stop.is_none() {
                    events.push(ExecEvent::Failed {
                        path: path.clone(),
                        error: NodeError::Failed("interrupted without a stop request".into()),
                    });
                }
                if inner.is_empty() {
                    self.interrupted.push(Interrupted {
                        path,
                        forced,
                        partial,
                        chunks: report.chunks,
                        error: None,
                    });
                } else {
                    // A loop or parallel: where it stopped is inside it.
                    self.interrupted.extend(inner);
                }
            }
        }
        events
    }

    /// A child ended without a report (killed or crashed): what it held is lost.
    pub(crate) fn on_lost(&mut self, host: &Host<'_>, child: Child, why: &str) -> Vec<ExecEvent> {
        let path = self.path(child.node);
        host.run.live().running.remove(&path);
        let _ = self.schedule.requeue(child.node);
        self.running_messages.remove(&child.node);
        if let Some(state) = self.running_frames.remove(&child.node) {
            // What it reported finished before it was lost still counts.
            self.saved_frames.push(SavedFrame {
                node: self.node_id(child.node).clone(),
                state,
            });
        }
        host.run.emit(RunEvent::NodeInterrupted {
            path: path.clone(),
            forced: true,
        });
        tracing::error!(parent: &self.span, node = %path, why, "node output lost");
        if self.halted {
            self.interrupted.push(Interrupted {
                path,
                forced: true,
                partial: None,
                chunks: 0,
                error: Some(NodeError::Failed(format!(
                    "node {why}; what it held is lost"
                ))),
            });
            Vec::new()
        } else {
            vec![ExecEvent::Failed {
                path,
                error: NodeError::Failed(why.to_owned()),
            }]
        }
    }

    /// Stops launching; asks running children to stop (graceful: their flag; force: abort).
    pub(crate) fn halt(&mut self, force: bool) {
        self.halted = true;
        if force && self.forced {
            return;
        }
        self.forced |= force;
        for child in self.children.values() {
            if force {
                // Not woken first: a handler that answered the stop flag before the abort
                // reached it would end as stopped rather than aborted, depending on timing.
                child.actor.abort();
            } else {
                child.stop.cancel();
                child.actor.stop_gracefully();
            }
        }
    }

    /// Gives up on children that did not report after an abort: killed, recorded as lost.
    pub(crate) fn abandon(&mut self, host: &Host<'_>) -> Vec<NodeReport> {
        let ids: Vec<ActorId> = self.children.keys().cloned().collect();
        let mut reports = Vec::new();
        for id in ids {
            let Some(mut child) = self.children.remove(&id) else {
                continue;
            };
            match child.report.try_recv() {
                Ok(report) => reports.push(report),
                Err(_) => {
                    child.actor.kill();
                    self.on_lost(host, child, "did not hand over its state after an abort");
                }
            }
        }
        reports
    }

    /// The children, for tree queries.
    pub(crate) fn describe_children(&self) -> Vec<(NodePath, &ChildRef)> {
        self.children
            .values()
            .map(|c| (self.path(c.node), &c.actor))
            .collect()
    }

    /// Where this execution runs: empty for the run's graph, `l/#3` for an iteration.
    pub(crate) fn prefix(&self) -> &NodePath {
        &self.prefix
    }

    /// The running children (for a forced teardown from `post_stop`).
    pub(crate) fn drain_children(&mut self) -> Vec<Child> {
        self.children.drain().map(|(_, c)| c).collect()
    }

    /// Saves this execution's progress.
    pub(crate) fn state(&self) -> GraphState {
        let mut frames = self.saved_frames.clone();
        // In node order, so successive snapshots list the same frames the same way (their
        // deltas then hold only what changed in each).
        let mut running: Vec<_> = self.running_frames.iter().collect();
        running.sort_by_key(|(node, _)| **node);
        let mut restoring: Vec<_> = self.restore_frames.iter().collect();
        restoring.sort_by_key(|(node, _)| **node);
        for (&node, state) in running {
            // Progress of a loop or parallel still running: a resume continues after what it
            // has finished.
            frames.push(SavedFrame {
                node: self.node_id(node).clone(),
                state: state.clone(),
            });
        }
        for (&node, state) in restoring {
            // Restored progress of a node that did not start again before the stop.
            frames.push(SavedFrame {
                node: self.node_id(node).clone(),
                state: state.clone(),
            });
        }
        GraphState {
            completed: self.completed_nodes(),
            frontier: self.frontier(),
            frames,
        }
    }

    /// The completed nodes, in completion order: the kept list, extended by the nodes that
    /// completed since the last call (completions are only ever appended).
    fn completed_nodes(&self) -> Vector<CompletedNode> {
        let mut kept = self
            .completed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let done = self.schedule.completions();
        if done.len() < kept.len() {
            *kept = Vector::new();
        }
        for (n, route) in &done[kept.len()..] {
            kept.push_back(CompletedNode {
                node: self.node_id(*n).clone(),
                route: route.clone(),
                output: self.outputs[*n].clone().unwrap_or_default(),
            });
        }
        kept.clone()
    }
}

/// Whether a never-blocking node may run on the host's task now: within the host's slice, and
/// never under a probe (a test's simulated interrupts meet every node in an actor).
fn may_inline(host: &Host<'_>) -> bool {
    host.run.scope.probe.is_none()
        && host
            .inline_until
            .is_some_and(|until| std::time::Instant::now() < until)
}

fn probe(run: &RunInfo, ask: impl FnOnce(&dyn crate::kinds::Probe) -> ProbeStop) -> ProbeStop {
    run.scope.probe.as_deref().and_then(ask)
}
