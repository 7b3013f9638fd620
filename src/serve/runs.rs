//! `/v1/runs` and `/v1/workflows/validate`: start a run (and wait for it, or not), list runs of
//! every worker, get one, its actor tree, stop and cancel it wherever it runs; validate a
//! workflow.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use runvisor_actors::{
    Map, RunHandle, RunId, RunLabels, RunQuery, RunStatus, StopMode, StopReason, ThreadId,
    WorkerId, Workflow, WorkflowDef,
};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::Service;
use super::error::ApiError;
use super::error::ErrorDocument;
use super::extract::{JsonBody, path_rejection, query_rejection};
use crate::ops::StopRunError;
use crate::report::OutcomeDocument;

/// How long workers of other processes are given to say what they run, or to show a tree.
const ASK_WAIT: Duration = Duration::from_secs(2);

/// How many events a streamed run may have ahead of its client before the run's observer
/// waits for the client.
const STREAM_BUFFER: usize = 256;

/// The most runs one page lists, and how far paging reaches.
const MAX_LIMIT: usize = 1000;
const MAX_REACH: usize = 10_000;

/// `POST /v1/runs`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StartRequest {
    /// The workflow definition: an object, or its JSON text.
    #[schema(value_type = Object)]
    workflow: Value,
    /// The begin node's inputs.
    #[serde(default)]
    #[schema(value_type = Object)]
    inputs: Map,
    /// The thread to run on; a fresh one by default.
    thread: Option<String>,
    /// The FastGPT app id (with `chat`).
    app: Option<String>,
    /// The FastGPT chat id (with `app`).
    chat: Option<String>,
    /// The RAGFlow task id.
    task: Option<String>,
    /// The user the run is for (NexAU's `user_id`).
    user: Option<String>,
    /// Answer the outcome once the run ends.
    #[serde(default)]
    wait: bool,
    /// Answer the run's events as server-sent events, then its outcome.
    #[serde(default)]
    stream: bool,
}

/// A workflow from a request, validated on this runtime; every problem listed otherwise.
pub(super) fn workflow(service: &Service, value: Value) -> Result<Workflow, ApiError> {
    let def = match value {
        Value::String(text) => WorkflowDef::from_json(&text),
        Value::Object(_) => WorkflowDef::from_json(&value.to_string()),
        _ => {
            return Err(ApiError::bad_request(
                "`workflow` must be a workflow definition (an object) or its JSON text",
            )
            .with("field", "workflow"));
        }
    };
    def.map_err(|e| runvisor_actors::ValidationErrors::from(vec![e]))
        .and_then(|def| service.runtime().validate(def))
        .map_err(|errors| ApiError::invalid_workflow(&errors))
}

pub(super) fn thread_id(text: &str, field: &str) -> Result<ThreadId, ApiError> {
    ThreadId::new(text).map_err(|e| ApiError::invalid_id(field, &e))
}

pub(super) fn run_id(path: Result<Path<String>, PathRejection>) -> Result<RunId, ApiError> {
    let Path(text) = path.map_err(path_rejection)?;
    text.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("bad run id {text:?}: expected a UUID"),
        )
        .with("field", "run_id")
    })
}

#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = StartRequest,
    responses(
        (status = 202, description = "Started: the run id, its thread and links", body = Object),
        (status = 200, description = "With `wait`: the outcome document; with `stream`: \
            `text/event-stream` of the run's events, then its outcome", body = Object),
        (status = 409, description = "`thread_busy`", body = ErrorDocument),
        (status = 422, description = "`invalid_workflow` (every problem), `invalid_input`",
            body = ErrorDocument),
    ))]
