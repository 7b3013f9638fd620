//! `RunSupervisor`: one actor per run. It executes the workflow's graph (a [`GraphExec`]),
//! whose node, loop and parallel actors are its linked children, learns of every child's end
//! through supervision, and persists the run's end once.
//!
//! The default ractor supervisor handler stops the parent when any child exits; this one
//! overrides it: a child's exit is a node's report (completed, failed, or cut short).
//!
//! Stopping never blocks the mailbox. A stop, a pause at an interactive node or a node failure
//! puts the run in *stopping*: no node starts any more, every running node's stop flag is
//! raised (and, when forced, its work aborted), and each child hands its report over as it
//! ends. When the last child has reported, the run persists once (history, checkpoint, run
//! record) and publishes its outcome. Meanwhile a second stop can escalate graceful to force,
//! and timers bound both.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use imbl::Vector;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::watch;

mod ending;

use super::body::BodyMsg;
use super::graph::{Ended, ExecEvent, GraphExec, Host, INLINE_SLICE, Outer};
use super::run::{LiveRun, RunInfo};
use crate::core::NodeIndex;
use crate::core::lifecycle::{Ending, Final, Lifecycle, StopStep};
use crate::core::save_gate::{ReadyStep, SaveGate};
use crate::model::{
    ActorTree, CheckpointError, CheckpointId, HistoryFlush, Interaction, Map, Message, NodePath,
    RunError, RunEvent, RunId, RunOutcome, RunRecord, RunStatus, StopMode, StopReason, StopResult,
    StoreError, Value, now_ms,
};
use crate::persist::snapshot::{GraphState, SnapshotWrite};
use crate::persist::{Durability, HistoryTail, Notice, Snapshot};
use crate::workflow::Plan;

/// How long aborted nodes get to hand over their reports before they are given up on.
const FORCE_GRACE: Duration = Duration::from_secs(2);

/// How long the run's actor waits for an awaited save itself before handing it to a task of
/// its own (whose answer comes back as `RunMsg::Saved`): a store that answers within this
/// costs no hand-over between tasks, and a stop or query waits at most this long meanwhile.
const SAVE_INLINE: Duration = Duration::from_millis(2);

/// An awaited save in flight, not yet handed to a task.
type PendingSave = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<CheckpointId, CheckpointError>> + Send>,
>;

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
        /// Who asked: `api` (this process's runtime), `signal` (a stop or cancel flag),
        /// `node` (a node of the run), `run_timeout`, `lease_keeper`.
        by: &'static str,
    },
    /// An interactive node inside a body has no answer: pause the run.
    Pause(Interaction),
    /// The graceful timeout passed: force the nodes still running.
    Escalate,
    /// Aborted nodes did not all report in time: give up on the rest.
    Deadline,
    /// Save the run's progress now (async durability: at most once per coalescing window).
    SaveProgress,
    /// An awaited progress snapshot was stored (or failed after the store's retries).
    Saved(Result<CheckpointId, CheckpointError>),
    /// Try the awaited progress snapshot again.
    RetrySave,
    /// A top-level loop or parallel finished iterations or items (its own, or nested
    /// bodies'): what it has finished, and the messages they produced, for the run's progress
    /// snapshots. In `sync` mode, `waiters` (the bodies that finished them) go on once a
    /// snapshot holding it is stored.
    Progress {
        node: crate::core::NodeIndex,
        frame: Box<crate::persist::snapshot::FrameState>,
        messages: Vector<Message>,
        waiters: Vec<ActorRef<BodyMsg>>,
    },
}

/// What waits at the save gate: nodes made ready by a completion, or a loop or parallel (at
/// any depth) whose next iteration or items wait for its progress to be stored.
#[derive(Debug)]
enum Held {
    Node(NodeIndex),
    Body(ActorRef<BodyMsg>),
}

pub(crate) struct RunSupervisor;

/// A run continued from a snapshot.
pub(crate) struct Restore {
    pub(crate) graph: GraphState,
    pub(crate) variables: Map,
    pub(crate) query: Option<Value>,
    pub(crate) parent_run_id: RunId,
}

