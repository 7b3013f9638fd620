//! The `Runtime` facade: one per process. It knows the node kinds, holds the stores, starts
//! runs (one supervised actor tree each) and answers ops queries about live runs.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use runvisor_actors::{Runtime, ThreadId, Map, Value};
//! let runtime = Runtime::builder().build();
//! let workflow = runtime.load_json(r#"{
//!   "id": "hello",
//!   "nodes": [
//!     {"id": "start", "kind": "begin"},
//!     {"id": "greet", "kind": "message", "params": {"template": "Hello, {{sys.query}}!"}}
//!   ],
//!   "edges": [{"from": "start", "to": "greet"}]
//! }"#)?;
//! let mut inputs = Map::new();
//! inputs.insert("query".into(), Value::from("world"));
//! let run = runtime.start(&workflow, inputs, ThreadId::new("chat-1")?).await?;
//! let outcome = run.wait().await;
//! assert_eq!(outcome.output("greet").and_then(|o| o.get("text")), Some(&Value::from("Hello, world!")));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ractor::{Actor, ActorRef};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use std::sync::atomic::AtomicU64;

use crate::checkpointer::{Backlog, CheckpointMsg, Checkpointer, CheckpointerArgs, Durability};
use crate::event::NodePath;
use crate::handler::{NodeHandler, RunInfo};
use crate::ids::{RunId, ThreadId};
use crate::kinds::{KindError, Kinds};
use crate::message::{Message, now_ms};
use crate::outcome::RunOutcome;
use crate::probe::Probe;
use crate::registry::{ActorTree, LiveState, RunRegistry, RunSummary};
use crate::stop::{FinishedRun, StopError, StopMode, StopReason, StopReply};
use crate::store::memory::{
    MemoryCheckpointStore, MemoryHistoryStore, MemoryRunStore, MemorySignalSource,
};
use crate::store::{
    CheckpointStore, HistoryStore, RunRecord, RunStatus, RunStore, SignalSource, StoreError,
};
use crate::supervisor::{Restore, RunArgs, RunMsg, RunSupervisor};
use crate::value::{Map, Value};
use crate::watcher::{RunLabels, SignalConfig, StopWatcher, WatchMsg, WatchedKeys, WatcherArgs};
use crate::workflow::{Plan, ValidationErrors, Workflow, WorkflowDef};

pub use handle::{EventStream, RunHandle};

mod handle;
mod resume;
mod signals;

pub use signals::StopRequest;

pub use resume::{ResumeError, ResumeFrom, ResumeInput};

/// Runtime settings. Durations are humantime strings in config files (`"30s"`, `"250ms"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// How long a graceful stop waits for running nodes before forcing them.
    #[serde(with = "humantime_serde")]
    pub stop_timeout: Duration,
    /// A deadline for every run: past it the run is stopped gracefully with reason `timeout`
    /// (and stays resumable). None by default.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub run_timeout: Option<Duration>,
    /// How long an ops query (actor tree) waits for each actor's answer.
    #[serde(with = "humantime_serde")]
    pub query_timeout: Duration,
    /// Events buffered per run for slow subscribers; past that a subscriber misses events
    /// (and is told how many).
    pub event_buffer: usize,
    /// When snapshots are written: `sync`, `async` (default) or `exit`.
    pub durability: Durability,
    /// Bytes of background snapshots allowed to wait for the store (during an outage); past
    /// that, runs wait for their snapshot to be stored before going on.
    pub checkpoint_buffer: usize,
    /// In `async` mode, the window over which a run's completions share one snapshot.
    #[serde(with = "humantime_serde")]
    pub checkpoint_coalesce: Duration,
    /// How long an awaited snapshot write keeps retrying a failing store before the run
    /// reports it as not written.
    #[serde(with = "humantime_serde")]
    pub checkpoint_flush_timeout: Duration,
    /// Stop and cancel flags: key formats and timings.
    pub signals: SignalConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            stop_timeout: Duration::from_secs(30),
            run_timeout: None,
            query_timeout: Duration::from_secs(1),
            event_buffer: 1024,
            durability: Durability::Async,
            checkpoint_buffer: 64 * 1024 * 1024,
            checkpoint_coalesce: Duration::from_millis(20),
            checkpoint_flush_timeout: Duration::from_secs(10),
            signals: SignalConfig::default(),
        }
    }
}

