//! What operators ask about runs, answered across every process that shares the stores: the
//! runs (`runvisor ps`) with the nodes each runs now, one run, the actor tree of a live run
//! (`runvisor tree`), and the stop of a live run, wherever it runs.
//!
//! Records come from the run store ([`Runtime::list_runs`]: `orphaned` is derived there from
//! the workers' heartbeats); what a run of another process runs now comes from that process,
//! asked through its control mailbox ([`crate::redis::control`]) when the stores are on Redis.

use std::collections::BTreeSet;
use std::time::Duration;

use runvisor_actors::{
    ActorTree, NodePath, QueryError, RunId, RunQuery, RunStatus, Runtime, StopMode, StopReason,
    StoreError, ThreadId, WorkerId,
};
use serde::Serialize;

use crate::redis::RedisStores;
use crate::redis::control::ControlError;
pub use crate::redis::control::{StopRunError, stop_here};

/// One run as `runvisor ps` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RunRow {
    /// The run.
    pub run_id: RunId,
    /// Its thread.
    pub thread: ThreadId,
    /// The workflow it runs.
    pub workflow_id: String,
    /// The run it resumed (or answered), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// Its status: `running`, `awaiting_input`, `orphaned`, `answered`, `stopped`,
    /// `succeeded`, `failed` or `cancelled`.
    pub status: RunStatus,
    /// Its app id, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_id: Option<String>,
    /// Its chat id, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    /// Its task id, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Its user, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The worker that runs (or ran) it.
    pub worker: Option<WorkerId>,
    /// Whether that worker heartbeats.
    pub worker_alive: bool,
    /// When it started, in ms since the epoch.
    pub started_at_ms: u64,
    /// When it ended, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// Why it stopped, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The nodes it runs now, by path; `None` when unknown (it does not run, or its worker
    /// did not answer).
    pub nodes: Option<Vec<NodePath>>,
}

/// Why a tree could not be shown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// No run has this id.
    #[error("no run {0}")]
    UnknownRun(RunId),
    /// The run does not run now: it has no actors.
    #[error("run {run} has no actors: it is {status}")]
    NotLive {
        /// The run.
        run: RunId,
        /// Its status.
        status: RunStatus,
    },
    /// The run's worker is gone.
    #[error("run {run} is orphaned: its worker {worker} stopped heartbeating")]
    Orphaned {
        /// The run.
        run: RunId,
        /// Its worker.
        worker: WorkerId,
    },
    /// This process runs it, and it did not answer.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// Its worker did not answer, or Redis failed.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The stores failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The runs `query` selects, from every worker sharing `runtime`'s stores, newest first. With
