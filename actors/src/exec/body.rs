//! `BodyActor`: runs the body sub-graph of a `loop` (iteration by iteration) or a `parallel`
//! node (per item, at most `max_concurrency` items in flight). It is a linked child of the
//! graph that contains its node and the supervisor of its body's actors.
//!
//! What to run next is decided by the pure machines in `core` ([`LoopMachine`],
//! [`ParallelMachine`]); this actor runs each iteration's or item's graph, resolves what the
//! machines need from the graph's scope (`output`, `until`), and carries their steps out.
//!
//! Like a `NodeActor`, it ends by handing its parent a report from `post_stop`: the node's
//! output when the body finished, the failure (naming the body node, iteration or item), or,
//! when it was stopped or paused, its progress as a [`FrameState`]: finished iterations and
//! items, loop variables, and the current iteration's or in-flight items' own progress. A
//! resume hands that frame back and the body continues where it was. A failed body hands its
//! progress over too, so what it finished never runs again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use imbl::Vector;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::oneshot;

mod items;
mod progress;

use super::graph::{ChildRef, Ended, ExecEvent, GraphExec, Host, INLINE_SLICE, Outer};
use super::node::{NodeEnd, NodeReport};
use super::run::RunInfo;
use super::supervisor::RunMsg;
use crate::core::NodeIndex;
use crate::core::items::{ItemStep, ParallelMachine, ParallelProgress};
use crate::core::iteration::{IterationEnd, LoopMachine, LoopProgress, LoopStep};
use crate::kinds::ProbeStop;
use crate::model::{
    ActorTree, Frame, Interaction, Map, Message, NodeError, NodeId, NodePath, StopMode, Usage,
    Value, add_usage,
};
use crate::persist::Durability;
use crate::persist::snapshot::{FrameState, GraphState, ItemState, LoopState, ParallelState};
use crate::workflow::{LoopMode, LoopSpec, NodeSpec, ParallelSpec};

/// How long aborted body nodes get to report before they are given up on.
const FORCE_GRACE: Duration = Duration::from_secs(2);

/// Messages a body actor handles.
#[derive(Debug)]
pub(crate) enum BodyMsg {
    /// Stop: no new iteration, item or node starts; running ones stop (graceful) or are
    /// aborted (force); then the actor reports its progress.
    Stop(StopMode),
    /// Describe this actor and its children.
    Describe(RpcReplyPort<ActorTree>),
    /// Aborted children did not all report in time.
    Deadline,
    /// The coalescing window passed: hand the run the progress made since the last report.
    ReportProgress,
    /// A loop or parallel running in one of this body's executions made progress; in `sync`
    /// mode, `waiters` go on once a snapshot holding it is stored (passed up with this body's
    /// report, and told by the run).
    ChildProgress {
        child: ractor::ActorId,
        node: NodeIndex,
        frame: Box<FrameState>,
        messages: Vector<Message>,
        waiters: Vec<ActorRef<BodyMsg>>,
    },
    /// A snapshot holding the progress this body reported is stored (`sync`): its next
    /// iteration or items may begin.
    Saved,
}

pub(crate) struct BodyActor;

pub(crate) struct BodyArgs {
    pub(crate) node: NodeIndex,
    pub(crate) id: NodeId,
    pub(crate) path: NodePath,
    pub(crate) spec: NodeSpec,
    pub(crate) input: Value,
    pub(crate) outer: Arc<Outer>,
    pub(crate) env: Map,
    pub(crate) history: Vector<Message>,
    pub(crate) run: Arc<RunInfo>,
    pub(crate) report: oneshot::Sender<NodeReport>,
    pub(crate) restore: Option<FrameState>,
    /// The body hosting this one; `None` when the run's supervisor does.
    pub(crate) parent: Option<ActorRef<BodyMsg>>,
    /// The loop's or parallel's node span.
    pub(crate) span: tracing::Span,
}

/// A loop: its machine (once begun) and the current iteration's graph.
struct LoopWork {
    spec: Arc<LoopSpec>,
    machine: Option<LoopMachine>,
    exec: Option<GraphExec>,
    /// The current iteration's saved progress, until the iteration starts again.
    saved_body: Option<GraphState>,
    /// The next iteration, held until the progress of the one before is stored (`sync`).
    held: Option<LoopStep>,
}

