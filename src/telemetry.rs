//! Logging, trace export and metrics.
//!
//! `tracing` events go to stderr, filtered by `RUST_LOG` (or a default), so a command's own
//! output on stdout stays clean.
//!
//! The engine makes `tracing` spans for what a run does (the run, each node, loop iterations
//! and parallel items, stops, checkpoint writes, resumes). When an OTLP endpoint is configured
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), those spans are
//! exported to it with `tracing-opentelemetry` and the OTLP exporter, over gRPC or
//! HTTP/protobuf as `OTEL_EXPORTER_OTLP_PROTOCOL` (or `..._TRACES_PROTOCOL`) says. Without
//! one, no OpenTelemetry layer is built and nothing is exported.
//!
//! Spans are exported in batches from a bounded queue on a thread of their own: a slow or dead
//! collector never slows a run. A span that finds the queue full, or whose batch the collector
//! did not take, is dropped and counted ([`Telemetry::dropped_spans`], [`dropped_spans_total`]).
//!
//! The process's metrics are OpenTelemetry instruments kept once (`meters`): `/metrics`
//! renders them, and when an OTLP metrics endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`
//! or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, unless `OTEL_METRICS_EXPORTER=none`) a thread
//! exports the same values every `OTEL_METRIC_EXPORT_INTERVAL`, and a last time at shutdown.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use runvisor_actors::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

mod meters;
mod stats;

pub(crate) use meters::{Meters, meters};
pub(crate) use stats::{engine_stats, exponential};

/// `RUST_LOG` could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ignoring RUST_LOG={value:?} ({reason}); using {used:?}")]
pub struct InvalidFilter {
    /// The filter as given.
    pub value: String,
    /// Why it was refused.
    pub reason: String,
    /// The filter used instead.
    pub used: String,
}

/// The telemetry settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// A variable has a value this build cannot use.
    #[error("{variable}={value:?}: {problem}")]
    Variable {
        /// The variable.
        variable: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The exporter could not be built.
    #[error("the OTLP exporter cannot be built: {0}")]
    Exporter(String),
}

/// How OTLP is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC (`grpc`), the endpoint as given (`http://collector:4317`).
    Grpc,
    /// Protobuf over HTTP (`http/protobuf`, the default), the endpoint being the signal's full
    /// URL (`http://collector:4318/v1/traces`).
    HttpProtobuf,
}

/// Where one signal (traces or metrics) is exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL: for HTTP the signal's full URL, for gRPC the collector's.
    pub url: String,
    /// How.
    pub protocol: Protocol,
}

impl Endpoint {
    /// A signal's endpoint from a collector's base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// names it: over HTTP the signal's path (`/v1/traces`, `/v1/metrics`) is appended.
    fn from_base(base: &str, path: &str, protocol: Protocol) -> Self {
        let url = match protocol {
            Protocol::Grpc => base.to_owned(),
            Protocol::HttpProtobuf => format!("{}{path}", base.trim_end_matches('/')),
        };
        Self { url, protocol }
    }
}

/// What is exported, and where. [`from_env`](Self::from_env) reads the standard variables;
/// a test builds one by hand (the process's environment is shared by its threads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// Where spans go; `None`: no span is exported and no OpenTelemetry layer is built.
    pub traces: Option<Endpoint>,
    /// Where metrics go; `None`: `/metrics` alone shows them.
    pub metrics: Option<Endpoint>,
    /// The service name; `None`: `OTEL_SERVICE_NAME` if set, else `runvisor`. Other resource
    /// attributes come from `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: Option<String>,
    /// How many finished spans wait for export at most; past that they are dropped (and
    /// counted). `OTEL_BSP_MAX_QUEUE_SIZE`, default 2048.
    pub max_queue_size: usize,
    /// How long a batch may take to be exported. `OTEL_EXPORTER_OTLP_TIMEOUT` (ms), default
    /// 10 s.
    pub export_timeout: Duration,
    /// How often metrics are exported. `OTEL_METRIC_EXPORT_INTERVAL` (ms), default 60 s.
    pub metrics_interval: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            traces: None,
            metrics: None,
            service_name: None,
            max_queue_size: 2048,
            export_timeout: Duration::from_secs(10),
            metrics_interval: Duration::from_secs(60),
        }
    }
}

impl TelemetryConfig {
    /// Both signals to one collector, as `OTEL_EXPORTER_OTLP_ENDPOINT=base` would.
    pub fn otlp(base: &str, protocol: Protocol) -> Self {
        Self {
            traces: Some(Endpoint::from_base(base, "/v1/traces", protocol)),
            metrics: Some(Endpoint::from_base(base, "/v1/metrics", protocol)),
            ..Self::default()
        }
    }

