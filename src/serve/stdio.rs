//! `runvisor serve --stdio`: the service as JSON-RPC 2.0 over a byte stream (stdin and stdout),
//! one JSON value per line (newline-delimited JSON; a request must not contain a raw newline,
//! which JSON text never needs).
//!
//! Methods, each answered by the same code as its HTTP endpoint:
//! - `agent.stop`: params are NexAU's `StopRequest` (`user_id`, `session_id`, `agent_id`,
//!   `force`, `timeout`), the result its `StopResponse` (`status`, `stop_reason`,
//!   `message_count`, `error`), as `POST /stop` answers them.
//! - `run.start`: params as `POST /v1/runs` (`workflow`, `inputs`, `thread`, `app`, `chat`,
//!   `task`, `user`, `wait`; not `stream`); the result is its JSON answer.
//! - `run.resume`: params are `thread` plus the fields of `POST /v1/threads/{thread}/resume`.
//!
//! Errors: `-32700` parse error, `-32600` invalid request, `-32601` method not found, `-32602`
//! invalid params (the service refused the params as a 400, 413, 415 or 422: its error object,
//! `{code, message, ...}`, is the error's `data`), `-32000` the service's other errors (a busy
//! thread, a run that is not live, an unavailable store: the same `data`).
//!
//! Each method takes `traceparent` (and `tracestate`) params as the W3C headers: the call's
//! span, and the run it starts or resumes, join that trace.
//!
//! Requests are handled concurrently (a `run.start` that waits blocks nothing else); each answer
//! is written whole on a line of its own. Notifications (no `id`) are handled and not answered;
//! a batch (an array) is answered with an array of the answers to its requests. End of input
//! shuts the service down as a signal does: every run stops with reason `shutdown`, the
//! requests in flight are answered, then [`serve_stdio`] returns.

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use tracing::Instrument;

use super::error::ApiError;
use super::extract::JsonBody;
use super::{ANSWER_GRACE, Service};
use crate::telemetry;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const SERVER_ERROR: i64 = -32000;

/// What the reading thread hands over.
enum Input {
    Line(String),
    /// A line longer than the body limit (its bytes are dropped).
    TooLong,
    /// A line that is not UTF-8, so not JSON.
    NotUtf8,
}

/// Serves `service` as JSON-RPC 2.0 on `input` (requests, one per line) and `output` (answers,
/// one per line) until `input` ends or `shutdown` completes; then drains the service (every run
/// stopped with reason `shutdown`, each resumable), answers the requests in flight (for ten
/// seconds at most) and returns. `input` is read on a thread of its own (a blocking read
/// never holds up the shutdown); lines longer than the service's body limit are refused.
pub async fn serve_stdio(
    service: Service,
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limit = service.shared.body_limit;
    let (line_tx, mut lines) = tokio::sync::mpsc::channel::<Input>(64);
    std::thread::Builder::new()
        .name("runvisor-stdin".into())
        .spawn(move || read_lines(input, limit, &line_tx))?;
    let (answer_tx, mut answers) = tokio::sync::mpsc::unbounded_channel::<String>();
    let writer = tokio::task::spawn_blocking(move || {
        let mut output = output;
        while let Some(mut answer) = answers.blocking_recv() {
            answer.push('\n');
            // One write and a flush per answer: answers never interleave.
            output.write_all(answer.as_bytes())?;
            output.flush()?;
        }
        Ok::<(), std::io::Error>(())
    });
    let mut handling = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let next = tokio::select! {
            next = lines.recv() => next,
            () = &mut shutdown => None,
        };
        let Some(next) = next else { break };
        let service = service.clone();
        let answer_tx = answer_tx.clone();
        handling.spawn(async move {
            let answer = match next {
                Input::Line(line) => handle_line(&service, &line).await,
                Input::NotUtf8 => Some(failure(
                    Value::Null,
                    PARSE_ERROR,
                    "Parse error: the line is not UTF-8".into(),
                    None,
                )),
                Input::TooLong => Some(failure(
                    Value::Null,
                    INVALID_REQUEST,
                    format!("Invalid Request: the line is longer than {limit} bytes"),
                    None,
                )),
            };
            if let Some(answer) = answer {
                let _ = answer_tx.send(answer.to_string());
            }
        });
        // Finished handlers are reaped as we go.
        while handling.try_join_next().is_some() {}
    }
    tracing::info!("stdio serving ends: stopping every run (reason shutdown)");
    service.drain().await;
    let answered = async { while handling.join_next().await.is_some() {} };
    if tokio::time::timeout(ANSWER_GRACE, answered).await.is_err() {
        tracing::warn!("requests still open {ANSWER_GRACE:?} after shutdown; dropping them");
        handling.abort_all();
    }
    drop(answer_tx);
    match tokio::time::timeout(Duration::from_secs(5), writer).await {
        Ok(Ok(written)) => written,
        Ok(Err(e)) => Err(std::io::Error::other(e)),
        Err(_) => {
            tracing::warn!("the output did not take the last answers within 5 s");
            Ok(())
        }
    }
}