/// A parallel: its machine (once begun) and the graphs of the items in flight.
struct ParWork {
    spec: Arc<ParallelSpec>,
    machine: Option<ParallelMachine>,
    in_flight: BTreeMap<u32, GraphExec>,
    /// Items that failed (collected) and whose other nodes are winding down.
    draining: BTreeMap<u32, GraphExec>,
    /// Saved progress of items that were in flight, until they start again.
    saved: HashMap<u32, GraphState>,
    /// What items in flight assigned before they were saved (given back when they continue).
    partial: HashMap<u32, Vec<(String, Value)>>,
}

enum Work {
    Loop(Box<LoopWork>),
    Parallel(Box<ParWork>),
}

pub(crate) struct BodyState {
    /// The end of the current message's slice for nodes that never block
    /// ([`Host::inline_until`]).
    slice: Option<std::time::Instant>,
    node: NodeIndex,
    id: NodeId,
    path: NodePath,
    run: Arc<RunInfo>,
    outer: Arc<Outer>,
    env: Map,
    /// The history the body's nodes see: what the body started with, then the messages of
    /// finished iterations and items.
    history: Vector<Message>,
    /// Messages of finished iterations and items.
    produced: Vector<Message>,
    usage: Usage,
    report: Option<oneshot::Sender<NodeReport>>,
    work: Work,
    start: Option<(Value, Option<FrameState>)>,
    stopping: bool,
    forced: bool,
    failure: Option<(Option<NodePath>, NodeError)>,
    interactions: Vec<Interaction>,
    /// A stop a probe requested inside the body: carried in the report, because the
    /// parent may see the report before the stop message this body sent to the run.
    requested_stop: ProbeStop,
    end: Option<NodeEnd>,
    deadline: Option<tokio::task::JoinHandle<()>>,
    /// When progress was last handed to the run, and whether newer progress waits for the
    /// next window (`async` durability reports at most once per coalescing window).
    reported_at: Option<tokio::time::Instant>,
    report_waiting: bool,
    /// Where progress goes: the hosting body, or the run's supervisor when `None`.
    parent: Option<ActorRef<BodyMsg>>,
    /// Progress reports this body waits to hear are stored (`sync`): until none is left, no
    /// iteration or item begins.
    unsaved: u32,
    /// Nested bodies waiting for their progress to be stored, to hand up with the next report.
    pass_on: Vec<ActorRef<BodyMsg>>,
    span: tracing::Span,
}

