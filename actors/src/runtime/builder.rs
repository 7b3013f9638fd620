//! [`RuntimeBuilder`]: node kinds, stores, probe and config, then a [`Runtime`].

use std::sync::Arc;

use super::facade::Runtime;
use super::services::Services;
use crate::exec::RuntimeConfig;
use crate::kinds::{KindError, Kinds, NodeHandler, Probe};
use crate::persist::memory::{
    MemoryCheckpointStore, MemoryHistoryStore, MemoryRunStore, MemorySignalSource,
};
use crate::persist::{CheckpointStore, HistoryStore, RunStore, SignalSource};

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
        let services = Services::new(
            self.history
                .unwrap_or_else(|| Arc::new(MemoryHistoryStore::new())),
            self.runs.unwrap_or_else(|| Arc::new(MemoryRunStore::new())),
            self.checkpoints
                .unwrap_or_else(|| Arc::new(MemoryCheckpointStore::new())),
            self.signals
                .unwrap_or_else(|| Arc::new(MemorySignalSource::new())),
            self.config,
        );
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
}
