//! [`ApiError`]: every error the service answers, and the one place where the runtime's errors
//! become HTTP statuses and stable codes.
//!
//! The body is always `{"error": {"code": "...", "message": "...", ...details}}`. Codes:
//! `bad_request` (400: malformed JSON, a wrong field or parameter), `invalid_id` (400),
//! `unauthorized` (401), `not_found` (404), `method_not_allowed` (405), `thread_busy` (409,
//! naming the run and its worker), `no_live_run` (409: the run does not run now),
//! `nothing_to_resume`, `not_resumable`, `answer_required`, `thread_exists` (409),
//! `payload_too_large` (413), `unsupported_media_type` (415), `invalid_workflow` (422, every
//! problem listed), `invalid_input`, `invalid_answer` (422), `internal` (500),
//! `storage_unavailable`, `worker_unavailable`, `shutting_down` (503).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use runvisor_actors::{
    InvalidId, ResumeError, RunId, RunStatus, StartError, StopError, StoreError, ThreadId,
    ValidationErrors, WorkerId,
};
use serde::Serialize;
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use crate::ops::TreeError;
use crate::redis::control::ControlError;

/// An error answer: an HTTP status, a stable code, a message and details.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Map<String, Value>,
}

impl ApiError {
    /// An error with no details.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// Adds a detail beside the code and message.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn invalid_id(field: &str, error: &InvalidId) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("bad {field}: {error}"),
        )
        .with("field", field)
    }

    pub(crate) fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than {limit} bytes"),
        )
        .with("limit", limit)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this endpoint needs `Authorization: Bearer <token>` with the service's token",
        )
    }

    pub(crate) fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the service is shutting down: it starts no runs",
        )
    }

    pub(crate) fn storage(error: &StoreError) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            format!("the store failed: {error}"),
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// `no_live_run`: the run exists but does not run now.
    pub(crate) fn no_live_run(run: RunId, status: RunStatus) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "no_live_run",
            format!("run {run} does not run now: it is {status}"),
        )
        .with("run_id", run.to_string())
        .with("status", status.to_string())
    }

    /// `invalid_workflow`, listing every problem (at most
    /// [`ValidationErrors::LISTED`] of them, and how many more).
    pub(crate) fn invalid_workflow(errors: &ValidationErrors) -> Self {
        let listed: Vec<Value> = errors
            .listed()
            .iter()
            .map(|e| Value::String(e.to_string()))
            .collect();
        let count = errors.len();
        let s = if count == 1 { "" } else { "s" };
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_workflow",
            format!("the workflow is invalid: {count} problem{s}"),
        )
        .with("errors", listed)
        .with("unlisted", errors.unlisted())
    }

    fn thread_busy(
        thread: &ThreadId,
        run: RunId,
        worker: Option<&WorkerId>,
        message: String,
    ) -> Self {
        Self::new(StatusCode::CONFLICT, "thread_busy", message)
            .with("thread", thread.as_str())
            .with("run_id", run.to_string())
            .with(
                "worker",
                worker
                    .map(|w| Value::String(w.to_string()))
                    .unwrap_or(Value::Null),
            )
    }
}

impl ApiError {
    /// The error as it is answered: `{"error": {"code", "message", ...details}}`.
    pub(crate) fn document(self) -> Value {
        let mut body = Map::new();
        body.insert("code".into(), Value::String(self.code.into()));
        body.insert("message".into(), Value::String(self.message));
        for (k, v) in self.details {
            body.entry(k).or_insert(v);
        }
        json!({ "error": body })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = (status, axum::Json(self.document())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<StartError> for ApiError {
    fn from(e: StartError) -> Self {
        let message = e.to_string();
        match e {
            StartError::InvalidInput { input, problem } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
                    .with("input", input)
                    .with("problem", problem)
            }
            StartError::InputTooDeep { input, .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
                    .with("input", input)
            }
            StartError::ThreadBusy {
                thread,
                run,
                worker,
            } => Self::thread_busy(&thread, run, worker.as_ref(), message),
            StartError::UnknownKind(kind) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_workflow",
                message.clone(),
            )
            .with("errors", vec![Value::String(message)])
            .with("unknown_kind", kind),
            StartError::Lease { .. } | StartError::History { .. } | StartError::RunStore(_) => {
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_unavailable",
                    message,
                )
            }
            _ => Self::internal(message),
        }
    }
}

