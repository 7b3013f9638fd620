//! Stop-from-anywhere benchmarks on a real `redis-server` that the bench starts itself (the
//! integration tests' harness, on a free loopback port, never 6379), with every store and the
//! signal source on Redis.
//!
//! Printed percentiles (stderr; criterion reports medians and means, not tails), each over
//! 200 stops of a live run whose node cooperates (it waits on `ctx.stopped()`), the flags set
//! at phases spread over the watcher's 100 ms tick:
//!
//! - `published`: another process (its own connection) sets the FastGPT flag and publishes
//!   the notice; timed from before the `SET` to the run's `StopResult`;
//! - `polled`: the same without the notice, so the watcher's 100 ms tick finds the flag;
//! - `request`: another runtime's `request_stop` (set, publish, wait for the run's end), timed
//!   until it answers `ended`.
//!
//! Then 10,000 idle live runs (20,000 flags) join the runtime: the time of one `read` of all
//! their flags (client side, and Redis's own time from `INFO commandstats`) is the watcher's
//! cost per tick, and the `published` and `polled` stops are measured again among them.
//!
//! Then the same crowd on a 3-master Redis Cluster (the tests' cluster harness: three
//! `redis-server`s joined by `redis-cli --cluster create`, on free loopback ports): the time of
//! one `read` of its 20,000 flags (grouped by slot, one pipeline per node, every node at once)
//! and Redis's time per tick summed over the nodes. The single-server crowd is shut down first.
//!
//! Criterion groups: `signals/stop_published`, `signals/read_20000_flags`,
//! `signals/stop_published_among_10000_runs`, `signals/read_20000_flags_cluster`.
//!
//! Run with `cargo bench --bench signals`.

#[allow(dead_code)]
#[path = "../tests/redis/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../tests/redis/cluster_support.rs"]
mod cluster_support;

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use runvisor::redis::RedisStores;
use runvisor::store::Notice;
use runvisor::{
    Map, NodeContext, NodeError, NodeHandler, NodeOutput, RunHandle, RunLabels, Runtime,
    StopReason, ThreadId, Value, Workflow, async_trait, render_key,
};
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

use common::{COOPERATIVE, Cooperative};

use cluster_support::RedisCluster;
use support::RedisServer;

/// Stops per printed percentile line.
const STOPS: usize = 200;
/// Idle live runs for the per-tick cost.
const CROWD: usize = 10_000;

/// Waits for the stop, counting the runs that reached it.
#[derive(Debug, Default)]
struct Idle {
    started: Arc<AtomicUsize>,
}

#[async_trait]
impl NodeHandler for Idle {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        ctx.stopped().await;
        Err(NodeError::Stopped)
    }
}

/// How the flag reaches the watcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// `SET` and `PUBLISH` from another process.
    Published,
    /// `SET` only: the tick finds it.
    Polled,
    /// Another runtime's `request_stop`, timed until it answers.
    Request,
}

struct Setup {
    server: RedisServer,
    /// The worker process: its runtime runs everything measured.
    worker: Runtime,
    /// Another process: its own connections, its own runtime.
    other: RedisStores,
    api: Runtime,
    measured: Workflow,
    idle: Workflow,
    crowd: Arc<AtomicUsize>,
    running: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
    next: AtomicUsize,
}

fn load(runtime: &Runtime, kind: &str) -> Workflow {
    runtime
        .load_json(&format!(
            r#"{{"id": "{kind}", "nodes": [
                {{"id": "start", "kind": "begin"}},
                {{"id": "node", "kind": "{kind}"}}
            ], "edges": [{{"from": "start", "to": "node"}}]}}"#
        ))
        .expect("bench workflow is valid")
}