/// Reads lines of at most `limit` bytes until the input ends or the server stops listening.
fn read_lines(input: impl Read, limit: usize, lines: &tokio::sync::mpsc::Sender<Input>) {
    let mut input = BufReader::new(input);
    loop {
        let mut bytes = Vec::new();
        let read = (&mut input)
            .take(limit as u64 + 1)
            .read_until(b'\n', &mut bytes);
        match read {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read stdin: treating it as ended");
                return;
            }
        }
        let next = if bytes.last() == Some(&b'\n') || bytes.len() <= limit {
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            if bytes.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            String::from_utf8(bytes).map_or(Input::NotUtf8, Input::Line)
        } else {
            // The rest of the long line is skipped.
            let _ = input.skip_until(b'\n');
            Input::TooLong
        };
        if lines.blocking_send(next).is_err() {
            return;
        }
    }
}

/// The answer to one line (a request or a batch); `None` when nothing is answered.
async fn handle_line(service: &Service, line: &str) -> Option<Value> {
    let value: Value = match serde_json::from_str(line) {
        Ok(value) => value,
        Err(e) => {
            return Some(failure(
                Value::Null,
                PARSE_ERROR,
                "Parse error".into(),
                Some(json!({"message": e.to_string()})),
            ));
        }
    };
    match value {
        Value::Array(batch) if batch.is_empty() => Some(failure(
            Value::Null,
            INVALID_REQUEST,
            "Invalid Request: an empty batch".into(),
            None,
        )),
        Value::Array(batch) => {
            let answers: Vec<Value> =
                futures::future::join_all(batch.into_iter().map(|one| handle(service, one)))
                    .await
                    .into_iter()
                    .flatten()
                    .collect();
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        one => handle(service, one).await,
    }
}

/// The answer to one request; `None` for a notification.
async fn handle(service: &Service, request: Value) -> Option<Value> {
    let Value::Object(mut request) = request else {
        return Some(failure(
            Value::Null,
            INVALID_REQUEST,
            "Invalid Request: expected an object".into(),
            None,
        ));
    };
    let id = match request.remove("id") {
        None => None,
        Some(id @ (Value::Null | Value::String(_) | Value::Number(_))) => Some(id),
        Some(_) => {
            return Some(failure(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: `id` must be a string, a number or null".into(),
                None,
            ));
        }
    };
    let invalid = |message: &str| {
        Some(failure(
            id.clone().unwrap_or(Value::Null),
            INVALID_REQUEST,
            format!("Invalid Request: {message}"),
            None,
        ))
    };
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("`jsonrpc` must be \"2.0\"");
    }
    let Some(Value::String(method)) = request.remove("method") else {
        return invalid("`method` must be a string");
    };
    let params = match request.remove("params") {
        None => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => {
            let id = id?;
            return Some(failure(
                id,
                INVALID_PARAMS,
                "Invalid params: `params` must be an object (named parameters)".into(),
                None,
            ));
        }
    };
    let outcome = traced(service, &method, params).await;
    // A notification is not answered, whatever came of it.
    let id = id?;
    Some(match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message, data)) => failure(id, code, message, data),
    })
}

type Failure = (i64, String, Option<Value>);

/// Runs `method` in a span of its own (an OpenTelemetry server span when spans are exported),
/// joining the trace a `traceparent` param names (with `tracestate`, as the HTTP headers): a
/// run it starts or resumes is its child.
async fn traced(
    service: &Service,
    method: &str,
    mut params: Map<String, Value>,
) -> Result<Value, Failure> {
    let mut text = |name: &str| match params.remove(name) {
        Some(Value::String(value)) => Some(value),
        _ => None,
    };
    let (traceparent, tracestate) = (text("traceparent"), text("tracestate"));
    let span = tracing::info_span!(
        "rpc",
        otel.name = method,
        otel.kind = "server",
        rpc.system = "jsonrpc",
        rpc.method = method,
    );
    if let Some(traceparent) = &traceparent {
        telemetry::join_traceparent(&span, traceparent, tracestate.as_deref());
    }
    call(service, method, params).instrument(span).await
}

