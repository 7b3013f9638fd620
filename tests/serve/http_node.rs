//! The `http` node kind against a real host: an axum server on a free loopback port in the
//! test, serving JSON, NDJSON and SSE answers, failing, hanging, and telling when the
//! connection it streams on is closed.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use futures::channel::mpsc;
use runvisor::http_node::{AllowList, HttpConfig};
use runvisor::{
    Map, RunEvent, RunHandle, RunOutcome, Runtime, StopMode, StopReply, ThreadId, Value,
    register_standard_kinds, register_standard_kinds_with,
};
use serde_json::json;
use tokio::sync::{Notify, oneshot};

use crate::server::PATIENCE;

/// What the host shares with the test.
#[derive(Default)]
struct Host {
    /// Calls of `/flaky`.
    flaky: AtomicU32,
    /// Calls of `/bad`.
    bad: AtomicU32,
    /// Calls of `/stalls`.
    stalls: AtomicU32,
    /// Lets `/slow` and `/endless` go on past their first chunks.
    release: Notify,
    /// Told when `/endless` finds its connection closed.
    closed: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

/// Starts the host; returns its address.
async fn host(state: Arc<Host>) -> String {
    let app = Router::new()
        .route("/json", post(echo))
        .route("/ndjson", post(ndjson))
        .route("/sse", post(sse))
        .route("/flaky", post(flaky))
        .route("/bad", post(bad))
        .route("/hang", post(hang))
        .route("/stalls", post(stalls))
        .route("/slow", post(slow))
        .route("/endless", post(endless))
        .route("/redirect", post(redirect))
        .route("/text", get(|| async { "plain words" }))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a free port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{address}")
}

/// Answers the request body and the headers that matter, as JSON.
async fn echo(headers: HeaderMap, body: Bytes) -> Response {
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    axum::Json(json!({
        "got": body,
        "content_type": header("content-type"),
        "traceparent": header("traceparent"),
        "x_key": header("x-key"),
    }))
    .into_response()
}

/// A body streamed from what a task sends; a send fails once the body is dropped.
fn streamed(content_type: &'static str) -> (mpsc::UnboundedSender<String>, Response) {
    let (tx, rx) = mpsc::unbounded::<String>();
    let body = Body::from_stream(rx.map(|s| Ok::<_, Infallible>(Bytes::from(s))));
    let response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    (tx, response)
}

async fn ndjson() -> Response {
    let (tx, response) = streamed("application/x-ndjson");
    for line in [
        "\"Hel\"\n",
        "\n",
        "{\"text\": \"lo\"}\n",
        "{\"model\": \"model-7b\"}\n",
        "{\"output\": {\"n\": 2}, \"usage\": {\"tokens\": 5}}\n",
    ] {
        let _ = tx.unbounded_send(line.into());
    }
    response
}

async fn sse() -> impl IntoResponse {
    let events = ["Hel", "{\"text\": \"lo\"}", "\"!\"", "[DONE]", "after done"]
        .map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    Sse::new(futures::stream::iter(events))
}

async fn flaky(State(host): State<Arc<Host>>) -> Response {
    if host.flaky.fetch_add(1, Ordering::SeqCst) < 2 {
        (StatusCode::SERVICE_UNAVAILABLE, "busy, try later").into_response()
    } else {
        axum::Json(json!({"ok": true})).into_response()
    }
}

async fn bad(State(host): State<Arc<Host>>) -> Response {
    host.bad.fetch_add(1, Ordering::SeqCst);
    (StatusCode::BAD_REQUEST, "no such question").into_response()
}

async fn hang() -> Response {
    std::future::pending().await
}

/// `one`, then nothing more: the body never ends.
async fn stalls(State(host): State<Arc<Host>>) -> Response {
    host.stalls.fetch_add(1, Ordering::SeqCst);
    let (tx, response) = streamed("application/x-ndjson");
    let _ = tx.unbounded_send("\"one\"\n".into());
    tokio::spawn(async move {
        // Keeps the body open (the sender alive) until the client goes.
        while !tx.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    response
}

/// `one`, then (once released) ` two`, ` three`, the end.
async fn slow(State(host): State<Arc<Host>>) -> Response {
    let (tx, response) = streamed("application/x-ndjson");
    let _ = tx.unbounded_send("\"one\"\n".into());
    tokio::spawn(async move {
        host.release.notified().await;
        for chunk in ["\" two\"\n", "\" three\"\n"] {
            let _ = tx.unbounded_send(chunk.into());
        }
    });
    response
}

/// `one`, ` two`, then (once released) a chunk every few milliseconds until the body is
/// dropped: the connection was closed.
async fn endless(State(host): State<Arc<Host>>) -> Response {
    let (tx, response) = streamed("application/x-ndjson");
    let _ = tx.unbounded_send("\"one\"\n".into());
    let _ = tx.unbounded_send("\" two\"\n".into());
    tokio::spawn(async move {
        host.release.notified().await;
        while tx.unbounded_send("\" tick\"\n".into()).is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Some(closed) = host.closed.lock().expect("not poisoned").take() {
            let _ = closed.send(());
        }
    });
    response
}

async fn redirect() -> Response {
    (
        StatusCode::FOUND,
        [(header::LOCATION, "http://192.0.2.1/elsewhere")],
    )
        .into_response()
}

/// `start (optional inputs `query`, `base`, `traceparent`) -> call (http, params) -> after (stream_text of the
/// call's text)`.
fn workflow(params: serde_json::Value) -> String {
    json!({"id": "http-node", "nodes": [
        {"id": "start", "kind": "begin", "params": {"inputs": [
            {"name": "query"}, {"name": "base"}, {"name": "traceparent"}]}},
        {"id": "call", "kind": "http", "params": params},
        {"id": "after", "kind": "stream_text",
         "params": {"text": "after: {{call.text}}", "interval": "0s", "append_message": false}}
    ], "edges": [{"from": "start", "to": "call"}, {"from": "call", "to": "after"}]})
    .to_string()
}

async fn start(runtime: &Runtime, params: serde_json::Value, inputs: Map) -> RunHandle {
    let workflow = runtime
        .load_json(&workflow(params))
        .expect("a valid workflow");
    runtime
        .start(&workflow, inputs, ThreadId::generate())
        .await
        .expect("the run starts")
}

/// Runs the workflow to its end; returns the outcome and the call's chunks.
async fn run(runtime: &Runtime, params: serde_json::Value) -> (RunOutcome, Vec<String>) {
    let inputs = Map::from([("query".to_owned(), Value::from("why?"))]);
    let run = start(runtime, params, inputs).await;
    let mut events = run.events();
    let mut chunks = Vec::new();
    while let Some(event) = events.next().await {
        if let RunEvent::NodeChunk { path, text } = event
            && path.to_string() == "call"
        {
            chunks.push(text.to_string());
        }
    }
    (run.wait().await, chunks)
}

fn output<'o>(outcome: &'o RunOutcome, node: &str) -> &'o Value {
    outcome
        .output(node)
        .unwrap_or_else(|| panic!("no output of {node}: {outcome:?}"))
}

fn text(value: &Value, field: &str) -> String {
    value
        .get(field)
        .map(Value::render)
        .unwrap_or_else(|| panic!("no `{field}` in {value}"))
}

#[tokio::test]
async fn a_json_answer_is_the_output_and_the_request_says_where_it_runs() {
    let base = host(Arc::default()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let inputs = Map::from([
        ("query".to_owned(), Value::from("why?")),
        ("traceparent".to_owned(), Value::from(traceparent)),
    ]);
    let run = start(
        &runtime,
        json!({"url": format!("{base}/json"), "input": {"q": "{{sys.query}}", "n": 3},
               "headers": {"X-Key": "k-{{sys.query}}"}}),
        inputs,
    )
    .await;
    let outcome = run.wait().await;
    let call = output(&outcome, "call").to_json();
    let got = &call["got"];
    assert_eq!(got["input"], json!({"q": "why?", "n": 3}), "{call}");
    assert_eq!(got["run_id"], json!(run.run_id().to_string()));
    assert_eq!(got["thread"], json!(run.thread().to_string()));
    assert_eq!(got["node"], json!("call"));
    assert_eq!(got["path"], json!("call"));
    assert_eq!(got["attempt"], json!(1));
    assert_eq!(call["content_type"], json!("application/json"));
    assert_eq!(call["traceparent"], json!(traceparent), "passed along");
    assert_eq!(call["x_key"], json!("k-why?"), "header values are resolved");
}

#[tokio::test]
async fn a_plain_text_answer_is_the_text_and_get_sends_no_body() {
    let base = host(Arc::default()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let (outcome, _) = run(
        &runtime,
        json!({"url": format!("{base}/text"), "method": "GET"}),
    )
    .await;
    assert_eq!(text(output(&outcome, "call"), "text"), "plain words");
}

#[tokio::test]
async fn an_ndjson_stream_is_streamed_and_its_final_object_joins_the_text() {
    let base = host(Arc::default()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let (outcome, chunks) = run(&runtime, json!({"url": format!("{base}/ndjson")})).await;
    assert_eq!(chunks, vec!["Hel", "lo"]);
    let call = output(&outcome, "call");
    assert_eq!(text(call, "text"), "Hello");
    assert_eq!(call.get("n"), Some(&Value::Int(2)));
    assert_eq!(outcome.usage().get("tokens"), Some(&5.0));
    assert_eq!(text(output(&outcome, "after"), "text"), "after: Hello");
}

#[tokio::test]
async fn an_sse_stream_is_streamed_until_done() {
    let base = host(Arc::default()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let (outcome, chunks) = run(&runtime, json!({"url": format!("{base}/sse")})).await;
    assert_eq!(
        chunks,
        vec!["Hel", "lo", "!"],
        "plain data, `text`, a JSON string"
    );
    assert_eq!(text(output(&outcome, "call"), "text"), "Hello!");
}

#[tokio::test]
async fn server_errors_are_retried_and_client_errors_are_not() {
    let state = Arc::new(Host::default());
    let base = host(state.clone()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let retry = json!({"attempts": 3, "backoff": "1ms"});

    let (outcome, _) = run(
        &runtime,
        json!({"url": format!("{base}/flaky"), "retry": retry}),
    )
    .await;
    assert_eq!(output(&outcome, "call").get("ok"), Some(&Value::Bool(true)));
    assert_eq!(state.flaky.load(Ordering::SeqCst), 3, "two 503s, then 200");

    let (outcome, _) = run(
        &runtime,
        json!({"url": format!("{base}/bad"), "retry": retry}),
    )
    .await;
    let error = outcome.error().expect("the run failed").to_string();
    assert_eq!(state.bad.load(Ordering::SeqCst), 1, "a 400 is not retried");
    for part in [
        "node `call` failed",
        &format!("POST {base}/bad"),
        "400 Bad Request",
        "no such question",
    ] {
        assert!(error.contains(part), "{part:?} in {error}");
    }
}

#[tokio::test]
async fn too_many_server_errors_fail_with_the_last_one() {
    let state = Arc::new(Host::default());
    let base = host(state.clone()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let (outcome, _) = run(
        &runtime,
        json!({"url": format!("{base}/flaky"), "retry": {"attempts": 2, "backoff": "1ms"}}),
    )
    .await;
    let error = outcome.error().expect("the run failed").to_string();
    assert!(
        error.contains("503 Service Unavailable: busy, try later (after 2 attempts)"),
        "{error}"
    );
}

#[tokio::test]
async fn answers_over_the_size_limit_fail_the_node() {
    let base = host(Arc::default()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    for path in ["json", "ndjson", "sse"] {
        let (outcome, _) = run(
            &runtime,
            json!({"url": format!("{base}/{path}"), "max_response_bytes": 8}),
        )
        .await;
        let error = outcome.error().expect("the run failed").to_string();
        assert!(
            error.contains("the answer is larger than 8 bytes"),
            "{path}: {error}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn each_attempt_times_out_and_timeouts_are_retried() {
    let base = host(Arc::default()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let (outcome, _) = run(
        &runtime,
        json!({"url": format!("{base}/hang"), "timeout": "5s",
               "retry": {"attempts": 2, "backoff": "1s"}}),
    )
    .await;
    let error = outcome.error().expect("the run failed").to_string();
    assert!(error.contains("timed out (after 2 attempts)"), "{error}");
}

#[tokio::test]
async fn a_call_that_streamed_is_never_retried() {
    let state = Arc::new(Host::default());
    let base = host(state.clone()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let (outcome, chunks) = run(
        &runtime,
        json!({"url": format!("{base}/stalls"), "timeout": "1s",
               "retry": {"attempts": 3, "backoff": "1ms"}}),
    )
    .await;
    let error = outcome.error().expect("the run failed").to_string();
    assert!(
        error.contains("timed out (after 1 streamed chunks: not retried)"),
        "{error}"
    );
    assert_eq!(chunks, vec!["one"]);
    assert_eq!(state.stalls.load(Ordering::SeqCst), 1, "one attempt only");
}

/// Waits for the call's first chunk(s): `count` of them.
async fn chunks_seen(events: &mut runvisor::EventStream, count: usize) {
    let mut seen = 0;
    while seen < count {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(RunEvent::NodeChunk { .. })) => seen += 1,
            Ok(Some(_)) => {}
            other => panic!("the stream ended before {count} chunks: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_graceful_stop_lets_the_call_finish_and_keeps_the_whole_answer() {
    let state = Arc::new(Host::default());
    let base = host(state.clone()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let run = Arc::new(start(&runtime, json!({"url": format!("{base}/slow")}), Map::new()).await);
    let mut events = run.events();
    chunks_seen(&mut events, 1).await;
    let stopping = {
        let run = Arc::clone(&run);
        tokio::spawn(async move {
            run.stop(StopMode::Graceful {
                timeout: Duration::from_secs(60),
            })
            .await
        })
    };
    // The rest of the answer comes once the stop is under way.
    loop {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(RunEvent::Stopping { .. })) => break,
            Ok(Some(_)) => {}
            other => panic!("no stopping event: {other:?}"),
        }
    }
    state.release.notify_one();
    let mut later = Vec::new();
    while let Some(event) = events.next().await {
        if let RunEvent::NodeChunk { text, .. } = event {
            later.push(text.to_string());
        }
    }
    assert_eq!(later, vec![" two", " three"], "streamed during the stop");
    let reply = stopping.await.expect("the stop task").expect("stopped");
    let StopReply::Stopped(stop) = reply else {
        panic!("not stopped: {reply:?}")
    };
    assert!(stop.interrupted.is_empty(), "the call finished: {stop:?}");
    assert!(
        stop.finished.iter().any(|n| n.as_str() == "call"),
        "{stop:?}"
    );
    assert_eq!(
        stop.frontier.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
        vec!["after"]
    );
    let call = stop.outputs.get("call").expect("the call's output");
    assert_eq!(text(call, "text"), "one two three");
}

#[tokio::test]
async fn a_force_stop_closes_the_connection_and_keeps_the_partial_text() {
    let state = Arc::new(Host::default());
    let (closed_tx, closed) = oneshot::channel();
    *state.closed.lock().expect("not poisoned") = Some(closed_tx);
    let base = host(state.clone()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let run = start(
        &runtime,
        json!({"url": format!("{base}/endless")}),
        Map::new(),
    )
    .await;
    let mut events = run.events();
    chunks_seen(&mut events, 2).await;
    let reply = run.stop(StopMode::Force).await.expect("stopped");
    let StopReply::Stopped(stop) = reply else {
        panic!("not stopped: {reply:?}")
    };
    assert_eq!(
        stop.partial_response.as_deref(),
        Some("one two"),
        "{stop:?}"
    );
    assert_eq!(stop.interrupted.len(), 1, "{stop:?}");
    assert!(stop.interrupted[0].forced, "{stop:?}");
    // The host goes on writing: it sees the connection closed.
    state.release.notify_one();
    tokio::time::timeout(PATIENCE, closed)
        .await
        .expect("the host saw the connection closed in time")
        .expect("the host told");
}

#[tokio::test]
async fn a_graceful_stop_that_times_out_keeps_what_streamed_during_it() {
    let state = Arc::new(Host::default());
    let (closed_tx, closed) = oneshot::channel();
    *state.closed.lock().expect("not poisoned") = Some(closed_tx);
    let base = host(state.clone()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let run = Arc::new(
        start(
            &runtime,
            json!({"url": format!("{base}/endless")}),
            Map::new(),
        )
        .await,
    );
    let mut events = run.events();
    chunks_seen(&mut events, 2).await;
    let stopping = {
        let run = Arc::clone(&run);
        tokio::spawn(async move {
            run.stop(StopMode::Graceful {
                timeout: Duration::from_secs(2),
            })
            .await
        })
    };
    loop {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(RunEvent::Stopping { .. })) => break,
            Ok(Some(_)) => {}
            other => panic!("no stopping event: {other:?}"),
        }
    }
    // The host goes on streaming and never ends: the stop's timeout forces the call.
    state.release.notify_one();
    chunks_seen(&mut events, 1).await;
    let reply = stopping.await.expect("the stop task").expect("stopped");
    let StopReply::Stopped(stop) = reply else {
        panic!("not stopped: {reply:?}")
    };
    assert_eq!(stop.interrupted.len(), 1, "{stop:?}");
    assert!(stop.interrupted[0].forced, "{stop:?}");
    let partial = stop.partial_response.clone().unwrap_or_default();
    assert!(
        partial.starts_with("one two tick"),
        "the chunks streamed during the stop are kept: {partial:?}"
    );
    tokio::time::timeout(PATIENCE, closed)
        .await
        .expect("the host saw the connection closed in time")
        .expect("the host told");
}

#[tokio::test]
async fn hosts_off_the_allow_list_are_refused_at_validation_and_at_run_time() {
    let base = host(Arc::default()).await;
    let config = HttpConfig {
        allow: AllowList::new(["api.example.com"]).expect("valid"),
    };
    let runtime = register_standard_kinds_with(Runtime::builder(), &config).build();
    let errors = runtime
        .load_json(&workflow(json!({"url": format!("{base}/json")})))
        .expect_err("refused");
    let text = errors.to_string();
    assert!(text.contains("node `call`: field `params.url`"), "{text}");
    assert!(
        text.contains("host `127.0.0.1` is not on the allow-list"),
        "{text}"
    );

    // A host only known at run time is checked then.
    let (outcome, _) = run(&runtime, json!({"url": "{{sys.query}}"})).await;
    let error = outcome.error().expect("failed").to_string();
    assert!(error.contains("is not a URL"), "{error}");
    let inputs = Map::from([("base".to_owned(), Value::from(base.clone()))]);
    let run = start(&runtime, json!({"url": "{{start.base}}/json"}), inputs).await;
    let error = run.wait().await.error().expect("failed").to_string();
    assert!(error.contains("node `call`"), "{error}");
    assert!(
        error.contains("host `127.0.0.1` is not on the allow-list"),
        "{error}"
    );
}

#[tokio::test]
async fn redirects_off_the_allow_list_are_not_followed() {
    let base = host(Arc::default()).await;
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let (outcome, _) = run(&runtime, json!({"url": format!("{base}/redirect")})).await;
    let error = outcome.error().expect("failed").to_string();
    assert!(
        error.contains("302 Found, a redirect to http://192.0.2.1/elsewhere (not followed"),
        "{error}"
    );
}

#[test]
fn bad_params_are_named_at_validation() {
    let runtime = register_standard_kinds(Runtime::builder()).build();
    let errors = runtime
        .load_json(&workflow(json!({
            "method": "FETCH",
            "timeout": "soon",
            "retry": {"attempts": 0, "backoff": 5},
            "headers": {"bad header": "x"},
            "max_response_bytes": 0,
            "extra": 1
        })))
        .expect_err("invalid");
    let text: Vec<String> = errors.errors().iter().map(|e| e.to_string()).collect();
    for want in [
        "node `call`: field `params.url`: is required",
        "node `call`: field `params.method`: \"FETCH\" is not one of",
        "node `call`: field `params.timeout`: is not a duration",
        "node `call`: field `params.retry.backoff`: expected a duration",
        "node `call`: field `params.extra`: is not a known field",
        "node `call`: field `params.headers.bad header`: is not a valid header name",
        "node `call`: field `params.retry.attempts`: 0 is not between 1 and 100",
        "node `call`: field `params.max_response_bytes`: 0 is not positive",
    ] {
        assert!(
            text.iter().any(|t| t.contains(want)),
            "{want:?} in {text:#?}"
        );
    }
    let bad_url = runtime
        .load_json(&workflow(json!({"url": "ftp://127.0.0.1/x"})))
        .expect_err("invalid")
        .to_string();
    assert!(bad_url.contains("is not an http:// URL"), "{bad_url}");
}