    /// From the process's environment (see [`from_vars`](Self::from_vars)).
    pub fn from_env() -> Result<Self, TelemetryError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From the standard variables, read with `var`: `OTEL_SDK_DISABLED`,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_EXPORTER_OTLP_PROTOCOL`, each signal's own
    /// `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_{ENDPOINT,PROTOCOL}` (an endpoint used as given),
    /// `OTEL_TRACES_EXPORTER` and `OTEL_METRICS_EXPORTER` (`none` turns a signal off),
    /// `OTEL_SERVICE_NAME`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_EXPORTER_OTLP_TIMEOUT` and
    /// `OTEL_METRIC_EXPORT_INTERVAL`. Headers and compression are read by the exporter
    /// (`OTEL_EXPORTER_OTLP_HEADERS`, ...).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, TelemetryError> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let mut config = Self {
            service_name: var("OTEL_SERVICE_NAME"),
            ..Self::default()
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(config);
        }
        let number = |name: &str| -> Result<Option<u64>, TelemetryError> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| TelemetryError::Variable {
                            variable: name.to_owned(),
                            value: v,
                            problem: "not a whole number",
                        })
                })
                .transpose()
        };
        if let Some(n) = number("OTEL_BSP_MAX_QUEUE_SIZE")? {
            config.max_queue_size = usize::try_from(n).unwrap_or(usize::MAX).max(1);
        }
        if let Some(ms) = number("OTEL_EXPORTER_OTLP_TIMEOUT")? {
            config.export_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = number("OTEL_METRIC_EXPORT_INTERVAL")? {
            config.metrics_interval = Duration::from_millis(ms.max(1));
        }
        let signal = |signal: &str, path: &str| -> Result<Option<Endpoint>, TelemetryError> {
            let off = format!("OTEL_{signal}_EXPORTER");
            if var(&off).is_some_and(|v| v.trim().eq_ignore_ascii_case("none")) {
                return Ok(None);
            }
            let protocol_var = [
                format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"),
                "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
            ]
            .into_iter()
            .find_map(|name| var(&name).map(|value| (name, value)));
            let protocol = match protocol_var {
                None => Protocol::HttpProtobuf,
                Some((_, value)) if value.trim() == "grpc" => Protocol::Grpc,
                Some((_, value)) if value.trim() == "http/protobuf" => Protocol::HttpProtobuf,
                Some((variable, value)) => {
                    return Err(TelemetryError::Variable {
                        variable,
                        value,
                        problem: "this build sends `grpc` or `http/protobuf`",
                    });
                }
            };
            if let Some(url) = var(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")) {
                return Ok(Some(Endpoint {
                    url: url.trim().to_owned(),
                    protocol,
                }));
            }
            Ok(var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .map(|base| Endpoint::from_base(base.trim(), path, protocol)))
        };
        config.traces = signal("TRACES", "/v1/traces")?;
        config.metrics = signal("METRICS", "/v1/metrics")?;
        Ok(config)
    }

    /// The resource every span and metric carries: the service name and
    /// `OTEL_RESOURCE_ATTRIBUTES`.
    fn resource(&self) -> Resource {
        resource_named(self.service_name.clone())
    }
}

/// The resource of a service named `name`, else `OTEL_SERVICE_NAME`, else `runvisor`, with
/// `OTEL_RESOURCE_ATTRIBUTES`.
fn resource_named(name: Option<String>) -> Resource {
    let name = name
        .or_else(|| std::env::var("OTEL_SERVICE_NAME").ok())
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "runvisor".to_owned());
    Resource::builder().with_service_name(name).build()
}

/// Spans not delivered by every exporter of this process, since it started.
static DROPPED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// Spans this process dropped (queue full, or the collector did not take them), over every
/// [`Telemetry`] it built.
pub fn dropped_spans_total() -> u64 {
    DROPPED_TOTAL.load(Ordering::Relaxed)
}

/// The export queue's bookkeeping: spans waiting, its bound, and spans dropped.
#[derive(Debug)]
struct SpanQueue {
    waiting: AtomicUsize,
    capacity: usize,
    dropped: AtomicU64,
}

impl SpanQueue {
    fn dropped(&self, n: usize) {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        self.dropped.fetch_add(n, Ordering::Relaxed);
        DROPPED_TOTAL.fetch_add(n, Ordering::Relaxed);
    }
}

