//! Control requests between processes: what a worker runs now, the actor tree of one of its
//! runs, and the stop of one of its runs, asked by any process (`runvisor ps`, `runvisor tree`,
//! `runvisor serve`) of the worker that runs it.
//!
//! Each worker serving requests ([`RedisStores::serve_control`]) waits on its mailbox, a LIST
//! `<p>:ctl:<worker>`, with `BLPOP` on a connection of its own. A request is a JSON object
//! `{"id": "<uuid>", "op": "runs"}`, `{"id": ..., "op": "tree", "run": "<run_id>"}` or
//! `{"id": ..., "op": "stop", "run": ..., "force": false, "timeout_ms": 5000, "reason":
//! "user_interrupted"}`
//! pushed onto the mailbox (which expires after [`MAILBOX_TTL`] unless a request refreshes it,
//! so the mailbox of a worker that died does not stay). The worker pushes its answer onto
//! `<p>:ctlreply:{<id>}:<worker>` (expiring after [`MAILBOX_TTL`]): `{"ok": true, "runs":
//! [...]}`, `{"ok": true, "tree": {...}}`, `{"ok": true, "outcome": {...}}` (the stopped run's
//! [outcome document](crate::report::OutcomeDocument)) or `{"ok": false, "error": "..."}`
//! (with `"status"` when the run to stop does not run). A stop is answered from a task of its
//! own, so a long graceful stop holds no other request up. The asker waits
//! for the answers with `BLPOP` over the reply keys of one request, which share a hash tag and
//! so a Cluster slot.
//!
//! The answers are what the worker's own registry and actors say at that moment; a worker
//! that is alive but not serving requests (a host that did not call `serve_control`) does not
//! answer, and askers say so.

use std::collections::HashMap;
use std::time::Duration;

use runvisor_actors::{
    ActorTree, RunId, RunOutcome, RunStatus, RunSummary, Runtime, StopError, StopMode, StopReason,
    StopReply, StoreError, WorkerId,
};
use serde::{Deserialize, Serialize};

use super::conn::{Conn, Endpoint};
use super::reply;
use super::{ConnectError, RedisConfig, RedisStores};

/// How long a worker blocks on its mailbox per call (then it calls again).
const BLOCK: Duration = Duration::from_secs(1);

/// How long an unserved mailbox and an unread answer live.
pub const MAILBOX_TTL: Duration = Duration::from_secs(10);

/// What went wrong asking a worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The worker did not answer in time: it is busy, not serving control requests, or gone.
    #[error("worker {worker} did not answer within {waited:?} (is it serving control requests?)")]
    NoAnswer {
        /// The worker asked.
        worker: WorkerId,
        /// How long the asker waited.
        waited: Duration,
    },
    /// The worker answered with an error.
    #[error("worker {worker}: {error}")]
    Refused {
        /// The worker asked.
        worker: WorkerId,
        /// What it said.
        error: String,
    },
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A connection for the request could not be opened.
    #[error(transparent)]
    Connect(#[from] ConnectError),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Runs,
    Tree {
        run: RunId,
    },
    Stop {
        run: RunId,
        force: bool,
        #[serde(default)]
        timeout_ms: Option<u64>,
        reason: StopReason,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    id: String,
    #[serde(flatten)]
    op: Op,
}

#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    runs: Option<Vec<RunSummary>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tree: Option<ActorTree>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<RunStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Answer {
    fn refused(error: String, status: Option<RunStatus>) -> Self {
        Self {
            ok: false,
            runs: None,
            tree: None,
            outcome: None,
            status,
            error: Some(error),
        }
    }
}

