//! The checkpoint-ops seed's endpoints, drop-in: checkpoint cleanup and stats with the
//! request and response JSON exactly as the seed gives them, computed by
//! [`CheckpointOps`](crate::redis::retention::CheckpointOps) (the same code as
//! `runvisor checkpoints stats|cleanup`).
//!
//! - `POST /api/v0/checkpoint/direct/cleanup` `{keep_count?, user_id?, thread_id?}`: keeps the
//!   newest `keep_count` (default `serve.checkpoint_keep_count`, 10 as the seed's
//!   `CHECKPOINT_KEEP_COUNT`) checkpoints of each thread of the scope: a thread given wins over a user; neither: every thread.
//! - `GET /api/v0/checkpoint/direct/stats[?user_id=]`: checkpoints per thread, of every user
//!   or of one.
//!
//! Both answer `{"code": 200, "success": true, "message": ..., "data": {...}}`, `data` being
//! the seed's fields of [`CleanupReport`] or [`Stats`]. An empty `user_id` or `thread_id` is
//! absent, as the seed's truthiness tests read them.
//!
//! Which keys: `layout` (`native`: runvisor's own, through its indexes; or `compat`:
//! `checkpoint:{user}:{timestamp}:{id}` keys, by `SCAN`), a query parameter on both
//! endpoints or a field of the cleanup body (which wins); when neither names it,
//! `serve.checkpoint_layout` (default `native`). The seed has no way to choose, so a seed
//! client that cannot add a field can still pick the layout in the URL, or the service's.
//!
//! Failures answer the seed's error shape, `{"code", "success": false, "message":
//! "请求处理失败", "data": {"response", "error_type", "timestamp"}}`: `400` with
//! `INVALID_THREAD_ID` or `INVALID_USER_ID` (ids are checked before they reach Redis), `500`
//! with `REDIS_CONNECTION_ERROR` or `DELETE_FAILED`, and `501` with `NOT_ON_REDIS` when the
//! service runs in memory. A body that is not JSON, a mistyped field or a `keep_count` below
//! 1 get the service's own `400 bad_request`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Service;
use super::error::ApiError;
use super::extract::{JsonBody, query_rejection};
use crate::redis::retention::{CheckpointOps, Layout, RetentionError, Scope, Stats};

/// The message of every failure, as the seed's `internal_error_response` gives it.
const FAILURE_MESSAGE: &str = "请求处理失败";

/// The cleanup request. Unknown fields are ignored, as the seed's handler does.
#[derive(Debug, Default, Deserialize)]
pub(super) struct CleanupRequest {
    #[serde(default)]
    keep_count: Option<usize>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    layout: Option<Layout>,
}

/// The query string of both endpoints.
#[derive(Debug, Default, Deserialize)]
pub(super) struct OpsQuery {
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    layout: Option<Layout>,
}

/// The seed's success answer.
#[derive(Debug, Serialize)]
struct Success {
    code: u16,
    success: bool,
    message: String,
    data: Value,
}

/// The seed's error answer.
#[derive(Debug)]
pub(super) struct SeedError {
    status: StatusCode,
    error_type: &'static str,
    response: String,
}

impl SeedError {
    fn not_on_redis() -> Self {
        Self {
            status: StatusCode::NOT_IMPLEMENTED,
            error_type: "NOT_ON_REDIS",
            response: "checkpoint ops need Redis: this service runs in memory \
                       (start it with --redis URL)"
                .to_owned(),
        }
    }
}