pub(crate) struct RunArgs {
    pub(crate) plan: Arc<Plan>,
    pub(crate) run: Arc<RunInfo>,
    /// The thread's history as the run read it: what its nodes see of it (the newest
    /// messages, within the runtime's window), and how many it holds (where its snapshots say
    /// the history stood).
    pub(crate) history: HistoryTail,
    /// Messages of the run known at its start (the user's query or instruction).
    pub(crate) produced: Vec<Message>,
    pub(crate) record: RunRecord,
    pub(crate) outcome: watch::Sender<Option<Arc<RunOutcome>>>,
    pub(crate) restore: Option<Restore>,
    /// The workflow definition's content hash, and whether the checkpoint store holds it
    /// (otherwise every snapshot carries the definition).
    pub(crate) workflow_hash: String,
    pub(crate) workflow_stored: bool,
    /// The run's span (a child of the span current where the run was started).
    pub(crate) span: tracing::Span,
}

pub(crate) struct RunState {
    /// The end of the current message's slice for nodes that never block
    /// ([`Host::inline_until`]).
    slice: Option<std::time::Instant>,
    plan: Arc<Plan>,
    run: Arc<RunInfo>,
    exec: GraphExec,
    restored: bool,
    /// Messages known at the start (persisted with the rest).
    start_messages: Vec<Message>,
    /// How many messages the thread's history held when the run started: its snapshots say
    /// where the history stood (what a fork copies).
    history_before: u64,
    query: Option<Value>,
    record: RunRecord,
    outcome: watch::Sender<Option<Arc<RunOutcome>>>,
    /// Running, stopping (why, whether forced) or ended.
    lifecycle: Lifecycle,
    interactions: Vec<Interaction>,
    /// Stop timers (escalation, deadline), cancelled when the run ends.
    timers: Vec<tokio::task::JoinHandle<()>>,
    /// What must be stored before which nodes start.
    gate: SaveGate<Held>,
    /// Since when the run waits for a failing store, and how long earlier waits lasted.
    storage_since: Option<tokio::time::Instant>,
    storage_waited: Duration,
    /// Messages of finished iterations and items of running top-level loops and parallels
    /// (they reach the run with the node's report; until then snapshots carry them).
    body_messages: HashMap<NodeIndex, Vector<Message>>,
    sequence: u64,
    /// The run lost its thread's lease: nothing more is written for it. Holds the store's
    /// refusal when a write found out.
    lease_lost: Option<Option<StoreError>>,
    workflow_hash: String,
    workflow_stored: bool,
    span: tracing::Span,
    /// The span of the stop in progress, and when it was asked.
    stop_span: Option<(tracing::Span, tokio::time::Instant)>,
    /// The awaited save started by this message's handling, waited for at its end (in a
    /// mutex only so the state stays `Sync`; it is never contended).
    pending_save: Option<std::sync::Mutex<PendingSave>>,
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
        let me = myself.clone();
        let _ = run.scope.stop.set(Box::new(move |mode, reason| {
            let _ = me.send_message(RunMsg::Stop {
                mode,
                reason,
                by: "node",
            });
        }));
        let (variables, query, restore) = match args.restore {
            Some(r) => (r.variables, r.query, Some(r.graph)),
            None => (
                plan.variables.clone(),
                run.scope.inputs.get("query").cloned(),
                None,
            ),
        };
        let mut sys = Map::new();
        if let Some(query) = &query {
            sys.insert("query".into(), query.clone());
        }
        sys.insert("run_id".into(), Value::String(run.run_id.to_string()));
        sys.insert("thread_id".into(), Value::String(run.thread.to_string()));
        sys.insert("workflow_id".into(), Value::String(plan.def.id.clone()));
        let span = args.span;
        let history_before = args.history.total;
        let mut history = args.history.messages;
        history.extend(args.produced.iter().cloned());
        let exec = GraphExec::new(
            plan.graph.clone(),
            NodePath::root(),
            Arc::new(Outer {
                sys,
                ..Outer::default()
            }),
            None,
            variables,
            history.into_iter().collect(),
        )
        .within(span.clone());
        let restored = restore.is_some();
        let mut exec = exec;
        // Between a node's completion and its dependents' start, the run saves its progress.
        exec.defer_launch = run.config().durability != Durability::Exit;
        let exec = match restore {
            Some(state) => exec
                .restore(state)
                .map_err(|e| format!("the checkpoint does not fit its workflow: {e}"))?,
            None => exec,
        };
        if !run.signal_keys.stop.is_empty() || !run.signal_keys.cancel.is_empty() {
            run.services
                .watch(run.run_id, run.signal_keys.clone(), myself.clone())
                .await;
        }
        // The lease keeper renews the run's lease while it runs, and stops it if it is lost.
        run.services
            .hold_lease(
                run.run_id,
                run.thread.clone(),
                run.lease.clone(),
                myself.clone(),
            )
            .await;
        run.services.register(
            run.run_id,
            LiveRun {
                thread: run.thread.clone(),
                workflow_id: plan.def.id.clone(),
                started_at_ms: args.record.started_at_ms,
                state: run.live.clone(),
                supervisor: Some(myself),
                outcome: args.outcome.subscribe(),
            },
        );
        Ok(RunState {
            slice: None,
            plan,
            run,
            exec,
            restored,
            start_messages: args.produced,
            history_before,
            query,
            record: args.record,
            outcome: args.outcome,
            lifecycle: Lifecycle::Running,
            interactions: Vec::new(),
            timers: Vec::new(),
            gate: SaveGate::default(),
            storage_since: None,
            storage_waited: Duration::ZERO,
            body_messages: Default::default(),
            sequence: 0,
            lease_lost: None,
            workflow_hash: args.workflow_hash,
            workflow_stored: args.workflow_stored,
            span,
            stop_span: None,
            pending_save: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.begin_slice();
        tracing::debug!(parent: &state.span, "run started");
        if let Some(deadline) = state.run.config().run_timeout {
            let me = myself.clone();
            let mode = StopMode::Graceful {
                timeout: state.run.config().stop_timeout,
            };
            state.timers.push(tokio::spawn(async move {
                tokio::time::sleep(deadline).await;
                let _ = me.send_message(RunMsg::Stop {
                    mode,
                    reason: StopReason::Timeout,
                    by: "run_timeout",
                });
            }));
        }
        state.run.emit(RunEvent::RunStarted {
            run_id: state.run.run_id,
            thread: state.run.thread.clone(),
        });
        let ready = state.exec.first_ready(state.restored);
        let events = state.launch(&myself, ready).await;
        state.process(&myself, events).await;
        state.drive_save(&myself).await;
        state.settle(&myself).await;
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
            RunMsg::Tree(reply) => state.answer_tree(&myself, reply),
            RunMsg::Stop { mode, reason, by } => {
                if reason == StopReason::LeaseLost && state.lease_lost.is_none() {
                    tracing::warn!(parent: &state.span, "the run lost its thread's lease: it stops and writes nothing more");
                    state.lease_lost = Some(None);
                }
                state.begin_stop(&myself, Ending::Stop(reason), mode, by);
            }
            RunMsg::Pause(interaction) => state.pause(&myself, interaction),
            RunMsg::Escalate => state.escalate(&myself),
            RunMsg::SaveProgress => {
                state.gate.fired();
                if state.lifecycle.is_running() {
                    state.save_in_background().await;
                }
            }
            RunMsg::Saved(result) => state.saved(&myself, result).await,
            RunMsg::Progress {
                node,
                frame,
                messages,
                waiters,
            } => {
                // Not noted: the run is stopping, and so are the waiting bodies.
                if state.lifecycle.is_running() && state.exec.note_progress(node, *frame) {
                    state.body_messages.insert(node, messages);
                    match state.run.config().durability {
                        Durability::Exit => {}
                        Durability::Async => state.progress(&myself),
                        // The bodies go on once a snapshot holding this is stored.
                        Durability::Sync => {
                            let held = waiters.into_iter().map(Held::Body).collect();
                            match state.gate.ready(held, true) {
                                ReadyStep::Save => state.start_save(),
                                ReadyStep::Hold => {}
                                ReadyStep::Launch(held) => {
                                    state.release(held);
                                }
                            }
                        }
                    }
                }
            }
            RunMsg::RetrySave => {
                if state.lifecycle.is_running() && state.gate.retry() {
                    state.start_save();
                }
            }
            RunMsg::Deadline => {
                let cell = myself.get_cell();
                let run = state.run.clone();
                let host = Host {
                    cell: &cell,
                    run: &run,
                    inline_until: state.slice,
                };
                let mut events = Vec::new();
                for report in state.exec.abandon(&host) {
                    events.extend(state.exec.on_report(&host, report).await);
                }
                state.process(&myself, events).await;
            }
        }
        state.drive_save(&myself).await;
        state.settle(&myself).await;
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
        let Some(events) = state.exec.child_ended(&host, &ended).await else {
            return Ok(());
        };
        state.process(&myself, events).await;
        state.drive_save(&myself).await;
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
        if !state.lifecycle.is_ended() {
            state.begin_stop(
                &myself,
                Ending::Stop(StopReason::Shutdown),
                StopMode::Force,
                "runtime",
            );
            let cell = myself.get_cell();
            let run = state.run.clone();
            let host = Host {
                cell: &cell,
                run: &run,
                inline_until: None,
            };
            for mut child in state.exec.drain_children() {
                match tokio::time::timeout(FORCE_GRACE, &mut child.report).await {
                    Ok(Ok(report)) => {
                        let _ = state.exec.on_report(&host, report).await;
                    }
                    _ => {
                        child.actor.kill();
                        let _ =
                            state
                                .exec
                                .on_lost(&host, child, "did not hand over its state in time");
                    }
                }
            }
            Box::pin(state.end_run()).await;
        }
        Ok(())
    }
}