/// What every run of a runtime shares.
pub(crate) struct Services {
    pub(crate) history: Arc<dyn HistoryStore>,
    pub(crate) runs: Arc<dyn RunStore>,
    pub(crate) checkpoints: Arc<dyn CheckpointStore>,
    pub(crate) signals: Arc<dyn SignalSource>,
    pub(crate) config: RuntimeConfig,
    pub(crate) registry: RunRegistry,
    checkpointer: tokio::sync::OnceCell<ActorRef<CheckpointMsg>>,
    pub(crate) backlog: Arc<Backlog>,
    watcher: tokio::sync::OnceCell<ActorRef<WatchMsg>>,
    pub(crate) signal_errors: Arc<AtomicU64>,
}

impl Services {
    /// The runtime's stop watcher, spawned on first use.
    pub(crate) async fn watcher(self: &Arc<Self>) -> Result<&ActorRef<WatchMsg>, String> {
        self.watcher
            .get_or_try_init(|| async {
                let args = WatcherArgs {
                    source: self.signals.clone(),
                    services: Arc::downgrade(self),
                    errors: self.signal_errors.clone(),
                };
                Actor::spawn(None, StopWatcher, args)
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| format!("could not spawn the stop watcher: {e}"))
            })
            .await
    }

    /// The runtime's checkpointer, spawned on first use.
    pub(crate) async fn checkpointer(&self) -> Result<&ActorRef<CheckpointMsg>, String> {
        self.checkpointer
            .get_or_try_init(|| async {
                let args = CheckpointerArgs {
                    store: self.checkpoints.clone(),
                    backlog: self.backlog.clone(),
                    flush_timeout: self.config.checkpoint_flush_timeout,
                };
                Actor::spawn(None, Checkpointer, args)
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| format!("could not spawn the checkpointer: {e}"))
            })
            .await
    }
}

