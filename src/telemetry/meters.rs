//! The process's metric instruments, kept once, read two ways.
//!
//! Every metric of the process is an OpenTelemetry instrument of one meter provider, whose one
//! reader (a [`ManualReader`], cumulative) is collected on demand: by `/metrics`, which renders
//! the collection in the OpenMetrics text format ([`render`]), and, when OTLP metrics are
//! configured, by an exporting thread every `OTEL_METRIC_EXPORT_INTERVAL`
//! ([`MetricsExport`]). Both read the same aggregation: a value is recorded once, whichever
//! way it leaves.
//!
//! Each instrument is described here as it is made ([`Family`]): its help, its labels in the
//! order `/metrics` shows them, and the label values shown at zero before anything is recorded
//! (as a Prometheus registry would); OTLP carries what was recorded.

use std::fmt::Write as _;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, MeterProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Temporality,
};

/// What kind of metric a family is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    /// With its buckets' upper bounds.
    Histogram(Vec<f64>),
}

/// A metric as `/metrics` describes it.
#[derive(Debug, Clone)]
pub(crate) struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    /// Its labels, in the order they are shown.
    labels: &'static [&'static str],
    /// Label values (in `labels`' order) shown at zero until something is recorded.
    presets: Vec<Vec<&'static str>>,
}

/// The process's meter provider, its reader, and what its instruments are.
pub(crate) struct Meters {
    /// Kept for the life of the process (a static), as are the instruments it made.
    _provider: SdkMeterProvider,
    reader: Arc<ManualReader>,
    meter: Meter,
    families: Mutex<Vec<Family>>,
    /// How often the metrics are exported over OTLP, once an export started: what is read
    /// rather than recorded (gauges of open runs, leases) is read that often too.
    export_interval: std::sync::OnceLock<Duration>,
}

impl std::fmt::Debug for Meters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meters").finish_non_exhaustive()
    }
}

/// The one reader, shared by the provider (which registers its pipeline in it) and whoever
/// collects.
#[derive(Debug)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

static METERS: OnceLock<Meters> = OnceLock::new();

/// The process's meters; made on first use with `resource` (the first [`Telemetry`]'s, else
/// the environment's: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).
///
/// [`Telemetry`]: super::Telemetry
pub(crate) fn meters_with(resource: impl FnOnce() -> Resource) -> &'static Meters {
    METERS.get_or_init(|| {
        let reader = Arc::new(ManualReader::builder().build());
        let provider = SdkMeterProvider::builder()
            .with_reader(SharedReader(reader.clone()))
            .with_resource(resource())
            .build();
        let meter = provider.meter("runvisor");
        Meters {
            _provider: provider,
            reader,
            meter,
            families: Mutex::new(Vec::new()),
            export_interval: std::sync::OnceLock::new(),
        }
    })
}

/// The process's meters (see [`meters_with`]).
pub(crate) fn meters() -> &'static Meters {
    meters_with(|| super::resource_named(None))
}

impl Meters {
    /// How often the metrics are exported over OTLP, if they are (the first export's
    /// interval).
    pub(crate) fn export_interval(&self) -> Option<Duration> {
        self.export_interval.get().copied()
    }

    fn describe(&self, family: Family) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        match families.iter_mut().find(|f| f.name == family.name) {
            Some(known) => known.presets.extend(family.presets),
            None => families.push(family),
        }
    }

    /// A counter (`name_total` on `/metrics`).
    pub(crate) fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Counter<u64> {
        self.describe(Family {
            name,
            help,
            kind: Kind::Counter,
            labels,
            presets: Vec::new(),
        });
        self.meter.u64_counter(name).with_description(help).build()
    }

    /// A counter whose value `read` gives when collected.
    pub(crate) fn counter_reading(
        &self,
        name: &'static str,
        help: &'static str,
        read: fn() -> u64,
    ) {
        self.describe(Family {
            name,
            help,
            kind: Kind::Counter,
            labels: &[],
            presets: Vec::new(),
        });
        let _registered = self
            .meter
            .u64_observable_counter(name)
            .with_description(help)
            .with_callback(move |observer| observer.observe(read(), &[]))
            .build();
    }

    /// A gauge.
    pub(crate) fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Gauge<i64> {
        self.describe(Family {
            name,
            help,
            kind: Kind::Gauge,
            labels,
            presets: Vec::new(),
        });
        self.meter.i64_gauge(name).with_description(help).build()
    }

    /// A histogram of `unit` (`s`, `By`) with these buckets' upper bounds.
    pub(crate) fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        unit: &'static str,
        bounds: Vec<f64>,
        labels: &'static [&'static str],
    ) -> Histogram<f64> {
        self.describe(Family {
            name,
            help,
            kind: Kind::Histogram(bounds.clone()),
            labels,
            presets: Vec::new(),
        });
        self.meter
            .f64_histogram(name)
            .with_description(help)
            .with_unit(unit)
            .with_boundaries(bounds)
            .build()
    }

    /// Shows the series of `name` with these label values (in its labels' order) at zero
    /// until something is recorded in it.
    pub(crate) fn preset(&self, name: &'static str, values: &[&'static str]) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(family) = families.iter_mut().find(|f| f.name == name)
            && !family.presets.iter().any(|p| p == values)
        {
            family.presets.push(values.to_vec());
        }
    }

    /// Every instrument's value now.
    pub(crate) fn collect(&self) -> Result<ResourceMetrics, String> {
        let mut rm = ResourceMetrics::default();
        self.reader.collect(&mut rm).map_err(|e| e.to_string())?;
        Ok(rm)
    }

    /// Every instrument's value now, in the OpenMetrics text format.
    pub(crate) fn render(&self) -> Result<String, String> {
        let rm = self.collect()?;
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        Ok(render(&families, &rm))
    }
}

