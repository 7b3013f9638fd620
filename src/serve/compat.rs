//! The seeds' stop endpoints, drop-in: the request and response JSON exactly as FastGPT and
//! NexAU give them, so their clients stop runvisor runs unchanged.
//!
//! - `POST /api/v2/chat/stop` `{appId, chatId}` -> `{success}` (FastGPT): stops the live run
//!   labelled with that app and chat, wherever it runs, and waits up to 5 s for it to end;
//!   `{"success": true}` whether it ended within the wait, had ended already, or there was none,
//!   as FastGPT answers.
//! - `POST /stop` `StopRequest {user_id, session_id, agent_id, force, timeout}` ->
//!   `StopResponse {status, stop_reason, message_count, error}` (NexAU): the session is the
//!   thread, `user_id` the run's user label (a run started without one is NexAU's default
//!   user's, `default-user`, as a NexAU agent started without a user is), `agent_id` its
//!   workflow id or run id; `force` is a force stop, `timeout` the graceful stop's timeout in
//!   seconds. A session
//!   with no live run is answered `200` with `status: "error"` and NexAU's message, as NexAU
//!   does; a store or worker that fails is answered `503` in the same shape.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use runvisor_actors::{RunLabels, RunQuery, RunStatus, Runtime, StopMode, StopReason, ThreadId};
use serde::{Deserialize, Serialize};

use super::Service;
use super::error::ApiError;
use super::extract::JsonBody;
use crate::ops::StopRunError;
use crate::redis::control::ControlError;

/// How long FastGPT's stop waits for the run to end before it answers.
const FASTGPT_WAIT: Duration = Duration::from_secs(5);

/// How long workers of other processes are given, beyond the stop itself, to answer.
const ASK_WAIT: Duration = Duration::from_secs(2);

/// The most live runs one app and chat, or one session, is looked for among.
const LOOKUP_LIMIT: usize = 100;

/// FastGPT's `StopV2ChatSchema`. Unknown fields (`outLinkAuthData`) are ignored, as zod does:
/// the service's bearer token is the authentication.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StopV2ChatRequest {
    app_id: String,
    chat_id: String,
}

/// FastGPT's `StopV2ChatResponse`.
#[derive(Debug, Serialize)]
pub(super) struct StopV2ChatResponse {
    success: bool,
}

/// `POST /api/v2/chat/stop`.
pub(super) async fn fastgpt_stop(
    State(service): State<Service>,
    JsonBody(request): JsonBody<StopV2ChatRequest>,
) -> Result<Json<StopV2ChatResponse>, ApiError> {
    let started = Instant::now();
    if request.app_id.is_empty() || request.chat_id.is_empty() {
        return Err(ApiError::bad_request(
            "`appId` and `chatId` must not be empty",
        ));
    }
    // Checked as run labels are, before they reach a store: no run carries another.
    RunLabels::new(
        Some(request.app_id.clone()),
        Some(request.chat_id.clone()),
        None,
    )
    .map_err(|e| ApiError::invalid_id("appId or chatId", &e))?;
    let runtime = service.runtime();
    let query = RunQuery {
        statuses: vec![RunStatus::Running],
        limit: LOOKUP_LIMIT,
        app_id: Some(request.app_id),
        chat_id: Some(request.chat_id),
        ..RunQuery::default()
    };
    let runs: Vec<_> = runtime
        .list_runs(&query)
        .await?
        .into_iter()
        .map(|v| v.record.run_id)
        .collect();
    let mode = StopMode::Graceful {
        timeout: runtime.config().stop_timeout,
    };
    // Each stop goes on in a task of its own: the answer waits 5 s at most, the stop as long as
    // it takes.
    let stops: Vec<_> = runs
        .into_iter()
        .map(|run| {
            let service = service.clone();
            tokio::spawn(async move { user_stop(&service, run, mode, "fastgpt", started).await })
        })
        .collect();
    let waited = tokio::time::timeout(FASTGPT_WAIT, futures::future::join_all(stops)).await;
    if let Ok(results) = waited {
        for result in results {
            match result {
                // Stopped, or it ended (or vanished) on its own meanwhile (its worker says it
                // does not run it): success.
                Ok(
                    Ok(_)
                    | Err(
                        StopRunError::NotLive { .. }
                        | StopRunError::UnknownRun(_)
                        | StopRunError::Control(ControlError::Refused { .. }),
                    ),
                ) => {}
                Ok(Err(StopRunError::Control(e))) => return Err(e.into()),
                Ok(Err(StopRunError::Store(e))) => return Err(e.into()),
                Err(e) => return Err(ApiError::internal(format!("the stop failed: {e}"))),
            }
        }
    }
    Ok(Json(StopV2ChatResponse { success: true }))
}