impl Setup {
    async fn new() -> Self {
        let server = RedisServer::start();
        let stores = support::stores(&server).await;
        let (tx, rx) = mpsc::unbounded_channel();
        let idle = Idle::default();
        let crowd = idle.started.clone();
        let worker = stores
            .install(Runtime::builder())
            .handler(COOPERATIVE, Cooperative { running: tx })
            .handler("idle", idle)
            .build();
        let other = support::stores(&server).await;
        let api = other.install(Runtime::builder()).build();
        Self {
            server,
            measured: load(&worker, "cooperative"),
            idle: load(&worker, "idle"),
            worker,
            other,
            api,
            crowd,
            running: tokio::sync::Mutex::new(rx),
            next: AtomicUsize::new(0),
        }
    }

    /// Starts a run labelled with a fresh chat id and waits until its node runs.
    async fn live_run(&self) -> (RunHandle, String) {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let chat = format!("c{i}");
        let run = self
            .worker
            .start_with(
                &self.measured,
                Map::new(),
                ThreadId::new(format!("bench-{i}")).expect("valid thread id"),
                RunLabels::app_chat("bench", chat.clone()).expect("valid labels"),
            )
            .await
            .expect("run starts");
        tokio::time::timeout(Duration::from_secs(10), self.running.lock().await.recv())
            .await
            .expect("the node runs within 10 s")
            .expect("the runtime holds the sender");
        (run, chat)
    }

    /// Stops a live run the given way, `phase` after it started (outside the timing); returns
    /// the time from the first command to the end.
    async fn timed_stop(&self, way: Way, phase: Duration) -> Duration {
        let (run, chat) = self.live_run().await;
        tokio::time::sleep(phase).await;
        let key = format!("agent_runtime_stopping:bench:{chat}");
        let signals = &self.other.signals;
        let begun = Instant::now();
        let took = match way {
            Way::Published | Way::Polled => {
                signals
                    .raise(&key, Duration::from_secs(60))
                    .await
                    .expect("raise");
                if way == Way::Published {
                    signals
                        .notify(&Notice { key, raised: true })
                        .await
                        .expect("notify");
                }
                let outcome = run.wait().await;
                let took = begun.elapsed();
                check(outcome.stop_result());
                took
            }
            Way::Request => {
                let request = self.api.request_stop("bench", &chat).await;
                let took = begun.elapsed();
                assert!(request.ended && request.error.is_none(), "{request:?}");
                check(run.wait().await.stop_result());
                took
            }
        };
        black_box(took)
    }

    /// Starts [`CROWD`] idle runs without labels (two native flags each) and returns their
    /// flags' keys.
    async fn start_crowd(&self) -> Vec<String> {
        start_crowd(&self.worker, &self.idle, &self.crowd).await
    }
}

