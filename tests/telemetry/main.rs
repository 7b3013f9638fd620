//! Trace and metrics export end to end: runs whose spans and metrics go over OTLP
//! (HTTP/protobuf or gRPC) to a receiver in the test process, built from the published OTLP
//! protobuf definitions; the span tree, and the metrics against what `/metrics` shows, are
//! read back from what it received.

mod receiver;
#[path = "../serve/server.rs"]
mod server;

use std::collections::HashMap;
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
    // A start while the thread is held is refused: its span ends as an error saying why.
    match runtime.start(&workflow, Map::new(), thread.clone()).await {
        Err(runvisor::StartError::ThreadBusy { .. }) => {}
        other => panic!(
            "a held thread refuses a start: {:?}",
            other.map(|r| r.run_id())
        ),
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

    let refused = one(&spans, "refused start", |s| {
        s.name == "invoke_workflow traced"
            && s.attr("runvisor.run.id")
                .is_some_and(|id| id != first_id && id != second_id)
    });
    assert_eq!(refused.status_code, 2, "an error: {refused:?}");
    assert!(
        refused.attr("runvisor.lease.fence").is_none(),
        "no lease was held: {refused:?}"
    );

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
    assert!(
        run1.attr("runvisor.lease.fence")
            .is_some_and(|f| f.parse::<u64>().is_ok_and(|f| f > 0)),
        "the run span names its lease's fencing token: {:?}",
        run1.attr("runvisor.lease.fence")
    );
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
/// An `llm` node that names the model it called and reports its tokens, as a host's model
/// call would.
struct Model;

#[runvisor::async_trait]
impl runvisor::NodeHandler for Model {
    async fn run(
        &self,
        _input: Value,
        _ctx: runvisor::NodeContext,
    ) -> Result<runvisor::NodeOutput, runvisor::NodeError> {
        Ok(runvisor::NodeOutput::new(Value::from("an answer"))
            .with_model("model-7b")
            .with_usage("prompt_tokens", 12.0)
            .with_usage("completion_tokens", 5.0))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_model_call_reports_its_model_and_tokens_under_the_genai_names() {
    let receiver = Receiver::start();
    let telemetry = Telemetry::new(&exporting_to(&receiver)).expect("built");
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(telemetry.layer()));
    let runtime = Runtime::builder().handler("llm", Model).build();
    let workflow = runtime
        .load_json(
            r#"{"id": "asks", "nodes": [{"id": "start", "kind": "begin"},
                {"id": "think", "kind": "llm"}], "edges": [{"from": "start", "to": "think"}]}"#,
        )
        .expect("valid");
    let run = runtime
        .start(&workflow, Map::new(), ThreadId::new("asks-1").expect("id"))
        .await
        .expect("started");
    assert!(matches!(run.wait().await, RunOutcome::Completed { .. }));
    telemetry.flush();

    let spans = receiver.wait_for(PATIENCE, |spans| {
        spans.iter().any(|s| s.name == "invoke_agent think")
    });
    let think = one(&spans, "model call", |s| s.name == "invoke_agent think");
    assert_eq!(think.attr("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(think.attr("gen_ai.agent.name"), Some("think"));
    assert_eq!(think.attr("gen_ai.request.model"), Some("model-7b"));
    assert_eq!(think.attr("gen_ai.usage.input_tokens"), Some("12"));
    assert_eq!(think.attr("gen_ai.usage.output_tokens"), Some("5"));
    assert_eq!(think.attr("runvisor.node.outcome"), Some("completed"));
    // A node that names no model reports none.
    let start = one(&spans, "begin", |s| s.name == "node start");
    assert_eq!(start.attr("gen_ai.request.model"), None);
}

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

/// A workflow that sleeps for `sys.query`, then streams a line.
fn sleepy() -> serde_json::Value {
    serde_json::json!({"id": "sleepy", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "a", "kind": "sleep", "params": {"duration": "{{sys.query}}"}},
        {"id": "b", "kind": "stream_text",
         "params": {"text": "done after {{sys.query}}", "interval": "1ms"}}
    ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]})
}

/// Runs [`sleepy`] for 1 ms on `server`, to its end.
async fn run_to_the_end(server: &Server) {
    let done = server
        .post(
            "/v1/runs",
            serde_json::json!({"workflow": sleepy(), "inputs": {"query": "1ms"}, "wait": true}),
        )
        .await;
    assert_eq!(done.body["status"], "succeeded", "{done:?}");
}

/// Starts [`sleepy`] for a minute on `server`; its run id.
async fn start_sleeping(server: &Server) -> String {
    let started = server
        .post(
            "/v1/runs",
            serde_json::json!({"workflow": sleepy(), "inputs": {"query": "60s"}}),
        )
        .await;
    started.body["run_id"]
        .as_str()
        .expect("a run id")
        .to_owned()
}

