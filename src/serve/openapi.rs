//! `GET /openapi.json`: the OpenAPI 3.1 document of the native API (`/v1`), generated with
//! utoipa from the handlers' own annotations and request types, so it follows the code.

use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::{ErrorDocument, ErrorFields};
use super::{events, runs, threads};

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
        events::events,
        runs::get,
        runs::tree,
        runs::stop,
        runs::cancel,
        runs::validate,
        threads::resume,
        threads::checkpoints,
    ),
    components(schemas(ErrorDocument, ErrorFields, events::RunChange)),
    modifiers(&BearerToken),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "Start, list, show, stop and cancel runs of every worker"),
        (name = "threads", description = "Resume a thread; its checkpoints"),
        (name = "workflows", description = "Validate a workflow"),
    )
)]
struct ApiDoc;

/// The bearer token, required on every path but the health checks and the operator page when
/// the service has one.
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

/// `GET /openapi.json`.
pub(super) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