/// Runs `method` with `params`.
async fn call(
    service: &Service,
    method: &str,
    mut params: Map<String, Value>,
) -> Result<Value, Failure> {
    match method {
        "agent.stop" => {
            let request = match params_as(params) {
                Ok(request) => request,
                Err(e) => return answer(Err(e)).await,
            };
            let response =
                super::compat::nexau_stop(State(service.clone()), JsonBody(request)).await;
            // NexAU answers its errors in a `StopResponse`; a request it refuses (a bad
            // timeout) is invalid params here.
            let refused = response.status() == StatusCode::BAD_REQUEST;
            let body = body(response).await?;
            if refused {
                let message = body["error"].as_str().unwrap_or("bad request").to_owned();
                return Err((
                    INVALID_PARAMS,
                    format!("Invalid params: {message}"),
                    Some(json!({"code": "bad_request", "message": message})),
                ));
            }
            Ok(body)
        }
        "run.start" => {
            let request = match refuse_stream(&params).and_then(|()| params_as(params)) {
                Ok(request) => request,
                Err(e) => return answer(Err(e)).await,
            };
            answer(super::runs::start(State(service.clone()), JsonBody(request)).await).await
        }
        "run.resume" => {
            let thread = match params.remove("thread") {
                Some(Value::String(thread)) => thread,
                _ => {
                    let e = ApiError::bad_request("`thread` (a string) names the thread to resume")
                        .with("field", "thread");
                    return answer(Err(e)).await;
                }
            };
            let request = match refuse_stream(&params).and_then(|()| params_as(params)) {
                Ok(request) => request,
                Err(e) => return answer(Err(e)).await,
            };
            answer(
                super::threads::resume(State(service.clone()), Ok(Path(thread)), JsonBody(request))
                    .await,
            )
            .await
        }
        other => Err((
            METHOD_NOT_FOUND,
            format!("Method not found: {other:?} (agent.stop, run.start, run.resume)"),
            None,
        )),
    }
}

/// Server-sent events need HTTP: `stream` is refused.
fn refuse_stream(params: &Map<String, Value>) -> Result<(), ApiError> {
    if params
        .get("stream")
        .is_some_and(|s| s != &Value::Bool(false))
    {
        return Err(ApiError::bad_request(
            "`stream` is not served over stdio: use `wait`, or follow the run over HTTP",
        )
        .with("field", "stream"));
    }
    Ok(())
}

/// `params` read as the HTTP endpoint reads its body.
fn params_as<T: DeserializeOwned>(params: Map<String, Value>) -> Result<T, ApiError> {
    serde_json::from_value(Value::Object(params))
        .map_err(|e| ApiError::bad_request(format!("bad params: {e}")))
}

/// A handler's answer as a result (2xx) or a failure carrying its error object.
async fn answer(answer: Result<Response, ApiError>) -> Result<Value, Failure> {
    let response = answer.unwrap_or_else(IntoResponse::into_response);
    let status = response.status();
    let body = body(response).await?;
    if status.is_success() {
        return Ok(body);
    }
    let data = body.get("error").cloned().unwrap_or(body);
    let message = data["message"]
        .as_str()
        .unwrap_or("the request failed")
        .to_owned();
    let code = match status {
        StatusCode::BAD_REQUEST
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::UNSUPPORTED_MEDIA_TYPE
        | StatusCode::UNPROCESSABLE_ENTITY => INVALID_PARAMS,
        _ => SERVER_ERROR,
    };
    let prefix = if code == INVALID_PARAMS {
        "Invalid params: "
    } else {
        ""
    };
    Err((code, format!("{prefix}{message}"), Some(data)))
}

/// A response's JSON body.
async fn body(response: Response) -> Result<Value, Failure> {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .map_err(|e| (SERVER_ERROR, format!("cannot read the answer: {e}"), None))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| (SERVER_ERROR, format!("the answer is not JSON: {e}"), None))
}

fn failure(id: Value, code: i64, message: String, data: Option<Value>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let (Some(data), Value::Object(fields)) = (data, &mut error) {
        fields.insert("data".into(), data);
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}
