//! `GET /metrics`: the service's metrics in the OpenMetrics text format (which Prometheus
//! scrapes), kept with `prometheus-client`.
//!
//! - `runvisor_runs{status}` (gauge): open runs in the stores, every worker's, by status
//!   (`running`, `awaiting_input`, `orphaned`), read when scraped.
//! - `runvisor_leases_held` (gauge): threads whose lease this process holds (its live runs).
//! - `runvisor_runs_started_total` and `runvisor_runs_ended_total{status}` (counters): runs
//!   this service started or resumed, and how they ended.
//! - `runvisor_node_executions_total{kind}` (counter): nodes those runs started.
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
//! The engine's timings come from its spans, timed by a layer of the process's subscriber
//! (see [`telemetry`](crate::telemetry)).
//!
//! What the engine does is read from the runs' event streams ([`Metrics::observe`]): the
//! engine knows nothing of metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use runvisor_actors::{RunEvent, RunHandle, RunId, RunQuery, RunStatus};
use tokio::sync::mpsc;

use super::Service;
use super::error::ApiError;

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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    source: &'static str,
    kind: &'static str,
}

impl ErrorLabel {
    fn new(source: &'static str, transient: bool) -> Self {
        let kind = if transient { "transient" } else { "rejected" };
        Self { source, kind }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

type Latency = Family<EndpointLabel, Histogram, fn() -> Histogram>;

/// The service's metrics. Cheap to clone; clones share everything.
#[derive(Clone)]
pub(crate) struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    runs: Family<StatusLabel, Gauge>,
    leases: Gauge,
    started: Counter,
    ended: Family<StatusLabel, Counter>,
    nodes: Family<KindLabel, Counter>,
    stop_latency: Latency,
    stop_ack: Histogram,
    /// The runs followed now, each with when a stop not yet acknowledged was asked.
    followed: Mutex<HashMap<RunId, Option<Instant>>>,
    store_errors: Family<ErrorLabel, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let runs = Family::<StatusLabel, Gauge>::default();
        registry.register(
            "runvisor_runs",
            "Open runs in the stores, every worker's, by status",
            runs.clone(),
        );
        let leases = Gauge::default();
        registry.register(
            "runvisor_leases_held",
            "Threads whose lease this process holds",
            leases.clone(),
        );
        let started = Counter::default();
        registry.register(
            "runvisor_runs_started",
            "Runs this service started or resumed",
            started.clone(),
        );
        let ended = Family::<StatusLabel, Counter>::default();
        registry.register(
            "runvisor_runs_ended",
            "Runs this service started or resumed that ended, by status",
            ended.clone(),
        );
        let nodes = Family::<KindLabel, Counter>::default();
        registry.register(
            "runvisor_node_executions",
            "Nodes started by the runs of this service, by kind",
            nodes.clone(),
        );
        let stop_latency: Latency = Family::new_with_constructor(latency_histogram);
        registry.register(
            "runvisor_stop_latency_seconds",
            "From a stop request to the run quiesced, by stop endpoint",
            stop_latency.clone(),
        );
        let stop_ack = latency_histogram();
        registry.register(
            "runvisor_stop_ack_seconds",
            "From a stop request to the run's supervisor acknowledging it, runs of this process",
            stop_ack.clone(),
        );
        crate::telemetry::engine_stats().register(&mut registry);
        let store_errors = Family::<ErrorLabel, Counter>::default();
        registry.register(
            "runvisor_store_errors",
            "Store failures seen by scrapes and by the runs of this service, by kind",
            store_errors.clone(),
        );
        // The label values known beforehand are there from the first scrape, at 0.
        for status in ENDED {
            let _created = ended.get_or_create(&StatusLabel {
                status: status.to_string(),
            });
        }
        for endpoint in STOP_ENDPOINTS {
            let _created = stop_latency.get_or_create(&EndpointLabel {
                endpoint: endpoint.to_owned(),
            });
        }
        for source in ["scrape", "checkpoint"] {
            for transient in [true, false] {
                let _created = store_errors.get_or_create(&ErrorLabel::new(source, transient));
            }
        }
        Self {
            inner: Arc::new(Inner {
                registry,
                runs,
                leases,
                started,
                ended,
                nodes,
                stop_latency,
                stop_ack,
                followed: Mutex::new(HashMap::new()),
                store_errors,
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
            self.inner
                .stop_latency
                .get_or_create(&EndpointLabel {
                    endpoint: endpoint.to_owned(),
                })
                .observe(at.elapsed().as_secs_f64());
        }
    }

    fn followed(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Option<Instant>>> {
        self.inner
            .followed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Follows a run this service started: counts its nodes and how it ended. Takes the run's
    /// events from its start; when `forward` is given, every event is also sent there (for a
    /// client streaming them; one that goes away stops nothing, the counting goes on).
    pub(crate) fn observe(&self, run: &RunHandle, forward: Option<mpsc::Sender<RunEvent>>) {
        self.inner.started.inc();
        let mut events = run.events();
        let run_id = run.run_id();
        self.followed().insert(run_id, None);
        let metrics = self.clone();
        tokio::spawn(async move {
            let mut forward = forward;
            while let Some(event) = events.next().await {
                match &event {
                    RunEvent::NodeStarted { kind, .. } => {
                        metrics
                            .inner
                            .nodes
                            .get_or_create(&KindLabel {
                                kind: kind.to_string(),
                            })
                            .inc();
                    }
                    RunEvent::Stopping { .. } => {
                        let asked = metrics.followed().get_mut(&run_id).and_then(Option::take);
                        if let Some(asked) = asked {
                            metrics
                                .inner
                                .stop_ack
                                .observe(asked.elapsed().as_secs_f64());
                        }
                    }
                    RunEvent::StorageWait {
                        waiting: true,
                        error: Some(error),
                    } => {
                        metrics
                            .inner
                            .store_errors
                            .get_or_create(&ErrorLabel::new("checkpoint", error.is_transient()))
                            .inc();
                    }
                    RunEvent::RunFinished { status, .. } => {
                        metrics
                            .inner
                            .ended
                            .get_or_create(&StatusLabel {
                                status: status.to_string(),
                            })
                            .inc();
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
        let runtime = service.runtime();
        let query = RunQuery {
            limit: COUNT_LIMIT,
            ..RunQuery::default()
        };
        match runtime.list_runs(&query).await {
            Ok(views) => {
                for status in OPEN {
                    let count = views.iter().filter(|v| v.status == status).count();
                    self.inner
                        .runs
                        .get_or_create(&StatusLabel {
                            status: status.to_string(),
                        })
                        .set(i64::try_from(count).unwrap_or(i64::MAX));
                }
            }
            Err(e) => {
                self.inner
                    .store_errors
                    .get_or_create(&ErrorLabel::new("scrape", e.is_transient()))
                    .inc();
            }
        }
        crate::telemetry::engine_stats().sync_dropped();
        let live = runtime.registry().len();
        self.inner
            .leases
            .set(i64::try_from(live).unwrap_or(i64::MAX));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.inner.registry)
            .map_err(|e| ApiError::internal(format!("cannot render the metrics: {e}")))?;
        Ok(text)
    }
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
