//! Trace export end to end: runs whose spans go over OTLP (HTTP/protobuf) to a receiver in
//! the test process, built from the published OTLP protobuf definitions; the span tree is
//! read back from what it received.

mod receiver;
#[path = "../serve/server.rs"]
mod server;

use std::time::Duration;

use receiver::{Receiver, Span};
use runvisor::telemetry::{self, Endpoint, Protocol, Telemetry, TelemetryConfig};
use runvisor::{
    Map, ResumeFrom, ResumeInput, RunEvent, RunOutcome, Runtime, StopMode, ThreadId, Value,
    register_standard_kinds,
};
use server::Server;
use tracing_subscriber::layer::SubscriberExt;

/// A bound against hanging, never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(30);

/// `start -> each (a loop over two topics: say) -> fan (a parallel over two items: echo) ->
/// ask (a selection) -> wait (a long sleep)`.
const WORKFLOW: &str = r#"{
  "id": "traced",
  "nodes": [
    {"id": "start", "kind": "begin", "params": {"inputs": [
      {"name": "topics", "type": "array", "default": ["tea", "coffee"]},
      {"name": "sources", "type": "array", "default": ["web", "news"]}
    ]}},
    {"id": "each", "kind": "loop",
     "params": {"mode": "array", "items": "{{start.topics}}", "output": "{{say.text}}"},
     "body": {"nodes": [{"id": "say", "kind": "stream_text",
                         "params": {"text": "{{each.item}}", "interval": "1ms"}}], "edges": []}},
    {"id": "fan", "kind": "parallel",
     "params": {"items": "{{start.sources}}", "max_concurrency": 2, "output": "{{echo.text}}"},
     "body": {"nodes": [{"id": "echo", "kind": "stream_text",
                         "params": {"text": "{{fan.item}}", "interval": "1ms",
                                    "append_message": false}}], "edges": []}},
    {"id": "ask", "kind": "interactive", "params": {"mode": "user_select", "prompt": "Go on?",
     "options": [{"value": "yes", "label": "Yes"}]}},
    {"id": "wait", "kind": "sleep", "params": {"duration": "1h"}}
  ],
  "edges": [
    {"from": "start", "to": "each"}, {"from": "each", "to": "fan"},
    {"from": "fan", "to": "ask"}, {"from": "ask", "to": "wait"}
  ]
}"#;

fn exporting_to(receiver: &Receiver) -> TelemetryConfig {
    TelemetryConfig {
        traces: Some(Endpoint {
            url: format!("{}/v1/traces", receiver.base),
            protocol: Protocol::HttpProtobuf,
        }),
        service_name: Some("runvisor-test".to_owned()),
        ..TelemetryConfig::default()
    }
}

fn runtime() -> Runtime {
    register_standard_kinds(Runtime::builder().trace_context(telemetry::trace_context())).build()
}

fn one<'a>(spans: &'a [Span], what: &str, check: impl Fn(&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| check(s)).collect();
    assert_eq!(found.len(), 1, "one {what} span, got {found:#?}");
    found[0]
}

fn by_id<'a>(spans: &'a [Span], id: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.span_id == id)
        .unwrap_or_else(|| panic!("no span {id}"))
}

fn node<'a>(spans: &'a [Span], run: &Span, path: &str) -> &'a Span {
    one(spans, path, |s| {
        s.trace_id == run.trace_id
            && s.attr("runvisor.node.path") == Some(path)
            && s.attr("runvisor.node.id").is_some()
            && s.attr("runvisor.node.kind").is_some()
    })
}

