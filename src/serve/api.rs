//! The routes, and what wraps them: the bearer token check, the body limit, JSON answers for
//! unknown routes and methods, and the health checks.

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use subtle::ConstantTimeEq;
use tower_http::limit::RequestBodyLimitLayer;
use tracing::Instrument;

use crate::telemetry;

use super::error::ApiError;
use super::{Service, checkpoint_ops, compat, events, metrics, openapi, page, runs, threads};

/// Every route of the service.
pub(super) fn router(service: Service) -> Router {
    let limit = service.shared.body_limit;
    let v1 = Router::new()
        .route("/v1/runs", post(runs::start).get(runs::list))
        .route("/v1/runs/{run_id}", get(runs::get))
        .route("/v1/events", get(events::events))
        .route("/v1/runs/{run_id}/tree", get(runs::tree))
        .route("/v1/runs/{run_id}/stop", post(runs::stop))
        .route("/v1/runs/{run_id}/cancel", post(runs::cancel))
        .route("/v1/threads/{thread}/resume", post(threads::resume))
        .route(
            "/v1/threads/{thread}/checkpoints",
            get(threads::checkpoints),
        )
        .route("/v1/workflows/validate", post(runs::validate))
        .route_layer(middleware::from_fn(traced));
    Router::new()
        .route("/", get(page::index))
        .route("/page.css", get(page::css))
        .route("/page.js", get(page::js))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::openapi))
        .route("/api/v2/chat/stop", post(compat::fastgpt_stop))
        .route("/stop", post(compat::nexau_stop))
        .route(
            "/api/v0/checkpoint/direct/cleanup",
            post(checkpoint_ops::cleanup),
        )
        .route(
            "/api/v0/checkpoint/direct/stats",
            get(checkpoint_ops::stats),
        )
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Around everything, unknown routes too, so they tell nothing without the token.
        .layer(middleware::from_fn_with_state(service.clone(), authorize))
        .with_state(service)
        // One limit, the configured one, instead of axum's 2 MB default for extractors.
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(middleware::map_response(move |r| {
            json_limit_error(r, limit)
        }))
}

/// A span per `/v1` request (an OpenTelemetry server span when spans are exported), joining
/// the trace its `traceparent` header names: a run it starts or resumes is its child.
async fn traced(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or_else(
        || request.uri().path().to_owned(),
        |p| p.as_str().to_owned(),
    );
    let method = request.method().clone();
    let span = tracing::info_span!(
        "request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    let headers = request.headers();
    if let Some(traceparent) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        let tracestate = headers.get("tracestate").and_then(|v| v.to_str().ok());
        telemetry::join_traceparent(&span, traceparent, tracestate);
    }
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}

/// The paths anyone may ask, token or not: the health checks, and the operator page (which
/// holds no data: the API calls it makes need the token).
const OPEN_PATHS: [&str; 5] = ["/healthz", "/readyz", "/", "/page.css", "/page.js"];

/// With a token configured, lets a request through only with `Authorization: Bearer <token>`
/// (compared in constant time), except the open paths.
async fn authorize(State(service): State<Service>, request: Request, next: Next) -> Response {
    if let Some(token) = &service.shared.token
        && !OPEN_PATHS.contains(&request.uri().path())
    {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .unwrap_or("");
        let same: bool = given.as_bytes().ct_eq(token.as_bytes()).into();
        if !same {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// The body limit layer refuses a request whose declared length is too large with a plain
/// text 413 before any route sees it; this answers it in the service's JSON shape.
async fn json_limit_error(response: Response, limit: usize) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return ApiError::payload_too_large(limit).into_response();
    }
    response
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!("no route {}", request.uri().path()))
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// `GET /healthz`: 200 while the process serves.
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: 200 when runs can be started: not shutting down, and the stores answer (a
/// key read through the signal source, with the store's deadlines); 503 otherwise.
async fn readyz(State(service): State<Service>) -> Result<Json<serde_json::Value>, ApiError> {
    if service.draining() {
        return Err(ApiError::shutting_down());
    }
    let runtime = service.runtime();
    let probe = format!("{}:readyz", runtime.config().signals.prefix);
    runtime
        .signal_source()
        .read(std::slice::from_ref(&probe))
        .await
        .map_err(|e| ApiError::storage(&e))?;
    Ok(Json(json!({
        "status": "ready",
        "worker": runtime.worker().id.to_string(),
        "stores": if service.redis().is_some() { "redis" } else { "memory" },
    })))
}
