//! `BodyActor`: runs the body sub-graph of a `loop` (iteration by iteration) or a `parallel`
//! node (per item, at most `max_concurrency` items in flight). It is a linked child of the
//! graph that contains its node and the supervisor of its body's actors.
//!
//! Like a `NodeActor`, it ends by handing its parent a report from `post_stop`: the node's
//! output when the body finished, the failure (naming the body node, iteration or item), or,
//! when it was stopped or paused, its progress as a [`FrameState`]: finished iterations and
//! items, loop variables, and the current iteration's or in-flight items' own progress. A
//! resume hands that frame back and the body continues where it was.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::graph::{ChildRef, Ended, ExecEvent, GraphExec, Host, Outer};
use super::node::{NodeEnd, NodeReport};
use super::run::RunInfo;
use super::supervisor::RunMsg;
use crate::core::NodeIndex;
use crate::model::{
    ActorTree, Frame, Interaction, Map, Message, NodeError, NodeId, NodeOutput, NodePath, StopMode,
    Usage, Value, add_usage,
};
use crate::persist::snapshot::{
    FrameState, GraphState, ItemError, ItemState, IterationDetail, LoopState, ParallelState,
};
use crate::workflow::{LoopMode, LoopSpec, NodeSpec, ParallelSpec, case_matches};

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
    pub(crate) history: Arc<[Message]>,
    pub(crate) run: Arc<RunInfo>,
    pub(crate) report: oneshot::Sender<NodeReport>,
    pub(crate) restore: Option<FrameState>,
}

struct LoopWork {
    spec: Arc<LoopSpec>,
    items: Option<Vec<Value>>,
    iteration: u32,
    vars: Map,
    history: Vec<Value>,
    details: Vec<IterationDetail>,
    exec: Option<GraphExec>,
}

struct ParWork {
    spec: Arc<ParallelSpec>,
    items: Vec<Value>,
    results: Vec<Option<Value>>,
    done: Vec<bool>,
    errors: Vec<ItemError>,
    next: u32,
    in_flight: BTreeMap<u32, GraphExec>,
    /// Items that failed (collect mode) and are winding down.
    failing: BTreeMap<u32, String>,
    assigned: Vec<(u32, Vec<(String, Value)>)>,
    /// Saved items to continue before new ones start.
    resume: Vec<(u32, GraphState)>,
}

enum Work {
    Loop(Box<LoopWork>),
    Parallel(Box<ParWork>),
}

