//! What telemetry costs a run: `chain/1000` (a thousand trivial nodes, so the engine's cost
//! per node is what is measured, spans included) with
//!
//! - `off`: no subscriber at all;
//! - `no_endpoint`: the subscriber a process installs when no OTLP endpoint is set (events on
//!   stderr at `warn`, the engine's timings for `/metrics`, no OpenTelemetry layer);
//! - `exporting`: the same plus the OpenTelemetry layer exporting every span over OTLP
//!   (HTTP/protobuf) to a receiver in this process that decodes every export (a collector's
//!   work, on the same cores);
//! - `exporting_discard`: the same, to a receiver that takes the exports without decoding
//!   them: what the process itself pays to export (its receiver thread still reads the
//!   requests).
//!
//! Every export leaves from the batch processor's thread; each receiver serves from a thread
//! of its own.
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
//! Last, the span pipeline alone: a thousand spans shaped as node spans (same fields, the same
//! values recorded), created and closed with nothing of the engine around them, under `off`
//! and both exporting setups; the run's thread's CPU time per span is printed. Against the
//! per-node difference of the runs, it separates what the pipeline's own code costs from what
//! running it between the engine's steps costs the engine (its caches and allocator shared).
//!
//! Run with `cargo bench --bench telemetry`. For a profiler, `TELEMETRY_PROFILE=<setup>`
//! (`off`, `no_endpoint` or `exporting`) runs only that setup, 300 runs (`TELEMETRY_RUNS`),
//! and prints its median: `TELEMETRY_PROFILE=exporting perf record -g target/release/deps/telemetry-*`.

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
fn exporting(name: &'static str, receiver: &receiver::Receiver) -> Setup {
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
    (name, Some(sub), exporting)
}