impl Actor for BodyActor {
    type Msg = BodyMsg;
    type State = BodyState;
    type Arguments = BodyArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: BodyArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let work = match args.spec {
            NodeSpec::Loop(spec) => Work::Loop(Box::new(LoopWork {
                spec,
                machine: None,
                exec: None,
                saved_body: None,
                held: None,
            })),
            NodeSpec::Parallel(spec) => Work::Parallel(Box::new(ParWork {
                spec,
                machine: None,
                in_flight: BTreeMap::new(),
                draining: BTreeMap::new(),
                saved: HashMap::new(),
                partial: HashMap::new(),
            })),
            _ => return Err("a body actor runs only loop and parallel nodes".into()),
        };
        let span = args.span;
        Ok(BodyState {
            slice: None,
            node: args.node,
            id: args.id,
            path: args.path,
            run: args.run,
            outer: args.outer,
            env: args.env,
            history: args.history,
            produced: Vector::new(),
            usage: Usage::new(),
            report: Some(args.report),
            work,
            start: Some((args.input, args.restore)),
            stopping: false,
            forced: false,
            failure: None,
            interactions: Vec::new(),
            requested_stop: None,
            end: None,
            deadline: None,
            reported_at: None,
            report_waiting: false,
            parent: args.parent,
            unsaved: 0,
            pass_on: Vec::new(),
            span,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.begin_slice();
        if let Some((input, restore)) = state.start.take() {
            let begun = match restore {
                Some(frame) => state.restore(frame),
                None => state.begin(&input),
            };
            match begun {
                Ok(()) => {
                    let events = state.kick(&myself.get_cell()).await;
                    state.handle_events(&myself, events);
                }
                Err(error) => state.fail(None, error),
            }
            state.settle(&myself).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.begin_slice();
        match message {
            BodyMsg::Stop(mode) => {
                state.stop(&myself, mode == StopMode::Force);
                state.settle(&myself).await;
            }
            BodyMsg::Describe(reply) => state.describe(&myself, reply),
            BodyMsg::ReportProgress => {
                if state.report_waiting && !state.stopping && state.end.is_none() {
                    state.report_waiting = false;
                    state.send_progress(&myself, Vec::new());
                }
            }
            BodyMsg::ChildProgress {
                child,
                node,
                frame,
                messages,
                waiters,
            } => {
                let noted = !state.stopping
                    && state.end.is_none()
                    && state
                        .exec_of(&child)
                        .is_some_and(|(_, exec)| exec.note_nested_progress(node, *frame, messages));
                // Not noted: this body is stopping, and so are the waiting ones.
                if noted {
                    state.pass_on.extend(waiters);
                    state.report_progress(&myself.get_cell(), false);
                }
            }
            BodyMsg::Saved => {
                state.unsaved = state.unsaved.saturating_sub(1);
                state.settle(&myself).await;
            }
            BodyMsg::Deadline => {
                let cell = myself.get_cell();
                let run = state.run.clone();
                let host = Host {
                    cell: &cell,
                    run: &run,
                    inline_until: state.slice,
                };
                for exec in state.execs_mut() {
                    for report in exec.abandon(&host) {
                        let _ = exec.on_report(&host, report).await;
                    }
                }
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
        let Some(ended) = Ended::from_event(event) else {
            return Ok(());
        };
        state.begin_slice();
        let me = myself.get_cell();
        let run = state.run.clone();
        let host = Host {
            cell: &me,
            run: &run,
            inline_until: state.slice,
        };
        let mut events = Vec::new();
        if let Some((item, exec)) = state.exec_of(&ended.id)
            && let Some(more) = exec.child_ended(&host, &ended).await
        {
            events.extend(more.into_iter().map(|e| (item, e)));
        }
        state.handle_events(&myself, events);
        state.settle(&myself).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(deadline) = state.deadline.take() {
            deadline.abort();
        }
        let end = match state.end.take() {
            Some(end) => end,
            None => {
                // Stopped from outside before it could report: abort what runs and save.
                for exec in state.execs_mut() {
                    exec.halt(true);
                    for mut child in exec.drain_children() {
                        if tokio::time::timeout(FORCE_GRACE, &mut child.report)
                            .await
                            .is_err()
                        {
                            child.actor.kill();
                        }
                    }
                }
                state.interrupted_end(true)
            }
        };
        let mut messages: Vec<Message> = std::mem::take(&mut state.produced).into_iter().collect();
        let mut usage = std::mem::take(&mut state.usage);
        for exec in state.execs_mut() {
            messages.extend(std::mem::take(&mut exec.produced));
            add_usage(&mut usage, &exec.usage);
        }
        super::node::record_end(&state.span, &end, &usage);
        let report = NodeReport {
            node: state.node,
            end,
            partial: String::new(),
            chunks: 0,
            messages,
            requested_stop: state.requested_stop.take(),
            usage,
        };
        if let Some(tx) = state.report.take() {
            let _ = tx.send(report);
        }
        Ok(())
    }
}

impl BodyState {
    /// Starts the slice of this message within which never-blocking nodes run on this actor.
    fn begin_slice(&mut self) {
        self.slice = Some(std::time::Instant::now() + INLINE_SLICE);
    }

    /// Every graph execution of the body: the current iteration, or the items in flight and
    /// those winding down.
    fn execs_mut(&mut self) -> Vec<&mut GraphExec> {
        match &mut self.work {
            Work::Loop(l) => l.exec.iter_mut().collect(),
            Work::Parallel(p) => p
                .in_flight
                .values_mut()
                .chain(p.draining.values_mut())
                .collect(),
        }
    }

    /// The execution a child belongs to, with its item index for parallels.
    fn exec_of(&mut self, id: &ractor::ActorId) -> Option<(Option<u32>, &mut GraphExec)> {
        match &mut self.work {
            Work::Loop(l) => l
                .exec
                .as_mut()
                .filter(|e| e.has_child(id))
                .map(|e| (None, e)),
            Work::Parallel(p) => p
                .in_flight
                .iter_mut()
                .chain(p.draining.iter_mut())
                .find(|(_, e)| e.has_child(id))
                .map(|(i, e)| (Some(*i), e)),
        }
    }

    /// Reads the node's inputs and prepares the loop or the items.
    fn begin(&mut self, input: &Value) -> Result<(), NodeError> {
        match &mut self.work {
            Work::Loop(l) => {
                l.machine = Some(LoopMachine::begin(self.id.clone(), l.spec.clone(), input)?);
            }
            Work::Parallel(p) => {
                p.machine = Some(ParallelMachine::begin(p.spec.clone(), input)?);
            }
        }
        Ok(())
    }

    /// Takes back saved progress; every count and index is checked by the machine.
    fn restore(&mut self, frame: FrameState) -> Result<(), NodeError> {
        let bad = |what: String| NodeError::Failed(format!("saved progress does not fit: {what}"));
        match (&mut self.work, frame) {
            (Work::Loop(l), FrameState::Loop(s)) => {
                let progress = LoopProgress {
                    iteration: s.iteration,
                    vars: s.vars,
                    history: s.history,
                    details: s.details,
                    items: s.items,
                    assigned: s.assigned,
                };
                let machine =
                    LoopMachine::restore(self.id.clone(), l.spec.clone(), progress).map_err(bad)?;
                // The iterations that ran assigned these: the next ones see them.
                for (name, value) in machine.assigned() {
                    if !name.contains('.') {
                        self.env.insert(name.clone(), value.clone());
                    }
                    Outer::assign(&mut self.outer, name, value);
                }
                l.machine = Some(machine);
                l.saved_body = Some(s.body);
            }
            (Work::Parallel(p), FrameState::Parallel(s)) => {
                let in_progress: Vec<u32> = s.in_progress.iter().map(|i| i.index).collect();
                // Assignments of items in flight go back to them; finished items' stay with
                // the machine until the node finishes.
                let mut finished_assigned = Vector::new();
                for (index, list) in s.assigned {
                    if in_progress.contains(&index) {
                        p.partial.entry(index).or_default().extend(list);
                    } else {
                        finished_assigned.push_back((index, list));
                    }
                }
                let progress = ParallelProgress {
                    items: s.items,
                    results: s.results,
                    done: s.done,
                    errors: s.errors,
                    assigned: finished_assigned,
                };
                let machine = ParallelMachine::restore(
                    &self.id,
                    p.spec.clone(),
                    progress,
                    &in_progress,
                    self.run.retry_failed,
                )
                .map_err(bad)?;
                p.machine = Some(machine);
                p.saved = s
                    .in_progress
                    .into_iter()
                    .map(|ItemState { index, body }| (index, body))
                    .collect();
            }
            _ => {
                return Err(bad(
                    "a loop's progress for a parallel node or the reverse".into()
                ));
            }
        }
        Ok(())
    }

    /// Starts work after `begin` or `restore`: the current iteration, or the first items.
    async fn kick(&mut self, cell: &ActorCell) -> Vec<(Option<u32>, ExecEvent)> {
        match &mut self.work {
            Work::Loop(l) => {
                let Some(machine) = l.machine.as_mut() else {
                    return Vec::new();
                };
                let step = machine.current();
                self.loop_step(cell, step).await
            }
            Work::Parallel(p) => {
                let Some(machine) = p.machine.as_ref() else {
                    return Vec::new();
                };
                if p.spec.fail_fast
                    && let Some(failed) = machine.first_error()
                {
                    // Restored with a failed item and no retry asked: the node fails again.
                    let path = self.path.child(Frame::Item(failed.index));
                    let error = NodeError::Failed(failed.error.clone());
                    self.fail(Some(path), error);
                    return Vec::new();
                }
                self.start_items(cell).await
            }
        }
    }

    /// Carries a loop's step out: starts the iteration, or finishes or fails the loop.
    async fn loop_step(
        &mut self,
        cell: &ActorCell,
        step: LoopStep,
    ) -> Vec<(Option<u32>, ExecEvent)> {
        match step {
            LoopStep::Start { index, frame } => {
                let Work::Loop(l) = &mut self.work else {
                    return Vec::new();
                };
                let saved = l.saved_body.take();
                let path = self.path.child(Frame::Iteration(index));
                let span = tracing::info_span!(
                    parent: &self.span,
                    "iteration",
                    otel.name = format!("iteration {}", self.id),
                    runvisor.node.id = %self.id,
                    runvisor.node.path = %path,
                    runvisor.iteration.index = index,
                );
                let exec = GraphExec::new(
                    l.spec.body.clone(),
                    path,
                    self.outer.clone(),
                    Some((self.id.clone(), Value::Object(frame))),
                    self.env.clone(),
                    self.history.clone(),
                )
                .within(span);
                let restored = saved.is_some();
                let exec = match saved {
                    Some(body) => match exec.restore(body) {
                        Ok(exec) => exec,
                        Err(e) => {
                            let path = self.path.child(Frame::Iteration(index));
                            self.fail(
                                Some(path),
                                NodeError::Failed(format!("saved progress does not fit: {e}")),
                            );
                            return Vec::new();
                        }
                    },
                    None => exec,
                };
                l.exec = Some(exec);
                self.launch_iteration(cell, restored).await
            }
            LoopStep::Finish(output) => {
                self.end = Some(NodeEnd::checked(output));
                Vec::new()
            }
            LoopStep::Fail { iteration, error } => {
                let path = iteration.map(|i| self.path.child(Frame::Iteration(i)));
                self.fail(path, error);
                Vec::new()
            }
        }
    }

    async fn launch_iteration(
        &mut self,
        cell: &ActorCell,
        restored: bool,
    ) -> Vec<(Option<u32>, ExecEvent)> {
        let run = self.run.clone();
        let host = Host {
            cell,
            run: &run,
            inline_until: self.slice,
        };
        let Work::Loop(l) = &mut self.work else {
            return Vec::new();
        };
        let Some(exec) = l.exec.as_mut() else {
            return Vec::new();
        };
        let ready = exec.first_ready(restored);
        exec.launch(&host, ready)
            .await
            .into_iter()
            .map(|e| (None, e))
            .collect()
    }

    fn handle_events(&mut self, myself: &ActorRef<BodyMsg>, events: Vec<(Option<u32>, ExecEvent)>) {
        for (item, event) in events {
            self.handle_event(myself, item, event);
        }
    }

    fn handle_event(&mut self, myself: &ActorRef<BodyMsg>, item: Option<u32>, event: ExecEvent) {
        match event {
            ExecEvent::Failed { path, error } => {
                if let (Some(index), Work::Parallel(p)) = (item, &mut self.work)
                    && let Some(machine) = p.machine.as_mut()
                {
                    let assigned = p
                        .in_flight
                        .get_mut(&index)
                        .map(|e| std::mem::take(&mut e.up))
                        .unwrap_or_default();
                    let mut assigned_all = p.partial.remove(&index).unwrap_or_default();
                    assigned_all.extend(assigned);
                    match machine.item_failed(index, format!("{path}: {error}"), assigned_all) {
                        ItemStep::Continue => {
                            // Collected: this item ends with its error; its other nodes are
                            // stopped and the other items go on.
                            if let Some(mut exec) = p.in_flight.remove(&index) {
                                exec.halt(true);
                                p.draining.insert(index, exec);
                            }
                            return;
                        }
                        ItemStep::Fail { .. } => {
                            if let Some(exec) = p.in_flight.remove(&index) {
                                p.draining.insert(index, exec);
                            }
                        }
                    }
                }
                self.fail(Some(path), error);
                self.stop(myself, true);
            }
            ExecEvent::Paused(interaction) => {
                if !self.interactions.iter().any(|i| i.id == interaction.id) {
                    if let Some(supervisor) = self.run.supervisor.get() {
                        let _ = supervisor.send_message(RunMsg::Pause(interaction.clone()));
                    }
                    self.interactions.push(interaction);
                }
                self.stop(myself, false);
            }
            // Body executions launch their ready nodes themselves.
            ExecEvent::Ready(_) => {}
            ExecEvent::Stop(mode, reason) => {
                if self.requested_stop.is_none() || mode == StopMode::Force {
                    self.requested_stop = Some((mode, reason));
                }
                if let Some(supervisor) = self.run.supervisor.get() {
                    let _ = supervisor.send_message(RunMsg::Stop {
                        mode,
                        reason,
                        by: "probe",
                    });
                }
                self.stop(myself, mode == StopMode::Force);
            }
        }
    }

    fn fail(&mut self, path: Option<NodePath>, error: NodeError) {
        if self.failure.is_none() {
            self.failure = Some((path, error));
        }
        self.stopping = true;
    }

    /// Stops starting work and asks running body nodes to stop (or aborts them).
    fn stop(&mut self, myself: &ActorRef<BodyMsg>, force: bool) {
        self.stopping = true;
        if force && !self.forced {
            self.forced = true;
            let me = myself.clone();
            self.deadline = Some(tokio::spawn(async move {
                tokio::time::sleep(FORCE_GRACE).await;
                let _ = me.send_message(BodyMsg::Deadline);
            }));
        }
        for exec in self.execs_mut() {
            exec.halt(force);
        }
    }

    /// Moves on as far as possible: records iterations and items that are done, starts the
    /// next ones, and ends the actor when nothing is left to wait for.
    async fn settle(&mut self, myself: &ActorRef<BodyMsg>) {
        let cell = myself.get_cell();
        loop {
            if self.end.is_some() {
                // Finished: `post_stop` hands the report over.
                myself.stop(None);
                return;
            }
            if self.stopping {
                if self.execs_mut().iter().all(|e| e.is_idle()) {
                    let end = match self.failure.take() {
                        Some((path, error)) => NodeEnd::Failed {
                            path,
                            error,
                            frame: self.progress_frame(),
                        },
                        None => self.interrupted_end(self.forced),
                    };
                    self.end = Some(end);
                    myself.stop(None);
                }
                return;
            }
            let events = match &self.work {
                Work::Loop(_) => self.loop_advance(&cell).await,
                Work::Parallel(_) => self.parallel_advance(&cell).await,
            };
            match events {
                // The step may have finished or failed the body: settle that first.
                None if self.end.is_some() || self.stopping => {}
                None => return,
                Some(events) => self.handle_events(myself, events),
            }
        }
    }

    /// If the current iteration is done: records it and carries out the machine's next step.
    /// `None` when there is nothing to do yet.
    async fn loop_advance(&mut self, cell: &ActorCell) -> Option<Vec<(Option<u32>, ExecEvent)>> {
        let Work::Loop(l) = &mut self.work else {
            return None;
        };
        if l.held.is_some() {
            // The next iteration begins once the one before is stored.
            if self.unsaved > 0 {
                return None;
            }
            let step = l.held.take()?;
            return Some(self.loop_step(cell, step).await);
        }
        if !l.exec.as_ref().is_some_and(GraphExec::is_done) {
            return None;
        }
        let mut exec = l.exec.take()?;
        let end = IterationEnd {
            output: match &l.spec.output {
                Some(t) => t.resolve(&exec),
                None => Ok(exec.sink_outputs()),
            },
            until: match (&l.spec.until, l.spec.mode) {
                (Some(t), LoopMode::Condition) => Some(t.resolve(&exec)),
                _ => None,
            },
            frame: match exec.frame() {
                Some(Value::Object(frame)) => frame.clone(),
                _ => Map::new(),
            },
            nodes: exec.completed(),
            assigned: std::mem::take(&mut exec.up),
        };
        for message in std::mem::take(&mut exec.produced) {
            self.history.push_back(message.clone());
            self.produced.push_back(message);
        }
        add_usage(&mut self.usage, &exec.usage);
        for (name, value) in &end.assigned {
            if !name.contains('.') {
                self.env.insert(name.clone(), value.clone());
            }
            // The next iteration sees what this one assigned to outer loops' variables.
            Outer::assign(&mut self.outer, name, value);
        }
        let Work::Loop(l) = &mut self.work else {
            return None;
        };
        let machine = l.machine.as_mut()?;
        let step = machine.iteration_done(end);
        if matches!(step, LoopStep::Start { .. }) && self.report_progress(cell, true) {
            // `sync`: the next iteration waits until this one is stored.
            if let Work::Loop(l) = &mut self.work {
                l.held = Some(step);
            }
            return None;
        }
        Some(self.loop_step(cell, step).await)
    }

    /// Answers a tree query without blocking: children are asked in a task.
    fn describe(&mut self, myself: &ActorRef<BodyMsg>, reply: RpcReplyPort<ActorTree>) {
        let timeout = self.run.config().query_timeout;
        let kind = match self.work {
            Work::Loop(_) => "loop",
            Work::Parallel(_) => "parallel",
        };
        let children: Vec<(NodePath, ChildRef)> = self
            .execs_mut()
            .iter()
            .flat_map(|e| {
                e.describe_children()
                    .into_iter()
                    .map(|(id, c)| (id, c.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut me = ActorTree::new(
            myself.get_id().to_string(),
            kind,
            Some(self.id.clone()),
            if self.stopping { "stopping" } else { "running" },
        );
        match &self.work {
            Work::Loop(l) => {
                me.iteration = l
                    .exec
                    .as_ref()
                    .and_then(|e| match e.prefix().frames().last() {
                        Some(Frame::Iteration(i)) => Some(*i),
                        _ => None,
                    });
            }
            Work::Parallel(p) => me.items = p.in_flight.keys().copied().collect(),
        }
        tokio::spawn(async move {
            let mut tree = me;
            for (id, child) in children {
                tree.children.push(child.describe(id, timeout).await);
            }
            tree.children.sort_by(|a, b| a.path.cmp(&b.path));
            let _ = reply.send(tree);
        });
    }
}
