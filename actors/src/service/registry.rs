//! `RunRegistry`: the live runs of this process, for ops tooling (`ps`, `tree`) and for
//! addressing a run by id (stop, query). A run is in the registry from `start` until its
//! supervisor has persisted its end.

use std::sync::Arc;

use dashmap::DashMap;
use serde::Serialize;

pub(crate) use crate::exec::LiveRun;
use crate::model::{NodePath, RunId, RunStatus, ThreadId};

/// What ops tooling sees of a live run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    /// The run.
    pub run_id: RunId,
    /// Its thread.
    pub thread: ThreadId,
    /// The workflow it runs.
    pub workflow_id: String,
    /// Its status.
    pub status: RunStatus,
    /// Milliseconds since the epoch.
    pub started_at_ms: u64,
    /// The nodes running now, by path (a node inside a loop shows its iteration).
    pub running_nodes: Vec<NodePath>,
    /// Whether the run waits for the checkpoint store (it failed; nothing goes on unsaved).
    pub waiting_for_storage: bool,
}

/// Live runs by id. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct RunRegistry {
    runs: Arc<DashMap<RunId, LiveRun>>,
}

impl RunRegistry {
    pub(crate) fn insert(&self, run_id: RunId, run: LiveRun) {
        self.runs.insert(run_id, run);
    }

    pub(crate) fn remove(&self, run_id: &RunId) {
        self.runs.remove(run_id);
    }

    /// Keeps a run listed without actors (it waits for input).
    pub(crate) fn detach(&self, run_id: &RunId) {
        if let Some(mut run) = self.runs.get_mut(run_id) {
            run.supervisor = None;
        }
    }

    /// Forgets the waiting runs of a thread (it is being resumed).
    pub(crate) fn forget_waiting(&self, thread: &ThreadId) {
        self.runs
            .retain(|_, run| !(run.supervisor.is_none() && &run.thread == thread));
    }

    /// The live (not waiting) run of a thread, if there is one.
    pub(crate) fn active_on(&self, thread: &ThreadId) -> Option<RunId> {
        self.runs
            .iter()
            .find(|r| r.supervisor.is_some() && &r.thread == thread)
            .map(|r| *r.key())
    }

    pub(crate) fn get(&self, run_id: &RunId) -> Option<LiveRun> {
        self.runs.get(run_id).map(|r| r.clone())
    }

    /// Whether a run is listed (live, or waiting for input).
    pub fn contains(&self, run_id: &RunId) -> bool {
        self.runs.contains_key(run_id)
    }

    /// How many runs are live.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// Whether no run is live.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The ids of all live runs.
    pub fn ids(&self) -> Vec<RunId> {
        self.runs.iter().map(|r| *r.key()).collect()
    }

    /// A summary of every live run, oldest first.
    pub fn list(&self) -> Vec<RunSummary> {
        let mut out: Vec<RunSummary> = self
            .runs
            .iter()
            .map(|entry| summary(*entry.key(), entry.value()))
            .collect();
        out.sort_by_key(|r| r.run_id);
        out
    }

    /// The summary of one live run.
    pub fn summary(&self, run_id: &RunId) -> Option<RunSummary> {
        self.runs.get(run_id).map(|r| summary(*run_id, &r))
    }
}

fn summary(run_id: RunId, run: &LiveRun) -> RunSummary {
    let state = run.lock();
    RunSummary {
        run_id,
        thread: run.thread.clone(),
        workflow_id: run.workflow_id.clone(),
        status: state.status,
        started_at_ms: run.started_at_ms,
        running_nodes: state.running.iter().cloned().collect(),
        waiting_for_storage: state.waiting_for_storage,
    }
}