/// The batch processor behind a bound of its own, so that every span it cannot take is
/// counted: a span finding `capacity` spans waiting is dropped here.
#[derive(Debug)]
struct BoundedBatch {
    inner: BatchSpanProcessor,
    queue: Arc<SpanQueue>,
}

impl SpanProcessor for BoundedBatch {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue.capacity {
            self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
            self.queue.dropped(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting the spans that leave the queue and those the collector refused.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queue: Arc<SpanQueue>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        self.queue.waiting.fetch_sub(n, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        if result.is_err() {
            self.queue.dropped(n);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// What is exported: built from a [`TelemetryConfig`], it holds the tracer provider (when
/// spans are exported) and the metrics export (when metrics are), and flushes them when shut
/// down or dropped.
pub struct Telemetry {
    tracer: Option<(SdkTracerProvider, SdkTracer)>,
    queue: Arc<SpanQueue>,
    metrics: Option<meters::MetricsExport>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("exporting_spans", &self.tracer.is_some())
            .field("exporting_metrics", &self.metrics.is_some())
            .field("dropped_spans", &self.dropped_spans())
            .finish_non_exhaustive()
    }
}

/// How long a shutdown waits for the last spans to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

impl Telemetry {
    /// Exports nothing.
    pub fn disabled() -> Self {
        Self {
            tracer: None,
            queue: Arc::new(SpanQueue {
                waiting: AtomicUsize::new(0),
                capacity: 0,
                dropped: AtomicU64::new(0),
            }),
            metrics: None,
        }
    }

    /// Builds the exporters `config` asks for. A gRPC exporter must be built inside a tokio
    /// runtime (it sends from it).
    ///
    /// The process's metrics are kept once, whatever is built: the first `Telemetry` gives
    /// them their resource, and each one exporting metrics sends them all.
    pub fn new(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let mut telemetry = Self::disabled();
        let meters = meters::meters_with(|| config.resource());
        if let Some(endpoint) = &config.metrics {
            telemetry.metrics = Some(Self::export_metrics(
                meters,
                endpoint,
                config.export_timeout,
                config.metrics_interval,
            )?);
        }
        let Some(endpoint) = &config.traces else {
            return Ok(telemetry);
        };
        let queue = Arc::new(SpanQueue {
            waiting: AtomicUsize::new(0),
            capacity: config.max_queue_size.max(1),
            dropped: AtomicU64::new(0),
        });
        let builder = opentelemetry_otlp::SpanExporter::builder();
        let exporter = match endpoint.protocol {
            Protocol::Grpc => builder
                .with_tonic()
                .with_endpoint(endpoint.url.clone())
                .with_timeout(config.export_timeout)
                .build(),
            Protocol::HttpProtobuf => builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint.url.clone())
                .with_timeout(config.export_timeout)
                .build(),
        }
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let batch = BatchSpanProcessor::builder(Counted {
            inner: exporter,
            queue: queue.clone(),
        })
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(queue.capacity)
                .build(),
        )
        .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BoundedBatch {
                inner: batch,
                queue: queue.clone(),
            })
            .with_resource(config.resource())
            .build();
        let tracer = provider.tracer("runvisor");
        telemetry.tracer = Some((provider, tracer));
        telemetry.queue = queue;
        Ok(telemetry)
    }

    /// The metrics export to `endpoint`, every `interval`.
    fn export_metrics(
        meters: &'static Meters,
        endpoint: &Endpoint,
        timeout: Duration,
        interval: Duration,
    ) -> Result<meters::MetricsExport, TelemetryError> {
        let builder = opentelemetry_otlp::MetricExporter::builder();
        let exporter = match endpoint.protocol {
            Protocol::Grpc => builder
                .with_tonic()
                .with_endpoint(endpoint.url.clone())
                .with_timeout(timeout)
                .build(),
            Protocol::HttpProtobuf => builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint.url.clone())
                .with_timeout(timeout)
                .build(),
        }
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        meters::MetricsExport::start(meters, exporter, interval)
            .map_err(|e| TelemetryError::Exporter(format!("no thread to export metrics: {e}")))
    }

    /// Whether spans are exported.
    pub fn exports_spans(&self) -> bool {
        self.tracer.is_some()
    }

    /// Whether metrics are exported.
    pub fn exports_metrics(&self) -> bool {
        self.metrics.is_some()
    }