pub(super) async fn start(
    State(service): State<Service>,
    JsonBody(request): JsonBody<StartRequest>,
) -> Result<Response, ApiError> {
    if service.draining() {
        return Err(ApiError::shutting_down());
    }
    let reply = Reply::new(request.wait, request.stream)?;
    let workflow = workflow(&service, request.workflow)?;
    let thread = match &request.thread {
        Some(text) => thread_id(text, "thread")?,
        None => ThreadId::generate(),
    };
    if request.app.is_some() != request.chat.is_some() {
        return Err(ApiError::bad_request(
            "`app` and `chat` go together: they name the FastGPT stop flag",
        ));
    }
    let mut labels = RunLabels::new(request.app, request.chat, request.task)
        .map_err(|e| ApiError::invalid_id("app, chat or task", &e))?;
    if let Some(user) = request.user {
        labels = labels
            .with_user(user)
            .map_err(|e| ApiError::invalid_id("user", &e))?;
    }
    let run = service
        .runtime()
        .start_with(&workflow, request.inputs, thread, labels)
        .await?;
    answer_run(&service, run, reply).await
}

/// How a start or resume is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// At once: `202 Accepted` with the run.
    Started,
    /// Once the run ends: its outcome.
    Wait,
    /// Its events as they come (server-sent events), then its outcome.
    Stream,
}

impl Reply {
    pub(super) fn new(wait: bool, stream: bool) -> Result<Self, ApiError> {
        match (wait, stream) {
            (true, true) => Err(ApiError::bad_request(
                "`wait` and `stream` exclude each other: stream ends with the outcome too",
            )),
            (true, false) => Ok(Self::Wait),
            (false, true) => Ok(Self::Stream),
            (false, false) => Ok(Self::Started),
        }
    }
}

/// The answer to a start or resume: the outcome when the caller waits, the events when it
/// streams, else `202 Accepted` with the run, its thread and where to follow it.
pub(super) async fn answer_run(
    service: &Service,
    run: RunHandle,
    reply: Reply,
) -> Result<Response, ApiError> {
    // The observer takes the events from the start; the followers of `/v1/events` see
    // what comes next.
    if reply == Reply::Stream {
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        service.metrics().observe(&run, Some(tx));
        service.shared.changes.follow(&run);
        return Ok(super::stream::events(run, rx).into_response());
    }
    service.metrics().observe(&run, None);
    service.shared.changes.follow(&run);
    if reply == Reply::Wait {
        let outcome = run.wait().await;
        let document = OutcomeDocument::new(run.workflow_id(), run.thread(), &outcome);
        return Ok(Json(document).into_response());
    }
    let location = format!("/v1/runs/{}", run.run_id());
    let body = json!({
        "run_id": run.run_id().to_string(),
        "thread": run.thread().as_str(),
        "workflow": run.workflow_id(),
        "status": RunStatus::Running.to_string(),
        "links": {"run": location, "tree": format!("{location}/tree")},
    });
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response())
}

/// `GET /v1/runs` parameters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListParams {
    /// Comma-separated statuses: running, awaiting_input, orphaned, answered, stopped,
    /// succeeded, failed, cancelled.
    status: Option<String>,
    /// Only runs of this thread.
    thread: Option<String>,
    /// Only runs with this app id.
    app: Option<String>,
    /// Only runs with this chat id.
    chat: Option<String>,
    /// Only runs with this task id.
    task: Option<String>,
    /// Only runs of this user.
    user: Option<String>,
    /// Only runs of this worker.
    worker: Option<String>,
    /// Also runs that ended (implied by a status filter naming an end status).
    #[serde(default)]
    all: bool,
    /// At most this many (1 to 1000; 100 by default).
    limit: Option<usize>,
    /// Skip this many.
    #[serde(default)]
    offset: usize,
}

#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(ListParams),
    responses(
        (status = 200, description = "`{runs, next_offset}`: runs of every worker, newest \
            first", body = Object),
        (status = 400, description = "`bad_request`, `invalid_id`", body = ErrorDocument),
    ))]