/// Redis stores, the workers running them are asked what they run now (waiting `wait` at most).
pub async fn list_runs(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    query: &RunQuery,
    wait: Duration,
) -> Result<Vec<RunRow>, StoreError> {
    let views = runtime.list_runs(query).await?;
    let elsewhere: Vec<WorkerId> = views
        .iter()
        .filter(|v| !v.here && v.status == RunStatus::Running)
        .filter_map(|v| v.worker.as_ref().map(|w| w.id.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let remote = match redis {
        Some(redis) if !elsewhere.is_empty() => match redis.ask_runs(&elsewhere, wait).await {
            Ok(answers) => answers,
            Err(e) => {
                tracing::warn!(error = %e, "could not ask the workers what they run");
                Default::default()
            }
        },
        _ => Default::default(),
    };
    Ok(views
        .into_iter()
        .map(|view| {
            let record = &view.record;
            let nodes = if view.here {
                Some(view.running_nodes.clone())
            } else if view.status == RunStatus::Running {
                record
                    .worker
                    .as_ref()
                    .and_then(|w| remote.get(w))
                    .map(|runs| {
                        runs.iter()
                            .find(|s| s.run_id == record.run_id)
                            .map(|s| s.running_nodes.clone())
                            .unwrap_or_default()
                    })
            } else {
                None
            };
            let alive = view.worker.is_some() || view.here;
            row(view.record, view.status, alive, nodes)
        })
        .collect())
}

/// One run by id, as [`list_runs`] would show it (its status derived from its worker's
/// heartbeat, the nodes it runs now asked of its worker); `None` when no run has that id.
pub async fn get_run(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    run: RunId,
    wait: Duration,
) -> Result<Option<RunRow>, StoreError> {
    let Some(record) = runtime.run_store().get(run).await? else {
        return Ok(None);
    };
    if record.status.is_open() || runtime.registry().contains(&run) {
        let query = RunQuery {
            thread: Some(record.thread.clone()),
            limit: usize::MAX,
            ..RunQuery::default()
        };
        let rows = list_runs(runtime, redis, &query, wait).await?;
        if let Some(row) = rows.into_iter().find(|r| r.run_id == run) {
            return Ok(Some(row));
        }
    }
    let status = record.status;
    Ok(Some(row(record, status, false, None)))
}

fn row(
    record: runvisor_actors::RunRecord,
    status: RunStatus,
    worker_alive: bool,
    nodes: Option<Vec<NodePath>>,
) -> RunRow {
    RunRow {
        run_id: record.run_id,
        app_id: record.labels.app_id().map(str::to_owned),
        chat_id: record.labels.chat_id().map(str::to_owned),
        task_id: record.labels.task_id().map(str::to_owned),
        user_id: record.labels.user_id().map(str::to_owned),
        thread: record.thread,
        workflow_id: record.workflow_id,
        parent_run_id: record.parent_run_id,
        status,
        worker: record.worker,
        worker_alive,
        started_at_ms: record.started_at_ms,
        finished_at_ms: record.finished_at_ms,
        stop_reason: record.stop_reason,
        nodes,
    }
}

/// The actor tree of a live run: asked of this runtime when it runs it, else of the worker
/// that does (with Redis stores), waiting `wait` at most.
pub async fn tree(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    run: RunId,
    wait: Duration,
) -> Result<ActorTree, TreeError> {
    if runtime.registry().summary(&run).is_some() {
        return Ok(runtime.tree(run).await?);
    }
    let record = runtime
        .run_store()
        .get(run)
        .await?
        .ok_or(TreeError::UnknownRun(run))?;
    let view = runtime
        .list_runs(&RunQuery {
            thread: Some(record.thread.clone()),
            limit: usize::MAX,
            ..RunQuery::default()
        })
        .await?
        .into_iter()
        .find(|v| v.record.run_id == run);
    let status = view.as_ref().map_or(record.status, |v| v.status);
    match (status, record.worker.clone(), redis) {
        (RunStatus::Running, Some(worker), Some(redis)) => {
            Ok(redis.ask_tree(&worker, run, wait).await?)
        }
        (RunStatus::Orphaned, Some(worker), _) => Err(TreeError::Orphaned { run, worker }),
        (status, ..) => Err(TreeError::NotLive { run, status }),
    }
}

/// Stops a run wherever it runs: here ([`stop_here`]), or, with Redis stores, asked of the
/// worker that runs it, waiting for its answer up to the stop's timeout and `wait` more.
/// Returns the stopped run's [outcome document](crate::report::OutcomeDocument), as JSON.
pub async fn stop(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    run: RunId,
    mode: StopMode,
    reason: StopReason,
    wait: Duration,
) -> Result<serde_json::Value, StopRunError> {
    let registry = runtime.registry();
    if registry.contains(&run) || registry.outcome(&run).is_some() {
        return stop_here(runtime, run, mode, reason).await;
    }
    let record = runtime
        .run_store()
        .get(run)
        .await?
        .ok_or(StopRunError::UnknownRun(run))?;
    if record.status != RunStatus::Running {
        return Err(StopRunError::NotLive {
            run,
            status: record.status,
        });
    }
    let view = runtime
        .list_runs(&RunQuery {
            thread: Some(record.thread.clone()),
            limit: usize::MAX,
            ..RunQuery::default()
        })
        .await?
        .into_iter()
        .find(|v| v.record.run_id == run);
    let status = view.as_ref().map_or(record.status, |v| v.status);
    match (status, record.worker, redis) {
        (RunStatus::Running, Some(worker), Some(redis)) if worker != runtime.worker().id => {
            let timeout = match mode {
                StopMode::Graceful { timeout } => timeout,
                StopMode::Force => Duration::ZERO,
            };
            Ok(redis
                .ask_stop(&worker, run, mode, reason, timeout + wait)
                .await?)
        }
        (status, ..) => Err(StopRunError::NotLive { run, status }),
    }
}
