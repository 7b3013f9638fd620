//! [`RuntimeBuilder`]: node kinds, stores, probe and config, then a [`Runtime`].

use std::sync::Arc;

use super::adopt::spawn_adopter;
use super::facade::Runtime;
use super::services::{Services, Stores};
use super::trace::TraceContext;
use crate::exec::RuntimeConfig;
use crate::kinds::{KindError, Kinds, NodeHandler, Probe};
use crate::model::{InvalidId, WorkerId, WorkerInfo};
use crate::persist::memory::{
    MemoryCheckpointStore, MemoryHistoryStore, MemoryRunStore, MemorySignalSource,
};
use crate::persist::{
    CheckpointStore, EndStore, HistoryStore, LeaseStore, MemoryLeaseStore, RunStore, SignalSource,
    SpillStore, StartStore,
};
use crate::service::CheckpointObserver;

/// Builds a [`Runtime`]: node kinds, stores and config. Stores default to the in-memory
/// (embedded) implementations.
pub struct RuntimeBuilder {
    kinds: Kinds,
    kind_errors: Vec<KindError>,
    history: Option<Arc<dyn HistoryStore>>,
    runs: Option<Arc<dyn RunStore>>,
    checkpoints: Option<Arc<dyn CheckpointStore>>,
    signals: Option<Arc<dyn SignalSource>>,
    leases: Option<Arc<dyn LeaseStore>>,
    ends: Option<Arc<dyn EndStore>>,
    starts: Option<Arc<dyn StartStore>>,
    spill: Option<Arc<dyn SpillStore>>,
    probe: Option<Arc<dyn Probe>>,
    trace: Option<Arc<dyn TraceContext>>,
    checkpoint_observer: Option<Arc<dyn CheckpointObserver>>,
    config: RuntimeConfig,
}