/// A worker answering control requests; it stops when dropped.
#[derive(Debug)]
pub struct ControlServer {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection whose calls may block for `block` (a `BLPOP`) on top of the usual timeouts.
pub(crate) async fn blocking_conn(
    config: &RedisConfig,
    endpoint: &Endpoint,
    block: Duration,
) -> Result<Conn, ConnectError> {
    let config = RedisConfig {
        response_timeout: config.response_timeout + block,
        call_timeout: config.call_timeout + block,
        ..config.clone()
    };
    Conn::connect(&config, endpoint).await
}

impl RedisStores {
    /// Answers control requests for `runtime` (this worker): what it runs, and the actor tree
    /// of a run, for `runvisor ps` and `runvisor tree` in other processes. Runs until the
    /// returned server is dropped.
    pub async fn serve_control(&self, runtime: &Runtime) -> Result<ControlServer, ConnectError> {
        let conn = blocking_conn(&self.config, &self.endpoint, BLOCK).await?;
        let keys = self.keys.clone();
        let runtime = runtime.clone();
        let mailbox = keys.control(&runtime.worker().id);
        let replies = self.conn.clone();
        let task = tokio::spawn(async move {
            let mut errors = 0u64;
            loop {
                let mut cmd = ::redis::cmd("BLPOP");
                cmd.arg(&mailbox).arg(BLOCK.as_secs_f64());
                let request = match conn.query(&mailbox, &cmd).await {
                    Ok(reply) => reply,
                    Err(e) => {
                        errors += 1;
                        if errors.is_power_of_two() {
                            tracing::warn!(error = %e, count = errors, "control mailbox unreachable");
                        }
                        tokio::time::sleep(BLOCK).await;
                        continue;
                    }
                };
                // Nil: nothing came within the block time.
                let Some(text) = popped(&request, &mailbox) else {
                    continue;
                };
                let request: Request = match serde_json::from_str(&text) {
                    Ok(request) => request,
                    Err(e) => {
                        tracing::debug!(error = %e, "ignored a malformed control request");
                        continue;
                    }
                };
                let reply = keys.control_reply(&request.id, &runtime.worker().id);
                if matches!(request.op, Op::Stop { .. }) {
                    // A graceful stop may take its whole timeout: other requests go on.
                    // It answers on the stores' connection: this one blocks in BLPOP.
                    let (runtime, replies) = (runtime.clone(), replies.clone());
                    tokio::spawn(async move {
                        let answer = answer(&runtime, request.op).await;
                        send_answer(&replies, &reply, &answer).await;
                    });
                } else {
                    let answer = answer(&runtime, request.op).await;
                    send_answer(&conn, &reply, &answer).await;
                }
            }
        });
        Ok(ControlServer { task })
    }

    /// What each of these workers runs now, by its own registry: one request each, answered
    /// within `wait`. A worker that does not answer in time is missing from the map.
    pub async fn ask_runs(
        &self,
        workers: &[WorkerId],
        wait: Duration,
    ) -> Result<HashMap<WorkerId, Vec<RunSummary>>, ControlError> {
        let answers = self.ask(workers, &Op::Runs, wait).await?;
        Ok(answers
            .into_iter()
            .filter_map(|(worker, answer)| Some((worker, answer.runs?)))
            .collect())
    }

    /// The actor tree of a run, asked of the worker that runs it.
    pub async fn ask_tree(
        &self,
        worker: &WorkerId,
        run: RunId,
        wait: Duration,
    ) -> Result<ActorTree, ControlError> {
        let mut answers = self
            .ask(std::slice::from_ref(worker), &Op::Tree { run }, wait)
            .await?;
        match answers.remove(worker) {
            Some(Answer {
                tree: Some(tree), ..
            }) => Ok(tree),
            Some(Answer { error, .. }) => Err(ControlError::Refused {
                worker: worker.clone(),
                error: error.unwrap_or_else(|| "no tree in the answer".to_owned()),
            }),
            None => Err(ControlError::NoAnswer {
                worker: worker.clone(),
                waited: wait,
            }),
        }
    }