/// A scrape of `/metrics`: each family's type, and each sample by name and label pairs
/// (sorted, as OTLP has them).
#[derive(Debug, Default)]
struct Scrape {
    types: HashMap<String, String>,
    samples: HashMap<(String, Vec<(String, String)>), f64>,
}

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut scrape = Self::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("a typed family");
                scrape.types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample");
            let value: f64 = value.parse().expect("a number");
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut pairs: Vec<(String, String)> = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once("=\"").expect("a label");
                    (k.to_owned(), v.trim_end_matches('"').to_owned())
                })
                .filter(|(k, _)| k != "le")
                .collect();
            pairs.sort();
            if !line.contains("_bucket") {
                scrape.samples.insert((name.to_owned(), pairs), value);
            }
        }
        scrape
    }

    fn get(&self, name: &str, labels: &[(String, String)]) -> Option<f64> {
        self.samples
            .get(&(name.to_owned(), labels.to_vec()))
            .copied()
    }
}

/// `runvisor serve` exporting over `protocol` to `receiver`, every 100 ms: a run that
/// succeeds and one stopped in its sleep. The metrics exported (the last export, made as the
/// service shuts down) are those `/metrics` showed last: same names, kinds and values, one way
/// and the other.
async fn exported_metrics_are_those_scraped(receiver: Receiver, protocol: &str) {
    let server = Server::start_with_env(
        &[],
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
            ("OTEL_SERVICE_NAME", "runvisor-metrics-test"),
        ],
    );
    run_to_the_end(&server).await;
    let run = start_sleeping(&server).await;
    server
        .until("the run to sleep", &format!("/v1/runs/{run}"), |a| {
            a.body["nodes"] == serde_json::json!(["a"])
        })
        .await;
    let stopped = server
        .post(&format!("/v1/runs/{run}/stop"), serde_json::json!({}))
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    let stopped_series = vec![("status".to_owned(), "stopped".to_owned())];
    let start = std::time::Instant::now();
    let text = loop {
        let (status, _, text) = server.get_text("/metrics").await;
        assert_eq!(status, 200, "{text}");
        let scrape = Scrape::parse(&text);
        if scrape.get("runvisor_runs_ended_total", &stopped_series) == Some(1.0) {
            break text;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the stopped run is not counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Exported every OTEL_METRIC_EXPORT_INTERVAL: more than the last export, long before the
    // default minute.
    let start = std::time::Instant::now();
    while receiver.metric_exports() < 2 && start.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(receiver.metric_exports() >= 2);
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");

    let scrape = Scrape::parse(&text);
    let exported = receiver.last_metrics();
    for point in &exported {
        let family = scrape.types.get(&point.name).map(String::as_str);
        let kind = if point.kind == "counter" {
            Some("counter")
        } else {
            Some(point.kind)
        };
        assert_eq!(family, kind, "{point:?} in:\n{text}");
        let ticking = point.name == "runvisor_watcher_tick_seconds";
        match point.kind {
            "counter" => {
                let shown = scrape.get(&format!("{}_total", point.name), &point.attributes);
                assert_eq!(shown, Some(point.value), "{point:?} in:\n{text}");
            }
            "gauge" => {
                assert_eq!(
                    scrape.get(&point.name, &point.attributes),
                    Some(point.value),
                    "{point:?} in:\n{text}"
                );
            }
            _ => {
                let count = scrape
                    .get(&format!("{}_count", point.name), &point.attributes)
                    .expect("a count");
                let sum = scrape
                    .get(&format!("{}_sum", point.name), &point.attributes)
                    .expect("a sum");
                #[allow(clippy::cast_precision_loss)]
                let exported_count = point.count as f64;
                if ticking {
                    // The watcher ticks on while the service shuts down.
                    assert!(exported_count >= count, "{point:?} in:\n{text}");
                } else {
                    assert_eq!(exported_count, count, "{point:?} in:\n{text}");
                    assert_eq!(point.value, sum, "{point:?} in:\n{text}");
                }
            }
        }
    }
    // The other way: what /metrics shows recorded is exported.
    for ((name, labels), value) in &scrape.samples {
        if *value == 0.0 {
            continue;
        }
        let base = name
            .strip_suffix("_total")
            .or_else(|| name.strip_suffix("_count"))
            .or_else(|| name.strip_suffix("_sum"))
            .filter(|base| scrape.types.contains_key(*base))
            .unwrap_or(name);
        assert!(
            exported
                .iter()
                .any(|p| p.name == base && p.attributes == *labels),
            "{name} {labels:?} not exported: {exported:#?}"
        );
    }
    let point = |name: &str, labels: &[(&str, &str)]| {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        exported
            .iter()
            .find(|p| p.name == name && p.attributes == labels)
            .unwrap_or_else(|| panic!("{name} {labels:?} not exported: {exported:#?}"))
            .clone()
    };
    let stop = point("runvisor_stop_latency_seconds", &[("endpoint", "v1_stop")]);
    assert_eq!((stop.kind, stop.count), ("histogram", 1));
    let slept = point(
        "runvisor_node_duration_seconds",
        &[("kind", "sleep"), ("outcome", "stopped")],
    );
    assert_eq!(slept.count, 1);
    assert!(slept.value > 0.0);
    let final_bytes = point("runvisor_checkpoint_bytes", &[("mode", "final")]);
    assert!(final_bytes.count >= 2 && final_bytes.value > 0.0);
    let started = point("runvisor_runs_started", &[]);
    assert_eq!((started.kind, started.value), ("counter", 2.0));
    assert!(scrape.types.contains_key("runvisor_store_errors"));

    // The spans went the same way.
    let spans = receiver.spans();
    assert!(
        spans
            .iter()
            .filter(|s| s.name == "invoke_workflow sleepy")
            .all(|s| s.service == "runvisor-metrics-test")
    );
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.name == "invoke_workflow sleepy")
            .count(),
        2
    );
}