pub(crate) struct BodyState {
    node: NodeIndex,
    id: NodeId,
    path: NodePath,
    run: Arc<RunInfo>,
    outer: Arc<Outer>,
    env: Map,
    history: Arc<[Message]>,
    /// Messages of finished iterations and items.
    produced: Vec<Message>,
    usage: Usage,
    /// Assignments to variables this node does not own.
    up: Vec<(String, Value)>,
    report: Option<oneshot::Sender<NodeReport>>,
    work: Work,
    start: Option<(Value, Option<FrameState>)>,
    stopping: bool,
    forced: bool,
    failure: Option<(Option<NodePath>, NodeError)>,
    interactions: Vec<Interaction>,
    /// A stop a probe requested inside the body: carried in the report, because the
    /// parent may see the report before the stop message this body sent to the run.
    requested_stop: crate::kinds::ProbeStop,
    end: Option<NodeEnd>,
    deadline: Option<tokio::task::JoinHandle<()>>,
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
                items: None,
                iteration: 0,
                vars: Map::new(),
                history: Vec::new(),
                details: Vec::new(),
                exec: None,
            })),
            NodeSpec::Parallel(spec) => Work::Parallel(Box::new(ParWork {
                spec,
                items: Vec::new(),
                results: Vec::new(),
                done: Vec::new(),
                errors: Vec::new(),
                next: 0,
                in_flight: BTreeMap::new(),
                failing: BTreeMap::new(),
                assigned: Vec::new(),
                resume: Vec::new(),
            })),
            _ => return Err("a body actor runs only loop and parallel nodes".into()),
        };
        let kind = match work {
            Work::Loop(_) => "loop",
            Work::Parallel(_) => "parallel",
        };
        let span = tracing::info_span!("body", node = %args.path, kind);
        Ok(BodyState {
            node: args.node,
            id: args.id,
            path: args.path,
            run: args.run,
            outer: args.outer,
            env: args.env,
            history: args.history,
            produced: Vec::new(),
            usage: Usage::new(),
            up: Vec::new(),
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
            span,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some((input, restore)) = state.start.take() {
            let cell = myself.get_cell();
            let begun = match restore {
                Some(frame) => state.restore(frame),
                None => state.begin(&input),
            };
            match begun {
                Ok(()) => {
                    let events = state.kick(&cell).await;
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
        match message {
            BodyMsg::Stop(mode) => {
                state.stop(&myself, mode == StopMode::Force);
                state.settle(&myself).await;
            }
            BodyMsg::Describe(reply) => state.describe(&myself, reply),
            BodyMsg::Deadline => {
                let cell = myself.get_cell();
                let host = Host {
                    cell: &cell,
                    run: &state.run.clone(),
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
        let me = myself.get_cell();
        let run = state.run.clone();
        let host = Host {
            cell: &me,
            run: &run,
        };
        let span = state.span.clone();
        let mut events = Vec::new();
        if let Some((item, exec)) = state.exec_of(&ended.id)
            && let Some(more) = exec.child_ended(&host, &ended).instrument(span).await
        {
            events.extend(more.into_iter().map(|e| (item, e)));
        }
        for (item, event) in events {
            state.handle_event(&myself, item, event);
        }
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
        let mut messages = std::mem::take(&mut state.produced);
        let mut usage = std::mem::take(&mut state.usage);
        for exec in state.execs_mut() {
            messages.append(&mut exec.produced);
            add_usage(&mut usage, &exec.usage);
        }
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
    fn execs_mut(&mut self) -> Vec<&mut GraphExec> {
        match &mut self.work {
            Work::Loop(l) => l.exec.iter_mut().collect(),
            Work::Parallel(p) => p.in_flight.values_mut().collect(),
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
                .find(|(_, e)| e.has_child(id))
                .map(|(i, e)| (Some(*i), e)),
        }
    }

    fn history_now(&self) -> Arc<[Message]> {
        if self.produced.is_empty() {
            self.history.clone()
        } else {
            self.history
                .iter()
                .chain(self.produced.iter())
                .cloned()
                .collect()
        }
    }

    /// Reads the node's inputs and prepares the first iteration or the items.
    fn begin(&mut self, input: &Value) -> Result<(), NodeError> {
        let id = self.id.clone();
        match &mut self.work {
            Work::Loop(l) => {
                if let Some(Value::Object(vars)) = input.get("variables") {
                    l.vars = vars.clone();
                }
                if l.spec.mode == LoopMode::Array {
                    let items = items_of(input)?;
                    if items.len() > l.spec.max_iterations as usize {
                        return Err(NodeError::invalid_input(
                            "items",
                            format!(
                                "loop `{id}` has {} items, more than its max_iterations ({})",
                                items.len(),
                                l.spec.max_iterations
                            ),
                        ));
                    }
                    l.items = Some(items);
                }
            }
            Work::Parallel(p) => {
                p.items = items_of(input)?;
                p.results = vec![None; p.items.len()];
                p.done = vec![false; p.items.len()];
            }
        }
        Ok(())
    }

    /// Takes back saved progress.
    fn restore(&mut self, frame: FrameState) -> Result<(), NodeError> {
        let bad = |what: &str| NodeError::Failed(format!("saved progress does not fit: {what}"));
        match (&mut self.work, frame) {
            (Work::Loop(l), FrameState::Loop(s)) => {
                l.iteration = s.iteration;
                l.vars = s.vars;
                l.history = s.history;
                l.details = s.details;
                l.items = s.items;
                for (name, value) in &s.assigned {
                    if !name.contains('.') {
                        self.env.insert(name.clone(), value.clone());
                    }
                    Outer::assign(&mut self.outer, name, value);
                }
                self.up = s.assigned;
                let exec = self
                    .new_iteration_exec()
                    .map(|e| e.restore(s.body))
                    .transpose()
                    .map_err(|e| bad(&e))?;
                if let Work::Loop(l) = &mut self.work {
                    l.exec = exec;
                }
            }
            (Work::Parallel(p), FrameState::Parallel(s)) => {
                if s.results.len() != s.items.len() || s.done.len() != s.items.len() {
                    return Err(bad("item counts differ"));
                }
                p.items = s.items;
                p.results = s.results;
                p.done = s.done;
                p.errors = s.errors;
                // As in a live run, items see the variables as they were when the parallel
                // started; each item's own assignments are given back to it when it continues.
                let mut assigned = s.assigned;
                assigned.sort_by_key(|(i, _)| *i);
                p.assigned = assigned;
                p.resume = s
                    .in_progress
                    .into_iter()
                    .map(|ItemState { index, body }| (index, body))
                    .collect();
            }
            _ => return Err(bad("a loop's progress for a parallel node or the reverse")),
        }
        Ok(())
    }

    fn new_iteration_exec(&self) -> Option<GraphExec> {
        let Work::Loop(l) = &self.work else {
            return None;
        };
        let item = l
            .items
            .as_ref()
            .and_then(|items| items.get(l.iteration as usize).cloned())
            .unwrap_or(Value::Null);
        let mut frame = l.vars.clone();
        frame.insert("index".into(), Value::from(l.iteration));
        frame.insert("item".into(), item);
        Some(GraphExec::new(
            l.spec.body.clone(),
            self.path.child(Frame::Iteration(l.iteration)),
            self.outer.clone(),
            Some((self.id.clone(), Value::Object(frame))),
            self.env.clone(),
            self.history_now(),
        ))
    }

    fn new_item_exec(&self, index: u32) -> Option<GraphExec> {
        let Work::Parallel(p) = &self.work else {
            return None;
        };
        let mut frame = Map::new();
        frame.insert("index".into(), Value::from(index));
        frame.insert(
            "item".into(),
            p.items.get(index as usize).cloned().unwrap_or_default(),
        );
        Some(GraphExec::new(
            p.spec.body.clone(),
            self.path.child(Frame::Item(index)),
            self.outer.clone(),
            Some((self.id.clone(), Value::Object(frame))),
            self.env.clone(),
            self.history_now(),
        ))
    }

    /// Starts work after `begin` or `restore`: the current iteration, or the items.
    async fn kick(&mut self, cell: &ActorCell) -> Vec<(Option<u32>, ExecEvent)> {
        match &self.work {
            Work::Loop(l) => {
                let restored = l.exec.is_some();
                if !restored && self.loop_may_start().is_err() {
                    return Vec::new();
                }
                if !restored {
                    let exec = self.new_iteration_exec();
                    if let Work::Loop(l) = &mut self.work {
                        l.exec = exec;
                    }
                }
                self.launch_loop(cell, restored).await
            }
            Work::Parallel(_) => {
                let mut events = Vec::new();
                let resume = match &mut self.work {
                    Work::Parallel(p) => std::mem::take(&mut p.resume),
                    Work::Loop(_) => Vec::new(),
                };
                for (index, body) in resume {
                    match self.new_item_exec(index).map(|e| e.restore(body)) {
                        Some(Ok(mut exec)) => {
                            if let Work::Parallel(p) = &self.work {
                                let own = p.assigned.iter().filter(|(i, _)| *i == index);
                                for (name, value) in own.flat_map(|(_, list)| list) {
                                    if !name.contains('.') {
                                        exec.env.insert(name.clone(), value.clone());
                                    }
                                }
                            }
                            events.extend(self.launch_item(cell, index, exec, true).await)
                        }
                        None => {}
                        Some(Err(e)) => {
                            self.fail(
                                Some(self.path.child(Frame::Item(index))),
                                NodeError::Failed(format!("saved progress does not fit: {e}")),
                            );
                            return events;
                        }
                    }
                }
                events
            }
        }
    }

    /// Whether an array loop has an item left (or a condition loop any iteration at all).
    fn loop_may_start(&self) -> Result<(), ()> {
        match &self.work {
            Work::Loop(l) => match &l.items {
                Some(items) if l.iteration as usize >= items.len() => Err(()),
                _ => Ok(()),
            },
            Work::Parallel(_) => Ok(()),
        }
    }

    async fn launch_loop(
        &mut self,
        cell: &ActorCell,
        restored: bool,
    ) -> Vec<(Option<u32>, ExecEvent)> {
        let run = self.run.clone();
        let host = Host { cell, run: &run };
        let span = self.span.clone();
        let Work::Loop(l) = &mut self.work else {
            return Vec::new();
        };
        let Some(exec) = l.exec.as_mut() else {
            return Vec::new();
        };
        let iteration = l.iteration;
        let ready = exec.first_ready(restored);
        let span = tracing::info_span!(parent: &span, "iteration", index = iteration);
        exec.launch(&host, ready)
            .instrument(span)
            .await
            .into_iter()
            .map(|e| (None, e))
            .collect()
    }

    async fn launch_item(
        &mut self,
        cell: &ActorCell,
        index: u32,
        mut exec: GraphExec,
        restored: bool,
    ) -> Vec<(Option<u32>, ExecEvent)> {
        let run = self.run.clone();
        let host = Host { cell, run: &run };
        let ready = exec.first_ready(restored);
        let span = tracing::info_span!(parent: &self.span, "item", index);
        let events = exec.launch(&host, ready).instrument(span).await;
        if let Work::Parallel(p) = &mut self.work {
            p.in_flight.insert(index, exec);
        }
        events.into_iter().map(|e| (Some(index), e)).collect()
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
                    && !p.spec.fail_fast
                {
                    // Collect: this item ends with its error; the others go on.
                    p.failing.insert(index, format!("{path}: {error}"));
                    if let Some(exec) = p.in_flight.get_mut(&index) {
                        exec.halt(true);
                    }
                    return;
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
                    let _ = supervisor.send_message(RunMsg::Stop { mode, reason });
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

    /// Moves on as far as possible: finishes iterations and items that are done, starts the
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
                        Some((path, error)) => NodeEnd::Failed { path, error },
                        None => self.interrupted_end(self.forced),
                    };
                    self.end = Some(end);
                    myself.stop(None);
                }
                return;
            }
            let step = match &self.work {
                Work::Loop(_) => self.loop_step(&cell).await,
                Work::Parallel(_) => self.parallel_step(&cell).await,
            };
            match step {
                // The step may have finished or failed the body: settle that first.
                Step::Wait if self.end.is_some() || self.stopping => {}
                Step::Wait => return,
                Step::Events(events) => self.handle_events(myself, events),
            }
        }
    }

    /// One step of a loop: if the current iteration is done, record it and start the next
    /// (or finish the loop).
    async fn loop_step(&mut self, cell: &ActorCell) -> Step {
        let Work::Loop(l) = &mut self.work else {
            return Step::Wait;
        };
        match &l.exec {
            Some(exec) if !exec.is_done() => return Step::Wait,
            Some(_) => {}
            None => {
                // No iteration could start: an array loop over no items.
                self.finish_loop();
                return Step::Wait;
            }
        }
        let Some(exec) = l.exec.take() else {
            return Step::Wait;
        };
        let iteration = l.iteration;
        let entry = match &l.spec.output {
            Some(t) => t.resolve(&exec),
            None => Ok(exec.sink_outputs()),
        };
        let until = match (&l.spec.until, l.spec.mode) {
            (Some(t), LoopMode::Condition) => Some(t.resolve(&exec)),
            _ => None,
        };
        let path = self.path.child(Frame::Iteration(iteration));
        let mut exec = exec;
        self.produced.append(&mut exec.produced);
        add_usage(&mut self.usage, &exec.usage);
        for (name, value) in exec.up.drain(..) {
            if !name.contains('.') {
                self.env.insert(name.clone(), value.clone());
            }
            // The next iteration sees what this one assigned to outer loops' variables.
            Outer::assign(&mut self.outer, &name, &value);
            self.up.push((name, value));
        }
        let Work::Loop(l) = &mut self.work else {
            return Step::Wait;
        };
        if let Some(Value::Object(frame)) = exec.frame() {
            for var in &l.spec.vars {
                if let Some(v) = frame.get(var) {
                    l.vars.insert(var.clone(), v.clone());
                }
            }
        }
        l.details.push(IterationDetail {
            index: iteration,
            nodes: exec.completed(),
        });
        match entry {
            Ok(entry) => l.history.push(entry),
            Err(e) => {
                self.fail(Some(path), NodeError::Resolve(e));
                return Step::Wait;
            }
        }
        let done = match until {
            None => false,
            Some(Ok(condition)) => match case_matches(&condition, 0) {
                Ok(hit) => hit,
                Err(e) => {
                    self.fail(Some(path), e);
                    return Step::Wait;
                }
            },
            Some(Err(e)) => {
                self.fail(Some(path), NodeError::Resolve(e));
                return Step::Wait;
            }
        };
        l.iteration += 1;
        let out_of_items = l
            .items
            .as_ref()
            .is_some_and(|items| l.iteration as usize >= items.len());
        if done || out_of_items {
            self.finish_loop();
            return Step::Wait;
        }
        if l.spec.mode == LoopMode::Condition && l.iteration >= l.spec.max_iterations {
            let error = NodeError::Failed(format!(
                "loop `{}` reached max_iterations ({}) before its `until` condition held",
                self.id, l.spec.max_iterations
            ));
            self.fail(None, error);
            return Step::Wait;
        }
        self.report_progress();
        let exec = self.new_iteration_exec();
        if let Work::Loop(l) = &mut self.work {
            l.exec = exec;
        }
        Step::Events(self.launch_loop(cell, false).await)
    }

    /// Hands the run what this top-level body has finished (iterations, items) and the
    /// messages they produced, so the run's progress snapshots hold them: a crash then reruns
    /// only the iteration or items in flight. Nested bodies are saved by their parent's stop.
    fn report_progress(&self) {
        if self.path.frames().len() != 1
            || self.run.config().durability == crate::persist::Durability::Exit
        {
            return;
        }
        let frame = match &self.work {
            Work::Loop(l) => FrameState::Loop(LoopState {
                iteration: l.iteration,
                vars: l.vars.clone(),
                history: l.history.clone(),
                details: l.details.clone(),
                items: l.items.clone(),
                body: GraphState::default(),
                assigned: self.up.clone(),
            }),
            Work::Parallel(p) => FrameState::Parallel(ParallelState {
                items: p.items.clone(),
                results: p.results.clone(),
                done: p.done.clone(),
                errors: p.errors.clone(),
                in_progress: Vec::new(),
                assigned: p.assigned.clone(),
            }),
        };
        if let Some(supervisor) = self.run.supervisor.get() {
            let _ = supervisor.send_message(RunMsg::Progress {
                node: self.node,
                frame: Box::new(frame),
                messages: self.produced.clone(),
            });
        }
    }

    fn finish_loop(&mut self) {
        let Work::Loop(l) = &mut self.work else {
            return;
        };
        let mut out = Map::new();
        out.insert(
            "history".into(),
            Value::Array(std::mem::take(&mut l.history)),
        );
        out.insert("variables".into(), Value::Object(l.vars.clone()));
        out.insert("iterations".into(), Value::from(l.details.len()));
        out.insert(
            "details".into(),
            Value::Array(
                l.details
                    .iter()
                    .map(|d| {
                        let mut m = Map::new();
                        m.insert("index".into(), Value::from(d.index));
                        m.insert(
                            "nodes".into(),
                            Value::Array(d.nodes.iter().map(|n| Value::from(n.as_str())).collect()),
                        );
                        Value::Object(m)
                    })
                    .collect(),
            ),
        );
        let mut output = NodeOutput::new(Value::Object(out));
        output.variables = std::mem::take(&mut self.up);
        self.end = Some(NodeEnd::Completed(output));
    }

    /// One step of a parallel: record finished items, start new ones up to the bound, and
    /// finish when every item is done.
    async fn parallel_step(&mut self, cell: &ActorCell) -> Step {
        let Work::Parallel(p) = &mut self.work else {
            return Step::Wait;
        };
        let finished: Vec<u32> = p
            .in_flight
            .iter()
            .filter(|(i, e)| e.is_done() || (p.failing.contains_key(i) && e.is_idle()))
            .map(|(i, _)| *i)
            .collect();
        let mut progressed = false;
        for index in finished {
            let Some(mut exec) = p.in_flight.remove(&index) else {
                continue;
            };
            self.produced.append(&mut exec.produced);
            add_usage(&mut self.usage, &exec.usage);
            let i = index as usize;
            if let Some(error) = p.failing.remove(&index) {
                p.errors.push(ItemError { index, error });
            } else {
                let result = match &p.spec.output {
                    Some(t) => t.resolve(&exec),
                    None => Ok(exec.sink_outputs()),
                };
                match result {
                    Ok(v) => p.results[i] = Some(v),
                    Err(e) if p.spec.fail_fast => {
                        let path = self.path.child(Frame::Item(index));
                        self.fail(Some(path), NodeError::Resolve(e));
                        return Step::Wait;
                    }
                    Err(e) => p.errors.push(ItemError {
                        index,
                        error: e.to_string(),
                    }),
                }
            }
            p.assigned.push((index, std::mem::take(&mut exec.up)));
            p.done[i] = true;
            progressed = true;
        }
        if progressed && !p.done.iter().all(|d| *d) {
            self.report_progress();
        }
        let Work::Parallel(p) = &mut self.work else {
            return Step::Wait;
        };
        // Start new items up to the bound.
        let mut starts = Vec::new();
        while p.in_flight.len() + starts.len() < p.spec.max_concurrency
            && (p.next as usize) < p.items.len()
        {
            let index = p.next;
            p.next += 1;
            if !p.done[index as usize] && !p.in_flight.contains_key(&index) {
                starts.push(index);
            }
        }
        if starts.is_empty() {
            if p.in_flight.is_empty() && p.done.iter().all(|d| *d) {
                self.finish_parallel();
            }
            return Step::Wait;
        }
        let mut events = Vec::new();
        for index in starts {
            if let Some(exec) = self.new_item_exec(index) {
                events.extend(self.launch_item(cell, index, exec, false).await);
            }
        }
        Step::Events(events)
    }

    fn finish_parallel(&mut self) {
        let Work::Parallel(p) = &mut self.work else {
            return;
        };
        p.assigned.sort_by_key(|(i, _)| *i);
        for (_, list) in p.assigned.drain(..) {
            self.up.extend(list);
        }
        p.errors.sort_by_key(|e| e.index);
        let mut out = Map::new();
        out.insert(
            "results".into(),
            Value::Array(
                p.results
                    .iter_mut()
                    .map(|r| r.take().unwrap_or(Value::Null))
                    .collect(),
            ),
        );
        out.insert(
            "errors".into(),
            Value::Array(
                p.errors
                    .iter()
                    .map(|e| {
                        let mut m = Map::new();
                        m.insert("index".into(), Value::from(e.index));
                        m.insert("error".into(), Value::String(e.error.clone()));
                        Value::Object(m)
                    })
                    .collect(),
            ),
        );
        out.insert("count".into(), Value::from(p.items.len()));
        let mut output = NodeOutput::new(Value::Object(out));
        output.variables = std::mem::take(&mut self.up);
        self.end = Some(NodeEnd::Completed(output));
    }

    /// The report of a body cut short: its progress, to continue on resume.
    fn interrupted_end(&mut self, forced: bool) -> NodeEnd {
        let frame = match &self.work {
            Work::Loop(l) => {
                let (vars, body, mut assigned) = match &l.exec {
                    Some(exec) => {
                        let mut vars = l.vars.clone();
                        if let Some(Value::Object(frame)) = exec.frame() {
                            for var in &l.spec.vars {
                                if let Some(v) = frame.get(var) {
                                    vars.insert(var.clone(), v.clone());
                                }
                            }
                        }
                        (vars, exec.state(), exec.up.clone())
                    }
                    None => (l.vars.clone(), GraphState::default(), Vec::new()),
                };
                let mut all = self.up.clone();
                all.append(&mut assigned);
                FrameState::Loop(LoopState {
                    iteration: l.iteration,
                    vars,
                    history: l.history.clone(),
                    details: l.details.clone(),
                    items: l.items.clone(),
                    body,
                    assigned: all,
                })
            }
            Work::Parallel(p) => {
                let mut assigned = p.assigned.clone();
                let mut in_progress = Vec::new();
                for (&index, exec) in &p.in_flight {
                    if let Some(error) = p.failing.get(&index) {
                        // Collected failure that was winding down: keep it as failed.
                        let _ = error;
                    }
                    in_progress.push(ItemState {
                        index,
                        body: exec.state(),
                    });
                    if !exec.up.is_empty() {
                        assigned.push((index, exec.up.clone()));
                    }
                }
                // Items not started yet stay not done: a resume starts them.
                FrameState::Parallel(ParallelState {
                    items: p.items.clone(),
                    results: p.results.clone(),
                    done: p.done.clone(),
                    errors: p.errors.clone(),
                    in_progress,
                    assigned,
                })
            }
        };
        let inner = match &self.work {
            Work::Loop(l) => l.exec.iter().flat_map(|e| e.interrupted.clone()).collect(),
            Work::Parallel(p) => p
                .in_flight
                .values()
                .flat_map(|e| e.interrupted.clone())
                .collect(),
        };
        NodeEnd::Interrupted {
            forced,
            frame: Some(frame),
            interactions: self.interactions.clone(),
            inner,
        }
    }

    /// Answers a tree query without blocking: children are asked in a task.
    fn describe(&mut self, myself: &ActorRef<BodyMsg>, reply: RpcReplyPort<ActorTree>) {
        let timeout = self.run.config().query_timeout;
        let kind = match self.work {
            Work::Loop(_) => "loop",
            Work::Parallel(_) => "parallel",
        };
        let children: Vec<(NodeId, ChildRef)> = self
            .execs_mut()
            .iter()
            .flat_map(|e| {
                e.describe_children()
                    .into_iter()
                    .map(|(id, c)| (id, c.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let me = ActorTree {
            actor_id: myself.get_id().to_string(),
            kind,
            node_id: Some(self.id.clone()),
            status: if self.stopping { "stopping" } else { "running" }.to_owned(),
            children: Vec::new(),
        };
        tokio::spawn(async move {
            let mut tree = me;
            for (id, child) in children {
                tree.children.push(child.describe(id, timeout).await);
            }
            tree.children.sort_by(|a, b| a.node_id.cmp(&b.node_id));
            let _ = reply.send(tree);
        });
    }
}

enum Step {
    Wait,
    Events(Vec<(Option<u32>, ExecEvent)>),
}

fn items_of(input: &Value) -> Result<Vec<Value>, NodeError> {
    match input.get("items") {
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(other) => Err(NodeError::invalid_input(
            "items",
            format!("expected an array, found {}", other.type_name()),
        )),
        None => Err(NodeError::invalid_input("items", "is required")),
    }
}
