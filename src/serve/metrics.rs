//! `GET /metrics`: the process's metrics in the OpenMetrics text format (which Prometheus
//! scrapes). They are OpenTelemetry instruments, kept once by the process's meters (see
//! [`telemetry`](crate::telemetry)): `/metrics` renders them, and when OTLP metrics are
//! configured (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`) the same
//! values are exported, under the same names.
//!
//! - `runvisor_runs{status}` (gauge): open runs in the stores, every worker's, by status
//!   (`running`, `awaiting_input`, `orphaned`), read when scraped and, while the metrics are
//!   exported over OTLP, every export interval.
//! - `runvisor_leases_held` (gauge): threads whose lease this process holds (its live runs),
//!   read likewise.
//! - `runvisor_runs_started_total` and `runvisor_runs_ended_total{status}` (counters): runs
//!   this service started or resumed, and how they ended.
//! - `runvisor_node_executions_total{kind}` (counter): nodes those runs started.
//! - `runvisor_node_duration_seconds{kind, outcome}` (histogram): how long those nodes ran,
//!   from their start event to their end event (`completed`, `failed`, `stopped`, `aborted`,
//!   `paused`).
//! - `runvisor_stop_latency_seconds{endpoint}` (histogram): from a stop request to the run
//!   quiesced (its stop result), per stop endpoint.
//! - `runvisor_stop_ack_seconds` (histogram): from a stop request to the run's supervisor
//!   acknowledging it (its `stopping` event), for runs of this process.
//! - `runvisor_store_errors_total{source, kind}` (counter): store failures, `transient` or
//!   `rejected`: while a scrape read the runs (`scrape`), and when a run of this service found
//!   the checkpoint store failing and waited for it (`checkpoint`).
//! - `runvisor_checkpoint_bytes{mode}` and `runvisor_checkpoint_write_seconds{mode}`
//!   (histograms): size and write time (retries included) of the checkpoints this process
//!   wrote, `sync`, `async` or `final`.
//! - `runvisor_watcher_tick_seconds` (histogram): the stop watcher's read of every watched
//!   flag, per tick.
//! - `runvisor_spans_dropped_total` (counter): spans not exported (queue full, or the
//!   collector did not take them).
//!
//! The engine's checkpoint writes come from its checkpoint observer, the watcher's ticks from
//! its spans, timed by a layer of the process's subscriber.
//!
//! What the engine does is read from the runs' event streams ([`Metrics::observe`]): the
//! engine knows nothing of metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram};
use runvisor_actors::{NodePath, RunEvent, RunHandle, RunId, RunQuery, RunStatus};
use tokio::sync::mpsc;

use super::Service;
use super::error::ApiError;
use crate::telemetry::{exponential, meters};

/// The most open runs a scrape counts.
const COUNT_LIMIT: usize = 100_000;

/// The statuses of open runs, each always reported (0 when none).
const OPEN: [RunStatus; 3] = [
    RunStatus::Running,
    RunStatus::AwaitingInput,
    RunStatus::Orphaned,
];

/// How a run may end: the statuses a run's end is counted under.
const ENDED: [RunStatus; 5] = [
    RunStatus::Succeeded,
    RunStatus::Failed,
    RunStatus::Stopped,
    RunStatus::Cancelled,
    RunStatus::AwaitingInput,
];

/// The endpoints whose stops are timed.
const STOP_ENDPOINTS: [&str; 4] = ["v1_stop", "v1_cancel", "fastgpt", "nexau"];

fn error_label(source: &'static str, transient: bool) -> [KeyValue; 2] {
    let kind = if transient { "transient" } else { "rejected" };
    [KeyValue::new("source", source), KeyValue::new("kind", kind)]
}

/// The service's instruments, the process's (see [`crate::telemetry`]'s meters).
struct Instruments {
    runs: Gauge<i64>,
    leases: Gauge<i64>,
    started: Counter<u64>,
    ended: Counter<u64>,
    nodes: Counter<u64>,
    node_seconds: Histogram<f64>,
    stop_latency: Histogram<f64>,
    stop_ack: Histogram<f64>,
    store_errors: Counter<u64>,
}

