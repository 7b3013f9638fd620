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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::Actor;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use crate::event::RunEvent;
use crate::handler::{NodeHandler, RunInfo};
use crate::ids::{RunId, ThreadId};
use crate::kinds::{KindError, Kinds};
use crate::message::{Message, now_ms};
use crate::outcome::{RunError, RunOutcome};
use crate::registry::{ActorTree, LiveRun, LiveState, RunRegistry, RunSummary};
use crate::store::memory::{
    MemoryCheckpointStore, MemoryHistoryStore, MemoryRunStore, MemorySignalSource,
};
use crate::store::{
    CheckpointStore, HistoryStore, RunRecord, RunStatus, RunStore, SignalSource, StoreError,
};
use crate::supervisor::{RunArgs, RunMsg, RunSupervisor};
use crate::value::{Map, Value};
use crate::workflow::{ValidationErrors, Workflow, WorkflowDef};

/// Runtime settings. Durations are humantime strings in config files (`"30s"`, `"250ms"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// How long a graceful stop waits for running nodes before forcing them.
    #[serde(with = "humantime_serde")]
    pub stop_timeout: Duration,
    /// How long an ops query (actor tree) waits for each actor's answer.
    #[serde(with = "humantime_serde")]
    pub query_timeout: Duration,
    /// Events buffered per run for slow subscribers; past that a subscriber misses events
    /// (and is told how many).
    pub event_buffer: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            stop_timeout: Duration::from_secs(30),
            query_timeout: Duration::from_secs(1),
            event_buffer: 1024,
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
        };
        Ok(Runtime {
            kinds: Arc::new(self.kinds),
            services: Arc::new(services),
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
}

/// The runtime. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Runtime {
    kinds: Arc<Kinds>,
    services: Arc<Services>,
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
        match live.supervisor.call(RunMsg::Tree, Some(timeout)).await {
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
        let plan = workflow.plan().clone();
        for node in &plan.graph.nodes {
            if self.kinds.get(&node.kind).is_none() {
                return Err(StartError::UnknownKind(node.kind.to_string()));
            }
        }
        let inputs = check_inputs(workflow, inputs)?;
        let history =
            self.services
                .history
                .load(&thread)
                .await
                .map_err(|error| StartError::History {
                    thread: thread.clone(),
                    error,
                })?;
        let run_id = RunId::new();
        let started_at_ms = now_ms();
        let record = RunRecord {
            run_id,
            thread: thread.clone(),
            workflow_id: plan.def.id.clone(),
            status: RunStatus::Running,
            parent_run_id: None,
            checkpoint_id: None,
            started_at_ms,
            finished_at_ms: None,
            failure_reason: None,
            stop_reason: None,
            unpersisted: None,
        };
        self.services
            .runs
            .put(&record)
            .await
            .map_err(StartError::RunStore)?;

        let mut produced = Vec::new();
        if let Some(Value::String(query)) = inputs.get("query") {
            if !query.is_empty() {
                let mut message = Message::user(query.clone());
                message.run_id = Some(run_id);
                produced.push(message);
            }
        }
        let (events, first_rx) = broadcast::channel(self.services.config.event_buffer.max(1));
        let (outcome_tx, outcome_rx) = watch::channel(None);
        let live = Arc::new(Mutex::new(LiveState {
            status: RunStatus::Running,
            running: Default::default(),
        }));
        let run = Arc::new(RunInfo {
            run_id,
            thread: thread.clone(),
            inputs: Arc::new(inputs),
            events: events.clone(),
        });
        let args = RunArgs {
            plan: plan.clone(),
            run,
            services: self.services.clone(),
            live: live.clone(),
            history,
            produced,
            record,
            outcome: outcome_tx,
        };
        let (supervisor, _) = Actor::spawn(None, RunSupervisor, args)
            .await
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        // The run may already have ended (a one-node workflow); only a live one is listed.
        if outcome_rx.borrow().is_none() {
            self.services.registry.insert(
                run_id,
                LiveRun {
                    thread: thread.clone(),
                    workflow_id: plan.def.id.clone(),
                    started_at_ms,
                    state: live,
                    supervisor,
                },
            );
            if outcome_rx.borrow().is_some() {
                self.services.registry.remove(&run_id);
            }
        }
        Ok(RunHandle {
            run_id,
            thread,
            events,
            first: Mutex::new(Some(first_rx)),
            outcome: outcome_rx,
        })
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
                    problem: format!(
                        "expected {}, found {}",
                        format!("{:?}", decl.ty).to_lowercase(),
                        value.type_name()
                    ),
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

/// A started run: its id, its events, and its outcome.
#[derive(Debug)]
pub struct RunHandle {
    run_id: RunId,
    thread: ThreadId,
    events: broadcast::Sender<RunEvent>,
    first: Mutex<Option<broadcast::Receiver<RunEvent>>>,
    outcome: watch::Receiver<Option<Arc<RunOutcome>>>,
}

impl RunHandle {
    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// The run's thread.
    pub fn thread(&self) -> &ThreadId {
        &self.thread
    }

    /// The run's events. The first call sees every event from the start of the run; later
    /// calls see events from the moment of the call.
    pub fn events(&self) -> EventStream {
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).take();
        EventStream {
            rx: first.unwrap_or_else(|| self.events.subscribe()),
            done: false,
        }
    }

    /// The outcome, if the run has ended.
    pub fn outcome(&self) -> Option<RunOutcome> {
        self.outcome.borrow().as_deref().cloned()
    }

    /// Waits until the run ends and returns its outcome.
    pub async fn wait(&self) -> RunOutcome {
        let mut rx = self.outcome.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(outcome) => match outcome.as_deref() {
                Some(outcome) => outcome.clone(),
                None => self.lost(),
            },
            Err(_) => self.lost(),
        }
    }

    /// The supervisor ended without publishing an outcome (it cannot, short of a bug or a
    /// kill): report that instead of hanging.
    fn lost(&self) -> RunOutcome {
        RunOutcome::Failed {
            run_id: self.run_id,
            error: RunError::Supervisor("run supervisor ended without an outcome".into()),
            outputs: Default::default(),
            history: Default::default(),
        }
    }
}

/// A run's events, in order.
#[derive(Debug)]
pub struct EventStream {
    rx: broadcast::Receiver<RunEvent>,
    done: bool,
}

impl EventStream {
    /// The next event; `None` after the run finished. A subscriber too slow to keep up with
    /// the event buffer gets [`RunEvent::EventsMissed`] in place of the events it missed.
    pub async fn next(&mut self) -> Option<RunEvent> {
        if self.done {
            return None;
        }
        match self.rx.recv().await {
            Ok(event) => {
                if matches!(event, RunEvent::RunFinished { .. }) {
                    self.done = true;
                }
                Some(event)
            }
            Err(broadcast::error::RecvError::Lagged(count)) => {
                Some(RunEvent::EventsMissed { count })
            }
            Err(broadcast::error::RecvError::Closed) => {
                self.done = true;
                None
            }
        }
    }
}