/// A run with a loop, a parallel and a pause, then its resume stopped in its last node: the
/// span tree, parent by parent, with the attributes that matter, and the resume's link back.
#[tokio::test(flavor = "current_thread")]
async fn a_run_exports_its_span_tree_and_a_resume_links_back() {
    let receiver = Receiver::start();
    let mut telemetry = Telemetry::new(&exporting_to(&receiver)).expect("built");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    // This test's tasks all run on its thread: the subscriber is this thread's.
    let _default = tracing::subscriber::set_default(subscriber);

    let runtime = runtime();
    let workflow = runtime.load_json(WORKFLOW).expect("valid");
    let thread = ThreadId::new("traced-1").expect("id");
    let first = runtime
        .start(&workflow, Map::new(), thread.clone())
        .await
        .expect("started");
    let first_id = first.run_id().to_string();
    let RunOutcome::AwaitingInput { interactions, .. } = first.wait().await else {
        panic!("the run pauses at `ask`");
    };
    let answer = ResumeInput::Answer {
        interaction_id: interactions[0].id,
        value: Value::from("yes"),
    };
    let second = runtime
        .resume(ResumeFrom::Thread(thread.clone()), answer)
        .await
        .expect("resumed");
    let second_id = second.run_id().to_string();
    let mut events = second.events();
    while let Some(event) = events.next().await {
        if matches!(&event, RunEvent::NodeStarted { kind, .. } if &**kind == "sleep") {
            break;
        }
    }
    second
        .stop(StopMode::Graceful {
            timeout: Duration::from_secs(5),
        })
        .await
        .expect("stopped");
    let stopped = second.wait().await;
    assert!(matches!(stopped, RunOutcome::Stopped(_)), "{stopped:?}");
    telemetry.flush();

    let spans = receiver.wait_for(PATIENCE, |spans| spans.iter().any(|s| s.name == "stop"));
    assert!(spans.iter().all(|s| s.service == "runvisor-test"));

    // The first run: its own trace, the loop's iterations and the parallel's items between
    // the nodes and theirs.
    let run1 = one(&spans, "first run", |s| {
        s.attr("runvisor.run.id") == Some(&first_id) && s.name == "invoke_workflow traced"
    });
    assert_eq!(
        run1.parent_span_id, "",
        "a run started outside any trace is a root"
    );
    assert_eq!(run1.attr("gen_ai.operation.name"), Some("invoke_workflow"));
    assert_eq!(run1.attr("runvisor.workflow.id"), Some("traced"));
    assert_eq!(run1.attr("gen_ai.conversation.id"), Some("traced-1"));
    assert_eq!(run1.attr("runvisor.run.status"), Some("awaiting_input"));

    let each = node(&spans, run1, "each");
    assert_eq!(each.parent_span_id, run1.span_id);
    assert_eq!(each.attr("runvisor.node.kind"), Some("loop"));
    assert_eq!(each.attr("runvisor.node.outcome"), Some("completed"));
    for index in 0..2 {
        let say = node(&spans, run1, &format!("each/#{index}/say"));
        assert_eq!(say.name, "node say");
        assert_eq!(say.attr("runvisor.node.kind"), Some("stream_text"));
        assert_eq!(say.attr("runvisor.node.outcome"), Some("completed"));
        let iteration = by_id(&spans, &say.parent_span_id);
        assert_eq!(iteration.name, "iteration each");
        assert_eq!(
            iteration.attr("runvisor.iteration.index"),
            Some(index.to_string().as_str())
        );
        assert_eq!(iteration.parent_span_id, each.span_id);
    }
    let fan = node(&spans, run1, "fan");
    assert_eq!(fan.parent_span_id, run1.span_id);
    assert_eq!(fan.attr("runvisor.node.kind"), Some("parallel"));
    for index in 0..2 {
        let echo = node(&spans, run1, &format!("fan/@{index}/echo"));
        let item = by_id(&spans, &echo.parent_span_id);
        assert_eq!(item.name, "item fan");
        assert_eq!(
            item.attr("runvisor.item.index"),
            Some(index.to_string().as_str())
        );
        assert_eq!(item.parent_span_id, fan.span_id);
    }
    let ask = node(&spans, run1, "ask");
    assert_eq!(ask.parent_span_id, run1.span_id);
    assert_eq!(ask.attr("runvisor.node.outcome"), Some("paused"));

    // The resume: its span is the second run's parent and links to the first run.
    let resume = one(&spans, "resume", |s| s.name == "resume");
    assert_eq!(
        resume.attr("runvisor.resumed_run.id"),
        Some(first_id.as_str())
    );
    assert_eq!(resume.attr("runvisor.run.id"), Some(second_id.as_str()));
    assert!(resume.attr("runvisor.checkpoint.id").is_some());
    assert!(resume.attr("runvisor.worker.id").is_some());
    assert_eq!(
        resume.links,
        vec![(run1.trace_id.clone(), run1.span_id.clone())],
        "the resume links back to the run it continues"
    );
    let run2 = one(&spans, "second run", |s| {
        s.attr("runvisor.run.id") == Some(&second_id) && s.name == "invoke_workflow traced"
    });
    assert_eq!(run2.parent_span_id, resume.span_id);
    assert_eq!(
        run2.attr("runvisor.run.resumed_from"),
        Some(first_id.as_str())
    );
    assert_eq!(run2.attr("runvisor.run.status"), Some("stopped"));

    // The stop: how, why, who asked, and what was flushed.
    let stop = one(&spans, "stop", |s| s.name == "stop");
    assert_eq!(stop.parent_span_id, run2.span_id);
    assert_eq!(stop.attr("runvisor.stop.mode"), Some("graceful"));
    assert_eq!(stop.attr("runvisor.stop.reason"), Some("user_interrupted"));
    assert_eq!(stop.attr("runvisor.stop.requested_by"), Some("api"));
    assert!(stop.attr("runvisor.stop.latency_ms").is_some());
    assert_eq!(stop.attr("runvisor.stop.flushed.history"), Some("true"));
    assert!(stop.attr("runvisor.stop.flushed.checkpoint").is_some());
    let wait = node(&spans, run2, "wait");
    assert_eq!(wait.parent_span_id, run2.span_id);
    assert_eq!(wait.attr("runvisor.node.outcome"), Some("stopped"));
    assert_eq!(telemetry.dropped_spans(), 0);
    telemetry.shutdown();
}