/// A label value, escaped for the text format.
fn escape(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A float as the text format writes it (`1.0`, `0.25`, `+Inf`).
fn float(value: f64, out: &mut String) {
    if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.is_nan() {
        out.push_str("NaN");
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        let _ = write!(out, "{value:.1}");
    } else {
        let _ = write!(out, "{value}");
    }
}

/// `{a="x",b="y"}` (with `extra` last, as `le`), or nothing without labels.
fn labels(names: &[&str], values: &[String], extra: Option<(&str, &str)>, out: &mut String) {
    let mut pairs = names
        .iter()
        .zip(values)
        .map(|(n, v)| (*n, v.as_str()))
        .chain(extra)
        .peekable();
    if pairs.peek().is_none() {
        return;
    }
    out.push('{');
    for (i, (name, value)) in pairs.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        escape(value, out);
        out.push('"');
    }
    out.push('}');
}

/// A data point of a family, flattened: its label values and what it holds.
enum Point {
    Number(String),
    Histogram {
        sum: f64,
        count: u64,
        /// Cumulative, one per bound then `+Inf`.
        buckets: Vec<u64>,
    },
}

fn values_of<'a>(names: &[&str], attributes: impl Iterator<Item = &'a KeyValue>) -> Vec<String> {
    let attributes: Vec<&KeyValue> = attributes.collect();
    names
        .iter()
        .map(|name| {
            attributes
                .iter()
                .find(|kv| kv.key.as_str() == *name)
                .map(|kv| kv.value.as_str().into_owned())
                .unwrap_or_default()
        })
        .collect()
}

fn cumulative(counts: impl Iterator<Item = u64>) -> Vec<u64> {
    counts
        .scan(0u64, |total, n| {
            *total = total.saturating_add(n);
            Some(*total)
        })
        .collect()
}

/// The points of one family in a collection.
#[allow(clippy::cast_precision_loss)]
fn points(family: &Family, data: &AggregatedMetrics) -> Vec<(Vec<String>, Point)> {
    let names = family.labels;
    match data {
        AggregatedMetrics::F64(d) => flatten(
            names,
            d,
            |v| {
                let mut s = String::new();
                float(v, &mut s);
                s
            },
            |v| v,
        ),
        AggregatedMetrics::U64(d) => flatten(names, d, |v| v.to_string(), |v| v as f64),
        AggregatedMetrics::I64(d) => flatten(names, d, |v| v.to_string(), |v| v as f64),
    }
}

fn flatten<T: Copy>(
    names: &[&str],
    data: &MetricData<T>,
    text: fn(T) -> String,
    as_f64: fn(T) -> f64,
) -> Vec<(Vec<String>, Point)> {
    match data {
        MetricData::Sum(sum) => sum
            .data_points()
            .map(|p| {
                let values = values_of(names, p.attributes());
                (values, Point::Number(text(p.value())))
            })
            .collect(),
        MetricData::Gauge(gauge) => gauge
            .data_points()
            .map(|p| {
                let values = values_of(names, p.attributes());
                (values, Point::Number(text(p.value())))
            })
            .collect(),
        MetricData::Histogram(h) => h
            .data_points()
            .map(|p| {
                let point = Point::Histogram {
                    sum: as_f64(p.sum()),
                    count: p.count(),
                    buckets: cumulative(p.bucket_counts()),
                };
                (values_of(names, p.attributes()), point)
            })
            .collect(),
        MetricData::ExponentialHistogram(_) => Vec::new(),
    }
}

