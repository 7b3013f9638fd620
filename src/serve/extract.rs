//! Reading requests: JSON bodies, path segments and query strings, every failure answered as
//! an [`ApiError`] (never axum's plain-text rejections).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::Service;
use super::error::ApiError;

/// A JSON request body. The request must say `Content-Type: application/json` (a web page
/// cannot send that to another origin without asking first, which this service refuses); an
/// empty body reads as `{}`, so requests whose fields are all optional need none.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T> FromRequest<Service> for JsonBody<T>
where
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, service: &Service) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| {
                let mime = mime.trim();
                mime.eq_ignore_ascii_case("application/json")
                    || (mime.len() > 5
                        && mime.to_ascii_lowercase().starts_with("application/")
                        && mime.to_ascii_lowercase().ends_with("+json"))
            });
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the request body must be JSON, sent with `Content-Type: application/json`",
            ));
        }
        let bytes = Bytes::from_request(req, service)
            .await
            .map_err(|r| body_rejection(r, service.shared.body_limit))?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        parse(text).map(JsonBody)
    }
}

/// Parses a JSON document; the error names the field (`inputs.tier`) and the position.
pub(crate) fn parse<T: DeserializeOwned>(text: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let mut error = ApiError::bad_request(format!("malformed JSON body: {inner}"));
        if path != "." && !path.is_empty() {
            error = error.with("field", path);
        }
        error
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    Ok(value)
}

/// A body that could not be read: too large (413) or cut off (400).
fn body_rejection(rejection: BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::payload_too_large(limit)
    } else {
        ApiError::bad_request(format!(
            "cannot read the request body: {}",
            rejection.body_text()
        ))
    }
}

/// A path segment that did not decode.
pub(crate) fn path_rejection(rejection: PathRejection) -> ApiError {
    ApiError::bad_request(format!("bad path: {}", rejection.body_text()))
}

/// A query string that did not parse into the endpoint's parameters.
pub(crate) fn query_rejection(rejection: QueryRejection) -> ApiError {
    ApiError::bad_request(format!("bad query string: {}", rejection.body_text()))
}
