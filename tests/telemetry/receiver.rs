//! An OTLP receiver for tests, on a free loopback port: HTTP/protobuf (`POST /v1/traces`,
//! `POST /v1/metrics`, [`Receiver::start`]) or gRPC (the trace and metrics services,
//! [`Receiver::start_grpc`]), decoding what it gets with the published OTLP protobuf
//! definitions (and, for gRPC, their generated tonic services). It runs on a thread of its own
//! (with its own async runtime), so a test blocked on a flush does not block it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as Number;
use prost::Message;

/// What the receiver got.
#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    /// Requests taken without decoding, and their bytes.
    discarded: (usize, usize),
}

async fn discard(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> impl IntoResponse {
    let mut received = received.lock().expect("received");
    received.discarded.0 += 1;
    received.discarded.1 += body.len();
    // Both services' responses are empty messages: zero bytes.
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        Vec::new(),
    )
}

/// A running receiver; it stops with the test process.
pub(crate) struct Receiver {
    pub(crate) base: String,
    received: Arc<Mutex<Received>>,
}

/// A span as received, flattened: ids in hex, attributes as text.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    pub(crate) name: String,
    pub(crate) trace_id: String,
    pub(crate) span_id: String,
    pub(crate) parent_span_id: String,
    pub(crate) attributes: HashMap<String, String>,
    /// Linked spans: (trace id, span id).
    pub(crate) links: Vec<(String, String)>,
    pub(crate) status_code: i32,
    pub(crate) service: String,
}

impl Span {
    pub(crate) fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

async fn traces(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> impl IntoResponse {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            received.lock().expect("received").traces.push(request);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
        Err(_) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            b"not an OTLP trace export".to_vec(),
        ),
    }
}

async fn metrics(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> impl IntoResponse {
    match ExportMetricsServiceRequest::decode(body) {
        Ok(request) => {
            received.lock().expect("received").metrics.push(request);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                ExportMetricsServiceResponse::default().encode_to_vec(),
            )
        }
        Err(_) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            b"not an OTLP metrics export".to_vec(),
        ),
    }
}

/// The gRPC services, keeping what they get.
struct Grpc(Arc<Mutex<Received>>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        self.0.lock().expect("received").traces.push(request);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        self.0.lock().expect("received").metrics.push(request);
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// A metric's data point as received (the last export's), flattened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Point {
    pub(crate) name: String,
    /// `counter` (a monotonic sum), `sum`, `gauge` or `histogram`.
    pub(crate) kind: &'static str,
    /// Its attributes, sorted by key.
    pub(crate) attributes: Vec<(String, String)>,
    /// A number's value, or a histogram's sum.
    pub(crate) value: f64,
    /// A histogram's count.
    pub(crate) count: u64,
}

impl Receiver {
    /// Over HTTP/protobuf; `base` is the collector's URL (the signals' paths appended).
    pub(crate) fn start() -> Self {
        Self::serve(|listener, state| {
            Box::pin(async move {
                let app = Router::new()
                    .route("/v1/traces", post(traces))
                    .route("/v1/metrics", post(metrics))
                    .with_state(state);
                axum::serve(listener, app).await.expect("served");
            })
        })
    }

    /// Over HTTP/protobuf, taking every export without decoding it (what a collector in
    /// another process would do with it costs this one nothing): only the requests and their
    /// bytes are counted ([`requests`](Self::requests), [`bytes`](Self::bytes)).
    pub(crate) fn start_discarding() -> Self {
        Self::serve(|listener, state| {
            Box::pin(async move {
                let app = Router::new()
                    .route("/v1/traces", post(discard))
                    .route("/v1/metrics", post(discard))
                    .with_state(state);
                axum::serve(listener, app).await.expect("served");
            })
        })
    }