    /// Stops a run of another worker, asked of that worker (which stops it as
    /// [`Runtime::stop_for`] does), waiting `wait` at most for its answer: the stopped run's
    /// [outcome document](crate::report::OutcomeDocument).
    pub async fn ask_stop(
        &self,
        worker: &WorkerId,
        run: RunId,
        mode: StopMode,
        reason: StopReason,
        wait: Duration,
    ) -> Result<serde_json::Value, ControlError> {
        let (force, timeout_ms) = match mode {
            StopMode::Force => (true, None),
            StopMode::Graceful { timeout } => (
                false,
                Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            ),
        };
        let op = Op::Stop {
            run,
            force,
            timeout_ms,
            reason,
        };
        let mut answers = self.ask(std::slice::from_ref(worker), &op, wait).await?;
        match answers.remove(worker) {
            Some(Answer {
                outcome: Some(outcome),
                ..
            }) => Ok(outcome),
            Some(Answer { error, status, .. }) => Err(ControlError::Refused {
                worker: worker.clone(),
                error: match status {
                    Some(status) => format!("run {run} does not run: it is {status}"),
                    None => error.unwrap_or_else(|| "no outcome in the answer".to_owned()),
                },
            }),
            None => Err(ControlError::NoAnswer {
                worker: worker.clone(),
                waited: wait,
            }),
        }
    }

    /// Sends one request to each worker and collects the answers that come within `wait`.
    async fn ask(
        &self,
        workers: &[WorkerId],
        op: &Op,
        wait: Duration,
    ) -> Result<HashMap<WorkerId, Answer>, ControlError> {
        let id = uuid::Uuid::now_v7().to_string();
        let request = serde_json::to_string(&Request {
            id: id.clone(),
            op: op.clone(),
        })
        .map_err(|e| StoreError::Unavailable(format!("cannot encode a control request: {e}")))?;
        let ttl = MAILBOX_TTL.as_millis() as u64;
        for worker in workers {
            let mailbox = self.keys.control(worker);
            let mut pipe = ::redis::pipe();
            pipe.atomic()
                .cmd("RPUSH")
                .arg(&mailbox)
                .arg(&request)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&mailbox)
                .arg(ttl)
                .ignore();
            self.conn.pipeline(&mailbox, &pipe).await?;
        }
        let mut waiting: HashMap<String, WorkerId> = workers
            .iter()
            .map(|w| (self.keys.control_reply(&id, w), w.clone()))
            .collect();
        let mut answers = HashMap::new();
        if waiting.is_empty() {
            return Ok(answers);
        }
        let conn = blocking_conn(&self.config, &self.endpoint, wait).await?;
        let deadline = tokio::time::Instant::now() + wait;
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left < Duration::from_millis(1) {
                break;
            }
            let mut cmd = ::redis::cmd("BLPOP");
            for key in waiting.keys() {
                cmd.arg(key);
            }
            cmd.arg(left.as_secs_f64());
            let first = waiting.keys().next().cloned().unwrap_or_default();
            let reply = conn.query(&first, &cmd).await?;
            let Some((key, text)) = popped_from(&reply, &first) else {
                break;
            };
            if let Some(worker) = waiting.remove(&key)
                && let Ok(answer) = serde_json::from_str::<Answer>(&text)
            {
                answers.insert(worker, answer);
            }
        }
        Ok(answers)
    }
}

/// Pushes an answer onto its reply key.
async fn send_answer(conn: &Conn, reply: &str, answer: &Answer) {
    let Ok(json) = serde_json::to_string(answer) else {
        return;
    };
    let mut pipe = ::redis::pipe();
    pipe.atomic()
        .cmd("RPUSH")
        .arg(reply)
        .arg(json)
        .ignore()
        .cmd("PEXPIRE")
        .arg(reply)
        .arg(MAILBOX_TTL.as_millis() as u64)
        .ignore();
    if let Err(e) = conn.pipeline(reply, &pipe).await {
        tracing::debug!(error = %e, "could not answer a control request");
    }
}

