//! Loops and parallels against their length under each durability mode (`exit`, `async`,
//! `sync`), on the in-memory stores and on a private Redis: is the cost per iteration or item
//! flat, and the memory bounded?
//!
//! Before the criterion groups, a summary is printed to stderr: for each store, body kind
//! (a condition loop of N iterations, a parallel of N items 16 at a time, both with one
//! trivial body node) and mode, per N one run's time per iteration or item, the process's peak
//! RSS during that run (`VmHWM` of `/proc/self/status`, reset before each run through
//! `/proc/self/clear_refs`), the checkpoint writes (count, median and largest size, total
//! bytes; a delta is the median, a compacted base the largest), and on Redis the memory the
//! thread's keys take after the run (`used_memory` growth; the final checkpoint, the chain
//! kept by retention and the run's records) and `MEMORY USAGE` of those keys by the kind in
//! their names (`cp`, `cpidx`, `hist`, `run`...); then the marginal cost per iteration from the
//! first N to the second and from the second to the third, and their ratio (flat cost: close
//! to 1).
//!
//! `BODIES_SIZES` (comma-separated, default `1000,10000,100000`) picks the lengths of the
//! summary; `BODIES_MODES` (default `exit,async,sync`) the durability modes; `BODIES_KINDS`
//! (default `loop,parallel`); `BODIES_STORES` (default `memory,redis`). The criterion groups
//! `bodies_<kind>_<n>/<store>_<mode>` time whole runs for the lengths in
//! `BODIES_CRITERION_SIZES` (default `1000,10000`; 100k runs are measured once, in the
//! summary), 10 samples each.
//!
//! Run with `cargo bench --bench bodies`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::{CheckpointObserver, Durability, Runtime, ThreadId, Value, Workflow};
use tokio::runtime::Runtime as Tokio;

use common::redis_server::{PrivateRedis, by_kind, flush, info, raw};
use common::{ECHO, Echo, counted_loop, run_once, tokio, wide_parallel, with_durability};

/// How many items of a parallel run at once.
const CONCURRENCY: usize = 16;

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn sizes(var: &str, default: &str) -> Vec<usize> {
    list(var, default)
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
}

fn modes() -> Vec<(&'static str, Durability)> {
    let wanted = list("BODIES_MODES", "exit,async,sync");
    [
        ("exit", Durability::Exit),
        ("async", Durability::Async),
        ("sync", Durability::Sync),
    ]
    .into_iter()
    .filter(|(name, _)| wanted.iter().any(|w| w == name))
    .collect()
}

fn kinds() -> Vec<String> {
    list("BODIES_KINDS", "loop,parallel")
}

fn stores() -> Vec<String> {
    list("BODIES_STORES", "memory,redis")
}

/// Sizes of the checkpoints a runtime wrote.
#[derive(Default)]
struct Writes(Mutex<Vec<usize>>);

impl CheckpointObserver for Writes {
    fn written(&self, _mode: &'static str, bytes: usize, _took: Duration, stored: bool) {
        if stored && let Ok(mut sizes) = self.0.lock() {
            sizes.push(bytes);
        }
    }
}

impl Writes {
    fn take(&self) -> Vec<usize> {
        self.0
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}

/// A field of `/proc/self/status` in kB.
fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(&format!("{field}:")))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Resets the peak RSS to the current RSS (Linux: writing 5 to `clear_refs`).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The workflow of a kind and length, and the check of its outcome.
fn body(runtime: &Runtime, kind: &str, n: usize) -> Workflow {
    match kind {
        "loop" => counted_loop(runtime, u32::try_from(n).expect("fits")),
        _ => wide_parallel(runtime, n, CONCURRENCY),
    }
}

/// Runs the body once; panics unless it completed with every iteration or item.
async fn run_body(runtime: &Runtime, workflow: &Workflow, thread: &ThreadId, kind: &str, n: usize) {
    let last = Value::from(n - 1);
    match kind {
        "loop" => {
            run_once(runtime, workflow, thread, |o| {
                let l = o.output("l");
                l.and_then(|l| l.get("iterations")) == Some(&Value::from(n))
                    && l.and_then(|l| l.get("history"))
                        .and_then(|h| h.as_array())
                        .and_then(|h| h.last())
                        == Some(&last)
            })
            .await
        }
        _ => {
            run_once(runtime, workflow, thread, |o| {
                let p = o.output("p");
                p.and_then(|p| p.get("count")) == Some(&Value::from(n))
                    && p.and_then(|p| p.get("results"))
                        .and_then(|r| r.as_array())
                        .and_then(|r| r.last())
                        == Some(&last)
            })
            .await
        }
    }
}

/// One runtime per store and mode, with its checkpoint writes observed.
fn runtime(
    store: &str,
    durability: Durability,
    redis: &RedisStores,
    writes: &Arc<Writes>,
) -> Runtime {
    let builder = Runtime::builder()
        .handler(ECHO, Echo)
        .config(with_durability(durability))
        .checkpoint_observer(writes.clone());
    match store {
        "redis" => redis.install(builder).build(),
        _ => builder.build(),
    }
}