impl From<RetentionError> for SeedError {
    fn from(e: RetentionError) -> Self {
        let status = match e {
            RetentionError::InvalidUser { .. } | RetentionError::InvalidThread { .. } => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self {
            status,
            error_type: e.error_type(),
            response: e.to_string(),
        }
    }
}

impl IntoResponse for SeedError {
    fn into_response(self) -> Response {
        let body = json!({
            "code": self.status.as_u16(),
            "success": false,
            "message": FAILURE_MESSAGE,
            "data": {
                "response": self.response,
                "error_type": self.error_type,
                "timestamp": timestamp(),
            },
        });
        (self.status, Json(body)).into_response()
    }
}

/// Either failure: the service's own (bad body or query) or the seed's.
pub(super) enum Failure {
    Api(ApiError),
    Seed(SeedError),
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Self::Api(e) => e.into_response(),
            Self::Seed(e) => e.into_response(),
        }
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl From<SeedError> for Failure {
    fn from(e: SeedError) -> Self {
        Self::Seed(e)
    }
}

impl From<RetentionError> for Failure {
    fn from(e: RetentionError) -> Self {
        Self::Seed(e.into())
    }
}

/// Now as the seed writes it: `2025-01-31T10:30:00` (UTC, no zone suffix).
fn timestamp() -> String {
    seed_timestamp(&humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string())
}

/// An RFC 3339 UTC time (`...Z`) as the seed writes it.
fn seed_timestamp(rfc3339: &str) -> String {
    rfc3339.strip_suffix('Z').unwrap_or(rfc3339).to_owned()
}

/// A report as the seed's `data`: without runvisor's `layout` field, its timestamp in the
/// seed's format.
fn seed_data(report: impl Serialize) -> Result<Value, ApiError> {
    let mut data = serde_json::to_value(report)
        .map_err(|e| ApiError::internal(format!("cannot write the report: {e}")))?;
    if let Value::Object(fields) = &mut data {
        fields.remove("layout");
        if let Some(Value::String(time)) = fields.get_mut("timestamp") {
            *time = seed_timestamp(time);
        }
    }
    Ok(data)
}

fn success(message: String, data: Value) -> Response {
    Json(Success {
        code: 200,
        success: true,
        message,
        data,
    })
    .into_response()
}

/// The stores' checkpoint ops; in memory there are none.
fn ops(service: &Service) -> Result<CheckpointOps, SeedError> {
    service
        .redis()
        .map(crate::redis::RedisStores::checkpoint_ops)
        .ok_or_else(SeedError::not_on_redis)
}

/// An id the seed would read as given: present and not empty.
fn given(id: Option<String>) -> Option<String> {
    id.filter(|id| !id.is_empty())
}

/// `POST /api/v0/checkpoint/direct/cleanup`.
pub(super) async fn cleanup(
    State(service): State<Service>,
    query: Result<Query<OpsQuery>, QueryRejection>,
    JsonBody(request): JsonBody<CleanupRequest>,
) -> Result<Response, Failure> {
    let Query(query) = query.map_err(query_rejection)?;
    let keep = request
        .keep_count
        .unwrap_or(service.shared.checkpoint_keep_count.get());
    if keep < 1 {
        return Err(ApiError::bad_request("`keep_count` must be at least 1")
            .with("field", "keep_count")
            .into());
    }
    let layout = request
        .layout
        .or(query.layout)
        .unwrap_or(service.shared.checkpoint_layout);
    // A thread given wins over a user; neither: every thread.
    let scope = match (given(request.thread_id), given(request.user_id)) {
        (Some(thread), _) => Scope::Thread(thread),
        (None, Some(user)) => Scope::User(user),
        (None, None) => Scope::All,
    };
    let ops = ops(&service)?;
    let report = ops.cleanup(layout, &scope, keep).await?;
    Ok(success(
        "Checkpoint清理完成".to_owned(),
        seed_data(&report)?,
    ))
}

/// `GET /api/v0/checkpoint/direct/stats[?user_id=]`.
pub(super) async fn stats(
    State(service): State<Service>,
    query: Result<Query<OpsQuery>, QueryRejection>,
) -> Result<Response, Failure> {
    let Query(query) = query.map_err(query_rejection)?;
    let layout = query.layout.unwrap_or(service.shared.checkpoint_layout);
    let user = given(query.user_id);
    let ops = ops(&service)?;
    let stats = ops.stats(layout, user.as_deref()).await?;
    let (message, data) = match stats {
        Stats::System(system) => ("获取系统checkpoint统计成功".to_owned(), seed_data(&system)?),
        Stats::User(mut one) => {
            // The seed lists a user's threads the fullest first.
            one.threads.sort_by(|a, b| {
                b.checkpoint_count
                    .cmp(&a.checkpoint_count)
                    .then_with(|| a.thread_id.cmp(&b.thread_id))
            });
            (format!("获取用户{}统计成功", one.user_id), seed_data(&one)?)
        }
    };
    Ok(success(message, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_the_seeds() {
        assert_eq!(
            seed_timestamp("2025-01-31T10:30:00Z"),
            "2025-01-31T10:30:00"
        );
        let now = timestamp();
        assert_eq!(now.len(), "2025-01-31T10:30:00".len(), "{now}");
        assert!(!now.ends_with('Z'));
    }

    #[test]
    fn errors_have_the_seed_shape() {
        let e: SeedError = RetentionError::InvalidThread {
            thread: "x".into(),
            reason: "no timestamp".into(),
        }
        .into();
        assert_eq!(
            (e.status, e.error_type),
            (StatusCode::BAD_REQUEST, "INVALID_THREAD_ID")
        );
    }
}