/// NexAU's `StopRequest`, with its defaults. Unknown fields are ignored, as pydantic does.
#[derive(Debug, Deserialize)]
pub(super) struct NexauStopRequest {
    #[serde(default = "default_user")]
    user_id: String,
    session_id: String,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    force: bool,
    #[serde(default = "default_timeout")]
    timeout: f64,
}

/// NexAU's user when a request names none; also the owner of runs started without a user.
const DEFAULT_USER: &str = "default-user";

fn default_user() -> String {
    DEFAULT_USER.to_owned()
}

fn default_timeout() -> f64 {
    30.0
}

/// NexAU's `StopResponse`: `status` is `"success"` or `"error"`.
#[derive(Debug, Serialize)]
pub(super) struct NexauStopResponse {
    status: &'static str,
    stop_reason: Option<String>,
    message_count: usize,
    error: Option<String>,
}

impl NexauStopResponse {
    fn error(status: StatusCode, message: String) -> Response {
        let body = Self {
            status: "error",
            stop_reason: None,
            message_count: 0,
            error: Some(message),
        };
        (status, Json(body)).into_response()
    }
}

/// `POST /stop`.
pub(super) async fn nexau_stop(
    State(service): State<Service>,
    JsonBody(request): JsonBody<NexauStopRequest>,
) -> Response {
    let started = Instant::now();
    let not_found = || {
        NexauStopResponse::error(
            StatusCode::OK,
            format!(
                "No running agent found for user_id={}, session_id={}, agent_id={}",
                request.user_id,
                request.session_id,
                request.agent_id.as_deref().unwrap_or("any")
            ),
        )
    };
    let mode = if request.force {
        StopMode::Force
    } else {
        match Duration::try_from_secs_f64(request.timeout) {
            Ok(timeout) => StopMode::Graceful { timeout },
            Err(_) => {
                return NexauStopResponse::error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "timeout must be a number of seconds, at least 0: got {}",
                        request.timeout
                    ),
                );
            }
        }
    };
    // A session id that cannot name a thread has no run.
    let Ok(thread) = ThreadId::new(&request.session_id) else {
        return not_found();
    };
    let runtime = service.runtime();
    let run = match live_run(
        runtime,
        thread,
        &request.user_id,
        request.agent_id.as_deref(),
    )
    .await
    {
        Ok(Some(run)) => run,
        Ok(None) => return not_found(),
        Err(e) => return NexauStopResponse::error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let result = user_stop(&service, run, mode, "nexau", started).await;
    match result {
        Ok(document) => {
            let message_count = document["messages"].as_array().map_or(0, Vec::len);
            let stop_reason = document["stop"]["reason"]
                .as_str()
                .map(str::to_ascii_uppercase);
            Json(NexauStopResponse {
                status: "success",
                stop_reason,
                message_count,
                error: None,
            })
            .into_response()
        }
        // It ended on its own between the lookup and the stop (its worker says it does not
        // run it).
        Err(
            StopRunError::NotLive { .. }
            | StopRunError::UnknownRun(_)
            | StopRunError::Control(ControlError::Refused { .. }),
        ) => not_found(),
        Err(StopRunError::Control(e)) => {
            NexauStopResponse::error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
        Err(StopRunError::Store(e)) => {
            NexauStopResponse::error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

/// Stops `run` for its user, wherever it runs, timed from `started` in the stop metrics of
/// `endpoint`.
async fn user_stop(
    service: &Service,
    run: runvisor_actors::RunId,
    mode: StopMode,
    endpoint: &str,
    started: Instant,
) -> Result<serde_json::Value, StopRunError> {
    service.metrics().stop_requested(run, started);
    let result = crate::ops::stop(
        service.runtime(),
        service.redis(),
        run,
        mode,
        StopReason::UserInterrupted,
        ASK_WAIT,
    )
    .await;
    service
        .metrics()
        .stop_answered(endpoint, started, result.is_ok());
    result
}

/// The live run of `thread` (a thread has one at most), if it is `user`'s (a run with no user
/// label is the default user's) and `agent_id` is absent or names it: its run id or its
/// workflow's id.
async fn live_run(
    runtime: &Runtime,
    thread: ThreadId,
    user: &str,
    agent_id: Option<&str>,
) -> Result<Option<runvisor_actors::RunId>, runvisor_actors::StoreError> {
    let query = RunQuery {
        statuses: vec![RunStatus::Running],
        limit: LOOKUP_LIMIT,
        thread: Some(thread),
        ..RunQuery::default()
    };
    Ok(runtime
        .list_runs(&query)
        .await?
        .into_iter()
        .map(|v| v.record)
        .find(|record| {
            record.labels.user_id().unwrap_or(DEFAULT_USER) == user
                && agent_id.is_none_or(|agent| {
                    agent == record.workflow_id || agent == record.run_id.to_string()
                })
        })
        .map(|record| record.run_id))
}