fn summary(rt: &Tokio, redis: &RedisStores, con: &MultiplexedConnection) {
    let thread = ThreadId::new("bodies").expect("id");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("bodies: load average {}", load.trim());
    for store in stores() {
        for kind in kinds() {
            let kind_of_body = kind.as_str();
            for (mode, durability) in modes() {
                let writes = Arc::new(Writes::default());
                let runtime = runtime(&store, durability, redis, &writes);
                let mut measured: Vec<(usize, f64)> = Vec::new();
                for n in sizes("BODIES_SIZES", "1000,10000,100000") {
                    let workflow = body(&runtime, &kind, n);
                    let mut con = con.clone();
                    let (took, held, kinds) = rt.block_on(async {
                        flush(&mut con).await;
                        let _ = runtime.checkpoint_store().prune(&thread, 0).await;
                        let mem_before = info(&mut con, "memory", "used_memory").await;
                        writes.take();
                        reset_peak();
                        let started = Instant::now();
                        run_body(&runtime, &workflow, &thread, &kind, n).await;
                        let took = started.elapsed();
                        let mem_after = info(&mut con, "memory", "used_memory").await;
                        let kinds = if store == "redis" {
                            by_kind(&mut con).await
                        } else {
                            Default::default()
                        };
                        (took, mem_after.saturating_sub(mem_before), kinds)
                    });
                    let peak_mb = status_kb("VmHWM") as f64 / 1024.0;
                    let mut sizes = writes.take();
                    sizes.sort_unstable();
                    let median = sizes.get(sizes.len() / 2).copied().unwrap_or(0);
                    let largest = sizes.last().copied().unwrap_or(0);
                    let total: usize = sizes.iter().sum();
                    let per = took.as_secs_f64() * 1e6 / n as f64;
                    let redis_part = if store == "redis" {
                        format!(", Redis holds {:.1} MB after it", held as f64 / 1e6)
                    } else {
                        String::new()
                    };
                    eprintln!(
                        "bodies {store} {kind} {mode} {n}: {per:.1} µs each ({:.2} s), peak RSS \
                         {peak_mb:.0} MB, {} checkpoints (median {median} B, largest {largest} \
                         B, {:.1} MB in all){redis_part}",
                        took.as_secs_f64(),
                        sizes.len(),
                        total as f64 / 1e6,
                    );
                    for (kind, (bytes, keys)) in &kinds {
                        eprintln!(
                            "bodies {store} {kind_name} {mode} {n}:   {kind:>10}: {:.2} MB in \
                             {keys} keys ({:.0} B per iteration)",
                            *bytes as f64 / 1e6,
                            *bytes as f64 / n as f64,
                            kind_name = kind_of_body,
                        );
                    }
                    measured.push((n, per));
                }
                let mut marginals = Vec::new();
                for pair in measured.windows(2) {
                    let ((a, pa), (b, pb)) = (pair[0], pair[1]);
                    let marginal = (pb * b as f64 - pa * a as f64) / (b - a) as f64;
                    eprintln!(
                        "bodies {store} {kind} {mode} marginal {a}->{b}: {marginal:.1} µs each"
                    );
                    marginals.push(marginal);
                }
                if let [first, second, ..] = marginals[..] {
                    eprintln!(
                        "bodies {store} {kind} {mode}: marginal ratio (second / first) {:.2}",
                        second / first
                    );
                }
            }
        }
    }
}

fn bodies(c: &mut Criterion) {
    let server = PrivateRedis::start();
    let url = server.url();
    let rt = tokio();
    let redis = rt
        .block_on(RedisStores::connect(RedisConfig::new(url.clone())))
        .expect("connect to the private redis-server");
    let con = rt.block_on(raw(&url));
    summary(&rt, &redis, &con);

    let thread = ThreadId::new("bodies").expect("id");
    for kind in kinds() {
        for n in sizes("BODIES_CRITERION_SIZES", "1000,10000") {
            let mut group = c.benchmark_group(format!("bodies_{kind}_{n}"));
            group
                .sample_size(10)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(if n >= 10_000 { 10 } else { 3 }))
                .throughput(Throughput::Elements(n as u64));
            for store in stores() {
                for (mode, durability) in modes() {
                    let writes = Arc::new(Writes::default());
                    let runtime = runtime(&store, durability, &redis, &writes);
                    let workflow = body(&runtime, &kind, n);
                    let con = con.clone();
                    let kind = kind.clone();
                    group.bench_function(format!("{store}_{mode}"), |b| {
                        b.to_async(&rt).iter_custom(|iters| {
                            let runtime = runtime.clone();
                            let workflow = workflow.clone();
                            let thread = thread.clone();
                            let mut con = con.clone();
                            let writes = writes.clone();
                            let kind = kind.clone();
                            async move {
                                let mut spent = Duration::ZERO;
                                for _ in 0..iters {
                                    // Untimed: Redis emptied, in-memory checkpoints dropped.
                                    flush(&mut con).await;
                                    let _ = runtime.checkpoint_store().prune(&thread, 0).await;
                                    writes.take();
                                    let started = Instant::now();
                                    run_body(&runtime, &workflow, &thread, &kind, n).await;
                                    spent += started.elapsed();
                                }
                                spent
                            }
                        });
                    });
                }
            }
            group.finish();
        }
    }
    drop(redis);
    drop(server);
}

criterion_group!(benches, bodies);
criterion_main!(benches);
