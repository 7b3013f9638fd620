//! `GET /v1/events`: what an operator follows (the page at `/` does), as server-sent events.
//!
//! - `runs`: the newest runs of every worker (the rows of `GET /v1/runs?all=true`, at most
//!   [`LIST_LIMIT`]), first when the stream opens, then after every change of a run of this
//!   process, and every [`REFRESH`] (runs of other workers change unseen).
//! - `run`: a run started or resumed through this service changed: `{run_id, thread, change,
//!   status}` with `change` one of `started`, `stopping` or `ended` (and the status it ended
//!   with, when known).
//!
//! The stream ends when the service shuts down.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use runvisor_actors::{RunEvent, RunHandle, RunQuery, RunStatus};
use serde::Serialize;
use serde_json::json;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::time::{Instant, MissedTickBehavior};
use utoipa::ToSchema;

use super::Service;
use super::error::{ApiError, ErrorDocument};

/// How often the list of runs is sent even when no run of this process changed.
pub(super) const REFRESH: Duration = Duration::from_secs(2);

/// The most runs one `runs` event lists.
pub(super) const LIST_LIMIT: usize = 100;

/// How many changes a slow subscriber may be behind before it skips to a fresh list.
const BUFFER: usize = 256;

/// How long workers of other processes are given to say what they run.
const ASK_WAIT: Duration = Duration::from_secs(2);

/// A change of a run of this process, as the `run` event tells it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(super) struct RunChange {
    /// The run (a UUID).
    run_id: String,
    /// Its thread.
    thread: String,
    /// `started`, `stopping` or `ended`.
    change: &'static str,
    /// The status it has now, when known.
    #[schema(value_type = Option<String>)]
    status: Option<RunStatus>,
}

/// What the changes channel carries.
#[derive(Debug, Clone)]
enum Note {
    Run(RunChange),
    /// The service shuts down: every stream ends.
    ShuttingDown,
}

/// The changes of the runs this service started, for every `/v1/events` stream.
#[derive(Debug)]
pub(super) struct Changes {
    tx: broadcast::Sender<Note>,
}

impl Changes {
    pub(super) fn new() -> Self {
        Self {
            tx: broadcast::channel(BUFFER).0,
        }
    }

    /// Tells the streams that `run` started, then when it begins to stop and when it ends.
    pub(super) fn follow(&self, run: &RunHandle) {
        let change = |change, status| {
            Note::Run(RunChange {
                run_id: run.run_id().to_string(),
                thread: run.thread().as_str().to_owned(),
                change,
                status,
            })
        };
        // No subscriber is fine: nobody follows.
        let _ = self.tx.send(change("started", Some(RunStatus::Running)));
        let stopping = change("stopping", Some(RunStatus::Running));
        let ended = change("ended", None);
        let mut events = run.events();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut ended = ended;
            while let Some(event) = events.next().await {
                match event {
                    RunEvent::Stopping { .. } => {
                        let _ = tx.send(stopping.clone());
                    }
                    RunEvent::RunFinished { status, .. } => {
                        if let Note::Run(change) = &mut ended {
                            change.status = Some(status);
                        }
                    }
                    _ => {}
                }
            }
            let _ = tx.send(ended);
        });
    }

    /// Ends every stream.
    pub(super) fn shutting_down(&self) {
        let _ = self.tx.send(Note::ShuttingDown);
    }
}

/// Where a stream is.
struct Follow {
    service: Service,
    changes: broadcast::Receiver<Note>,
    /// When the list is sent next without a change.
    refresh: tokio::time::Interval,
    /// Changes sent since the last list: a list follows them.
    changed: bool,
}

#[utoipa::path(get, path = "/v1/events", tag = "runs",
    responses(
        (status = 200, description = "`text/event-stream`: `runs` events (`{runs}`: the newest \
            runs of every worker, when the stream opens, after each change, and every 2 s) and \
            `run` events (a run of this process started, is stopping, or ended)",
            body = RunChange, content_type = "text/event-stream"),
        (status = 503, description = "`shutting_down`", body = ErrorDocument),
    ))]
pub(super) async fn events(
    State(service): State<Service>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    if service.draining() {
        return Err(ApiError::shutting_down());
    }
    let changes = service.shared.changes.tx.subscribe();
    // The first tick is at once: the list opens the stream.
    let mut refresh = tokio::time::interval_at(Instant::now(), REFRESH);
    refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let follow = Follow {
        service,
        changes,
        refresh,
        changed: false,
    };
    let stream = futures::stream::unfold(Some(follow), |state| async move {
        let mut follow = state?;
        let event = follow.next().await?;
        Some((Ok(event), Some(follow)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

impl Follow {
    /// The next event; `None` once the service shuts down.
    async fn next(&mut self) -> Option<Event> {
        if self.changed {
            // Changes that came together are told together, then one list.
            match self.changes.try_recv() {
                Ok(Note::Run(change)) => return Some(change_event(&change)),
                Ok(Note::ShuttingDown) | Err(TryRecvError::Closed) => return None,
                Err(TryRecvError::Lagged(_) | TryRecvError::Empty) => {}
            }
            self.changed = false;
            self.refresh.reset();
            return Some(self.list().await);
        }
        tokio::select! {
            note = self.changes.recv() => match note {
                Ok(Note::Run(change)) => {
                    self.changed = true;
                    Some(change_event(&change))
                }
                Ok(Note::ShuttingDown) | Err(RecvError::Closed) => None,
                // Changes were missed: a fresh list tells where things are.
                Err(RecvError::Lagged(_)) => {
                    self.refresh.reset();
                    Some(self.list().await)
                }
            },
            _ = self.refresh.tick() => {
                if self.service.draining() {
                    return None;
                }
                Some(self.list().await)
            }
        }
    }

    /// The `runs` event: the newest runs of every worker, or why they cannot be listed now.
    async fn list(&self) -> Event {
        let query = RunQuery {
            include_ended: true,
            limit: LIST_LIMIT,
            ..RunQuery::default()
        };
        let service = &self.service;
        match crate::ops::list_runs(service.runtime(), service.redis(), &query, ASK_WAIT).await {
            Ok(runs) => event("runs", &json!({ "runs": runs })),
            Err(e) => event("error", &ApiError::from(e).document()),
        }
    }
}

fn change_event(change: &RunChange) -> Event {
    event("run", &json!(change))
}

fn event(name: &str, data: &serde_json::Value) -> Event {
    Event::default().event(name).data(data.to_string())
}