/// 1 ms to about 65 s.
fn latency_buckets() -> Vec<f64> {
    exponential(0.001, 2.0, 17)
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meters = meters();
        let instruments = Instruments {
            runs: meters.gauge(
                "runvisor_runs",
                "Open runs in the stores, every worker's, by status",
                &["status"],
            ),
            leases: meters.gauge(
                "runvisor_leases_held",
                "Threads whose lease this process holds",
                &[],
            ),
            started: meters.counter(
                "runvisor_runs_started",
                "Runs this service started or resumed",
                &[],
            ),
            ended: meters.counter(
                "runvisor_runs_ended",
                "Runs this service started or resumed that ended, by status",
                &["status"],
            ),
            nodes: meters.counter(
                "runvisor_node_executions",
                "Nodes started by the runs of this service, by kind",
                &["kind"],
            ),
            node_seconds: meters.histogram(
                "runvisor_node_duration_seconds",
                "From a node's start to its end, nodes of the runs of this service, by kind and \
                 outcome (completed, failed, stopped, aborted, paused)",
                "s",
                // 100 µs to about 13 min.
                exponential(0.0001, 4.0, 13),
                &["kind", "outcome"],
            ),
            stop_latency: meters.histogram(
                "runvisor_stop_latency_seconds",
                "From a stop request to the run quiesced, by stop endpoint",
                "s",
                latency_buckets(),
                &["endpoint"],
            ),
            stop_ack: meters.histogram(
                "runvisor_stop_ack_seconds",
                "From a stop request to the run's supervisor acknowledging it, runs of this \
                 process",
                "s",
                latency_buckets(),
                &[],
            ),
            store_errors: meters.counter(
                "runvisor_store_errors",
                "Store failures seen by scrapes and by the runs of this service, by kind",
                &["source", "kind"],
            ),
        };
        crate::telemetry::engine_stats();
        // The label values known beforehand are there from the first scrape, at 0.
        meters.preset("runvisor_runs_started", &[]);
        meters.preset("runvisor_leases_held", &[]);
        meters.preset("runvisor_stop_ack_seconds", &[]);
        for status in OPEN {
            meters.preset("runvisor_runs", &[status.as_str()]);
        }
        for status in ENDED {
            meters.preset("runvisor_runs_ended", &[status.as_str()]);
        }
        for endpoint in STOP_ENDPOINTS {
            meters.preset("runvisor_stop_latency_seconds", &[endpoint]);
        }
        for source in ["scrape", "checkpoint"] {
            for kind in ["transient", "rejected"] {
                meters.preset("runvisor_store_errors", &[source, kind]);
            }
        }
        instruments
    })
}

