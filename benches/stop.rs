//! Stop latency benchmarks: the time from a `Runtime::stop` call to its `StopResult`, for runs
//! whose running node cooperates (it waits on `ctx.stopped()` and returns at once), on the
//! in-memory stores. What is measured is the engine's stop path: the stop message, the flag
//! reaching the node, the node actor's report, the flush (history, checkpoint, run record) and
//! the result reaching the caller.
//!
//! - `stop/one_run`: one live run, one stop call;
//! - `stop/1000_runs`: 1000 live runs, all stopped at once (time until every caller has its
//!   result).
//!
//! Starting the runs and waiting until their nodes run is setup, outside the timing. Before the
//! criterion groups, a plain loop of 1000 measured single stops prints its percentiles to
//! stderr (criterion reports medians and means, not tails).
//!
//! Run with `cargo bench --bench stop`.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use runvisor::{NodeDef, RunHandle, Runtime, StopMode, StopReply, ThreadId, Workflow, WorkflowDef};
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

use common::{COOPERATIVE, Cooperative};

/// A runtime with the cooperative kind, `begin -> wait`, and the receiver of "running" pings.
struct Setup {
    runtime: Runtime,
    workflow: Workflow,
    running: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
}

impl Setup {
    fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let runtime = Runtime::builder()
            .handler(COOPERATIVE, Cooperative { running: tx })
            .build();
        let def = WorkflowDef::new("stop-bench")
            .node(NodeDef::new("begin", "begin"))
            .node(NodeDef::new("wait", COOPERATIVE))
            .edge("begin", "wait");
        let workflow = runtime.validate(def).expect("bench workflow is valid");
        Self {
            runtime,
            workflow,
            running: tokio::sync::Mutex::new(rx),
        }
    }

    /// Starts `count` runs, each on its own thread, and waits until every one's node runs.
    async fn live_runs(&self, count: usize) -> Vec<RunHandle> {
        let mut runs = Vec::with_capacity(count);
        for i in 0..count {
            let thread = ThreadId::new(format!("bench-{i}")).expect("valid thread id");
            let run = self
                .runtime
                .start(&self.workflow, Default::default(), thread)
                .await
                .expect("run starts");
            runs.push(run);
        }
        let mut running = self.running.lock().await;
        for _ in 0..count {
            tokio::time::timeout(Duration::from_secs(10), running.recv())
                .await
                .expect("the node runs within 10 s")
                .expect("the runtime holds the sender");
        }
        runs
    }

    /// Drops the checkpoints the stops wrote, so the stores stay small however long the
    /// bench runs (outside the timing).
    async fn tidy(&self, count: usize) {
        for i in 0..count {
            let thread = ThreadId::new(format!("bench-{i}")).expect("valid thread id");
            self.runtime
                .checkpoint_store()
                .prune(&thread, 0)
                .await
                .expect("prune");
        }
    }
}

/// Stops a live run and returns how long the stop call took; panics unless it stopped the run
/// with a checkpoint, so a broken engine cannot report fast numbers.
async fn timed_stop(runtime: &Runtime, run: &RunHandle) -> Duration {
    let begun = Instant::now();
    let reply = runtime
        .stop(run.run_id(), StopMode::graceful())
        .await
        .expect("the run is live");
    let took = begun.elapsed();
    check(reply);
    took
}

fn check(reply: StopReply) {
    match reply {
        StopReply::Stopped(stop) if stop.checkpoint_id.is_some() && stop.interrupted.len() == 1 => {
            black_box(stop);
        }
        other => panic!("the stop did not stop the run as expected: {other:?}"),
    }
}

fn tokio() -> Tokio {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// 1000 measured single stops, one after another; prints percentiles to stderr.
fn percentiles(rt: &Tokio, setup: &Setup) {
    const STOPS: usize = 1000;
    let mut times = rt.block_on(async {
        // Warm up.
        for _ in 0..100 {
            let runs = setup.live_runs(1).await;
            timed_stop(&setup.runtime, &runs[0]).await;
        }
        let mut times = Vec::with_capacity(STOPS);
        for _ in 0..STOPS {
            let runs = setup.live_runs(1).await;
            times.push(timed_stop(&setup.runtime, &runs[0]).await);
        }
        setup.tidy(1).await;
        times
    });
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    eprintln!(
        "stop latency, one run, {STOPS} stops: p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        at(0.50),
        at(0.90),
        at(0.99),
        times[times.len() - 1],
    );
}

fn benches(c: &mut Criterion) {
    let rt = tokio();
    let setup = Arc::new(Setup::new());

    percentiles(&rt, &setup);

    let mut group = c.benchmark_group("stop");
    group
        .sample_size(100)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    group.bench_function("one_run", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let setup = setup.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let runs = setup.live_runs(1).await;
                    total += timed_stop(&setup.runtime, &runs[0]).await;
                }
                setup.tidy(1).await;
                total
            }
        });
    });

    const RUNS: usize = 1000;
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.bench_function(format!("{RUNS}_runs"), |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let setup = setup.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let runs = setup.live_runs(RUNS).await;
                    let begun = Instant::now();
                    let replies = futures::future::join_all(
                        runs.iter()
                            .map(|run| setup.runtime.stop(run.run_id(), StopMode::graceful())),
                    )
                    .await;
                    total += begun.elapsed();
                    for reply in replies {
                        check(reply.expect("the run is live"));
                    }
                    setup.tidy(RUNS).await;
                }
                total
            }
        });
    });
    group.finish();
}

criterion_group!(stop, benches);
criterion_main!(stop);
