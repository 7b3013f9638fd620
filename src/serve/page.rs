//! The operator page at `/`: one HTML page, its stylesheet and its script, embedded in the
//! binary (no front-end build, nothing fetched from elsewhere). It lists the runs of every
//! worker and follows `/v1/events`, shows a run's actor tree, and stops, cancels or resumes
//! it through the native API. The three files hold no data, so they are served without the
//! token; the page asks for the token when the API answers 401 and sends it on every call.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("page/index.html");
const CSS: &str = include_str!("page/page.css");
const JS: &str = include_str!("page/page.js");

/// Only this origin's files and API, no inline script or style, not framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self'; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// `GET /`: the page.
pub(super) async fn index() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /page.css`.
pub(super) async fn css() -> impl IntoResponse {
    asset("text/css; charset=utf-8", CSS)
}

/// `GET /page.js`.
pub(super) async fn js() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", JS)
}
