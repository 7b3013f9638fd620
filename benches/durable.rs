//! Durable cost against run length: chains of 100, 1,000 and 10,000 trivial nodes on a private
//! Redis under `sync` and `async` durability (and on the in-memory stores, the baseline), with
//! the PING round trip measured in the same run.
//!
//! Before the criterion groups, a summary is printed to stderr for each mode: per chain length
//! the best of a few runs in µs per node, as a ratio to the PING round trip measured right
//! before those runs (the median of their batches; a batch is the mean of 1,000 PINGs on a
//! multiplexed connection, sent from a task on the runtime as the engine's writes are: this
//! machine's load moves it), the bytes sent to Redis per node
//! (`total_net_input_bytes`) and the bytes Redis holds after the run (`used_memory` growth);
//! then the median PING of the mode and, against it, the marginal cost per node from 100 to
//! 1,000 and from 1,000 to 10,000 nodes, and their ratio to one another (flat cost: close
//! to 1). After each chain length it prints how
//! long restoring the thread's newest delta takes (base and chain read in one script, then
//! applied) and how many deltas that chain has, and the server's own time per call of the
//! busiest commands (`INFO commandstats`), the part of a write's cost spent inside Redis.
//! Under `sync` it then times the store alone: 1,000 delta puts of the chain's newest delta's
//! size, back to back from a task on the runtime with no engine around them (the floor of a
//! `sync` node, as a ratio to the same PING), and the engine's part of a node (the best time
//! per node less that).
//!
//! `DURABLE_SIZES` (comma-separated, default `100,1000,10000`) picks the chain lengths;
//! `DURABLE_MODES` (default `sync,async`) the durability modes; `DURABLE_COMPACT`
//! (`<every>,<percent>`, default the runtime's) the compaction of checkpoint chains
//! (`checkpoint_compact_every`, `checkpoint_compact_percent`), to compare policies: `64,100`
//! compacts every 64 deltas. The criterion groups
//! `durable_chain_<len>/<store>_<mode>` time whole runs (start -> wait), 10 samples each.
//!
//! Run with `cargo bench --bench durable`.

mod common;

use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use runvisor::delta::{DeltaLink, materialize};
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::store::StoredCheckpoint;
use runvisor::{CheckpointId, Durability, RunId, Runtime, ThreadId};
use tokio::runtime::Runtime as Tokio;

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

/// The median of some figures.
fn median(figures: &[f64]) -> f64 {
    let mut sorted = figures.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The mean PING round trip over `n` pings, sent from a task on the bench's runtime as the
/// engine's writes are: a PING awaited on the thread outside the runtime (`block_on`) would
/// add two hand-overs between threads to every round trip and flatter the ratio.
async fn ping_rtt(con: &MultiplexedConnection, n: u32) -> Duration {
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
        started.elapsed() / n
    })
    .await
    .expect("the PING task")
}

/// What one chain length cost on Redis: best time per node, bytes sent and held per node.
struct Measured {
    len: usize,
    per_node: f64,
    sent_per_node: f64,
    held_per_node: f64,
}

