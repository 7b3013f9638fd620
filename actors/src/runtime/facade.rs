//! [`Runtime`]: one per process. It knows the node kinds, holds the stores, and answers ops
//! queries about live runs; starting, stopping and resuming runs are in their own files.

use std::sync::Arc;

use super::errors::QueryError;
use super::services::Services;
use crate::exec::{RunMsg, RuntimeConfig};
use crate::kinds::{Kinds, Probe};
use crate::model::{ActorTree, RunId, StoreError, WorkerInfo};
use crate::persist::{CheckpointStore, HistoryStore, RunStore, SignalSource};
use crate::service::{RunRegistry, RunSummary};
use crate::workflow::{ValidationErrors, Workflow, WorkflowDef};

/// The runtime. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Runtime {
    pub(super) kinds: Arc<Kinds>,
    pub(super) services: Arc<Services>,
    pub(super) probe: Option<Arc<dyn Probe>>,
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
    /// The node kinds this runtime knows.
    pub fn kinds(&self) -> &Kinds {
        &self.kinds
    }

    /// This runtime as a worker: its id (in run records, leases and logs) and heartbeat.
    pub fn worker(&self) -> &WorkerInfo {
        &self.services.worker
    }

    /// Writes this worker's heartbeat now and keeps renewing it (every `lease.renew`) until
    /// [`Runtime::shutdown`]: a worker that takes work from others (a job queue) shows it is
    /// alive before it holds any lease.
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        self.services.ensure_heartbeat().await
    }

    /// The runtime's config.
    pub fn config(&self) -> &RuntimeConfig {
        &self.services.config
    }

    /// Validates a workflow definition against this runtime's kinds.
    pub fn validate(&self, def: WorkflowDef) -> Result<Workflow, ValidationErrors> {
        Workflow::validate(def, &*self.kinds)
    }

    /// Parses and validates a workflow in JSON.
    pub fn load_json(&self, text: &str) -> Result<Workflow, ValidationErrors> {
        Workflow::from_json(text, &*self.kinds)
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
}