/// Answers one request from this worker's registry and actors.
async fn answer(runtime: &Runtime, op: Op) -> Answer {
    let ok = Answer {
        ok: true,
        runs: None,
        tree: None,
        outcome: None,
        status: None,
        error: None,
    };
    match op {
        Op::Runs => Answer {
            runs: Some(runtime.runs()),
            ..ok
        },
        Op::Tree { run } => match runtime.tree(run).await {
            Ok(tree) => Answer {
                tree: Some(tree),
                ..ok
            },
            Err(e) => Answer::refused(e.to_string(), None),
        },
        Op::Stop {
            run,
            force,
            timeout_ms,
            reason,
        } => {
            let mode = if force {
                StopMode::Force
            } else {
                StopMode::Graceful {
                    timeout: timeout_ms
                        .map_or(runtime.config().stop_timeout, Duration::from_millis),
                }
            };
            match stop_here(runtime, run, mode, reason).await {
                Ok(outcome) => Answer {
                    outcome: Some(outcome),
                    ..ok
                },
                Err(StopRunError::NotLive { status, .. }) => Answer::refused(
                    format!("run {run} does not run: it is {status}"),
                    Some(status),
                ),
                Err(e) => Answer::refused(e.to_string(), None),
            }
        }
    }
}

/// The value a `BLPOP` of one key popped; `None` when it timed out (or answered otherwise).
fn popped(reply: &::redis::Value, key: &str) -> Option<String> {
    popped_from(reply, key).map(|(_, value)| value)
}

/// The key and value a `BLPOP` popped.
fn popped_from(reply: &::redis::Value, key: &str) -> Option<(String, String)> {
    let items = reply::array(reply, key).ok()?;
    match items {
        [k, v] => Some((
            reply::text(k, key).ok()?.to_owned(),
            reply::text(v, key).ok()?.to_owned(),
        )),
        _ => None,
    }
}

/// Why a run could not be stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StopRunError {
    /// No run has this id.
    #[error("no run {0}")]
    UnknownRun(RunId),
    /// The run does not run now: it ended, waits for input, or is orphaned.
    #[error("run {run} does not run now: it is {status}")]
    NotLive {
        /// The run.
        run: RunId,
        /// Its status.
        status: RunStatus,
    },
    /// Its worker did not answer, or refused.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The stores failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Stops a run of this process ([`Runtime::stop_for`]) and renders its outcome document; a
/// run that had already ended otherwise is [`StopRunError::NotLive`]. Every caller of a stop
/// gets the same stop result, also one asking after the run stopped.
pub async fn stop_here(
    runtime: &Runtime,
    run: RunId,
    mode: StopMode,
    reason: StopReason,
) -> Result<serde_json::Value, StopRunError> {
    let summary = runtime.registry().summary(&run);
    let reply = runtime
        .stop_for(run, mode, reason)
        .await
        .map_err(|e| match e {
            StopError::UnknownRun(run) => StopRunError::UnknownRun(run),
            StopError::NotInThisProcess(run, status) => StopRunError::NotLive { run, status },
            StopError::Store(e) => StopRunError::Store(e),
            other => StopRunError::Store(StoreError::Unavailable(other.to_string())),
        })?;
    let result = match reply {
        StopReply::Stopped(result) => result,
        StopReply::AlreadyFinished(finished) => {
            return Err(StopRunError::NotLive {
                run,
                status: finished.status,
            });
        }
        _ => {
            return Err(StopRunError::NotLive {
                run,
                status: RunStatus::Running,
            });
        }
    };
    let (workflow, thread) = match summary {
        Some(summary) => (summary.workflow_id, summary.thread),
        None => match runtime.run_store().get(run).await? {
            Some(record) => (record.workflow_id, record.thread),
            None => return Err(StopRunError::UnknownRun(run)),
        },
    };
    let outcome = RunOutcome::Stopped(result);
    let document = crate::report::OutcomeDocument::new(&workflow, &thread, &outcome);
    serde_json::to_value(&document)
        .map_err(|e| StopRunError::Store(StoreError::Unavailable(format!("cannot render: {e}"))))
}