    /// Metric exports the collector did not take.
    pub fn failed_metric_exports(&self) -> u64 {
        self.metrics
            .as_ref()
            .map_or(0, meters::MetricsExport::failed)
    }

    /// The layer turning spans into OpenTelemetry spans, when spans are exported: the
    /// engine's and this crate's spans and events (`info` and up), nothing of the exporter's
    /// own. Filtered per layer, for a subscriber of its own (a test's); the process's
    /// subscriber ([`subscriber`], [`init`]) filters once for every layer.
    pub fn layer<S>(&self) -> Option<impl Layer<S> + use<S>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let targets = Targets::new()
            .with_target("runvisor", tracing::Level::INFO)
            .with_target("runvisor_actors", tracing::Level::INFO);
        Some(self.otel_layer()?.with_filter(targets))
    }

    /// The OpenTelemetry layer, unfiltered.
    fn otel_layer<S>(&self) -> Option<impl Layer<S> + use<S>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let (_, tracer) = self.tracer.as_ref()?;
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer.clone())
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                // Neither the busy and idle times of every span (two clock reads per poll of
                // an instrumented future, two attributes each) nor an OpenTelemetry context
                // made current on every entry (a context clone per poll): a span's context is
                // read from the span itself (`traceparent_of`).
                .with_tracked_inactivity(false)
                .with_context_activation(false),
        )
    }

    /// Spans not delivered: dropped because the queue was full, or refused by the collector.
    pub fn dropped_spans(&self) -> u64 {
        self.queue.dropped.load(Ordering::Relaxed)
    }

    /// Exports what waits (and the metrics now), for at most a few seconds.
    pub fn flush(&self) {
        if let Some((provider, _)) = &self.tracer
            && let Err(e) = provider.force_flush()
        {
            tracing::debug!(error = %e, "spans not flushed");
        }
        if let Some(metrics) = &self.metrics {
            metrics.flush(SHUTDOWN_TIMEOUT);
        }
    }

    /// Exports what waits and stops exporting (also done when dropped). Says on stderr how
    /// many spans were dropped, if any.
    pub fn shutdown(&mut self) {
        if let Some(mut metrics) = self.metrics.take() {
            metrics.shutdown();
        }
        if let Some((provider, _)) = self.tracer.take() {
            let _ = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
            let dropped = self.dropped_spans();
            if dropped > 0 {
                tracing::warn!(
                    dropped,
                    "spans were not exported (queue full or collector unavailable)"
                );
            }
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What [`init`] installed.
#[derive(Debug)]
pub struct Installed {
    /// The exporters; dropping it flushes them.
    pub telemetry: Telemetry,
    /// What could not be used, for the caller to print as warnings.
    pub warnings: Vec<String>,
}

/// Installs the global subscriber: formatted events on stderr, filtered by `RUST_LOG` when it is
/// set, else by `default_filter` (`EnvFilter` syntax: `"warn"`, `"info,runvisor=debug"`), the
/// timing of the engine's checkpoint writes and stop watcher reads (for `/metrics`), and,
/// when the environment names an OTLP endpoint ([`TelemetryConfig::from_env`]), the
/// OpenTelemetry layer exporting spans. Call it inside the tokio runtime the process runs on
/// (a gRPC exporter sends from it), and keep the returned [`Telemetry`] until the end: dropping
/// it flushes the last spans.
///
/// A subscriber is always installed: an unusable `RUST_LOG` falls back to the default, and
/// unusable OTLP settings export nothing; each is reported in the warnings. If a global
/// subscriber is set already (a second call, a test harness), that one stays.
pub fn init(default_filter: &str) -> Installed {
    let mut warnings = Vec::new();
    let (filter, problem) = choose_filter(std::env::var("RUST_LOG").ok(), default_filter);
    if let Some(problem) = problem {
        warnings.push(problem.to_string());
    }
    let telemetry = match TelemetryConfig::from_env().and_then(|c| Telemetry::new(&c)) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            warnings.push(format!("not exporting telemetry: {e}"));
            Telemetry::disabled()
        }
    };
    let _already_set = stack(filter, &telemetry).try_init();
    Installed {
        telemetry,
        warnings,
    }
}

/// The subscriber [`init`] installs, built without installing it (for a scope of its own,
/// with [`tracing::subscriber::set_default`]): events on stderr filtered by `filter`
/// (`EnvFilter` syntax; an unusable one falls back to `warn`), the engine's timings for
/// `/metrics`, and `telemetry`'s OpenTelemetry layer when it exports spans.
pub fn subscriber(filter: &str, telemetry: &Telemetry) -> impl tracing::Subscriber + Send + Sync {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("warn"));
    stack(filter, telemetry)
}