impl RunState {
    /// Starts ready nodes of the workflow's graph.
    async fn launch(
        &mut self,
        myself: &ActorRef<RunMsg>,
        ready: Vec<crate::core::NodeIndex>,
    ) -> Vec<ExecEvent> {
        let cell = myself.get_cell();
        let run = self.run.clone();
        let host = Host {
            cell: &cell,
            run: &run,
            inline_until: self.slice,
        };
        self.exec.launch(&host, ready).await
    }

    /// Starts the slice of this message within which never-blocking nodes run on this actor.
    fn begin_slice(&mut self) {
        self.slice = Some(std::time::Instant::now() + INLINE_SLICE);
    }

    /// Acts on what the graph reported: failures, pauses and stops end the run; ready nodes
    /// start after the run's progress is saved (per the durability mode).
    async fn process(&mut self, myself: &ActorRef<RunMsg>, events: Vec<ExecEvent>) {
        let mut queue: std::collections::VecDeque<ExecEvent> = events.into();
        while let Some(event) = queue.pop_front() {
            match event {
                ExecEvent::Ready(ready) => {
                    if !self.lifecycle.is_running() {
                        continue;
                    }
                    // Dependents start once the progress that made them ready is stored, when
                    // the durability mode asks for it.
                    let ready = ready.into_iter().map(Held::Node).collect();
                    match self.gate.ready(ready, self.must_save_first()) {
                        ReadyStep::Save => self.start_save(),
                        ReadyStep::Hold => {}
                        ReadyStep::Launch(held) => {
                            self.progress(myself);
                            let ready = self.release(held);
                            queue.extend(self.launch(myself, ready).await);
                        }
                    }
                }
                ExecEvent::Failed { path, error } => {
                    tracing::info!(parent: &self.span, node = %path, %error, "node failed");
                    let cause = Ending::Failure(RunError::Node { path, error });
                    self.begin_stop(myself, cause, StopMode::Force, "failure");
                }
                ExecEvent::Paused(interaction) => self.pause(myself, interaction),
                ExecEvent::Stop(mode, reason) => {
                    self.begin_stop(myself, Ending::Stop(reason), mode, "probe");
                }
            }
        }
    }

