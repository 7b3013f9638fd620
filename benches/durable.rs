//! Durable cost against run length: chains of 100, 1,000 and 10,000 trivial nodes on a private
//! Redis under `sync` and `async` durability (and on the in-memory stores, the baseline), with
//! the PING round trip measured in the same run.
//!
//! Before the criterion groups, a summary is printed to stderr for each mode. Each chain length
//! runs a few times (five, three from 10,000 nodes), each run between two batches of 500 PINGs
//! (a batch is their mean round trip on a multiplexed connection, sent from a task on the
//! runtime as the engine's writes are). This machine's load moves the round trip from one
//! second to the next, so each run is compared with the PINGs right around it. Per chain length
//! it prints the time per node (median, least and greatest of the runs, and the best) and its
//! ratio to the PING around each run (median, least and greatest), the bytes sent to Redis per
//! node (`total_net_input_bytes`) and the bytes Redis holds after the run (`used_memory`
//! growth); how long restoring the thread's newest delta takes (base and chain read in one
//! script, then applied) and how many deltas that chain has; and the server's own time per call
//! of the busiest commands (`INFO commandstats`), the part of a write's cost spent inside
//! Redis, with the scripts' time as a ratio to the PING: a script's round trip takes at least
//! one PING plus that, the floor under a `sync` node whatever the engine does. Under `sync` it splits each run's time in two, measured together: the store's part
//! (its awaited writes, from each one's first attempt to the store's answer, as the engine
//! tells a `CheckpointObserver`) and the engine's part (the rest), each per node and as a
//! ratio to the PING around the run. After each run it also times the store alone: 500 delta
//! puts of the chain's newest delta's size, back to back from a task on the runtime with no
//! engine around them, fenced by a lease as a run's are (the floor of a `sync` node),
//! followed by one more PING batch, and
//! prints their time, their ratio to the PINGs around them, and how much longer a write took
//! within the run than a put of the store alone right after it. Then, per mode, the median of
//! every PING batch and, from the best runs, the marginal cost per node from 100 to 1,000 and from 1,000 to 10,000
//! nodes, in time (and as a ratio to that median PING) and in round trips (from each run's
//! ratio to its own PINGs), and the ratio of the two marginals to one another (flat cost:
//! close to 1).
//!
//! The summary runs once per placement of the bench and its server (see
//! [`common::placement`]): `apart` (Redis on a CPU of its own, the bench on the others, as a
//! deployment runs it) and `together` (both on one CPU) by default. Left unpinned, the kernel
//! moves the two between those placements from one second to the next, and a PING batch and
//! the run beside it can be measured in different ones: on two-CPU virtual machines the round
//! trip is about 15 µs together and 80-100 µs apart, so a ratio of the two would be noise.
//!
//! `DURABLE_PLACEMENT` (comma-separated `apart`, `together`, `free`) picks the placements, the
//! first of them also the criterion groups' (unpinned when it is not set); `DURABLE_SIZES`
//! (comma-separated, default `100,1000,10000`) picks the chain lengths;
//! `DURABLE_MODES` (default `sync,async`) the durability modes; `DURABLE_COMPACT`
//! (`<every>,<percent>`, default the runtime's) the compaction of checkpoint chains
//! (`checkpoint_compact_every`, `checkpoint_compact_percent`), to compare policies: `64,100`
//! compacts every 64 deltas. The criterion groups
//! `durable_chain_<len>/<store>_<mode>` time whole runs (start -> wait), 10 samples each.
//!
//! Run with `cargo bench --bench durable`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use runvisor::delta::{DeltaLink, materialize};
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::store::StoredCheckpoint;
use runvisor::{
    CheckpointId, CheckpointObserver, Durability, LeaseHolder, RunId, Runtime, ThreadId, WorkerId,
};
use tokio::runtime::Runtime as Tokio;

use common::placement::Placement;
use common::redis_server::{PrivateRedis, command_times, flush, info, raw, reset_stats};
use common::{ECHO, Echo, chain, compact_from_env, run_chain, tokio, with_durability};