fn stack(
    filter: EnvFilter,
    telemetry: &Telemetry,
) -> impl tracing::Subscriber + Send + Sync + for<'a> tracing_subscriber::registry::LookupSpan<'a> {
    // One global filter, so spans nobody wants are never made; exporting, it also admits what
    // is exported, and the events layer keeps to what `RUST_LOG` admits.
    let export = telemetry
        .otel_layer()
        .map(|layer| stats::Judged::new(layer, stats::Exported));
    let events = match export {
        Some(_) => {
            let logged =
                EnvFilter::try_new(filter.to_string()).unwrap_or_else(|_| EnvFilter::new("warn"));
            (
                None,
                Some(stats::Judged::new(fmt_layer(), stats::Logged(logged))),
            )
        }
        None => (Some(fmt_layer()), None),
    };
    let exporting = export.is_some();
    Registry::default()
        .with(stats::Admit::new(filter, exporting))
        .with(events.0)
        .with(events.1)
        .with(stats::StatsLayer)
        .with(export)
}

/// Events on stderr, in colour on a terminal.
fn fmt_layer<S>() -> impl Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
}

/// The filter to use, and why `RUST_LOG` was not it when it was set but unusable.
fn choose_filter(
    rust_log: Option<String>,
    default_filter: &str,
) -> (EnvFilter, Option<InvalidFilter>) {
    let default = || {
        EnvFilter::try_new(default_filter)
            .map(|f| (f, default_filter.to_owned()))
            .unwrap_or_else(|_| (EnvFilter::new("warn"), "warn".to_owned()))
    };
    match rust_log.filter(|v| !v.trim().is_empty()) {
        None => (default().0, None),
        Some(value) => match EnvFilter::try_new(&value) {
            Ok(filter) => (filter, None),
            Err(e) => {
                let (filter, used) = default();
                let problem = InvalidFilter {
                    value,
                    reason: e.to_string(),
                    used,
                };
                (filter, Some(problem))
            }
        },
    }
}