    /// Lets held bodies go on (their progress is stored) and returns the held nodes, to start.
    fn release(&self, held: Vec<Held>) -> Vec<NodeIndex> {
        let mut nodes = Vec::new();
        for h in held {
            match h {
                Held::Node(node) => nodes.push(node),
                Held::Body(body) => {
                    let _ = body.send_message(BodyMsg::Saved);
                }
            }
        }
        nodes
    }

    /// Whether dependents must wait until the run's progress is stored: always in `sync` mode;
    /// in `async` mode when too many snapshots already wait for the store.
    fn must_save_first(&self) -> bool {
        let config = self.run.config();
        match config.durability {
            Durability::Sync => true,
            Durability::Async => self.run.services.backlog_bytes() > config.checkpoint_buffer,
            Durability::Exit => false,
        }
    }

    /// In `async` mode, arms one background save at the end of the coalescing window, so a
    /// burst of completions costs one snapshot.
    fn progress(&mut self, myself: &ActorRef<RunMsg>) {
        if self.run.config().durability == Durability::Async && self.gate.arm() {
            let window = self.run.config().checkpoint_coalesce;
            self.timer(myself, window, || RunMsg::SaveProgress);
        }
    }

    /// The run's progress as a snapshot: messages are persisted when the run ends; until then
    /// they travel in its snapshots, so a crash loses none of them (a resume persists them,
    /// once, by id).
    fn progress_snapshot(&mut self) -> SnapshotWrite {
        let running = self.exec.running_nodes();
        self.body_messages.retain(|node, _| running.contains(node));
        // Persistent vectors: joining them shares their contents instead of copying them.
        let mut produced: Vector<Message> = self.start_messages.iter().cloned().collect();
        produced.append(self.exec.produced.clone());
        for messages in self.body_messages.values() {
            produced.append(messages.clone());
        }
        // Nothing of the run is in the history store yet: it stands where the run found it.
        self.snapshot(RunStatus::Running, None, produced, self.history_before)
    }