impl Drop for Services {
    /// The runtime is gone: its checkpointer writes what is still queued, then ends; its
    /// watcher ends.
    fn drop(&mut self) {
        if let Some(checkpointer) = self.checkpointer.get() {
            let _ = checkpointer.drain();
        }
        if let Some(watcher) = self.watcher.get() {
            watcher.stop(None);
        }
    }
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Runtime`]: node kinds, stores and config. Stores default to the in-memory
/// (embedded) implementations.
pub struct RuntimeBuilder {
    kinds: Kinds,
    kind_errors: Vec<KindError>,
    history: Option<Arc<dyn HistoryStore>>,
    runs: Option<Arc<dyn RunStore>>,
    checkpoints: Option<Arc<dyn CheckpointStore>>,
    signals: Option<Arc<dyn SignalSource>>,
    probe: Option<Arc<dyn Probe>>,
    config: RuntimeConfig,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("kinds", &self.kinds)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// Registers a host node kind. A name that is built in, reserved or already registered
    /// makes [`try_build`](Self::try_build) fail.
    pub fn handler(mut self, kind: impl Into<String>, handler: impl NodeHandler) -> Self {
        if let Err(e) = self.kinds.register(kind, handler) {
            self.kind_errors.push(e);
        }
        self
    }

    /// Registers a shared host node kind.
    pub fn handler_arc(mut self, kind: impl Into<String>, handler: Arc<dyn NodeHandler>) -> Self {
        if let Err(e) = self.kinds.register_arc(kind, handler) {
            self.kind_errors.push(e);
        }
        self
    }

    /// Uses this history store.
    pub fn history_store(mut self, store: Arc<dyn HistoryStore>) -> Self {
        self.history = Some(store);
        self
    }

    /// Uses this run store.
    pub fn run_store(mut self, store: Arc<dyn RunStore>) -> Self {
        self.runs = Some(store);
        self
    }

    /// Uses this checkpoint store.
    pub fn checkpoint_store(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        self.checkpoints = Some(store);
        self
    }

    /// Uses this signal source.
    pub fn signal_source(mut self, source: Arc<dyn SignalSource>) -> Self {
        self.signals = Some(source);
        self
    }

    /// Installs a probe: points where a test (or a policy) may request a stop at an exact
    /// moment. The `testkit` module (cargo feature `testkit`) builds scripted interrupts on it.
    pub fn probe(mut self, probe: Arc<dyn Probe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Uses this config.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Builds the runtime, or reports the first kind that could not be registered.
    pub fn try_build(self) -> Result<Runtime, KindError> {
        if let Some(e) = self.kind_errors.into_iter().next() {
            return Err(e);
        }
        let services = Services {
            history: self
                .history
                .unwrap_or_else(|| Arc::new(MemoryHistoryStore::new())),
            runs: self.runs.unwrap_or_else(|| Arc::new(MemoryRunStore::new())),
            checkpoints: self
                .checkpoints
                .unwrap_or_else(|| Arc::new(MemoryCheckpointStore::new())),
            signals: self
                .signals
                .unwrap_or_else(|| Arc::new(MemorySignalSource::new())),
            config: self.config,
            registry: RunRegistry::default(),
            checkpointer: tokio::sync::OnceCell::new(),
            backlog: Arc::default(),
            watcher: tokio::sync::OnceCell::new(),
            signal_errors: Arc::default(),
        };
        Ok(Runtime {
            kinds: Arc::new(self.kinds),
            services: Arc::new(services),
            probe: self.probe,
        })
    }

    /// Builds the runtime. Panics if a kind could not be registered (a programming error in
    /// the host's setup code); use [`try_build`](Self::try_build) to handle it instead.
    pub fn build(self) -> Runtime {
        match self.try_build() {
            Ok(runtime) => runtime,
            Err(e) => panic!("runvisor runtime setup: {e}"),
        }
    }
}

/// Why a run could not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A declared input is missing, has the wrong type, or an input is not declared.
    #[error("input `{input}`: {problem}")]
    InvalidInput {
        /// The input's name.
        input: String,
        /// What is wrong.
        problem: String,
    },
    /// The workflow uses a kind this runtime does not know.
    #[error("node kind `{0}` is not registered on this runtime")]
    UnknownKind(String),
    /// The thread's history could not be loaded.
    #[error("could not load the history of thread `{thread}`: {error}")]
    History {
        /// The thread.
        thread: ThreadId,
        /// The store's error.
        error: StoreError,
    },
    /// The run could not be recorded.
    #[error("could not record run: {0}")]
    RunStore(StoreError),
    /// The run's supervisor could not be spawned.
    #[error("could not spawn the run supervisor: {0}")]
    Spawn(String),
}

/// Why an ops query about a run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// No live run has this id in this process.
    #[error("no live run {0} in this process")]
    UnknownRun(RunId),
    /// The run ended or did not answer in time.
    #[error("run {0} did not answer: {1}")]
    NoAnswer(RunId, String),
    /// The run holds no actors: it waits for input.
    #[error("run {0} holds no actors ({1})")]
    NotRunning(RunId, RunStatus),
}

/// The runtime. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Runtime {
    kinds: Arc<Kinds>,
    services: Arc<Services>,
    probe: Option<Arc<dyn Probe>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("kinds", &self.kinds)
            .field("live_runs", &self.services.registry.len())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Starts building a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            kinds: Kinds::builtin(),
            kind_errors: Vec::new(),
            history: None,
            runs: None,
            checkpoints: None,
            signals: None,
            probe: None,
            config: RuntimeConfig::default(),
        }
    }

    /// The node kinds this runtime knows.
    pub fn kinds(&self) -> &Kinds {
        &self.kinds
    }

    /// The runtime's config.
    pub fn config(&self) -> &RuntimeConfig {
        &self.services.config
    }

    /// Validates a workflow definition against this runtime's kinds.
    pub fn validate(&self, def: WorkflowDef) -> Result<Workflow, ValidationErrors> {
        Workflow::validate(def, &self.kinds)
    }

    /// Parses and validates a workflow in JSON.
    pub fn load_json(&self, text: &str) -> Result<Workflow, ValidationErrors> {
        Workflow::from_json(text, &self.kinds)
    }

    /// The live runs of this process.
    pub fn registry(&self) -> &RunRegistry {
        &self.services.registry
    }

    /// The history store.
    pub fn history_store(&self) -> &Arc<dyn HistoryStore> {
        &self.services.history
    }

    /// The run store.
    pub fn run_store(&self) -> &Arc<dyn RunStore> {
        &self.services.runs
    }

    /// The checkpoint store.
    pub fn checkpoint_store(&self) -> &Arc<dyn CheckpointStore> {
        &self.services.checkpoints
    }

    /// The signal source.
    pub fn signal_source(&self) -> &Arc<dyn SignalSource> {
        &self.services.signals
    }

    /// How many signal source errors the stop watcher has met (each meant "not stopping").
    pub fn signal_errors(&self) -> u64 {
        self.services
            .signal_errors
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Summaries of the live runs.
    pub fn runs(&self) -> Vec<RunSummary> {
        self.services.registry.list()
    }

    /// The actor tree of a live run, as its actors describe themselves.
    pub async fn tree(&self, run_id: RunId) -> Result<ActorTree, QueryError> {
        let live = self
            .services
            .registry
            .get(&run_id)
            .ok_or(QueryError::UnknownRun(run_id))?;
        // Each node actor is asked with the query timeout; allow for all of them plus slack.
        let timeout = self.services.config.query_timeout * 2;
        let Some(supervisor) = live.supervisor else {
            let status = live.lock().status;
            return Err(QueryError::NotRunning(run_id, status));
        };
        match supervisor.call(RunMsg::Tree, Some(timeout)).await {
            Ok(ractor::rpc::CallResult::Success(tree)) => Ok(tree),
            Ok(other) => Err(QueryError::NoAnswer(run_id, format!("{other:?}"))),
            Err(e) => Err(QueryError::NoAnswer(run_id, e.to_string())),
        }
    }

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
    /// named by, so any process can stop it (see [`SignalConfig`]).
    pub async fn start_with(
        &self,
        workflow: &Workflow,
        inputs: Map,
        thread: ThreadId,
        labels: RunLabels,
    ) -> Result<RunHandle, StartError> {
        let inputs = check_inputs(workflow, inputs)?;
        let history = self.load_history(&thread).await?;
        let run_id = RunId::new();
        let mut produced = Vec::new();
        if let Some(Value::String(query)) = inputs.get("query")
            && !query.is_empty()
        {
            let mut message = Message::user(query.clone());
            message.run_id = Some(run_id);
            produced.push(message);
        }
        self.launch(Launch {
            run_id,
            plan: workflow.plan().clone(),
            inputs,
            thread,
            history,
            produced,
            restore: None,
            answers: HashMap::new(),
            labels,
        })
        .await
    }

    pub(crate) async fn load_history(&self, thread: &ThreadId) -> Result<Vec<Message>, StartError> {
        self.services
            .history
            .load(thread)
            .await
            .map_err(|error| StartError::History {
                thread: thread.clone(),
                error,
            })
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
        } = launch;
        for node in &plan.graph.nodes {
            if self.kinds.get(&node.kind).is_none() {
                return Err(StartError::UnknownKind(node.kind.to_string()));
            }
        }
        let record = RunRecord {
            run_id,
            thread: thread.clone(),
            workflow_id: plan.def.id.clone(),
            status: RunStatus::Running,
            parent_run_id: restore.as_ref().map(|r| r.parent_run_id),
            checkpoint_id: None,
            started_at_ms: now_ms(),
            finished_at_ms: None,
            failure_reason: None,
            stop_reason: None,
            unpersisted: None,
            labels: labels.clone(),
            not_resumable: None,
        };
        self.services
            .runs
            .put(&record)
            .await
            .map_err(StartError::RunStore)?;
        // The definition is stored once per thread; snapshots name it by hash. If it cannot be
        // stored, each snapshot carries it instead.
        let workflow_hash = plan.def_hash();
        let workflow_stored = match self
            .services
            .checkpoints
            .put_workflow(&thread, &workflow_hash, &plan.def_json())
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%thread, error = %e, "workflow definition not stored apart; snapshots will carry it");
                false
            }
        };
        let (events, first_rx) = broadcast::channel(self.services.config.event_buffer.max(1));
        let (outcome_tx, outcome_rx) = watch::channel(None);
        let run = Arc::new(RunInfo {
            run_id,
            thread: thread.clone(),
            inputs: Arc::new(inputs),
            events: events.clone(),
            supervisor: OnceLock::new(),
            probe: self.probe.clone(),
            answers,
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
        };
        Actor::spawn(None, RunSupervisor, args)
            .await
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        Ok(RunHandle::new(
            run_id,
            thread,
            events,
            first_rx,
            outcome_rx,
            self.services.clone(),
        ))
    }

    /// Stops a live run with reason `UserInterrupted`. See [`stop_for`](Self::stop_for).
    pub async fn stop(&self, run_id: RunId, mode: StopMode) -> Result<StopReply, StopError> {
        stop_run(&self.services, run_id, mode, StopReason::UserInterrupted).await
    }

    /// Stops a live run: returns once it has stopped and persisted what it held. Concurrent
    /// callers all get the same [`StopResult`](crate::StopResult); a run that already ended
    /// (or ends on its own first) answers [`StopReply::AlreadyFinished`] with its final state.
    pub async fn stop_for(
        &self,
        run_id: RunId,
        mode: StopMode,
        reason: StopReason,
    ) -> Result<StopReply, StopError> {
        stop_run(&self.services, run_id, mode, reason).await
    }

    /// Gracefully stops every live run with reason `Shutdown` (each within the configured stop
    /// timeout, then forced), so every run stays resumable. Returns each run's answer.
    pub async fn shutdown(&self) -> Vec<(RunId, Result<StopReply, StopError>)> {
        let mode = StopMode::Graceful {
            timeout: self.services.config.stop_timeout,
        };
        let stops = self
            .services
            .registry
            .ids()
            .into_iter()
            .map(|run_id| async move {
                let reply = stop_run(&self.services, run_id, mode, StopReason::Shutdown).await;
                (run_id, reply)
            });
        futures::future::join_all(stops).await
    }
}

/// What `launch` needs to start a run.
pub(crate) struct Launch {
    pub(crate) run_id: RunId,
    pub(crate) plan: Arc<Plan>,
    pub(crate) inputs: Map,
    pub(crate) thread: ThreadId,
    pub(crate) history: Vec<Message>,
    pub(crate) produced: Vec<Message>,
    pub(crate) restore: Option<Restore>,
    /// Answers to interactions, by the path of their node.
    pub(crate) answers: HashMap<NodePath, Value>,
    pub(crate) labels: RunLabels,
}

/// Stops a run of this process, or reports its recorded end.
pub(crate) async fn stop_run(
    services: &Services,
    run_id: RunId,
    mode: StopMode,
    reason: StopReason,
) -> Result<StopReply, StopError> {
    if let Some(live) = services.registry.get(&run_id) {
        // A send fails only when the run is ending: its outcome is published regardless.
        // A run waiting for input has no supervisor: its outcome is there already.
        if let Some(supervisor) = &live.supervisor {
            let _ = supervisor.send_message(RunMsg::Stop { mode, reason });
        }
        let mut rx = live.outcome.clone();
        let outcome = rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|o| o.as_deref().cloned());
        match outcome {
            Some(RunOutcome::Stopped(result)) => return Ok(StopReply::Stopped(result)),
            Some(other) => {
                let record = services.runs.get(run_id).await.ok().flatten();
                return Ok(StopReply::AlreadyFinished(FinishedRun {
                    run_id,
                    status: other.status(),
                    outcome: Some(other),
                    record,
                }));
            }
            None => {}
        }
    }
    match services.runs.get(run_id).await {
        Ok(Some(record)) if record.status.is_terminal() => {
            Ok(StopReply::AlreadyFinished(FinishedRun {
                run_id,
                status: record.status,
                outcome: None,
                record: Some(record),
            }))
        }
        Ok(Some(record)) => Err(StopError::NotInThisProcess(run_id, record.status)),
        Ok(None) => Err(StopError::UnknownRun(run_id)),
        Err(e) => Err(StopError::Store(e.to_string())),
    }
}

/// Applies defaults and checks types of the inputs the `begin` node declares.
fn check_inputs(workflow: &Workflow, mut inputs: Map) -> Result<Map, StartError> {
    let declared = workflow.inputs();
    if declared.is_empty() {
        return Ok(inputs);
    }
    for name in inputs.keys() {
        if !declared.iter().any(|d| &d.name == name) {
            let known: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
            return Err(StartError::InvalidInput {
                input: name.clone(),
                problem: format!(
                    "not declared by the begin node (declared: {})",
                    known.join(", ")
                ),
            });
        }
    }
    for decl in declared {
        match inputs.get(&decl.name) {
            Some(value) if !decl.ty.accepts(value) => {
                return Err(StartError::InvalidInput {
                    input: decl.name.clone(),
                    problem: format!("expected {}, found {}", decl.ty.name(), value.type_name()),
                });
            }
            Some(_) => {}
            None => match &decl.default {
                Some(default) => {
                    inputs.insert(decl.name.clone(), default.clone());
                }
                None if decl.required => {
                    return Err(StartError::InvalidInput {
                        input: decl.name.clone(),
                        problem: "is required".into(),
                    });
                }
                None => {}
            },
        }
    }
    Ok(inputs)
}