fn sizes() -> Vec<usize> {
    std::env::var("DURABLE_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 1000, 10_000])
}

/// The runtime config of a mode, with `DURABLE_COMPACT`'s compaction when set.
fn config(durability: Durability) -> runvisor::RuntimeConfig {
    let mut config = with_durability(durability);
    compact_from_env("DURABLE_COMPACT", &mut config);
    config
}

fn modes() -> Vec<(&'static str, Durability)> {
    let wanted = std::env::var("DURABLE_MODES").unwrap_or_else(|_| "sync,async".into());
    [("sync", Durability::Sync), ("async", Durability::Async)]
        .into_iter()
        .filter(|(name, _)| wanted.split(',').any(|w| w.trim() == *name))
        .collect()
}

/// PINGs per batch: one batch right before and one right after each measured run.
const PING_BATCH: u32 = 500;
/// Delta puts the store alone makes after each `sync` run.
const STORE_PUTS: u64 = 500;

/// The median of some figures.
fn median(figures: &[f64]) -> f64 {
    let mut sorted = figures.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The mean PING round trip in µs over `n` pings, sent from a task on the bench's runtime as the
/// engine's writes are: a PING awaited on the thread outside the runtime (`block_on`) would
/// add two hand-overs between threads to every round trip and flatter the ratio.
async fn ping_rtt(con: &MultiplexedConnection, n: u32) -> f64 {
    let mut con = con.clone();
    tokio::spawn(async move {
        for _ in 0..100 {
            let _: String = ::redis::cmd("PING")
                .query_async(&mut con)
                .await
                .expect("PONG");
        }
        let started = Instant::now();
        for _ in 0..n {
            let _: String = ::redis::cmd("PING")
                .query_async(&mut con)
                .await
                .expect("PONG");
        }
        started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    })
    .await
    .expect("the PING task")
}

/// The time the store took for a runtime's awaited checkpoint writes (every write but the
/// background ones of `async`), as the engine tells its [`CheckpointObserver`] when each write
/// ends: from its first attempt to the store's answer. Summed over one run, it splits the run's
/// time into the store's part and the engine's, measured together.
#[derive(Default)]
struct AwaitedWrites {
    nanos: AtomicU64,
}

impl CheckpointObserver for AwaitedWrites {
    fn written(&self, mode: &'static str, _bytes: usize, took: Duration, _stored: bool) {
        if mode != "async" {
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            self.nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }
}

impl AwaitedWrites {
    /// The total time in µs of the writes since the last call; starts counting again.
    fn take(&self) -> f64 {
        self.nanos.swap(0, Ordering::Relaxed) as f64 / 1e3
    }
}

/// What one chain length cost on Redis: the best time per node, the median of its tries'
/// ratios to the PING around them, and bytes sent and held per node.
struct Measured {
    len: usize,
    per_node: f64,
    ratio: f64,
    sent_per_node: f64,
    held_per_node: f64,
}

/// One try of a chain length: its time per node and the PING round trip around it (the mean
/// of a batch right before and one right after), and under `sync` the store alone right after.
struct Try {
    per_node: f64,
    ping: f64,
    /// The awaited writes of the run, in µs per node.
    writes: f64,
    alone: Option<Alone>,
}

/// The store alone after a `sync` run: the size of each delta put, the time per put, and the
/// PING round trip around the puts (the batch right after the run and one right after them).
struct Alone {
    bytes: usize,
    per_put: f64,
    ping: f64,
}

/// Median, least and greatest of some figures, as `median (least-greatest)`.
fn spread(figures: &[f64], digits: usize) -> String {
    let least = figures.iter().copied().fold(f64::MAX, f64::min);
    let greatest = figures.iter().copied().fold(f64::MIN, f64::max);
    format!(
        "{:.digits$} ({least:.digits$}-{greatest:.digits$})",
        median(figures)
    )
}

fn summary(
    rt: &Tokio,
    stores: &RedisStores,
    con: &MultiplexedConnection,
    redis: &PrivateRedis,
    placements: &[Placement],
) {
    let thread = ThreadId::new("durable").expect("id");
    for (placement, (mode, durability)) in placements
        .iter()
        .flat_map(|p| modes().into_iter().map(move |m| (*p, m)))
    {
        placement.apply(redis.pid());
        let name = format!("{mode} [{placement}]");
        let name = name.as_str();
        let awaited = Arc::new(AwaitedWrites::default());
        let runtime = stores
            .install(
                Runtime::builder()
                    .handler(ECHO, Echo)
                    .config(config(durability))
                    .checkpoint_observer(awaited.clone()),
            )
            .build();
        let mut con = con.clone();
        let compact = config(durability);
        eprintln!(
            "durable {name}: chains compacted after {} deltas or {}% of their base",
            compact.checkpoint_compact_every, compact.checkpoint_compact_percent
        );
        let mut measured = Vec::new();
        // Every PING measured in this mode, for its median.
        let mut pings = Vec::new();
        for len in sizes() {
            let workflow = chain(&runtime, len);
            let tries = if len < 10_000 { 5 } else { 3 };
            let mut runs = Vec::new();
            let (mut sent, mut held) = (0u64, 0u64);
            let mut server = Vec::new();
            for _ in 0..tries {
                rt.block_on(async {
                    flush(&mut con).await;
                    // The round trip right before and right after each run: this machine's
                    // load moves it from one second to the next.
                    let before = ping_rtt(&con, PING_BATCH).await;
                    reset_stats(&mut con).await;
                    let mem_before = info(&mut con, "memory", "used_memory").await;
                    let in_before = info(&mut con, "stats", "total_net_input_bytes").await;
                    awaited.take();
                    let started = Instant::now();
                    run_chain(&runtime, &workflow, &thread, len).await;
                    let took = started.elapsed().as_secs_f64() * 1e6 / len as f64;
                    let writes = awaited.take();
                    let in_after = info(&mut con, "stats", "total_net_input_bytes").await;
                    let mem_after = info(&mut con, "memory", "used_memory").await;
                    server = command_times(&mut con).await;
                    let after = ping_rtt(&con, PING_BATCH).await;
                    pings.extend([before, after]);
                    sent = in_after.saturating_sub(in_before);
                    held = mem_after.saturating_sub(mem_before);
                    // The store alone, between the same kind of PINGs, right after the chain.
                    let mut alone = None;
                    if durability == Durability::Sync
                        && let Some(delta) = newest_delta(stores, &thread).await
                    {
                        let bytes = delta.bytes.len();
                        let per_put = store_alone(stores, delta.bytes, STORE_PUTS).await;
                        let again = ping_rtt(&con, PING_BATCH).await;
                        pings.push(again);
                        alone = Some(Alone {
                            bytes,
                            per_put,
                            ping: (after + again) / 2.0,
                        });
                    }
                    runs.push(Try {
                        per_node: took,
                        ping: (before + after) / 2.0,
                        writes: writes / len as f64,
                        alone,
                    });
                });
            }
            rt.block_on(restore_time(stores, &thread, name, len));
            let ratios: Vec<f64> = runs.iter().map(|t| t.per_node / t.ping).collect();
            let per_node: Vec<f64> = runs.iter().map(|t| t.per_node).collect();
            let best = per_node.iter().copied().fold(f64::MAX, f64::min);
            eprintln!(
                "durable {name} chain {len}: {} µs/node over {tries} runs, best {best:.1}; \
                 {}x the PING around each run ({} µs); {:.0} bytes sent to Redis per node, \
                 {:.0} bytes held per node",
                spread(&per_node, 1),
                spread(&ratios, 2),
                spread(&runs.iter().map(|t| t.ping).collect::<Vec<_>>(), 1),
                sent as f64 / len as f64,
                held as f64 / len as f64,
            );
            let busiest: Vec<String> = server
                .iter()
                .filter(|(name, ..)| name != "info")
                .take(3)
                .map(|(name, calls, us)| format!("{name} {calls} calls at {us:.1} µs"))
                .collect();
            eprintln!(
                "durable {name} chain {len}: server time per call: {}",
                busiest.join(", ")
            );
            // A round trip to a script takes at least a PING's plus the script's own time
            // inside Redis: the floor under a `sync` node, whatever the engine does.
            if let (Some((_, calls, us)), Some(last)) = (
                server.iter().find(|(name, ..)| name == "evalsha"),
                runs.last(),
            ) {
                eprintln!(
                    "durable {name} chain {len}: the scripts' own time inside Redis (mostly \
                     checkpoint puts, {calls} calls in the last run) is {us:.1} µs per call, \
                     {:.2}x the PING around that run: no script's round trip there took less \
                     than {:.2}x the PING",
                    us / last.ping,
                    1.0 + us / last.ping,
                );
            }
            if durability == Durability::Sync {
                let of = |f: fn(&Try) -> f64| -> Vec<f64> { runs.iter().map(f).collect() };
                eprintln!(
                    "durable {name} chain {len}: within each run, its awaited writes took {} \
                     µs per node ({}x the PING around the run) and the engine around them {} \
                     µs per node ({}x)",
                    spread(&of(|t| t.writes), 1),
                    spread(&of(|t| t.writes / t.ping), 2),
                    spread(&of(|t| t.per_node - t.writes), 1),
                    spread(&of(|t| (t.per_node - t.writes) / t.ping), 2),
                );
            }
            let alone: Vec<(&Try, &Alone)> = runs
                .iter()
                .filter_map(|t| t.alone.as_ref().map(|a| (t, a)))
                .collect();
            if let Some((_, first)) = alone.first() {
                let of = |f: fn(&Try, &Alone) -> f64| -> Vec<f64> {
                    alone.iter().map(|(t, a)| f(t, a)).collect()
                };
                eprintln!(
                    "durable {name} chain {len}: the store alone, {STORE_PUTS} delta puts of \
                     {} bytes back to back after each run: {} µs per put, {}x the PING \
                     around them; a write within the run took {}x a put of the store alone \
                     right after it",
                    first.bytes,
                    spread(&of(|_, a| a.per_put), 1),
                    spread(&of(|_, a| a.per_put / a.ping), 2),
                    spread(&of(|t, a| t.writes / a.per_put), 2),
                );
            }
            measured.push(Measured {
                len,
                per_node: best,
                ratio: median(&ratios),
                sent_per_node: sent as f64 / len as f64,
                held_per_node: held as f64 / len as f64,
            });
        }
        let rtt_us = median(&pings);
        eprintln!(
            "durable {name}: PING round trip {rtt_us:.1} µs (median of {} batches of \
             {PING_BATCH}, from {:.1} to {:.1})",
            pings.len(),
            pings.iter().copied().fold(f64::MAX, f64::min),
            pings.iter().copied().fold(0.0, f64::max),
        );
        let mut marginals = Vec::new();
        for pair in measured.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let marginal = |of: fn(&Measured) -> f64| {
                (of(b) * b.len as f64 - of(a) * a.len as f64) / (b.len - a.len) as f64
            };
            let (time, round_trips) = (marginal(|m| m.per_node), marginal(|m| m.ratio));
            eprintln!(
                "durable {name} marginal {}->{}: {time:.1} µs/node ({:.2}x the mode's median \
                 PING); in round trips, from each run's own PING: {round_trips:.2}; bytes sent \
                 per node {:.0} -> {:.0}, held {:.0} -> {:.0}",
                a.len,
                b.len,
                time / rtt_us,
                a.sent_per_node,
                b.sent_per_node,
                a.held_per_node,
                b.held_per_node,
            );
            marginals.push((time, round_trips));
        }
        if let [first, second, ..] = marginals[..] {
            eprintln!(
                "durable {name}: marginal ratio (second / first) {:.2} in time, {:.2} in round \
                 trips",
                second.0 / first.0,
                second.1 / first.1,
            );
        }
        rt.block_on(flush(&mut con));
    }
}

/// Prints how long restoring the thread's newest delta takes (best of 5): its base and its
/// chain read (one script) and applied.
async fn restore_time(stores: &RedisStores, thread: &ThreadId, name: &str, len: usize) {
    let store = &*stores.checkpoints;
    let Some(stored) = newest_delta(stores, thread).await else {
        eprintln!("durable {name} chain {len}: no delta kept to restore");
        return;
    };
    let mut best = Duration::MAX;
    let mut chain = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let snapshot = materialize(store, thread, &stored)
            .await
            .expect("materializes");
        best = best.min(started.elapsed());
        chain = snapshot.graph.completed.len();
    }
    let deltas = store
        .chain(thread, stored.id, 10_000)
        .await
        .expect("chain")
        .len()
        .saturating_sub(1);
    eprintln!(
        "durable {name} chain {len}: restoring its newest delta ({deltas} deltas on a base, \
         {chain} completed nodes) takes {:.2} ms",
        best.as_secs_f64() * 1e3
    );
}

/// The thread's newest checkpoint that is a delta, if it keeps one.
async fn newest_delta(stores: &RedisStores, thread: &ThreadId) -> Option<StoredCheckpoint> {
    let store = &*stores.checkpoints;
    let ids = store.list(thread).await.expect("list");
    for id in ids.into_iter().rev() {
        let stored = store.get(thread, id).await.expect("get").expect("listed");
        if stored.link.is_some() {
            return Some(stored);
        }
    }
    None
}

/// The store alone: the mean time in µs of `n` delta puts, back to back from a task on the
/// runtime, each chained to the one before on one base and fenced by a lease taken for them
/// (the fenced script a `sync` node pays, without the engine), with `bytes` as every delta's
/// payload.
async fn store_alone(stores: &RedisStores, bytes: Vec<u8>, n: u64) -> f64 {
    let store = stores.checkpoints.clone();
    let leases = stores.leases.clone();
    tokio::spawn(async move {
        let thread = ThreadId::new("durable-store").expect("id");
        let run = RunId::new();
        let holder = LeaseHolder {
            worker: WorkerId::new("durable-store").expect("id"),
            run,
        };
        let lease = leases
            .acquire(&thread, &holder, Duration::from_secs(600))
            .await
            .expect("the store-alone thread is free")
            .lease;
        let fence = Some(lease.fence);
        let base = CheckpointId::new();
        let whole = StoredCheckpoint {
            id: base,
            run,
            sequence: 1,
            bytes: bytes.clone(),
            link: None,
        };
        store.put(&thread, whole, fence).await.expect("base put");
        let mut parent = base;
        let started = Instant::now();
        for sequence in 2..n + 2 {
            let id = CheckpointId::new();
            let delta = StoredCheckpoint {
                id,
                run,
                sequence,
                bytes: bytes.clone(),
                link: Some(DeltaLink { base, parent }),
            };
            store.put(&thread, delta, fence).await.expect("delta put");
            parent = id;
        }
        let per_put = started.elapsed().as_secs_f64() * 1e6 / n as f64;
        leases
            .release(&thread, &lease)
            .await
            .expect("release the store-alone thread");
        per_put
    })
    .await
    .expect("the store's task")
}

fn durable(c: &mut Criterion) {
    let server = PrivateRedis::start();
    let url = server.url();
    let rt = tokio();
    let stores = rt
        .block_on(RedisStores::connect(RedisConfig::new(url.clone())))
        .expect("connect to the private redis-server");
    let con = rt.block_on(raw(&url));
    let placements = Placement::from_env(
        "DURABLE_PLACEMENT",
        &[Placement::Apart, Placement::Together],
    );
    summary(&rt, &stores, &con, &server, &placements);
    // The criterion groups run in the first placement `DURABLE_PLACEMENT` names, or unpinned
    // (every CPU for the runtime, as in-memory runs elsewhere are measured).
    let criterion_placement = if std::env::var_os("DURABLE_PLACEMENT").is_some() {
        placements.first().copied().unwrap_or(Placement::Free)
    } else {
        Placement::Free
    };
    criterion_placement.apply(server.pid());

    let thread = ThreadId::new("durable").expect("id");
    for len in sizes() {
        let mut group = c.benchmark_group(format!("durable_chain_{len}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(if len >= 10_000 { 20 } else { 5 }))
            .throughput(Throughput::Elements(len as u64));
        for (name, durability) in modes() {
            let redis = stores
                .install(
                    Runtime::builder()
                        .handler(ECHO, Echo)
                        .config(config(durability)),
                )
                .build();
            let memory = Runtime::builder()
                .handler(ECHO, Echo)
                .config(config(durability))
                .build();
            for (store, runtime) in [("redis", redis), ("memory", memory)] {
                let workflow = chain(&runtime, len);
                let con = con.clone();
                group.bench_function(format!("{store}_{name}"), |b| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let runtime = runtime.clone();
                        let workflow = workflow.clone();
                        let thread = thread.clone();
                        let mut con = con.clone();
                        async move {
                            let mut spent = Duration::ZERO;
                            for _ in 0..iters {
                                // Untimed: Redis emptied, in-memory checkpoints dropped.
                                flush(&mut con).await;
                                let _ = runtime.checkpoint_store().prune(&thread, 0).await;
                                let started = Instant::now();
                                run_chain(&runtime, &workflow, &thread, len).await;
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
    drop(stores);
    drop(server);
}

criterion_group!(benches, durable);
criterion_main!(benches);