/// Why a runtime could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A node kind could not be registered.
    #[error(transparent)]
    Kind(#[from] KindError),
    /// The configured worker id is not acceptable.
    #[error("config `worker_id`: {0}")]
    WorkerId(InvalidId),
    /// A setting cannot work.
    #[error("config `{field}`: {problem}")]
    Config {
        /// The setting, as the config file names it.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A store was given without the lease store whose fencing tokens it checks.
    #[error(
        "a {store} was given without a lease store: fenced writes are checked against the \
         lease store's tokens, so give the one that goes with the stores (RedisStores::install \
         gives both; for stores in one process, MemoryLeaseStore)"
    )]
    LeaseStoreMissing {
        /// Which store was given.
        store: &'static str,
    },
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

    /// Writes each run's end (final checkpoint, messages, record, flags and lease) in one step
    /// through this store, where it can (see [`EndStore`]); it must write to the same place as
    /// the checkpoint, history and run stores given. Without one, the end is written step by
    /// step through those stores.
    pub fn end_store(mut self, store: Arc<dyn EndStore>) -> Self {
        self.ends = Some(store);
        self
    }

    /// Starts each new run (its lease, its first record, its thread's history) in one step
    /// through this store, where it can (see [`StartStore`]); it must write to the same place
    /// as the lease, run and history stores given. Without one, a start takes the lease, then
    /// writes the record and reads the history.
    pub fn start_store(mut self, store: Arc<dyn StartStore>) -> Self {
        self.starts = Some(store);
        self
    }

    /// Uses this lease store (workers' heartbeats, threads' leases and fencing tokens). The
    /// stores given with it check their writes against its tokens, so they must go together
    /// (`RedisStores::install` of the `runvisor` crate gives both); a store given without
    /// a lease store makes [`try_build`](Self::try_build) fail. The default in-memory stores
    /// check tokens only against the default lease store.
    pub fn lease_store(mut self, store: Arc<dyn LeaseStore>) -> Self {
        self.leases = Some(store);
        self
    }

    /// Keeps the ends of runs that the stores did not take (they kept failing until the
    /// store deadline, or refused) in this spill store, to be replayed later
    /// ([`Runtime::replay_spilled`]). Without one, such a run's outcome still reports what was
    /// not stored, and holds it, but nothing outlives the process.
    pub fn spill_store(mut self, store: Arc<dyn SpillStore>) -> Self {
        self.spill = Some(store);
        self
    }

    /// Installs a probe: points where a test (or a policy) may request a stop at an exact
    /// moment. The `testkit` module (cargo feature `testkit`) builds scripted interrupts on it.
    pub fn probe(mut self, probe: Arc<dyn Probe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Tells the runtime how the host's tracing backend names spans: run records then keep
    /// their run's place in its trace, and a resume's span links back to the run it
    /// continues. Without it, spans are made all the same and records keep nothing.
    pub fn trace_context(mut self, trace: Arc<dyn TraceContext>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Tells `observer` of every checkpoint write as it ends (mode, size, time, stored or
    /// not): how a host keeps checkpoint metrics without a tracing layer timing spans.
    pub fn checkpoint_observer(mut self, observer: Arc<dyn CheckpointObserver>) -> Self {
        self.checkpoint_observer = Some(observer);
        self
    }

    /// Uses this config.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Builds the runtime, or reports what is wrong with its setup: a kind that could not be
    /// registered, a bad worker id, or stores without their lease store.
    pub fn try_build(self) -> Result<Runtime, BuildError> {
        if let Some(e) = self.kind_errors.into_iter().next() {
            return Err(BuildError::Kind(e));
        }
        let worker = match &self.config.worker_id {
            Some(id) => WorkerId::new(id).map_err(BuildError::WorkerId)?,
            None => generated_worker_id(),
        };
        if self.config.adopt_orphans && self.config.adopt_every.is_zero() {
            return Err(BuildError::Config {
                field: "adopt_every",
                problem: "must be greater than zero".to_owned(),
            });
        }
        if self.config.store_deadline.is_zero() {
            return Err(BuildError::Config {
                field: "store_deadline",
                problem: "must be greater than zero".to_owned(),
            });
        }
        let lease = &self.config.lease;
        if lease.renew.is_zero() || lease.renew >= lease.ttl {
            return Err(BuildError::Config {
                field: "lease.renew",
                problem: format!(
                    "{} must be greater than zero and less than `lease.ttl` ({})",
                    humantime::format_duration(lease.renew),
                    humantime::format_duration(lease.ttl)
                ),
            });
        }
        if self.leases.is_none() {
            let given = [
                ("history store", self.history.is_some()),
                ("run store", self.runs.is_some()),
                ("checkpoint store", self.checkpoints.is_some()),
                ("signal source", self.signals.is_some()),
                ("end store", self.ends.is_some()),
                ("start store", self.starts.is_some()),
            ];
            if let Some((store, _)) = given.into_iter().find(|(_, given)| *given) {
                return Err(BuildError::LeaseStoreMissing { store });
            }
        }
        // The default in-memory stores check fenced writes against the default lease store;
        // with a lease store of the host's, they cannot see its counters and check nothing.
        let (leases, memory_leases): (Arc<dyn LeaseStore>, _) = match self.leases {
            Some(leases) => (leases, None),
            None => {
                let memory = Arc::new(MemoryLeaseStore::new());
                (memory.clone(), Some(memory))
            }
        };
        let history = MemoryHistoryStore::new();
        let runs = MemoryRunStore::new();
        let checkpoints = MemoryCheckpointStore::new();
        let signals = MemorySignalSource::new();
        let (history, runs, checkpoints, signals) = match memory_leases {
            Some(m) => (
                history.fenced_by(m.clone()),
                runs.fenced_by(m.clone()),
                checkpoints.fenced_by(m.clone()),
                signals.fenced_by(m),
            ),
            None => (history, runs, checkpoints, signals),
        };
        let stores = Stores {
            history: self.history.unwrap_or_else(|| Arc::new(history)),
            runs: self.runs.unwrap_or_else(|| Arc::new(runs)),
            checkpoints: self.checkpoints.unwrap_or_else(|| Arc::new(checkpoints)),
            signals: self.signals.unwrap_or_else(|| Arc::new(signals)),
            leases,
            ends: self.ends,
            starts: self.starts,
            spill: self.spill,
        };
        let mut services = Services::new(stores, self.config, WorkerInfo::this_process(worker));
        services.trace = self.trace;
        services.checkpoint_observer = self.checkpoint_observer;
        let runtime = Runtime {
            kinds: Arc::new(self.kinds),
            services: Arc::new(services),
            probe: self.probe,
        };
        if runtime.services.config.adopt_orphans {
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return Err(BuildError::Config {
                    field: "adopt_orphans",
                    problem: "a runtime adopting orphans must be built inside a tokio runtime"
                        .to_owned(),
                });
            };
            let _enter = handle.enter();
            let adopter = spawn_adopter(
                Arc::downgrade(&runtime.services),
                runtime.kinds.clone(),
                runtime.probe.clone(),
                runtime.services.config.adopt_every,
            );
            let _ = runtime.services.adopter.set(adopter.abort_handle());
        }
        Ok(runtime)
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
            leases: None,
            ends: None,
            starts: None,
            spill: None,
            probe: None,
            trace: None,
            checkpoint_observer: None,
            config: RuntimeConfig::default(),
        }
    }
}

/// A worker id for this process: the host name, the process id and a random part, so two
/// runtimes of one process differ too.
fn generated_worker_id() -> WorkerId {
    let host: String = crate::model::hostname()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .take(64)
        .collect();
    // The random tail of a UUIDv7 (its first part is the time).
    let random = uuid::Uuid::now_v7().simple().to_string();
    let text = format!(
        "{}-{}-{}",
        if host.is_empty() { "worker" } else { &host },
        std::process::id(),
        &random[24..]
    );
    match WorkerId::new(&text) {
        Ok(id) => id,
        // Only letters, digits, `-`, `.` and `_`: always a valid id.
        Err(_) => WorkerId::generate(),
    }
}
