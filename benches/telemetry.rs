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
        .build()
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The three setups, each a subscriber (none for `off`) and what keeps its exporter.
fn setups(
    receiver: &receiver::Receiver,
) -> Vec<(&'static str, Option<tracing::Dispatch>, Telemetry)> {
    let off = Telemetry::disabled();
    let quiet = Telemetry::new(&TelemetryConfig::default()).expect("built");
    let quiet_sub = tracing::Dispatch::new(telemetry::subscriber("warn", &quiet));
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
    let exporting_sub = tracing::Dispatch::new(telemetry::subscriber("warn", &exporting));
    vec![
        ("off", None, off),
        ("no_endpoint", Some(quiet_sub), quiet),
        ("exporting", Some(exporting_sub), exporting),
    ]
}

fn within<T>(dispatch: Option<&tracing::Dispatch>, f: impl FnOnce() -> T) -> T {
    match dispatch {
        Some(d) => tracing::dispatcher::with_default(d, f),
        None => tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), f),
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio();
    let runtime = runtime();
    let workflow = chain(&runtime, LEN);
    let thread = ThreadId::new("bench").expect("valid thread id");
    let receiver = receiver::Receiver::start();
    let setups = setups(&receiver);

    let mut group = c.benchmark_group("telemetry_chain_1000");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(LEN as u64));
    for (name, dispatch, _) in &setups {
        within(dispatch.as_ref(), || {
            group.bench_function(*name, |b| {
                b.iter(|| rt.block_on(run_once(&runtime, &workflow, &thread, |_| true)));
            });
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
                rt.block_on(run_once(&runtime, &workflow, &thread, |_| true));
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
    for (_, _, telemetry) in &setups {
        telemetry.flush();
    }
}

criterion_group!(telemetry_benches, benches);
criterion_main!(telemetry_benches);
