//! `/v1/threads`: resume a thread (continue, with a new instruction, or with the answer to
//! the interaction it waits for; or fork it from a checkpoint), and list its checkpoints.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use runvisor_actors::delta::materialize;
use runvisor_actors::{CheckpointId, InteractionId, ResumeFrom, ResumeInput, ThreadId, Value};
use serde::Deserialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::Service;
use super::error::ApiError;
use super::error::ErrorDocument;
use super::extract::{JsonBody, path_rejection, query_rejection};
use super::runs::{Reply, answer_run, thread_id};

/// `POST /v1/threads/{thread}/resume`; every field is optional: no field continues from the
/// newest checkpoint.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ResumeRequest {
    /// A new instruction from the user (it becomes `{{sys.query}}`).
    say: Option<String>,
    /// The answer to the interaction the thread waits for.
    #[schema(value_type = Option<Object>)]
    answer: Option<serde_json::Value>,
    /// The interaction answered; by default the one the checkpoint waits for.
    interaction: Option<String>,
    /// Fork from this checkpoint of the thread into a new thread.
    checkpoint: Option<String>,
    /// The fork's new thread (with `checkpoint`); a fresh id by default.
    fork_into: Option<String>,
    /// Answer the outcome once the run ends.
    #[serde(default)]
    wait: bool,
    /// Answer the run's events as server-sent events, then its outcome.
    #[serde(default)]
    stream: bool,
}

fn thread_of(path: Result<Path<String>, PathRejection>) -> Result<ThreadId, ApiError> {
    let Path(text) = path.map_err(path_rejection)?;
    thread_id(&text, "thread")
}

fn parse_id<T: std::str::FromStr>(text: &str, field: &str) -> Result<T, ApiError> {
    text.parse().map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("bad {field} {text:?}"),
        )
        .with("field", field)
    })
}

#[utoipa::path(post, path = "/v1/threads/{thread}/resume", tag = "threads",
    request_body = ResumeRequest,
    params(("thread" = String, Path, description = "The thread")),
    responses(
        (status = 202, description = "Resumed: the new run's id, its thread and links",
            body = Object),
        (status = 200, description = "With `wait`: the outcome document; with `stream`: \
            `text/event-stream` of the run's events, then its outcome", body = Object),
        (status = 404, description = "`not_found`: no checkpoint to resume from",
            body = ErrorDocument),
        (status = 409, description = "`thread_busy`, `nothing_to_resume`, `not_resumable`, \
            `answer_required`, `no_interaction`, `thread_exists`", body = ErrorDocument),
        (status = 422, description = "`invalid_answer`", body = ErrorDocument),
    ))]
pub(super) async fn resume(
    State(service): State<Service>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<ResumeRequest>,
) -> Result<Response, ApiError> {
    let thread = thread_of(path)?;
    if service.draining() {
        return Err(ApiError::shutting_down());
    }
    let reply = Reply::new(request.wait, request.stream)?;
    if request.say.is_some() && request.answer.is_some() {
        return Err(ApiError::bad_request(
            "`say` and `answer` exclude each other: a resume brings one of them",
        ));
    }
    if request.interaction.is_some() && request.answer.is_none() {
        return Err(ApiError::bad_request("`interaction` goes with `answer`"));
    }
    if request.fork_into.is_some() && request.checkpoint.is_none() {
        return Err(ApiError::bad_request("`fork_into` goes with `checkpoint`"));
    }
    let from = match &request.checkpoint {
        Some(id) => ResumeFrom::Fork {
            thread: thread.clone(),
            checkpoint: parse_id::<CheckpointId>(id, "checkpoint")?,
            into: request
                .fork_into
                .as_deref()
                .map(|t| thread_id(t, "fork_into"))
                .transpose()?,
        },
        None => ResumeFrom::Thread(thread.clone()),
    };
    let runtime = service.runtime();
    let input = match (request.say, request.answer) {
        (Some(text), _) => ResumeInput::Instruction(text),
        (None, Some(answer)) => {
            let interaction_id = match &request.interaction {
                Some(id) => parse_id::<InteractionId>(id, "interaction")?,
                None => runtime
                    .pending_interactions(from.clone())
                    .await?
                    .first()
                    .map(|i| i.id)
                    .ok_or_else(|| {
                        ApiError::new(
                            axum::http::StatusCode::CONFLICT,
                            "no_interaction",
                            format!("thread {thread} waits for no answer: resume without `answer`"),
                        )
                    })?,
            };
            ResumeInput::Answer {
                interaction_id,
                value: Value::from(answer),
            }
        }
        (None, None) => ResumeInput::Continue,
    };
    let run = runtime.resume(from, input).await?;
    answer_run(&service, run, reply).await
}

/// `GET /v1/threads/{thread}/checkpoints` parameters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct CheckpointParams {
    /// At most this many, newest first (default 50).
    limit: Option<usize>,
}

/// The checkpoints of a thread, newest first: each with its run, when it was written, the
/// run's status then, what a resume would start and what it waits for.
#[utoipa::path(get, path = "/v1/threads/{thread}/checkpoints", tag = "threads",
    params(("thread" = String, Path, description = "The thread"), CheckpointParams),
    responses(
        (status = 200, description = "`{thread, total, checkpoints}`, newest first",
            body = Object),
        (status = 400, description = "`invalid_id`", body = ErrorDocument),
    ))]
pub(super) async fn checkpoints(
    State(service): State<Service>,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<CheckpointParams>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let thread = thread_of(path)?;
    let Query(params) = params.map_err(query_rejection)?;
    let limit = params.limit.unwrap_or(50).clamp(1, 1000);
    let store = service.runtime().checkpoint_store();
    let ids = store.list(&thread).await?;
    let total = ids.len();
    let mut listed = Vec::new();
    for id in ids.into_iter().rev().take(limit) {
        let Some(stored) = store.get(&thread, id).await? else {
            // Pruned or expired between the listing and the read.
            continue;
        };
        let entry = match materialize(store.as_ref(), &thread, &stored).await {
            Ok(snapshot) => json!({
                "checkpoint_id": id.to_string(),
                "run_id": stored.run.to_string(),
                "sequence": stored.sequence,
                "created_at_ms": snapshot.created_at_ms,
                "status": snapshot.status.to_string(),
                "stop_reason": snapshot.stop_reason.map(|r| r.to_string()),
                "frontier": snapshot.graph.frontier.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
                "interactions": snapshot.interactions,
            }),
            Err(e) => json!({
                "checkpoint_id": id.to_string(),
                "run_id": stored.run.to_string(),
                "sequence": stored.sequence,
                "error": format!("cannot be decoded: {e}"),
            }),
        };
        listed.push(entry);
    }
    Ok(Json(json!({
        "thread": thread.as_str(),
        "total": total,
        "checkpoints": listed,
    })))
}