/// With the metrics exported over OTLP and nobody scraping `/metrics`, the gauges read from
/// the stores (open runs, leases held) are read every export interval: an export shows the
/// run running now, and, once it stopped, none.
#[tokio::test]
async fn exported_gauges_follow_the_runs_without_a_scrape() {
    let receiver = Receiver::start();
    let server = Server::start_with_env(
        &[],
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ],
    );
    let gauge = |name: &str, labels: &[(&str, &str)]| {
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        receiver
            .last_metrics()
            .iter()
            .find(|p| p.name == name && p.attributes == labels)
            .map(|p| p.value)
    };
    let until = async |what: &str, check: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while !check() {
            assert!(start.elapsed() < PATIENCE, "no export showed {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let run = start_sleeping(&server).await;
    until("the run running and its lease held", &|| {
        gauge("runvisor_runs", &[("status", "running")]) == Some(1.0)
            && gauge("runvisor_leases_held", &[]) == Some(1.0)
    })
    .await;
    let stopped = server
        .post(&format!("/v1/runs/{run}/stop"), serde_json::json!({}))
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    until("no run running and no lease held", &|| {
        gauge("runvisor_runs", &[("status", "running")]) == Some(0.0)
            && gauge("runvisor_leases_held", &[]) == Some(0.0)
    })
    .await;
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
}

#[tokio::test]
async fn metrics_exported_over_http_are_those_scraped() {
    exported_metrics_are_those_scraped(Receiver::start(), "http/protobuf").await;
}

#[tokio::test]
async fn metrics_and_spans_exported_over_grpc_are_those_scraped() {
    exported_metrics_are_those_scraped(Receiver::start_grpc(), "grpc").await;
}

/// `OTEL_METRICS_EXPORTER=none`: spans are exported, metrics are not.
#[tokio::test]
async fn metrics_export_can_be_turned_off() {
    let receiver = Receiver::start();
    let server = Server::start_with_env(
        &[],
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base.as_str()),
            ("OTEL_METRICS_EXPORTER", "none"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "10"),
        ],
    );
    run_to_the_end(&server).await;
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    assert!(
        receiver
            .spans()
            .iter()
            .any(|s| s.name == "invoke_workflow sleepy")
    );
    assert_eq!(receiver.metric_exports(), 0);
}

/// `serve --stdio`: a `run.start` with a `traceparent` param joins that trace under the call's
/// span, as a `traceparent` header does over HTTP.
#[test]
fn a_run_started_over_stdio_joins_the_callers_trace() {
    use std::io::{BufRead, BufReader, Write};
    let receiver = Receiver::start();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_runvisor"))
        .args(["serve", "--stdio"])
        .env_remove("RUST_LOG")
        .env_remove("RUNVISOR_REDIS_URL")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.base)
        .env("OTEL_METRICS_EXPORTER", "none")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn runvisor serve --stdio");
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let request = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "run.start",
        "params": {"workflow": sleepy(), "inputs": {"query": "1ms"}, "wait": true,
                   "traceparent": format!("00-{trace}-{caller}-01")}});
    let mut stdin = child.stdin.take().expect("piped stdin");
    writeln!(stdin, "{request}").expect("a request");
    stdin.flush().expect("flushed");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("an answer");
    let answer: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(answer["result"]["status"], "succeeded", "{answer}");
    let run_id = answer["result"]["run_id"]
        .as_str()
        .expect("a run id")
        .to_owned();
    drop(stdin);
    assert!(child.wait().expect("exited").success());

    let spans = receiver.spans();
    let call = one(&spans, "call", |s| s.name == "run.start");
    assert_eq!(call.trace_id, trace);
    assert_eq!(call.parent_span_id, caller);
    assert_eq!(call.attr("rpc.system"), Some("jsonrpc"));
    let run = one(&spans, "run", |s| {
        s.attr("runvisor.run.id") == Some(&run_id) && s.name == "invoke_workflow sleepy"
    });
    assert_eq!(run.trace_id, trace);
    assert_eq!(run.parent_span_id, call.span_id);
}