    /// Over gRPC; `base` is the collector's URL.
    pub(crate) fn start_grpc() -> Self {
        Self::serve(|listener, state| {
            Box::pin(async move {
                let state = Arc::new(Grpc(state));
                let incoming = tokio_stream_of(listener);
                tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::from_arc(state.clone()))
                    .add_service(MetricsServiceServer::from_arc(state))
                    .serve_with_incoming(incoming)
                    .await
                    .expect("served");
            })
        })
    }

    fn serve(
        server: impl FnOnce(
            tokio::net::TcpListener,
            Arc<Mutex<Received>>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
        + Send
        + 'static,
    ) -> Self {
        let received = Arc::new(Mutex::new(Received::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let state = received.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("a free port");
                let address = listener.local_addr().expect("an address");
                tx.send(address).expect("told");
                server(listener, state).await;
            });
        });
        let address = rx.recv().expect("the receiver listens");
        Self {
            base: format!("http://{address}"),
            received,
        }
    }

    /// The data points of the last metrics export received, sorted by name and attributes.
    pub(crate) fn last_metrics(&self) -> Vec<Point> {
        let received = self.received.lock().expect("received");
        let mut points = Vec::new();
        let Some(request) = received.metrics.last() else {
            return points;
        };
        let sorted = |list: &[KeyValue]| {
            let mut a: Vec<(String, String)> = list
                .iter()
                .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                .collect();
            a.sort();
            a
        };
        #[allow(clippy::cast_precision_loss)]
        let number = |v: &Option<Number>| match v {
            Some(Number::AsDouble(d)) => *d,
            Some(Number::AsInt(i)) => *i as f64,
            None => f64::NAN,
        };
        for resource in &request.resource_metrics {
            for scope in &resource.scope_metrics {
                for metric in &scope.metrics {
                    let name = metric.name.clone();
                    match &metric.data {
                        Some(Data::Sum(sum)) => {
                            let kind = if sum.is_monotonic { "counter" } else { "sum" };
                            points.extend(sum.data_points.iter().map(|p| Point {
                                name: name.clone(),
                                kind,
                                attributes: sorted(&p.attributes),
                                value: number(&p.value),
                                count: 0,
                            }));
                        }
                        Some(Data::Gauge(gauge)) => {
                            points.extend(gauge.data_points.iter().map(|p| Point {
                                name: name.clone(),
                                kind: "gauge",
                                attributes: sorted(&p.attributes),
                                value: number(&p.value),
                                count: 0,
                            }));
                        }
                        Some(Data::Histogram(h)) => {
                            points.extend(h.data_points.iter().map(|p| Point {
                                name: name.clone(),
                                kind: "histogram",
                                attributes: sorted(&p.attributes),
                                value: p.sum.unwrap_or(f64::NAN),
                                count: p.count,
                            }));
                        }
                        _ => {}
                    }
                }
            }
        }
        points.sort_by(|a, b| (&a.name, &a.attributes).cmp(&(&b.name, &b.attributes)));
        points
    }

    /// How many metrics exports arrived.
    pub(crate) fn metric_exports(&self) -> usize {
        self.received.lock().expect("received").metrics.len()
    }

    /// Every span received so far.
    pub(crate) fn spans(&self) -> Vec<Span> {
        let received = self.received.lock().expect("received");
        let mut spans = Vec::new();
        for request in &received.traces {
            for resource in &request.resource_spans {
                let service = resource
                    .resource
                    .as_ref()
                    .and_then(|r| {
                        r.attributes
                            .iter()
                            .find(|kv| kv.key == "service.name")
                            .map(|kv| text(kv.value.as_ref()))
                    })
                    .unwrap_or_default();
                for scope in &resource.scope_spans {
                    for span in &scope.spans {
                        spans.push(Span {
                            name: span.name.clone(),
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent_span_id: hex(&span.parent_span_id),
                            attributes: attributes(&span.attributes),
                            links: span
                                .links
                                .iter()
                                .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                                .collect(),
                            status_code: span.status.as_ref().map_or(0, |s| s.code),
                            service: service.clone(),
                        });
                    }
                }
            }
        }
        spans
    }

    /// How many export requests arrived.
    pub(crate) fn requests(&self) -> usize {
        let received = self.received.lock().expect("received");
        received.traces.len() + received.metrics.len() + received.discarded.0
    }

    /// The bytes of the requests taken without decoding.
    pub(crate) fn bytes(&self) -> usize {
        self.received.lock().expect("received").discarded.1
    }

    /// Waits until `check` holds for the spans received, or `patience` passes (a bound
    /// against hanging, not a timing assertion); returns the spans.
    pub(crate) fn wait_for(
        &self,
        patience: Duration,
        check: impl Fn(&[Span]) -> bool,
    ) -> Vec<Span> {
        let start = std::time::Instant::now();
        loop {
            let spans = self.spans();
            if check(&spans) || start.elapsed() > patience {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The connections `listener` accepts, as tonic serves them.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