pub(super) async fn list(
    State(service): State<Service>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params.map_err(query_rejection)?;
    let mut statuses = Vec::new();
    for name in params.status.iter().flat_map(|s| s.split(',')) {
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        let status = RunStatus::parse(name)
            .map_err(|e| ApiError::bad_request(e.to_string()).with("field", "status"))?;
        statuses.push(status);
    }
    let limit = params.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(
            ApiError::bad_request(format!("limit must be 1 to {MAX_LIMIT}")).with("field", "limit"),
        );
    }
    if params.offset + limit > MAX_REACH {
        return Err(ApiError::bad_request(format!(
            "offset + limit must be at most {MAX_REACH}: narrow the filters"
        ))
        .with("field", "offset"));
    }
    let query = RunQuery {
        include_ended: params.all,
        // One more than the page, to tell whether another page follows.
        limit: params.offset + limit + 1,
        statuses,
        thread: params
            .thread
            .as_deref()
            .map(|t| thread_id(t, "thread"))
            .transpose()?,
        app_id: params.app,
        chat_id: params.chat,
        task_id: params.task,
        user_id: params.user,
        worker: params
            .worker
            .as_deref()
            .map(WorkerId::new)
            .transpose()
            .map_err(|e| ApiError::invalid_id("worker", &e))?,
    };
    let rows = crate::ops::list_runs(service.runtime(), service.redis(), &query, ASK_WAIT).await?;
    let more = rows.len() > params.offset + limit;
    let page: Vec<_> = rows.into_iter().skip(params.offset).take(limit).collect();
    Ok(Json(json!({
        "runs": page,
        "next_offset": more.then_some(params.offset + limit),
    })))
}

#[utoipa::path(get, path = "/v1/runs/{run_id}", tag = "runs",
    params(("run_id" = String, Path, description = "The run (a UUID)")),
    responses(
        (status = 200, description = "The run: status, worker, nodes running now, outcome",
            body = Object),
        (status = 404, description = "`not_found`", body = ErrorDocument),
    ))]
pub(super) async fn get(
    State(service): State<Service>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(path)?;
    let runtime = service.runtime();
    let row = crate::ops::get_run(runtime, service.redis(), run, ASK_WAIT)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!("no run {run}")).with("run_id", run.to_string())
        })?;
    let mut body = serde_json::to_value(&row).map_err(|e| ApiError::internal(e.to_string()))?;
    // The outcome, while this process keeps it.
    if let (Some(outcome), Value::Object(fields)) = (runtime.registry().outcome(&run), &mut body) {
        let document = OutcomeDocument::new(&row.workflow_id, &row.thread, &outcome);
        fields.insert(
            "outcome".into(),
            serde_json::to_value(&document).map_err(|e| ApiError::internal(e.to_string()))?,
        );
    }
    Ok(Json(body))
}

#[utoipa::path(get, path = "/v1/runs/{run_id}/tree", tag = "runs",
    params(("run_id" = String, Path, description = "The run (a UUID)")),
    responses(
        (status = 200, description = "Its live actor tree, whichever process runs it",
            body = Object),
        (status = 409, description = "`no_live_run`", body = ErrorDocument),
    ))]
pub(super) async fn tree(
    State(service): State<Service>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<runvisor_actors::ActorTree>, ApiError> {
    let run = run_id(path)?;
    let tree = crate::ops::tree(service.runtime(), service.redis(), run, ASK_WAIT).await?;
    Ok(Json(tree))
}

/// `POST /v1/runs/{run_id}/stop`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StopBody {
    #[serde(default)]
    mode: Mode,
    /// How long running nodes may take to finish (graceful), as `5s` or `1m 30s`; the
    /// runtime's stop timeout by default.
    #[serde(default, with = "humantime_serde")]
    #[schema(value_type = Option<String>, example = "5s")]
    timeout: Option<Duration>,
}

/// A graceful stop lets running nodes finish within the timeout; a force stop aborts them.
#[derive(Debug, Default, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum Mode {
    #[default]
    Graceful,
    Force,
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/stop", tag = "runs", request_body = StopBody,
    params(("run_id" = String, Path, description = "The run (a UUID)")),
    responses(
        (status = 200, description = "The stopped run's outcome, with its stop result",
            body = Object),
        (status = 404, description = "`not_found`", body = ErrorDocument),
        (status = 409, description = "`no_live_run`", body = ErrorDocument),
        (status = 503, description = "`worker_unavailable`, `storage_unavailable`",
            body = ErrorDocument),
    ))]
