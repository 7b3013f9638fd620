//! `RunRegistry`: the live runs of this process, for ops tooling (`ps`, `tree`) and for
//! addressing a run by id (stop, query). A run is in the registry from `start` until its
//! supervisor has persisted its end.
//!
//! It also holds, per thread, the one run allowed to start or run on it in this process: a
//! start or resume claims the thread atomically before it reads anything, so of concurrent
//! resumes exactly one goes on. And it keeps the outcomes of recently finished runs, so a stop
//! that arrives after a run ended still learns how it ended.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use serde::{Deserialize, Serialize};

pub(crate) use crate::exec::LiveRun;
use crate::model::{NodePath, RunId, RunOutcome, RunStatus, ThreadId};

/// What ops tooling sees of a live run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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

/// Live runs by id, the run holding each thread, and the outcomes of recently finished runs.
/// Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct RunRegistry {
    runs: Arc<DashMap<RunId, LiveRun>>,
    /// The run starting or live on each thread in this process.
    threads: Arc<DashMap<ThreadId, RunId>>,
    finished: Arc<Mutex<Finished>>,
}

impl Default for RunRegistry {
    fn default() -> Self {
        let config = crate::exec::RuntimeConfig::default();
        Self::new(config.finished_outcomes, config.finished_outcomes_bytes)
    }
}

/// The outcomes of the last runs that ended, oldest first out: at most `capacity` of them,
/// weighing at most `budget` bytes together ([`RunOutcome::weight`]).
#[derive(Debug, Default)]
struct Finished {
    capacity: usize,
    budget: usize,
    order: VecDeque<RunId>,
    outcomes: HashMap<RunId, Kept>,
    /// What the kept outcomes weigh together.
    weight: usize,
}

/// A kept outcome and its weight.
#[derive(Debug)]
struct Kept {
    outcome: Arc<RunOutcome>,
    weight: usize,
}

/// A thread claimed for a run that is starting. Dropping it gives the thread back; once the
/// run is up, [`ThreadClaim::hand_over`] leaves it to the run, which gives it back when it
/// ends (or pauses for input).
#[derive(Debug)]
#[must_use = "dropping the claim gives the thread back at once"]
pub(crate) struct ThreadClaim {
    threads: Arc<DashMap<ThreadId, RunId>>,
    thread: ThreadId,
    run: RunId,
    held: bool,
}

impl ThreadClaim {
    /// The run is up: it holds the thread from now on.
    pub(crate) fn hand_over(mut self) {
        self.held = false;
    }
}

impl Drop for ThreadClaim {
    fn drop(&mut self) {
        if self.held {
            self.threads
                .remove_if(&self.thread, |_, run| *run == self.run);
        }
    }
}

impl RunRegistry {
    /// A registry keeping the outcomes of the last `finished_outcomes` runs that ended, as
    /// many of them as weigh `finished_outcomes_bytes` together.
    pub(crate) fn new(finished_outcomes: usize, finished_outcomes_bytes: usize) -> Self {
        Self {
            runs: Arc::default(),
            threads: Arc::default(),
            finished: Arc::new(Mutex::new(Finished {
                capacity: finished_outcomes,
                budget: finished_outcomes_bytes,
                ..Finished::default()
            })),
        }
    }

    /// Claims `thread` for `run`, atomically: fails with the run that holds it (starting, or
    /// live with actors) if one does.
    pub(crate) fn claim(&self, thread: &ThreadId, run: RunId) -> Result<ThreadClaim, RunId> {
        match self.threads.entry(thread.clone()) {
            Entry::Occupied(holder) => Err(*holder.get()),
            Entry::Vacant(free) => {
                free.insert(run);
                Ok(ThreadClaim {
                    threads: self.threads.clone(),
                    thread: thread.clone(),
                    run,
                    held: true,
                })
            }
        }
    }

    /// The run holding a thread in this process (starting, or live with actors), if any.
    pub fn holder(&self, thread: &ThreadId) -> Option<RunId> {
        self.threads.get(thread).map(|run| *run)
    }

    pub(crate) fn insert(&self, run_id: RunId, run: LiveRun) {
        self.runs.insert(run_id, run);
    }

    /// A run ended (`waiting`: it paused for input and stays listed without actors): its
    /// outcome is kept for late stop callers before it stops being live, and its thread is
    /// given back.
    pub(crate) fn finish(&self, run_id: RunId, waiting: bool, outcome: Arc<RunOutcome>) {
        // Weighed before the lock: a large outcome's walk holds no other run's end back.
        let weight = outcome.weight();
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run_id, Kept { outcome, weight });
        let thread = if waiting {
            self.runs.get_mut(&run_id).map(|mut run| {
                run.supervisor = None;
                run.thread.clone()
            })
        } else {
            self.runs.remove(&run_id).map(|(_, run)| run.thread)
        };
        if let Some(thread) = thread {
            self.threads.remove_if(&thread, |_, run| *run == run_id);
        }
    }

    /// The outcome of a run that ended in this process, while it is among the last
    /// [`RuntimeConfig::finished_outcomes`](crate::RuntimeConfig::finished_outcomes) to end.
    pub fn outcome(&self, run_id: &RunId) -> Option<Arc<RunOutcome>> {
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .outcomes
            .get(run_id)
            .map(|kept| kept.outcome.clone())
    }

    /// Forgets the waiting runs of a thread (it is being resumed).
    pub(crate) fn forget_waiting(&self, thread: &ThreadId) {
        self.runs
            .retain(|_, run| !(run.supervisor.is_none() && &run.thread == thread));
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

impl Finished {
    fn insert(&mut self, run_id: RunId, kept: Kept) {
        if let Some(earlier) = self.outcomes.remove(&run_id) {
            self.order.retain(|id| *id != run_id);
            self.weight = self.weight.saturating_sub(earlier.weight);
        }
        let weight = kept.weight;
        // An outcome heavier than the whole budget is not kept: keeping it would push out
        // every other one.
        if self.capacity == 0 || weight > self.budget {
            return;
        }
        while self.order.len() >= self.capacity || self.weight.saturating_add(weight) > self.budget
        {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.outcomes.remove(&oldest) {
                self.weight = self.weight.saturating_sub(gone.weight);
            }
        }
        self.outcomes.insert(run_id, kept);
        self.order.push_back(run_id);
        self.weight = self.weight.saturating_add(weight);
    }
}
