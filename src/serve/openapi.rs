//! `GET /openapi.json`: the OpenAPI 3.1 document of the native API (`/v1`), generated with
//! utoipa from the handlers' own annotations and request types, so it follows the code.

use axum::Json;
use serde::Serialize;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use super::{runs, threads};

/// The OpenAPI document of `/v1`.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "runvisor",
        description = "Supervised, stoppable, resumable workflow runs over HTTP. Every error \
                       is `{\"error\": {\"code\", \"message\", ...details}}` with a stable code."
    ),
    paths(
        runs::start,
        runs::list,
        runs::get,
        runs::tree,
        runs::stop,
        runs::cancel,
        runs::validate,
        threads::resume,
        threads::checkpoints,
    ),
    components(schemas(ErrorDocument, ErrorFields)),
    modifiers(&BearerToken),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "Start, list, show, stop and cancel runs of every worker"),
        (name = "threads", description = "Resume a thread; its checkpoints"),
        (name = "workflows", description = "Validate a workflow"),
    )
)]
struct ApiDoc;

/// The bearer token, required on every path but the health checks when the service has one.
struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
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

/// `GET /openapi.json`.
pub(super) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