pub(super) async fn stop(
    State(service): State<Service>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody<StopBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(path)?;
    let mode = match (body.mode, body.timeout) {
        (Mode::Force, Some(_)) => {
            return Err(ApiError::bad_request(
                "a force stop takes no timeout: it aborts running nodes at once",
            ));
        }
        (Mode::Force, None) => StopMode::Force,
        (Mode::Graceful, timeout) => StopMode::Graceful {
            timeout: timeout.unwrap_or(service.runtime().config().stop_timeout),
        },
    };
    stop_with(&service, run, mode, StopReason::UserInterrupted).await
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/cancel", tag = "runs",
    params(("run_id" = String, Path, description = "The run (a UUID)")),
    responses(
        (status = 200, description = "The run's outcome: status cancelled (resumable)",
            body = Object),
        (status = 404, description = "`not_found`", body = ErrorDocument),
        (status = 409, description = "`no_live_run`", body = ErrorDocument),
    ))]
pub(super) async fn cancel(
    State(service): State<Service>,
    path: Result<Path<String>, PathRejection>,
    _body: JsonBody<CancelBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(path)?;
    let mode = StopMode::Graceful {
        timeout: service.runtime().config().signals.cancel_timeout,
    };
    stop_with(&service, run, mode, StopReason::Cancelled).await
}

/// `POST /v1/runs/{run_id}/cancel` takes no fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelBody {}

async fn stop_with(
    service: &Service,
    run: RunId,
    mode: StopMode,
    reason: StopReason,
) -> Result<Json<Value>, ApiError> {
    let started = std::time::Instant::now();
    service.metrics().stop_requested(run, started);
    let endpoint = if reason == StopReason::Cancelled {
        "v1_cancel"
    } else {
        "v1_stop"
    };
    let result = crate::ops::stop(
        service.runtime(),
        service.redis(),
        run,
        mode,
        reason,
        ASK_WAIT,
    )
    .await;
    service
        .metrics()
        .stop_answered(endpoint, started, result.is_ok());
    match result {
        Ok(document) => Ok(Json(document)),
        Err(StopRunError::UnknownRun(run)) => {
            Err(ApiError::not_found(format!("no run {run}")).with("run_id", run.to_string()))
        }
        Err(StopRunError::NotLive { run, status }) => Err(ApiError::no_live_run(run, status)),
        Err(StopRunError::Control(e)) => Err(e.into()),
        Err(StopRunError::Store(e)) => Err(e.into()),
    }
}

/// `POST /v1/workflows/validate`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ValidateRequest {
    /// The workflow definition: an object, or its JSON text.
    #[schema(value_type = Object)]
    workflow: Value,
}

#[utoipa::path(post, path = "/v1/workflows/validate", tag = "workflows",
    request_body = ValidateRequest,
    responses(
        (status = 200, description = "`{valid, workflow, nodes, inputs}`", body = Object),
        (status = 422, description = "`invalid_workflow`: `errors` lists every problem",
            body = ErrorDocument),
    ))]
pub(super) async fn validate(
    State(service): State<Service>,
    JsonBody(request): JsonBody<ValidateRequest>,
) -> Result<Json<Value>, ApiError> {
    let workflow = workflow(&service, request.workflow)?;
    let inputs: Vec<Value> = workflow
        .inputs()
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "type": d.ty.name(),
                "required": d.required,
                "default": d.default.as_ref().map(|v| serde_json::to_value(v).unwrap_or(Value::Null)),
            })
        })
        .collect();
    Ok(Json(json!({
        "valid": true,
        "workflow": workflow.id(),
        "nodes": workflow.node_ids().count(),
        "inputs": inputs,
    })))
}