/// The CPU time `clock` (`CLOCK_THREAD_CPUTIME_ID`, `CLOCK_PROCESS_CPUTIME_ID`) has counted.
fn cpu(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clocks named are always available.
    let _ = unsafe { libc::clock_gettime(clock, &raw mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
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

        // Interleaved rounds, so drift of the machine hits every setup alike. Each round is
        // flushed before the next starts (outside the wall time), so no round exports another's
        // spans; the process's CPU time is counted through the flush.
        let rounds = 30;
        let mut wall: Vec<Vec<Duration>> = vec![Vec::new(); setups.len()];
        let mut thread: Vec<Vec<Duration>> = vec![Vec::new(); setups.len()];
        let mut process: Vec<Vec<Duration>> = vec![Vec::new(); setups.len()];
        for _ in 0..rounds {
            for (i, (_, dispatch, telemetry)) in setups.iter().enumerate() {
                within(dispatch.as_ref(), || {
                    let (p0, t0) = (
                        cpu(libc::CLOCK_PROCESS_CPUTIME_ID),
                        cpu(libc::CLOCK_THREAD_CPUTIME_ID),
                    );
                    let start = Instant::now();
                    self.run();
                    wall[i].push(start.elapsed());
                    thread[i].push(cpu(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(t0));
                    telemetry.flush();
                    process[i].push(cpu(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(p0));
                });
            }
        }
        let median = |t: &mut Vec<Duration>| {
            t.sort();
            t[t.len() / 2]
        };
        let medians: Vec<[Duration; 3]> = (0..setups.len())
            .map(|i| {
                [
                    median(&mut wall[i]),
                    median(&mut thread[i]),
                    median(&mut process[i]),
                ]
            })
            .collect();
        println!(
            "\ntelemetry, chain/1000, medians of {rounds} interleaved runs: wall time, CPU time \
             of the run's thread, CPU time of the process (every thread: export, receiver) \
             through the flush of the run's spans"
        );
        for ((name, _, telemetry), m) in setups.iter().zip(&medians) {
            let ratio = |k: usize| m[k].as_secs_f64() / medians[0][k].as_secs_f64();
            println!(
                "  {name:<18} wall {:>8.3} ms {:>6.3}x | thread {:>8.3} ms {:>6.3}x | process \
                 {:>8.3} ms {:>6.3}x  (spans dropped: {})",
                m[0].as_secs_f64() * 1e3,
                ratio(0),
                m[1].as_secs_f64() * 1e3,
                ratio(1),
                m[2].as_secs_f64() * 1e3,
                ratio(2),
                telemetry.dropped_spans()
            );
        }
        for (_, _, telemetry) in setups {
            telemetry.flush();
        }
    }
}

/// What the span pipeline alone costs per span, under `setup`'s subscriber: `LEN` spans
/// shaped as the engine's node spans (same target, name and fields, the same values recorded
/// at the start and the end), children of one run span, each closed at once; nothing of the
/// engine runs. The median over interleaved rounds of the run's thread CPU time per span,
/// against `off` (no subscriber), is printed: the floor under the per-node cost of exporting.
fn span_floor(setups: &[&Setup]) {
    let rounds = 30;
    let mut per_span: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    for _ in 0..rounds {
        for (i, (_, dispatch, telemetry)) in setups.iter().enumerate() {
            within(dispatch.as_ref(), || {
                let t0 = cpu(libc::CLOCK_THREAD_CPUTIME_ID);
                let run = tracing::info_span!(target: "runvisor_actors", "run");
                for n in 0..LEN {
                    let id = format!("n{n}");
                    let span = tracing::info_span!(
                        target: "runvisor_actors",
                        parent: &run,
                        "node",
                        otel.name = "node",
                        gen_ai.operation.name = None::<&str>,
                        gen_ai.tool.name = None::<&str>,
                        gen_ai.agent.name = None::<&str>,
                        runvisor.node.id = id.as_str(),
                        runvisor.node.kind = ECHO,
                        runvisor.node.path = %id,
                        runvisor.node.outcome = tracing::field::Empty,
                        error.type = tracing::field::Empty,
                        otel.status_code = tracing::field::Empty,
                        otel.status_description = tracing::field::Empty,
                        gen_ai.request.model = tracing::field::Empty,
                        gen_ai.usage.input_tokens = tracing::field::Empty,
                        gen_ai.usage.output_tokens = tracing::field::Empty,
                    );
                    span.in_scope(|| std::hint::black_box(n));
                    span.record("runvisor.node.outcome", "completed");
                }
                drop(run);
                let spent = cpu(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(t0);
                per_span[i].push(spent.as_secs_f64() * 1e6 / LEN as f64);
                telemetry.flush();
            });
        }
    }
    println!("
the span pipeline alone: {LEN} node-shaped spans, CPU time of the thread per span (median of {rounds} interleaved rounds)");
    let base = {
        let mut v = per_span[0].clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for ((name, _, _), mut v) in setups.iter().zip(per_span) {
        v.sort_by(f64::total_cmp);
        let m = v[v.len() / 2];
        println!(
            "  {name:<18} {m:>7.3} µs per span ({:+.3} µs over off)",
            m - base
        );
    }
}

/// One setup alone, `runs` times (for a profiler): its median wall time.
fn profile(bench: &Bench, name: &str) {
    let runs: usize = std::env::var("TELEMETRY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let receiver = receiver::Receiver::start();
    let (_, dispatch, telemetry) = match name {
        "off" => off(),
        "no_endpoint" => no_endpoint(),
        "exporting" => exporting("exporting", &receiver),
        other => panic!("TELEMETRY_PROFILE={other}: expected off, no_endpoint or exporting"),
    };
    let mut wall = Vec::with_capacity(runs);
    for _ in 0..runs {
        within(dispatch.as_ref(), || {
            let start = Instant::now();
            bench.run();
            wall.push(start.elapsed());
            telemetry.flush();
        });
    }
    wall.sort();
    println!(
        "telemetry profile {name}: {runs} runs of chain/{LEN}, median {:.3} ms",
        wall[runs / 2].as_secs_f64() * 1e3
    );
}

fn benches(c: &mut Criterion) {
    let runtime = runtime();
    let bench = Bench {
        rt: tokio(),
        workflow: chain(&runtime, LEN),
        runtime,
        thread: ThreadId::new("bench").expect("valid thread id"),
    };
    if let Ok(name) = std::env::var("TELEMETRY_PROFILE") {
        profile(&bench, &name);
        return;
    }
    bench.phase(c, &[off(), no_endpoint()], &["off", "no_endpoint"]);
    let receiver = receiver::Receiver::start();
    let discarding = receiver::Receiver::start_discarding();
    let setups = [
        off(),
        exporting("exporting", &receiver),
        exporting("exporting_discard", &discarding),
    ];
    // One run, to count what it exports.
    within(setups[1].1.as_ref(), || bench.run());
    setups[1].2.flush();
    let spans = receiver.spans().len();
    println!("\none run of chain/{LEN} exports {spans} spans");
    bench.phase(c, &setups, &["exporting", "exporting_discard"]);
    println!(
        "  (the discarding receiver took {} requests, {} bytes)",
        discarding.requests(),
        discarding.bytes()
    );
    span_floor(&[&setups[0], &setups[1], &setups[2]]);
}

criterion_group!(telemetry_benches, benches);
criterion_main!(telemetry_benches);