fn summary(rt: &Tokio, stores: &RedisStores, con: &MultiplexedConnection) {
    let thread = ThreadId::new("durable").expect("id");
    for (name, durability) in modes() {
        let runtime = stores
            .install(
                Runtime::builder()
                    .handler(ECHO, Echo)
                    .config(config(durability)),
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
            let tries = if len >= 10_000 { 2 } else { 3 };
            let mut best = f64::MAX;
            let (mut sent, mut held) = (0u64, 0u64);
            let mut server = Vec::new();
            for _ in 0..tries {
                rt.block_on(async {
                    flush(&mut con).await;
                    // The round trip right before each run: the machine's load changes it.
                    pings.push(ping_rtt(&con, 1000).await.as_secs_f64() * 1e6);
                    reset_stats(&mut con).await;
                    let mem_before = info(&mut con, "memory", "used_memory").await;
                    let in_before = info(&mut con, "stats", "total_net_input_bytes").await;
                    let started = Instant::now();
                    run_chain(&runtime, &workflow, &thread, len).await;
                    let took = started.elapsed().as_secs_f64() * 1e6 / len as f64;
                    let in_after = info(&mut con, "stats", "total_net_input_bytes").await;
                    let mem_after = info(&mut con, "memory", "used_memory").await;
                    if took < best {
                        best = took;
                    }
                    sent = in_after.saturating_sub(in_before);
                    held = mem_after.saturating_sub(mem_before);
                    server = command_times(&mut con).await;
                });
            }
            rt.block_on(restore_time(stores, &thread, name, len));
            let rtt_us = median(&pings[pings.len() - tries..]);
            eprintln!(
                "durable {name} chain {len}: {best:.1} µs/node ({:.2}x PING of {rtt_us:.1} µs), \
                 {:.0} bytes sent to Redis per node, {:.0} bytes held per node",
                best / rtt_us,
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
            if durability == Durability::Sync
                && let Some(delta) = rt.block_on(newest_delta(stores, &thread))
            {
                let size = delta.bytes.len();
                let put = rt.block_on(store_alone(stores, delta.bytes, 1000));
                let put_us = put.as_secs_f64() * 1e6;
                eprintln!(
                    "durable {name} chain {len}: the store alone, 1,000 delta puts of {} bytes \
                     back to back: {put_us:.1} µs per put ({:.2}x PING); the engine's part of a \
                     node: {:.1} µs",
                    size,
                    put_us / rtt_us,
                    best - put_us,
                );
            }
            measured.push(Measured {
                len,
                per_node: best,
                sent_per_node: sent as f64 / len as f64,
                held_per_node: held as f64 / len as f64,
            });
        }
        let rtt_us = median(&pings);
        eprintln!(
            "durable {name}: PING round trip {rtt_us:.1} µs (median of {} batches of 1,000, \
             from {:.1} to {:.1})",
            pings.len(),
            pings.iter().copied().fold(f64::MAX, f64::min),
            pings.iter().copied().fold(0.0, f64::max),
        );
        let mut marginals = Vec::new();
        for pair in measured.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let total = |m: &Measured| m.per_node * m.len as f64;
            let marginal = (total(b) - total(a)) / (b.len - a.len) as f64;
            eprintln!(
                "durable {name} marginal {}->{}: {marginal:.1} µs/node ({:.2}x PING); bytes \
                 sent per node {:.0} -> {:.0}, held {:.0} -> {:.0}",
                a.len,
                b.len,
                marginal / rtt_us,
                a.sent_per_node,
                b.sent_per_node,
                a.held_per_node,
                b.held_per_node,
            );
            marginals.push(marginal);
        }
        if let [first, second, ..] = marginals[..] {
            eprintln!(
                "durable {name}: marginal ratio (second / first) {:.2}",
                second / first
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
        .range(
            thread,
            stored.link.map_or(stored.id, |l| l.base),
            stored.id,
            10_000,
        )
        .await
        .expect("range")
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

/// The store alone: the mean time of `n` delta puts, back to back from a task on the
/// runtime, each chained to the one before on one base (the fenced script a `sync` node
/// pays, without the engine), with `bytes` as every delta's payload.
async fn store_alone(stores: &RedisStores, bytes: Vec<u8>, n: u64) -> Duration {
    let store = stores.checkpoints.clone();
    tokio::spawn(async move {
        let thread = ThreadId::new("durable-store").expect("id");
        let run = RunId::new();
        let base = CheckpointId::new();
        let whole = StoredCheckpoint {
            id: base,
            run,
            sequence: 1,
            bytes: bytes.clone(),
            link: None,
        };
        store.put(&thread, whole, None).await.expect("base put");
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
            store.put(&thread, delta, None).await.expect("delta put");
            parent = id;
        }
        started.elapsed() / n as u32
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
    summary(&rt, &stores, &con);

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