    /// Hands the run's progress to the checkpointer, to write in the background.
    async fn save_in_background(&mut self) {
        let mut write = self.progress_snapshot();
        write.mode = "async";
        self.run.services.save_background(write).await;
    }

    /// Starts an awaited save of the run's progress for the held ready nodes, waited for at
    /// the end of the message being handled ([`Self::drive_save`]).
    fn start_save(&mut self) {
        let write = self.progress_snapshot();
        let services = self.run.services.clone();
        let deadline = tokio::time::Instant::now() + self.run.config().store_deadline;
        debug_assert!(self.pending_save.is_none(), "one awaited save at a time");
        self.pending_save = Some(std::sync::Mutex::new(Box::pin(async move {
            services
                .save_awaited(write, deadline)
                .await
                .map_err(|failed| failed.error)
        })));
    }

    /// Waits for the awaited save in flight, for at most [`SAVE_INLINE`], and acts on its
    /// answer (which may start the next one); a save that takes longer goes on in a task of
    /// its own and its answer comes back as `RunMsg::Saved`, so the run keeps answering stops
    /// and queries meanwhile.
    async fn drive_save(&mut self, myself: &ActorRef<RunMsg>) {
        while let Some(save) = self.pending_save.take() {
            let mut save = save.into_inner().unwrap_or_else(|e| e.into_inner());
            match tokio::time::timeout(SAVE_INLINE, &mut save).await {
                Ok(result) => Box::pin(self.saved(myself, result)).await,
                Err(_) => {
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let result = save.await;
                        let _ = me.send_message(RunMsg::Saved(result));
                    });
                }
            }
        }
    }

    /// An awaited progress snapshot came back: start the nodes it was holding, or, if the store
    /// kept failing, wait for it (the run pauses rather than going on unsaved) and try again;
    /// if the store refused it for good, the run fails (waiting would never end).
    async fn saved(
        &mut self,
        myself: &ActorRef<RunMsg>,
        result: Result<CheckpointId, CheckpointError>,
    ) {
        let running = self.lifecycle.is_running();
        let step = self.gate.saved(result.is_ok(), running);
        match result {
            Ok(id) => {
                self.record.checkpoint_id = Some(id);
                if step.wait_over {
                    if let Some(since) = self.storage_since.take() {
                        self.storage_waited += since.elapsed();
                    }
                    self.run.live().waiting_for_storage = false;
                    tracing::info!(parent: &self.span, "checkpoint store is back; the run goes on");
                    self.run.emit(RunEvent::StorageWait {
                        waiting: false,
                        error: None,
                    });
                }
                let launch = self.release(step.launch);
                if !launch.is_empty() {
                    let events = self.launch(myself, launch).await;
                    Box::pin(self.process(myself, events)).await;
                }
                if step.save_again {
                    self.start_save();
                }
            }
            Err(CheckpointError::Refused(e @ StoreError::Fenced { .. })) => {
                // Another run holds the thread now: this one stops without writing more.
                tracing::warn!(parent: &self.span, error = %e, "progress refused: the run lost its thread's lease");
                self.lease_lost = Some(Some(e));
                self.begin_stop(
                    myself,
                    Ending::Stop(StopReason::LeaseLost),
                    StopMode::Force,
                    "store",
                );
            }
            Err(error) if !error.is_transient() => {
                tracing::error!(parent: &self.span, %error, "the run's progress is refused for good: the run fails");
                let cause = Ending::Failure(RunError::Storage(error));
                self.begin_stop(myself, cause, StopMode::Force, "store");
            }
            Err(error) => {
                if step.wait_begins {
                    self.storage_since = Some(tokio::time::Instant::now());
                    self.run.live().waiting_for_storage = true;
                    tracing::warn!(parent: &self.span, %error, "checkpoint store failing: the run waits for it");
                    self.run.emit(RunEvent::StorageWait {
                        waiting: true,
                        error: Some(error),
                    });
                }
                if step.retry {
                    self.timer(myself, Duration::from_millis(500), || RunMsg::RetrySave);
                }
            }
        }
    }

    /// The run's state as a snapshot to write, with the next sequence number. `history_len`:
    /// how many messages the thread's history store holds that belong to this state (the
    /// pending messages come after them).
    fn snapshot(
        &mut self,
        status: RunStatus,
        stop_reason: Option<StopReason>,
        pending_messages: Vector<Message>,
        history_len: u64,
    ) -> SnapshotWrite {
        self.sequence += 1;
        SnapshotWrite {
            thread: self.run.thread.clone(),
            run: self.run.run_id,
            sequence: self.sequence,
            fence: self.run.fence(),
            mode: "sync",
            parent: self.span.clone(),
            snapshot: Box::new(Snapshot {
                run_id: self.run.run_id,
                parent_run_id: self.record.parent_run_id,
                thread: self.run.thread.clone(),
                sequence: self.sequence,
                created_at_ms: now_ms(),
                status,
                stop_reason,
                workflow_hash: self.workflow_hash.clone(),
                workflow: (!self.workflow_stored).then(|| self.plan.def_json()),
                inputs: Map::clone(&self.run.scope.inputs),
                query: self.query.clone(),
                variables: self.exec.env.clone(),
                graph: self.exec.state(),
                interactions: self.interactions.clone(),
                pending_messages,
                labels: self.run.labels.clone(),
                history_len: Some(history_len),
            }),
        }
    }

    fn pause(&mut self, myself: &ActorRef<RunMsg>, interaction: Interaction) {
        if !self.interactions.iter().any(|i| i.id == interaction.id) {
            tracing::info!(parent: &self.span, at = %interaction.path, "paused for input");
            self.interactions.push(interaction);
        }
        let mode = StopMode::Graceful {
            timeout: self.run.config().stop_timeout,
        };
        self.begin_stop(myself, Ending::Pause, mode, "interaction");
    }

    /// Puts the run into stopping (or escalates a graceful stop in progress to force), as the
    /// lifecycle decides.
    fn begin_stop(
        &mut self,
        myself: &ActorRef<RunMsg>,
        cause: Ending,
        mode: StopMode,
        by: &'static str,
    ) {
        let reason = match &cause {
            Ending::Stop(reason) => Some(*reason),
            _ => None,
        };
        match self.lifecycle.stop(cause, mode, self.exec.is_idle()) {
            StopStep::Ignore => {}
            StopStep::Escalate => self.abort_running(myself),
            StopStep::Begin {
                force,
                escalate_after,
            } => {
                if let Some(reason) = reason {
                    tracing::info!(parent: &self.span, %reason, ?mode, "stopping");
                    self.run.emit(RunEvent::Stopping { reason });
                    let mode_name = match mode {
                        StopMode::Graceful { .. } => "graceful",
                        StopMode::Force => "force",
                    };
                    let span = tracing::info_span!(
                        parent: &self.span,
                        "stop",
                        otel.name = "stop",
                        runvisor.stop.mode = mode_name,
                        runvisor.stop.reason = reason.as_str(),
                        runvisor.stop.requested_by = by,
                        runvisor.stop.latency_ms = tracing::field::Empty,
                        runvisor.stop.interrupted_nodes = tracing::field::Empty,
                        runvisor.stop.flushed.messages = tracing::field::Empty,
                        runvisor.stop.flushed.checkpoint = tracing::field::Empty,
                        runvisor.stop.flushed.history = tracing::field::Empty,
                    );
                    self.stop_span = Some((span, tokio::time::Instant::now()));
                }
                if force {
                    self.abort_running(myself);
                } else {
                    self.exec.halt(false);
                    if let Some(timeout) = escalate_after {
                        self.timer(myself, timeout, || RunMsg::Escalate);
                    }
                }
            }
        }
    }

    /// The graceful timeout passed: aborts the nodes still running.
    fn escalate(&mut self, myself: &ActorRef<RunMsg>) {
        if self.lifecycle.escalate() {
            self.abort_running(myself);
        }
    }

    /// Aborts every running node; gives them a bounded time to hand over what they hold.
    fn abort_running(&mut self, myself: &ActorRef<RunMsg>) {
        self.exec.halt(true);
        if !self.exec.is_idle() {
            self.timer(myself, FORCE_GRACE, || RunMsg::Deadline);
        }
    }

    /// Sends a message to this run after a delay, unless the run has ended by then.
    fn timer(&mut self, myself: &ActorRef<RunMsg>, after: Duration, msg: fn() -> RunMsg) {
        let me = myself.clone();
        self.timers.retain(|t| !t.is_finished());
        self.timers.push(tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = me.send_message(msg());
        }));
    }

    /// Ends the run when there is nothing left to wait for.
    async fn settle(&mut self, myself: &ActorRef<RunMsg>) {
        if self.lifecycle.is_ended() || !self.exec.is_idle() {
            return;
        }
        if self.lifecycle.is_running() && self.gate.busy() {
            // Ready nodes wait for their progress to be stored.
            return;
        }
        // Boxed: the end's future is large, and every handler awaits `settle`; inline, each
        // message would move a future that size (ractor handles one message at a time).
        Box::pin(self.end_run()).await;
        myself.stop(None);
    }

    /// Answers a tree query without blocking the run: each child is asked in a task.
    fn answer_tree(&self, myself: &ActorRef<RunMsg>, reply: RpcReplyPort<ActorTree>) {
        let children: Vec<_> = self
            .exec
            .describe_children()
            .into_iter()
            .map(|(id, c)| (id, c.clone()))
            .collect();
        let timeout = self.run.config().query_timeout;
        let status = match self.lifecycle.describe() {
            Some(doing) => doing.to_owned(),
            None => self.run.live().status.to_string(),
        };
        let me = ActorTree::new(myself.get_id().to_string(), "run_supervisor", None, status);
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