/// Starts [`CROWD`] idle runs of `idle` without labels (two native flags each), waits until
/// `started` counts them all, and returns their flags' keys.
async fn start_crowd(worker: &Runtime, idle: &Workflow, started: &AtomicUsize) -> Vec<String> {
    let config = &worker.config().signals;
    let mut keys = Vec::with_capacity(2 * CROWD);
    for i in 0..CROWD {
        let thread = ThreadId::new(format!("crowd-{i}")).expect("valid thread id");
        let run = worker
            .start(idle, Map::new(), thread.clone())
            .await
            .expect("run starts");
        keys.extend(
            config
                .stop_keys
                .iter()
                .chain(&config.cancel_keys)
                .filter_map(|t| {
                    render_key(
                        t,
                        &config.prefix,
                        &RunLabels::default(),
                        Some(&thread),
                        Some(run.run_id()),
                    )
                }),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while started.load(Ordering::SeqCst) < CROWD {
        assert!(
            Instant::now() < deadline,
            "the crowd did not start in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    keys
}

/// The crowd on a 3-master cluster: its own runtime, stores and keys.
struct ClusterCrowd {
    cluster: RedisCluster,
    worker: Runtime,
    keys: Vec<String>,
}

impl ClusterCrowd {
    async fn new(cluster: RedisCluster) -> Self {
        let stores = cluster_support::cluster_stores(&cluster).await;
        let idle = Idle::default();
        let started = idle.started.clone();
        let worker = stores
            .install(Runtime::builder())
            .handler("idle", idle)
            .build();
        let workflow = load(&worker, "idle");
        let begun = Instant::now();
        let keys = start_crowd(&worker, &workflow, &started).await;
        eprintln!(
            "{CROWD} idle live runs started on the cluster in {:?}",
            begun.elapsed()
        );
        Self {
            cluster,
            worker,
            keys,
        }
    }

    /// `calls` and `usec` of MGET summed over the cluster's nodes.
    async fn mget_stats(&self) -> (u64, u64) {
        let mut total = (0, 0);
        for node in self.cluster.nodes() {
            let (calls, usec) = mget_stats_of(node).await;
            total.0 += calls;
            total.1 += usec;
        }
        total
    }

    /// The watcher's cost per tick on the cluster, as [`tick_cost`] measures it on one server.
    async fn tick_cost(&self) {
        let signals = self.worker.signal_source();
        let mut times = Vec::with_capacity(STOPS);
        for _ in 0..STOPS {
            let begun = Instant::now();
            let flags = signals.read(&self.keys).await.expect("read");
            times.push(begun.elapsed());
            assert_eq!(flags.len(), self.keys.len());
        }
        let slots: std::collections::HashSet<u16> = self
            .keys
            .iter()
            .map(|k| runvisor::redis::hash_slot(k.as_bytes()))
            .collect();
        eprintln!(
            "one read of {} flags on a 3-master cluster ({} MGETs, one per slot, one pipeline \
             per node), {STOPS} reads: {}",
            self.keys.len(),
            slots.len(),
            summary(times)
        );
        let (calls, usec) = self.mget_stats().await;
        let window = Duration::from_secs(3);
        tokio::time::sleep(window).await;
        let (calls2, usec2) = self.mget_stats().await;
        let ticks = (calls2 - calls) / slots.len().max(1) as u64;
        eprintln!(
            "watcher with {CROWD} live runs on the cluster: {ticks} ticks in {window:?}, Redis \
             busy {:.2} ms per tick summed over the nodes ({:.2} us per MGET)",
            (usec2 - usec) as f64 / ticks.max(1) as f64 / 1000.0,
            (usec2 - usec) as f64 / (calls2 - calls).max(1) as f64,
        );
    }
}

fn check(stop: Option<&runvisor::StopResult>) {
    match stop {
        Some(stop)
            if stop.reason == StopReason::UserInterrupted && stop.checkpoint_id.is_some() =>
        {
            black_box(stop);
        }
        other => panic!("the flag did not stop the run as expected: {other:?}"),
    }
}

fn tokio() -> Tokio {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// p50, p90, p99 and max of some durations, as one line.
fn summary(mut times: Vec<Duration>) -> String {
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    format!(
        "p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        at(0.50),
        at(0.90),
        at(0.99),
        times[times.len() - 1]
    )
}

/// Prints the percentiles of [`STOPS`] stops made one way (after a few for warm-up).
///
/// Each flag is set at another point of the watcher's tick (0 to 99 ms after the run
/// started, stepping by 37 ms): stopping right after the previous stop would always land
/// just after a tick (the one that found the previous flag) and measure the worst case only.
async fn stop_percentiles(setup: &Setup, way: Way, label: &str) {
    let phase = |i: usize| Duration::from_millis((i as u64 * 37) % 100);
    for i in 0..10 {
        setup.timed_stop(way, phase(i)).await;
    }
    let mut times = Vec::with_capacity(STOPS);
    for i in 0..STOPS {
        times.push(setup.timed_stop(way, phase(i)).await);
    }
    eprintln!("stop latency, {label}, {STOPS} stops: {}", summary(times));
}

/// `calls` and `usec` of MGET in Redis's `INFO commandstats`.
async fn mget_stats(setup: &Setup) -> (u64, u64) {
    mget_stats_of(&setup.server).await
}

/// `calls` and `usec` of MGET in one server's `INFO commandstats`.
async fn mget_stats_of(server: &RedisServer) -> (u64, u64) {
    let mut con = support::raw(server).await;
    let info: String = support::cmd(&mut con, &["INFO", "commandstats"]).await;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_mget:"))
            .and_then(|stats| {
                stats
                    .split(',')
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            })
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// The watcher's cost per tick with the crowd live: the client's time for one read of every
/// flag, and Redis's own time per tick over a few seconds of ticking.
async fn tick_cost(setup: &Setup, keys: &[String]) {
    let signals = &setup.worker.signal_source();
    let mut times = Vec::with_capacity(STOPS);
    for _ in 0..STOPS {
        let begun = Instant::now();
        let flags = signals.read(keys).await.expect("read");
        times.push(begun.elapsed());
        assert_eq!(flags.len(), keys.len());
    }
    eprintln!(
        "one read of {} flags ({} MGETs of up to {} keys, one round trip), {STOPS} reads: {}",
        keys.len(),
        keys.len().div_ceil(runvisor::redis::signal::READ_BATCH),
        runvisor::redis::signal::READ_BATCH,
        summary(times)
    );
    let (calls, usec) = mget_stats(setup).await;
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let (calls2, usec2) = mget_stats(setup).await;
    let batches = keys.len().div_ceil(runvisor::redis::signal::READ_BATCH) as u64;
    let ticks = (calls2 - calls) / batches;
    eprintln!(
        "watcher with {CROWD} live runs: {ticks} ticks in {window:?}, Redis busy {:.2} ms per tick \
         ({:.2} us per MGET)",
        (usec2 - usec) as f64 / ticks.max(1) as f64 / 1000.0,
        (usec2 - usec) as f64 / (calls2 - calls).max(1) as f64,
    );
}

fn benches(c: &mut Criterion) {
    let rt = tokio();
    let setup = Arc::new(rt.block_on(Setup::new()));

    rt.block_on(async {
        stop_percentiles(&setup, Way::Published, "published (SET + PUBLISH)").await;
        stop_percentiles(&setup, Way::Polled, "polled (SET only, 100 ms tick)").await;
        stop_percentiles(&setup, Way::Request, "request_stop from another runtime").await;
    });

    let mut group = c.benchmark_group("signals");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    group.bench_function("stop_published", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let setup = setup.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += setup.timed_stop(Way::Published, Duration::ZERO).await;
                }
                total
            }
        });
    });

    let keys = Arc::new(rt.block_on(async {
        let begun = Instant::now();
        let keys = setup.start_crowd().await;
        eprintln!("{CROWD} idle live runs started in {:?}", begun.elapsed());
        tick_cost(&setup, &keys).await;
        stop_percentiles(&setup, Way::Published, "published, among 10,000 live runs").await;
        stop_percentiles(&setup, Way::Polled, "polled, among 10,000 live runs").await;
        keys
    }));

    group.bench_function("read_20000_flags", |b| {
        b.to_async(&rt).iter(|| {
            let setup = setup.clone();
            let keys = keys.clone();
            async move {
                let flags = setup
                    .worker
                    .signal_source()
                    .read(&keys)
                    .await
                    .expect("read");
                black_box(flags)
            }
        });
    });
    group.bench_function("stop_published_among_10000_runs", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let setup = setup.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += setup.timed_stop(Way::Published, Duration::ZERO).await;
                }
                total
            }
        });
    });

    // The same crowd on a cluster, alone: the single server's runs end first.
    rt.block_on(setup.worker.shutdown());
    drop(setup);
    let cluster = RedisCluster::start();
    let crowd = Arc::new(rt.block_on(ClusterCrowd::new(cluster)));
    rt.block_on(crowd.tick_cost());
    group.bench_function("read_20000_flags_cluster", |b| {
        b.to_async(&rt).iter(|| {
            let crowd = crowd.clone();
            async move {
                let flags = crowd
                    .worker
                    .signal_source()
                    .read(&crowd.keys)
                    .await
                    .expect("read");
                black_box(flags)
            }
        });
    });
    group.finish();
}

criterion_group!(signals, benches);
criterion_main!(signals);