/// Without an endpoint no OpenTelemetry layer is built: spans carry no trace context, run
/// records keep none, and nothing reaches a receiver.
#[tokio::test(flavor = "current_thread")]
async fn without_an_endpoint_nothing_is_exported() {
    let receiver = Receiver::start();
    let config = TelemetryConfig::from_vars(|name| match name {
        "OTEL_SERVICE_NAME" => Some("runvisor-test".to_owned()),
        _ => None,
    })
    .expect("read");
    let telemetry = Telemetry::new(&config).expect("built");
    assert!(!telemetry.exports_spans());
    let layer = telemetry.layer::<tracing_subscriber::Registry>();
    assert!(layer.is_none());
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let runtime = runtime();
    let workflow = runtime.load_json(WORKFLOW).expect("valid");
    let thread = ThreadId::new("untraced-1").expect("id");
    let run = runtime
        .start(&workflow, Map::new(), thread)
        .await
        .expect("started");
    let outcome = run.wait().await;
    assert!(matches!(outcome, RunOutcome::AwaitingInput { .. }));
    let record = runtime
        .run_store()
        .get(run.run_id())
        .await
        .expect("read")
        .expect("recorded");
    assert_eq!(record.traceparent, None);
    telemetry.flush();
    drop(telemetry);
    assert_eq!(receiver.requests(), 0);
}

/// `runvisor serve` with `OTEL_EXPORTER_OTLP_ENDPOINT` set: a run started with a
/// `traceparent` header joins that trace under the request's span, and the spans are flushed
/// when the service shuts down.
#[tokio::test]
async fn a_run_started_over_http_joins_the_callers_trace() {
    let receiver = Receiver::start();
    let server = Server::start_with_env(
        &[],
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "runvisor-serve-test"),
        ],
    );
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let workflow = serde_json::json!({"id": "hello", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "say", "kind": "stream_text", "params": {"text": "hi", "interval": "1ms"}}
    ], "edges": [{"from": "start", "to": "say"}]});
    let done = server
        .post_with(
            "/v1/runs",
            &[("traceparent", &format!("00-{trace}-{caller}-01"))],
            serde_json::json!({"workflow": workflow, "wait": true}),
        )
        .await;
    assert_eq!(done.body["status"], "succeeded", "{done:?}");
    let run_id = done.body["run_id"].as_str().expect("a run id").to_owned();
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");

    let spans = receiver.spans();
    assert!(spans.iter().all(|s| s.service == "runvisor-serve-test"));
    let request = one(&spans, "request", |s| s.name == "POST /v1/runs");
    assert_eq!(request.trace_id, trace);
    assert_eq!(request.parent_span_id, caller);
    assert_eq!(request.attr("http.route"), Some("/v1/runs"));
    assert_eq!(request.attr("http.response.status_code"), Some("200"));
    let run = one(&spans, "run", |s| {
        s.attr("runvisor.run.id") == Some(&run_id) && s.name == "invoke_workflow hello"
    });
    assert_eq!(run.trace_id, trace);
    assert_eq!(run.parent_span_id, request.span_id);
    assert_eq!(run.attr("runvisor.run.status"), Some("succeeded"));
    let say = node(&spans, run, "say");
    assert_eq!(say.parent_span_id, run.span_id);
    let checkpoint = one(&spans, "final checkpoint", |s| {
        s.name == "checkpoint write" && s.attr("runvisor.checkpoint.mode") == Some("final")
    });
    assert_eq!(checkpoint.parent_span_id, run.span_id);
    assert_eq!(
        checkpoint.attr("runvisor.checkpoint.outcome"),
        Some("stored")
    );
    assert_eq!(checkpoint.attr("runvisor.checkpoint.retries"), Some("0"));
    assert!(
        checkpoint
            .attr("runvisor.checkpoint.bytes")
            .and_then(|b| b.parse::<u64>().ok())
            .is_some_and(|b| b > 0)
    );
}

/// A collector that is not there: the run goes on as ever, and every span it made is counted
/// as dropped (the queue was full, or the export was refused).
#[tokio::test(flavor = "current_thread")]
async fn a_dead_collector_blocks_no_run_and_drops_are_counted() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("an address").port()
    };
    let mut telemetry = Telemetry::new(&TelemetryConfig {
        traces: Some(Endpoint {
            url: format!("http://127.0.0.1:{port}/v1/traces"),
            protocol: Protocol::HttpProtobuf,
        }),
        max_queue_size: 4,
        ..TelemetryConfig::default()
    })
    .expect("built");
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(telemetry.layer()));
    let runtime = runtime();
    let workflow = runtime.load_json(WORKFLOW).expect("valid");
    let run = runtime
        .start(&workflow, Map::new(), ThreadId::new("dead-1").expect("id"))
        .await
        .expect("started");
    assert!(matches!(run.wait().await, RunOutcome::AwaitingInput { .. }));
    telemetry.shutdown();
    assert!(telemetry.dropped_spans() > 0);
    assert!(telemetry::dropped_spans_total() >= telemetry.dropped_spans());
}