/// `families` as `rm` has them, in the OpenMetrics text format: each family described (its
/// help and type) whether or not anything was recorded, its points sorted by label values,
/// the presets not recorded yet at zero.
fn render(families: &[Family], rm: &ResourceMetrics) -> String {
    let mut out = String::new();
    for family in families {
        let mut points = rm
            .scope_metrics()
            .flat_map(|scope| scope.metrics())
            .filter(|m| m.name() == family.name)
            .flat_map(|m| points(family, m.data()))
            .collect::<Vec<_>>();
        for preset in &family.presets {
            let values: Vec<String> = preset.iter().map(|v| (*v).to_owned()).collect();
            if !points.iter().any(|(v, _)| *v == values) {
                let zero = match &family.kind {
                    Kind::Histogram(bounds) => Point::Histogram {
                        sum: 0.0,
                        count: 0,
                        buckets: vec![0; bounds.len() + 1],
                    },
                    Kind::Counter | Kind::Gauge => Point::Number("0".to_owned()),
                };
                points.push((values, zero));
            }
        }
        points.sort_by(|a, b| a.0.cmp(&b.0));
        let (kind, suffix) = match family.kind {
            Kind::Counter => ("counter", "_total"),
            Kind::Gauge => ("gauge", ""),
            Kind::Histogram(_) => ("histogram", ""),
        };
        let _ = writeln!(out, "# HELP {} {}.", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {kind}", family.name);
        for (values, point) in &points {
            match point {
                Point::Number(n) => {
                    out.push_str(family.name);
                    out.push_str(suffix);
                    labels(family.labels, values, None, &mut out);
                    let _ = writeln!(out, " {n}");
                }
                Point::Histogram {
                    sum,
                    count,
                    buckets,
                } => {
                    let _ = write!(out, "{}_sum", family.name);
                    labels(family.labels, values, None, &mut out);
                    out.push(' ');
                    float(*sum, &mut out);
                    out.push('\n');
                    let _ = write!(out, "{}_count", family.name);
                    labels(family.labels, values, None, &mut out);
                    let _ = writeln!(out, " {count}");
                    let bounds = match &family.kind {
                        Kind::Histogram(bounds) => bounds.as_slice(),
                        Kind::Counter | Kind::Gauge => &[],
                    };
                    let mut le = String::new();
                    for (i, n) in buckets.iter().enumerate() {
                        le.clear();
                        float(bounds.get(i).copied().unwrap_or(f64::INFINITY), &mut le);
                        let _ = write!(out, "{}_bucket", family.name);
                        labels(family.labels, values, Some(("le", &le)), &mut out);
                        let _ = writeln!(out, " {n}");
                    }
                }
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// A message to the exporting thread.
enum Command {
    /// Export now, then say so.
    Flush(mpsc::Sender<()>),
    /// Export a last time and end.
    Stop,
}

/// The OTLP export of the process's metrics: a thread collecting them every interval (and
/// when flushed, and a last time when shut down) and sending them to the collector. A slow
/// or dead collector delays only this thread; a failed export is counted and the next one
/// carries the values on (they are cumulative).
#[derive(Debug)]
pub(crate) struct MetricsExport {
    commands: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
    failed: Arc<std::sync::atomic::AtomicU64>,
}

impl MetricsExport {
    /// Starts exporting the process's meters with `exporter` every `interval`.
    pub(crate) fn start<E: PushMetricExporter>(
        meters: &'static Meters,
        exporter: E,
        interval: Duration,
    ) -> std::io::Result<Self> {
        let _ = meters.export_interval.set(interval);
        let (commands, rx) = mpsc::channel();
        let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = failed.clone();
        let export = move || {
            let ok = match meters.collect() {
                Ok(rm) => futures::executor::block_on(exporter.export(&rm)).is_ok(),
                Err(_) => false,
            };
            if !ok {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        };
        let thread = std::thread::Builder::new()
            .name("runvisor-metrics-export".to_owned())
            .spawn(move || {
                loop {
                    match rx.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => export(),
                        Ok(Command::Flush(done)) => {
                            export();
                            let _ = done.send(());
                        }
                        Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => {
                            export();
                            return;
                        }
                    }
                }
            })?;
        Ok(Self {
            commands,
            thread: Some(thread),
            failed,
        })
    }

    /// Exports now, waiting at most `patience` for it.
    pub(crate) fn flush(&self, patience: Duration) {
        let (done, wait) = mpsc::channel();
        if self.commands.send(Command::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(patience);
        }
    }

    /// Exports that failed (the collector did not take them, or nothing could be collected).
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Exports a last time and ends the thread.
    pub(crate) fn shutdown(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.commands.send(Command::Stop);
            let _ = thread.join();
        }
    }
}

impl Drop for MetricsExport {
    fn drop(&mut self) {
        self.shutdown();
    }
}