impl From<ResumeError> for ApiError {
    fn from(e: ResumeError) -> Self {
        let message = e.to_string();
        let conflict = |code| Self::new(StatusCode::CONFLICT, code, message.clone());
        match e {
            ResumeError::NoCheckpoint(thread) => {
                Self::not_found(message).with("thread", thread.as_str())
            }
            ResumeError::CheckpointNotFound { thread, checkpoint } => Self::not_found(message)
                .with("thread", thread.as_str())
                .with("checkpoint_id", checkpoint.to_string()),
            ResumeError::ThreadBusy {
                thread,
                run,
                worker,
            } => Self::thread_busy(&thread, run, worker.as_ref(), message),
            ResumeError::NothingToResume { run, status, .. } => conflict("nothing_to_resume")
                .with("run_id", run.to_string())
                .with("status", status.to_string()),
            ResumeError::Corrupt { .. }
            | ResumeError::Workflow { .. }
            | ResumeError::Inconsistent { .. }
            | ResumeError::HistoryMissing { .. } => conflict("not_resumable"),
            ResumeError::UnknownInteraction { pending, .. } => {
                let pending: Vec<Value> = pending
                    .iter()
                    .map(|i| Value::String(i.to_string()))
                    .collect();
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_answer", message)
                    .with("pending", pending)
            }
            ResumeError::InvalidAnswer { .. } | ResumeError::AnswerTooDeep { .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_answer", message)
            }
            ResumeError::AnswerRequired { interaction, .. } => conflict("answer_required").with(
                "interaction",
                serde_json::to_value(&*interaction).unwrap_or(Value::Null),
            ),
            ResumeError::ForkTargetExists { thread, .. } => {
                conflict("thread_exists").with("thread", thread.as_str())
            }
            ResumeError::Store(error) => Self::storage(&error),
            ResumeError::Start(e) => e.into(),
            _ => Self::internal(message),
        }
    }
}

impl From<StopError> for ApiError {
    fn from(e: StopError) -> Self {
        match e {
            StopError::UnknownRun(run) => {
                Self::not_found(format!("no run {run}")).with("run_id", run.to_string())
            }
            StopError::NotInThisProcess(run, status) => Self::no_live_run(run, status),
            StopError::Store(error) => Self::storage(&error),
            other => Self::internal(other.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Self::storage(&e)
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        let message = e.to_string();
        match e {
            ControlError::NoAnswer { worker, .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "worker_unavailable",
                message,
            )
            .with("worker", worker.to_string()),
            ControlError::Refused { worker, .. } => {
                Self::new(StatusCode::CONFLICT, "no_live_run", message)
                    .with("worker", worker.to_string())
            }
            ControlError::Store(error) => Self::storage(&error),
            _ => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                message,
            ),
        }
    }
}

impl From<TreeError> for ApiError {
    fn from(e: TreeError) -> Self {
        use runvisor_actors::QueryError;
        let message = e.to_string();
        match e {
            TreeError::UnknownRun(run) => Self::not_found(message).with("run_id", run.to_string()),
            TreeError::NotLive { run, status } => Self::no_live_run(run, status),
            TreeError::Orphaned { run, worker } => {
                Self::no_live_run(run, RunStatus::Orphaned).with("worker", worker.to_string())
            }
            TreeError::Query(QueryError::NoAnswer(run, _)) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "worker_unavailable",
                message,
            )
            .with("run_id", run.to_string()),
            TreeError::Query(QueryError::NotRunning(run, status)) => Self::no_live_run(run, status),
            TreeError::Query(_) => Self::new(StatusCode::CONFLICT, "no_live_run", message),
            TreeError::Control(e) => e.into(),
            TreeError::Store(e) => Self::storage(&e),
        }
    }
}

/// An error answer: `{"error": {"code", "message", ...details}}`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorDocument {
    error: ErrorFields,
}

/// The error: a stable code, a message, and details beside them (`field`, `run_id`, ...).
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorFields {
    /// The stable code: `bad_request`, `thread_busy`, `no_live_run`, `invalid_workflow`, ...
    code: String,
    /// What went wrong, for people.
    message: String,
}