/// The service's metrics: the process's instruments, and the runs it follows. Cheap to clone;
/// clones share everything.
#[derive(Clone)]
pub(crate) struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    instruments: &'static Instruments,
    /// The runs followed now, each with when a stop not yet acknowledged was asked.
    followed: Mutex<HashMap<RunId, Option<Instant>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                instruments: instruments(),
                followed: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A stop of `run` was asked at `at`: when this service follows the run, its
    /// acknowledgement (the run's `stopping` event) is timed from then.
    pub(crate) fn stop_requested(&self, run: RunId, at: Instant) {
        if let Some(asked @ None) = self.followed().get_mut(&run) {
            *asked = Some(at);
        }
    }

    /// The stop of `run` asked at `at` through `endpoint` was answered; when it `stopped` the
    /// run, how long it took to quiesce is recorded.
    pub(crate) fn stop_answered(&self, endpoint: &str, at: Instant, stopped: bool) {
        if stopped {
            self.inner.instruments.stop_latency.record(
                at.elapsed().as_secs_f64(),
                &[KeyValue::new("endpoint", endpoint.to_owned())],
            );
        }
    }

    fn followed(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Option<Instant>>> {
        self.inner
            .followed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Follows a run this service started: counts its nodes, times them (from their start
    /// events to their end events, as this service receives them), and counts how it ended.
    /// Takes the run's events from its start; when `forward` is given, every event is also
    /// sent there (for a client streaming them; one that goes away stops nothing, the counting
    /// goes on).
    pub(crate) fn observe(&self, run: &RunHandle, forward: Option<mpsc::Sender<RunEvent>>) {
        let instruments = self.inner.instruments;
        instruments.started.add(1, &[]);
        let mut events = run.events();
        let run_id = run.run_id();
        self.followed().insert(run_id, None);
        let metrics = self.clone();
        tokio::spawn(async move {
            let mut forward = forward;
            // The nodes running: their kind and when they started.
            let mut running: HashMap<NodePath, (KeyValue, Instant)> = HashMap::new();
            let ended = |running: &mut HashMap<NodePath, (KeyValue, Instant)>,
                         path: &NodePath,
                         outcome: &'static str| {
                if let Some((kind, started)) = running.remove(path) {
                    instruments.node_seconds.record(
                        started.elapsed().as_secs_f64(),
                        &[kind, KeyValue::new("outcome", outcome)],
                    );
                }
            };
            while let Some(event) = events.next().await {
                match &event {
                    RunEvent::NodeStarted { kind, path } => {
                        let kind = KeyValue::new("kind", kind.clone());
                        instruments.nodes.add(1, std::slice::from_ref(&kind));
                        running.insert(path.clone(), (kind, Instant::now()));
                    }
                    RunEvent::NodeFinished { path, .. } => ended(&mut running, path, "completed"),
                    RunEvent::NodeFailed { path, .. } => ended(&mut running, path, "failed"),
                    RunEvent::NodeInterrupted { path, forced } => {
                        ended(
                            &mut running,
                            path,
                            if *forced { "aborted" } else { "stopped" },
                        );
                    }
                    RunEvent::Paused { path } => ended(&mut running, path, "paused"),
                    RunEvent::Stopping { .. } => {
                        let asked = metrics.followed().get_mut(&run_id).and_then(Option::take);
                        if let Some(asked) = asked {
                            instruments
                                .stop_ack
                                .record(asked.elapsed().as_secs_f64(), &[]);
                        }
                    }
                    RunEvent::StorageWait {
                        waiting: true,
                        error: Some(error),
                    } => {
                        instruments
                            .store_errors
                            .add(1, &error_label("checkpoint", error.is_transient()));
                    }
                    RunEvent::RunFinished { status, .. } => {
                        instruments
                            .ended
                            .add(1, &[KeyValue::new("status", status.as_str())]);
                    }
                    _ => {}
                }
                if let Some(tx) = &forward
                    && tx.send(event).await.is_err()
                {
                    forward = None;
                }
            }
            metrics.followed().remove(&run_id);
        });
    }

    /// Reads what is read when scraped (the open runs, the leases held) and renders every
    /// metric.
    async fn render(&self, service: &Service) -> Result<String, ApiError> {
        self.refresh(service).await;
        meters()
            .render()
            .map_err(|e| ApiError::internal(format!("cannot collect the metrics: {e}")))
    }

    /// Reads what is read rather than recorded (the open runs, the leases held) into the
    /// gauges: when scraped, and every OTLP export interval while the metrics are exported,
    /// so an export carries values at most one interval old even when nobody scrapes.
    async fn refresh(&self, service: &Service) {
        let instruments = self.inner.instruments;
        let runtime = service.runtime();
        let query = RunQuery {
            limit: COUNT_LIMIT,
            ..RunQuery::default()
        };
        match runtime.list_runs(&query).await {
            Ok(views) => {
                for status in OPEN {
                    let count = views.iter().filter(|v| v.status == status).count();
                    instruments.runs.record(
                        i64::try_from(count).unwrap_or(i64::MAX),
                        &[KeyValue::new("status", status.as_str())],
                    );
                }
            }
            Err(e) => {
                instruments
                    .store_errors
                    .add(1, &error_label("scrape", e.is_transient()));
            }
        }
        let live = runtime.registry().len();
        instruments
            .leases
            .record(i64::try_from(live).unwrap_or(i64::MAX), &[]);
    }
}

/// While the process exports its metrics over OTLP, refreshes `service`'s read gauges every
/// export interval, for as long as the service lives (the task holds it weakly). Nothing
/// when the metrics are not exported, or outside a tokio runtime.
pub(super) fn keep_fresh(service: &Service) {
    let Some(interval) = meters().export_interval() else {
        return;
    };
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = service.downgrade();
    handle.spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(service) = Service::upgrade(&weak) else {
                return;
            };
            service.metrics().refresh(&service).await;
        }
    });
}

/// `GET /metrics`.
pub(super) async fn metrics(State(service): State<Service>) -> Result<impl IntoResponse, ApiError> {
    let text = service.metrics().render(&service).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    ))
}
