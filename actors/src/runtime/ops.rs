//! Runs as operators see them, across every process sharing the stores: the records of open
//! (or recent) runs, with `orphaned` derived from the workers' heartbeats and, for the runs of
//! this process, what is running now.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use super::facade::Runtime;
use crate::model::{NodePath, RunRecord, RunStatus, StoreError, ThreadId, WorkerId, WorkerInfo};

/// Which runs [`Runtime::list_runs`] lists: build it with `..RunQuery::default()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunQuery {
    /// Also runs that ended (the newest `limit` runs whatever their status); by default only
    /// open runs (running, orphaned, awaiting input).
    pub include_ended: bool,
    /// At most this many runs, newest first.
    pub limit: usize,
    /// Only runs whose status (as derived) is one of these; any status when empty. Naming a
    /// status of ended runs (not running, orphaned or awaiting input) lists the newest `limit`
    /// runs as [`RunQuery::include_ended`] does.
    pub statuses: Vec<RunStatus>,
    /// Only runs of this thread.
    pub thread: Option<ThreadId>,
    /// Only runs with this app id.
    pub app_id: Option<String>,
    /// Only runs with this chat id.
    pub chat_id: Option<String>,
    /// Only runs with this task id.
    pub task_id: Option<String>,
    /// Only runs of this user (their `user` label).
    pub user_id: Option<String>,
    /// Only runs of this worker.
    pub worker: Option<WorkerId>,
}

impl Default for RunQuery {
    fn default() -> Self {
        Self {
            include_ended: false,
            limit: 100,
            statuses: Vec::new(),
            thread: None,
            app_id: None,
            chat_id: None,
            task_id: None,
            user_id: None,
            worker: None,
        }
    }
}

impl RunQuery {
    /// Whether a run, with its derived status, passes the filters.
    fn admits(&self, record: &RunRecord, status: RunStatus) -> bool {
        let label = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|want| have == Some(want))
        };
        (self.statuses.is_empty() || self.statuses.contains(&status))
            && self.thread.as_ref().is_none_or(|t| &record.thread == t)
            && label(&self.app_id, record.labels.app_id())
            && label(&self.chat_id, record.labels.chat_id())
            && label(&self.task_id, record.labels.task_id())
            && label(&self.user_id, record.labels.user_id())
            && self
                .worker
                .as_ref()
                .is_none_or(|w| record.worker.as_ref() == Some(w))
    }
}

/// A run as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RunView {
    /// Its record, as stored.
    pub record: RunRecord,
    /// Its status: the record's, except `orphaned` for a run recorded as running whose worker
    /// stopped heartbeating (or restarted since the run began), and the live status for a run
    /// of this process.
    pub status: RunStatus,
    /// The nodes running now, by path: known for the runs of this process (others' workers
    /// answer for theirs through their own channel); empty otherwise.
    pub running_nodes: Vec<NodePath>,
    /// Whether this process runs it.
    pub here: bool,
    /// Its worker's heartbeat, when the worker is alive.
    pub worker: Option<WorkerInfo>,
}

/// Whether a run recorded as running is orphaned, given its worker's heartbeat (if alive).
pub fn is_orphaned(record: &RunRecord, heartbeat: Option<&WorkerInfo>) -> bool {
    if record.status != RunStatus::Running || record.worker.is_none() {
        return false;
    }
    match heartbeat {
        None => true,
        // The worker restarted after the run began: the run is not among its runs.
        Some(worker) => worker.started_at_ms > record.started_at_ms,
    }
}

impl Runtime {
    /// The runs of every process sharing this runtime's stores, newest first: open runs (or
    /// also ended ones, see [`RunQuery::include_ended`]), filtered. A run recorded as running
    /// whose worker is gone is `orphaned`; a run of this process shows its live status and
    /// running nodes.
    pub async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunView>, StoreError> {
        let ended = query.include_ended || query.statuses.iter().any(|s| !s.is_open());
        let mut records = if ended {
            self.services.runs.list_recent(query.limit).await?
        } else {
            let mut open = self.services.runs.list_open().await?;
            open.reverse();
            open
        };
        // Runs of this process that the store does not list yet (their first record is being
        // written) are still runs.
        let listed: BTreeSet<_> = records.iter().map(|r| r.run_id).collect();
        for summary in self.registry().list() {
            if !listed.contains(&summary.run_id)
                && let Ok(Some(record)) = self.services.runs.get(summary.run_id).await
            {
                records.push(record);
            }
        }
        let workers: Vec<WorkerId> = records
            .iter()
            .filter_map(|r| r.worker.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let alive: HashMap<WorkerId, WorkerInfo> = workers
            .iter()
            .cloned()
            .zip(self.services.leases.workers(&workers).await?)
            .filter_map(|(id, info)| Some((id, info?)))
            .collect();
        let mut views = Vec::with_capacity(records.len());
        for record in records {
            let heartbeat = record.worker.as_ref().and_then(|w| alive.get(w)).cloned();
            let live = self.registry().summary(&record.run_id);
            let (status, running_nodes, here) = match live {
                Some(live) => (live.status, live.running_nodes, true),
                None if is_orphaned(&record, heartbeat.as_ref()) => {
                    (RunStatus::Orphaned, Vec::new(), false)
                }
                None => (record.status, Vec::new(), false),
            };
            if query.admits(&record, status) {
                views.push(RunView {
                    record,
                    status,
                    running_nodes,
                    here,
                    worker: heartbeat,
                });
            }
        }
        views.sort_by_key(|v| std::cmp::Reverse((v.record.started_at_ms, v.record.run_id)));
        views.truncate(query.limit);
        Ok(views)
    }
}