/// The W3C `traceparent` of `span` (`00-<trace id>-<span id>-<flags>`), when an
/// OpenTelemetry layer records it; `None` otherwise. What an `http` node sends to the host,
/// and what a run record keeps.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// The OpenTelemetry context a W3C `traceparent` (and `tracestate`) names, as a remote parent;
/// `None` when it is not a valid one.
pub fn context_from_traceparent(
    traceparent: &str,
    tracestate: Option<&str>,
) -> Option<opentelemetry::Context> {
    let mut carrier = HashMap::from([("traceparent".to_owned(), traceparent.trim().to_owned())]);
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// The span context a W3C `traceparent` names; `None` when it is not a valid one.
fn span_context_of(traceparent: &str) -> Option<SpanContext> {
    context_from_traceparent(traceparent, None).map(|cx| cx.span().span_context().clone())
}

/// Lets `span` join the trace `traceparent` names (a request's), as its child. Returns whether
/// it did: not when the header is invalid, no OpenTelemetry layer records the span, or the span
/// has started already.
pub fn join_traceparent(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) -> bool {
    context_from_traceparent(traceparent, tracestate).is_some_and(|cx| span.set_parent(cx).is_ok())
}

/// The engine's view of OpenTelemetry spans ([`TraceContext`]): run records keep their run's
/// `traceparent`, and a resume's span links to it. Register it with
/// [`RuntimeBuilder::trace_context`](runvisor_actors::RuntimeBuilder::trace_context).
#[derive(Debug, Clone, Copy, Default)]
pub struct OtelTraceContext;

impl TraceContext for OtelTraceContext {
    fn traceparent(&self, span: &tracing::Span) -> Option<String> {
        traceparent_of(span)
    }

    fn link(&self, span: &tracing::Span, traceparent: &str) {
        if let Some(sc) = span_context_of(traceparent) {
            span.add_link(sc);
        }
    }
}

/// The engine's view of OpenTelemetry spans, shared.
pub fn trace_context() -> Arc<dyn TraceContext> {
    Arc::new(OtelTraceContext)
}

/// Records the engine's checkpoint writes (size and time, by mode) for `/metrics`. Register it
/// with [`RuntimeBuilder::checkpoint_observer`](runvisor_actors::RuntimeBuilder::checkpoint_observer).
pub fn checkpoint_observer() -> Arc<dyn runvisor_actors::CheckpointObserver> {
    Arc::new(stats::CheckpointMetrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_wins_when_usable() {
        let (filter, problem) = choose_filter(Some("debug".into()), "warn");
        assert_eq!(filter.to_string(), "debug");
        assert_eq!(problem, None);
        let (filter, problem) = choose_filter(None, "info");
        assert_eq!(filter.to_string(), "info");
        assert_eq!(problem, None);
        let (filter, _) = choose_filter(Some("  ".into()), "info");
        assert_eq!(filter.to_string(), "info");
    }

    #[test]
    fn a_bad_filter_falls_back_and_says_so() {
        let (filter, problem) = choose_filter(Some("=[".into()), "info");
        assert_eq!(filter.to_string(), "info");
        let problem = problem.expect("reported");
        assert_eq!(problem.used, "info");
        assert!(problem.to_string().starts_with("ignoring RUST_LOG=\"=[\""));
        let (filter, _) = choose_filter(None, "=[");
        assert_eq!(filter.to_string(), "warn");
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn no_endpoint_exports_nothing() {
        let config = TelemetryConfig::from_vars(vars(&[("OTEL_SERVICE_NAME", "x")])).expect("ok");
        assert_eq!(config.traces, None);
        assert_eq!(config.metrics, None);
        let telemetry = Telemetry::new(&config).expect("built");
        assert!(!telemetry.exports_spans());
        assert!(telemetry.layer::<Registry>().is_none());
    }

    #[test]
    fn endpoints_follow_the_standard_variables() {
        let config = TelemetryConfig::from_vars(vars(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector:4318/",
        )]))
        .expect("ok");
        let traces = config.traces.expect("traces");
        assert_eq!(traces.url, "http://collector:4318/v1/traces");
        assert_eq!(traces.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            config.metrics.expect("metrics").url,
            "http://collector:4318/v1/metrics"
        );

        let config = TelemetryConfig::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "http://m:4318/custom",
            ),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "16"),
        ]))
        .expect("ok");
        assert_eq!(
            config.traces,
            Some(Endpoint {
                url: "http://collector:4317".into(),
                protocol: Protocol::Grpc
            })
        );
        assert_eq!(
            config.metrics,
            Some(Endpoint {
                url: "http://m:4318/custom".into(),
                protocol: Protocol::HttpProtobuf
            })
        );
        assert_eq!(config.max_queue_size, 16);

        let only_traces = TelemetryConfig::from_vars(vars(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://t:4318/v1/traces",
            ),
            ("OTEL_METRICS_EXPORTER", "none"),
        ]))
        .expect("ok");
        assert!(only_traces.traces.is_some());
        assert_eq!(only_traces.metrics, None);

        let disabled = TelemetryConfig::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]))
        .expect("ok");
        assert_eq!(disabled.traces, None);
    }

    #[test]
    fn unusable_settings_are_named() {
        let e = TelemetryConfig::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ]))
        .expect_err("refused");
        assert!(
            e.to_string()
                .starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=\"http/json\"")
        );
        let e = TelemetryConfig::from_vars(vars(&[("OTEL_BSP_MAX_QUEUE_SIZE", "many")]))
            .expect_err("refused");
        assert!(e.to_string().contains("OTEL_BSP_MAX_QUEUE_SIZE"));
    }

    #[test]
    fn traceparents_round_trip_through_spans() {
        assert!(context_from_traceparent("00-zz-00f067aa0ba902b7-01", None).is_none());
        let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(span_context_of(given).is_some());
        // Without an OpenTelemetry layer a span has no trace context.
        assert_eq!(traceparent_of(&tracing::info_span!("plain")), None);
        let config = TelemetryConfig {
            traces: Some(Endpoint {
                // Nothing listens here; nothing is flushed in this test.
                url: "http://127.0.0.1:9/v1/traces".into(),
                protocol: Protocol::HttpProtobuf,
            }),
            ..TelemetryConfig::default()
        };
        let mut telemetry = Telemetry::new(&config).expect("built");
        let subscriber = Registry::default().with(telemetry.layer());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(target: "runvisor", "request");
            assert!(join_traceparent(&span, given, None));
            let child = tracing::info_span!(target: "runvisor", parent: &span, "node");
            let of_child = traceparent_of(&child).expect("recorded");
            assert!(of_child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
            assert!(of_child.ends_with("-01"));
            assert_ne!(of_child, given);
            // Once started, a span keeps its parent.
            assert!(!join_traceparent(&child, given, None));
        });
        telemetry.shutdown();
    }
}
