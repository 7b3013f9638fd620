//! What telemetry costs a run: `chain/1000` (a thousand trivial nodes, so the engine's cost
//! per node is what is measured, spans included) with
//!
//! - `off`: no subscriber at all;
//! - `no_endpoint`: the subscriber a process installs when no OTLP endpoint is set (events on
//!   stderr at `warn`, the engine's timings for `/metrics`, no OpenTelemetry layer);
//! - `exporting`: the same plus the OpenTelemetry layer exporting every span over OTLP
//!   (HTTP/protobuf) to a receiver in this process.
//!
//! Every run executes on one thread (a current-thread tokio runtime), so the subscriber set
//! for the bench's scope is the one every actor of the run sees. After criterion's groups, the
//! medians of interleaved rounds are printed with the ratios to `off`.
//!
//! Two phases: `off` against `no_endpoint`, then `off` against `exporting`. `tracing` caches
//! whether a callsite is wanted over every subscriber that exists: while the exporting one
//! (which wants every span) exists, every span of the other setups is asked for again each
//! time, which a process without an endpoint never does. So the exporting subscriber is built
//! only for the second phase.
//!
//! Run with `cargo bench --bench telemetry`.

#[path = "../tests/telemetry/receiver.rs"]
mod receiver;

mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use runvisor::telemetry::{self, Endpoint, Protocol, Telemetry, TelemetryConfig};
use runvisor::{Runtime, ThreadId};

use common::{ECHO, Echo, chain, run_once};

const LEN: usize = 1000;

fn runtime() -> Runtime {
    Runtime::builder()
        .handler(ECHO, Echo)
        .trace_context(telemetry::trace_context())
        .checkpoint_observer(telemetry::checkpoint_observer())
        .build()
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A setup: its name, its subscriber (none for `off`) and what keeps its exporter.
type Setup = (&'static str, Option<tracing::Dispatch>, Telemetry);

/// No subscriber at all.
fn off() -> Setup {
    ("off", None, Telemetry::disabled())
}

/// The subscriber of a process without an OTLP endpoint.
fn no_endpoint() -> Setup {
    let quiet = Telemetry::new(&TelemetryConfig::default()).expect("built");
    let sub = tracing::Dispatch::new(telemetry::subscriber("warn", &quiet));
    ("no_endpoint", Some(sub), quiet)
}

/// The same, exporting every span to `receiver`.
fn exporting(receiver: &receiver::Receiver) -> Setup {
    let exporting = Telemetry::new(&TelemetryConfig {
        traces: Some(Endpoint {
            url: format!("{}/v1/traces", receiver.base),
            protocol: Protocol::HttpProtobuf,
        }),
        // Room for every span of a run: what is measured is export, not drops.
        max_queue_size: 65_536,
        ..TelemetryConfig::default()
    })
    .expect("built");
    let sub = tracing::Dispatch::new(telemetry::subscriber("warn", &exporting));
    ("exporting", Some(sub), exporting)
}

fn within<T>(dispatch: Option<&tracing::Dispatch>, f: impl FnOnce() -> T) -> T {
    match dispatch {
        Some(d) => tracing::dispatcher::with_default(d, f),
        None => tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), f),
    }
}

/// What the setups share: the tokio runtime, the engine and the workflow.
struct Bench {
    rt: tokio::runtime::Runtime,
    runtime: Runtime,
    workflow: runvisor::Workflow,
    thread: ThreadId,
}

impl Bench {
    fn run(&self) {
        self.rt.block_on(run_once(
            &self.runtime,
            &self.workflow,
            &self.thread,
            |_| true,
        ));
    }

    /// Criterion's figures for `measured`, then the medians of interleaved rounds of
    /// `setups`, with their ratios to the first.
    fn phase(&self, c: &mut Criterion, setups: &[Setup], measured: &[&str]) {
        let mut group = c.benchmark_group("telemetry_chain_1000");
        group
            .sample_size(20)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(5))
            .throughput(Throughput::Elements(LEN as u64));
        for (name, dispatch, _) in setups.iter().filter(|s| measured.contains(&s.0)) {
            within(dispatch.as_ref(), || {
                group.bench_function(*name, |b| b.iter(|| self.run()));
            });
        }
        group.finish();

        // Interleaved rounds, so drift of the machine hits every setup alike.
        let rounds = 30;
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); setups.len()];
        for _ in 0..rounds {
            for (i, (_, dispatch, _)) in setups.iter().enumerate() {
                within(dispatch.as_ref(), || {
                    let start = Instant::now();
                    self.run();
                    times[i].push(start.elapsed());
                });
            }
        }
        let medians: Vec<Duration> = times
            .iter_mut()
            .map(|t| {
                t.sort();
                t[t.len() / 2]
            })
            .collect();
        println!("\ntelemetry, chain/1000, medians of {rounds} interleaved runs:");
        for ((name, _, telemetry), median) in setups.iter().zip(&medians) {
            println!(
                "  {name:<12} {:>9.3} ms  {:>6.3}x off  (spans dropped: {})",
                median.as_secs_f64() * 1e3,
                median.as_secs_f64() / medians[0].as_secs_f64(),
                telemetry.dropped_spans()
            );
        }
        for (_, _, telemetry) in setups {
            telemetry.flush();
        }
    }
}

fn benches(c: &mut Criterion) {
    let runtime = runtime();
    let bench = Bench {
        rt: tokio(),
        workflow: chain(&runtime, LEN),
        runtime,
        thread: ThreadId::new("bench").expect("valid thread id"),
    };
    bench.phase(c, &[off(), no_endpoint()], &["off", "no_endpoint"]);
    let receiver = receiver::Receiver::start();
    bench.phase(c, &[off(), exporting(&receiver)], &["exporting"]);
}

criterion_group!(telemetry_benches, benches);
criterion_main!(telemetry_benches);
