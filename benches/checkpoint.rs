//! Checkpointing costs: the snapshot codec, and whole checkpointed runs against a real Redis.
//!
//! - `snapshot/encode/<size>`, `snapshot/decode/<size>`: the envelope codec on snapshots whose
//!   node outputs total ~1 KiB, 64 KiB and 1 MiB (throughput in bytes);
//! - `delta/<body>_<n>`: one step's delta (computed and encoded) of a snapshot holding a
//!   parallel of `n` items (one more finished), a loop of `n` iterations (one more finished),
//!   or a parallel item in progress whose nested loop has `n` iterations (one more finished),
//!   for `n` of 1,000 and 100,000: a flat cost is the same time and bytes at both sizes (the
//!   bytes are printed to stderr);
//! - `redis/ping`: one PING round trip on a multiplexed connection, the unit the durable runs
//!   are compared with; `redis/checkpoint_put`: one checkpoint store `put` (the Lua script)
//!   of a real mid-chain progress snapshot, as `sync` pays it per node;
//! - `chain_100/<store>_<durability>`: a whole 100-node chain run (start -> wait) on the
//!   private Redis with `sync`, `async` and `exit` durability, and on the in-memory stores (the
//!   baseline) with the same modes. Throughput is 100 elements, so criterion's time per run
//!   divided by 100 is the cost per node (per-run costs included: the run record at the start;
//!   flags, history, final checkpoint and record at the end);
//! - `chain_1000/...`: the same with 1000 nodes; `(t1000 - t100) / 900` is the marginal cost
//!   of a node, with the per-run costs taken out.
//!
//! A private `redis-server` (no persistence, a free loopback port, never 6379) is started for
//! the bench and killed when it ends; `redis-server` must be on the PATH. Redis is flushed
//! between runs, outside the timing, so memory stays flat. Before the groups, the sizes of the
//! chain's snapshots are printed to stderr.
//!
//! Run with `cargo bench --bench checkpoint`.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use runvisor::delta::materialize;
use runvisor::delta::{DeltaLink, SnapshotDelta};
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::snapshot::{
    CompletedNode, FrameState, GraphState, ItemState, IterationDetail, LoopState, ParallelState,
    SavedFrame, Snapshot,
};
use runvisor::store::{RunStatus, StoredCheckpoint};
use runvisor::{CheckpointId, Durability, Map, Route, RunId, RunLabels, Runtime, ThreadId, Value};

use common::redis_server::{PrivateRedis, flush, raw};
use common::{ECHO, Echo, chain, run_chain, tokio, with_durability as config};

/// Nodes in the checkpointed chain.
const CHAIN: usize = 100;
/// Nodes in the long chain, which separates per-run costs from per-node ones.
const LONG_CHAIN: usize = 1000;
/// The durability modes, by name.
const MODES: [(&str, Durability); 3] = [
    ("sync", Durability::Sync),
    ("async", Durability::Async),
    ("exit", Durability::Exit),
];

/// A snapshot whose node outputs total about `bytes`, over eight nodes.
fn snapshot_of(bytes: usize) -> Snapshot {
    let per_node = bytes / 8;
    let completed = (0..8)
        .map(|i| {
            let text: String = (0..per_node)
                .map(|j| char::from(b'a' + ((i + j) % 26) as u8))
                .collect();
            let mut output = Map::new();
            output.insert("text".to_owned(), Value::from(text));
            output.insert("index".to_owned(), Value::Int(i as i64));
            CompletedNode {
                node: runvisor::NodeId::new(format!("n{i}")).expect("id"),
                route: Route::All,
                output: Arc::new(Value::Object(output)),
            }
        })
        .collect();
    Snapshot {
        run_id: RunId::new(),
        parent_run_id: None,
        thread: ThreadId::new("bench").expect("id"),
        sequence: 9,
        created_at_ms: 1,
        status: RunStatus::Running,
        stop_reason: None,
        workflow_hash: "0".repeat(32),
        workflow: Some(Arc::from(r#"{"id":"codec"}"#)),
        inputs: Map::new(),
        query: None,
        variables: Map::new(),
        graph: GraphState {
            completed,
            frontier: vec![runvisor::NodeId::new("n8").expect("id")],
            frames: Vec::new(),
        },
        interactions: Vec::new(),
        pending_messages: Default::default(),
        labels: RunLabels::default(),
        history_len: Some(0),
    }
}

fn node_id(id: &str) -> runvisor::NodeId {
    runvisor::NodeId::new(id).expect("id")
}

/// A loop's progress after `n` iterations of one body node.
fn loop_after(n: usize) -> LoopState {
    LoopState {
        iteration: u32::try_from(n).expect("fits"),
        vars: Map::new(),
        history: (0..n).map(|i| Value::Int(i as i64)).collect(),
        details: (0..n)
            .map(|i| IterationDetail {
                index: u32::try_from(i).expect("fits"),
                nodes: vec![node_id("b")],
            })
            .collect(),
        items: None,
        body: GraphState::default(),
        assigned: Vec::new(),
    }
}

/// The loop after one more iteration.
fn iterate(l: &mut LoopState) {
    l.history.push_back(Value::Int(i64::from(l.iteration)));
    l.details.push_back(IterationDetail {
        index: l.iteration,
        nodes: vec![node_id("b")],
    });
    l.iteration += 1;
}

/// A parallel of `n` items: those before `done` finished, the 16 after them in progress.
fn parallel_at(n: usize, done: usize) -> ParallelState {
    ParallelState {
        items: (0..n).map(|i| Value::Int(i as i64)).collect(),
        results: (0..n)
            .map(|i| (i < done).then_some(Value::Int(i as i64)))
            .collect(),
        done: (0..n).map(|i| i < done).collect(),
        errors: Default::default(),
        in_progress: (done..(done + 16).min(n))
            .map(|i| ItemState {
                index: u32::try_from(i).expect("fits"),
                body: GraphState::default(),
            })
            .collect(),
        assigned: (0..done)
            .map(|i| (u32::try_from(i).expect("fits"), Vec::new()))
            .collect(),
    }
}

/// Item `i` of the parallel finished, and the next one started.
fn finish_item(p: &mut ParallelState, i: usize) {
    p.done.set(i, true);
    p.results.set(i, Some(Value::Int(i as i64)));
    p.assigned
        .push_back((u32::try_from(i).expect("fits"), Vec::new()));
    p.in_progress.retain(|item| item.index as usize != i);
    let next = i + 16;
    if next < p.done.len() {
        p.in_progress.push(ItemState {
            index: u32::try_from(next).expect("fits"),
            body: GraphState::default(),
        });
    }
}

/// Two consecutive progress snapshots of a run in a body of `n`: before and after one more
/// iteration or item finished.
fn body_step(kind: &str, n: usize) -> (Snapshot, Snapshot) {
    let frame = |state| SavedFrame {
        node: node_id("x"),
        state,
    };
    let mut old = snapshot_of(1024);
    let mut new = old.clone();
    new.sequence += 1;
    match kind {
        "parallel" => {
            let half = n / 2;
            let before = parallel_at(n, half);
            let mut after = before.clone();
            finish_item(&mut after, half);
            old.graph.frames = vec![frame(FrameState::Parallel(before))];
            new.graph.frames = vec![frame(FrameState::Parallel(after))];
        }
        "loop" => {
            let before = loop_after(n);
            let mut after = before.clone();
            iterate(&mut after);
            old.graph.frames = vec![frame(FrameState::Loop(before))];
            new.graph.frames = vec![frame(FrameState::Loop(after))];
        }
        _ => {
            // A parallel whose item 0 runs a loop of `n` iterations.
            let inner = loop_after(n);
            let mut outer = parallel_at(16, 0);
            outer.in_progress[0].body.frames = vec![frame(FrameState::Loop(inner))];
            let mut after = outer.clone();
            if let FrameState::Loop(l) = &mut after.in_progress[0].body.frames[0].state {
                iterate(l);
            }
            old.graph.frames = vec![frame(FrameState::Parallel(outer))];
            new.graph.frames = vec![frame(FrameState::Parallel(after))];
        }
    }
    (old, new)
}

/// One step's delta, encoded.
fn step_delta(old: &Snapshot, new: &Snapshot) -> Vec<u8> {
    let link = DeltaLink {
        base: CheckpointId::new(),
        parent: CheckpointId::new(),
    };
    SnapshotDelta::between(old, new, link)
        .encode()
        .expect("encodes")
}

fn deltas(c: &mut Criterion) {
    let mut group = c.benchmark_group("delta");
    configure(&mut group);
    for kind in ["parallel", "loop", "nested_loop"] {
        for n in [1000, 100_000] {
            let (old, new) = body_step(kind, n);
            eprintln!(
                "delta {kind} of {n}: {} bytes for one more finished",
                step_delta(&old, &new).len()
            );
            group.bench_function(format!("{kind}_{n}"), |b| {
                b.iter(|| black_box(step_delta(&old, &new)));
            });
        }
    }
    group.finish();
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
}

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("snapshot");
    configure(&mut group);
    for (name, size) in [("1KiB", 1 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20)] {
        let snapshot = snapshot_of(size);
        let bytes = snapshot.encode().expect("encodes");
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(format!("encode/{name}"), |b| {
            b.iter(|| black_box(snapshot.encode().expect("encodes")));
        });
        group.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| black_box(Snapshot::decode(&bytes).expect("decodes")));
        });
    }
    group.finish();
}

fn durable(c: &mut Criterion) {
    let server = PrivateRedis::start();
    let url = server.url();
    let rt = tokio();
    let stores = rt
        .block_on(RedisStores::connect(RedisConfig::new(url.clone())))
        .expect("connect to the private redis-server");
    let mut con = rt.block_on(raw(&url));
    let thread = ThreadId::new("bench").expect("id");

    // What `sync` writes per node: the progress snapshots of one chain run, by size.
    let probe = stores
        .install(
            Runtime::builder()
                .handler(ECHO, Echo)
                .config(config(Durability::Sync)),
        )
        .build();
    let workflow = chain(&probe, CHAIN);
    rt.block_on(run_chain(&probe, &workflow, &thread, CHAIN));
    let ids = rt.block_on(stores.checkpoints.list(&thread)).expect("list");
    let sizes: Vec<usize> = ids
        .iter()
        .map(|id| {
            rt.block_on(stores.checkpoints.get(&thread, *id))
                .expect("get")
                .expect("listed")
                .bytes
                .len()
        })
        .collect();
    let middle = rt
        .block_on(stores.checkpoints.get(&thread, ids[ids.len() / 2]))
        .expect("get")
        .expect("listed");
    let workflow_json = rt
        .block_on(materialize(&*stores.checkpoints, &thread, &middle))
        .expect("decodes")
        .workflow
        .map_or(0, |w| w.len());
    eprintln!(
        "chain_100 sync: {} snapshots per run, {} to {} bytes (median {}), {} bytes of it the \
         workflow definition; {} bytes written per run",
        sizes.len(),
        sizes.iter().min().copied().unwrap_or(0),
        sizes.iter().max().copied().unwrap_or(0),
        middle.bytes.len(),
        workflow_json,
        sizes.iter().sum::<usize>()
    );
    drop(probe);
    // Redis's own time per checkpoint put (the Lua script), from its command statistics.
    let stats: String = rt
        .block_on(
            ::redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut con.clone()),
        )
        .expect("INFO");
    if let Some(line) = stats.lines().find(|l| l.starts_with("cmdstat_evalsha:")) {
        eprintln!("chain_100 sync, server side: {line}");
    }
    rt.block_on(flush(&mut con));

    let mut group = c.benchmark_group("redis");
    configure(&mut group);
    group.bench_function("ping", |b| {
        b.to_async(&rt).iter(|| {
            let mut con = con.clone();
            async move {
                let _: String = ::redis::cmd("PING")
                    .query_async(&mut con)
                    .await
                    .expect("PONG");
            }
        });
    });
    group.bench_function("checkpoint_put", |b| {
        let store = stores.checkpoints.clone();
        let bytes = middle.bytes.clone();
        let con = con.clone();
        b.to_async(&rt).iter_custom(|iters| {
            let store = store.clone();
            let bytes = bytes.clone();
            let mut con = con.clone();
            async move {
                let run = RunId::new();
                let thread = ThreadId::new("put").expect("id");
                let mut spent = Duration::ZERO;
                for i in 0..iters {
                    if i % 1000 == 0 {
                        // Keep Redis small, untimed.
                        flush(&mut con).await;
                    }
                    let checkpoint = StoredCheckpoint {
                        id: CheckpointId::new(),
                        run,
                        sequence: i + 1,
                        bytes: bytes.clone(),
                        link: None,
                    };
                    let started = Instant::now();
                    store.put(&thread, checkpoint, None).await.expect("put");
                    spent += started.elapsed();
                }
                spent
            }
        });
    });
    group.finish();

    for len in [CHAIN, LONG_CHAIN] {
        let mut group = c.benchmark_group(format!("chain_{len}"));
        configure(&mut group);
        if len == LONG_CHAIN {
            // A sync run of 1000 nodes writes ~100 MB: fewer samples.
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(10));
        }
        group.throughput(Throughput::Elements(len as u64));
        for (name, durability) in MODES {
            let runtime = stores
                .install(
                    Runtime::builder()
                        .handler(ECHO, Echo)
                        .config(config(durability)),
                )
                .build();
            let workflow = chain(&runtime, len);
            let con = con.clone();
            group.bench_function(format!("redis_{name}"), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let runtime = runtime.clone();
                    let workflow = workflow.clone();
                    let thread = thread.clone();
                    let mut con = con.clone();
                    async move {
                        let mut spent = Duration::ZERO;
                        for _ in 0..iters {
                            flush(&mut con).await;
                            let started = Instant::now();
                            run_chain(&runtime, &workflow, &thread, len).await;
                            spent += started.elapsed();
                        }
                        spent
                    }
                });
            });
        }
        for (name, durability) in MODES {
            let runtime = Runtime::builder()
                .handler(ECHO, Echo)
                .config(config(durability))
                .build();
            let workflow = chain(&runtime, len);
            group.bench_function(format!("memory_{name}"), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let runtime = runtime.clone();
                    let workflow = workflow.clone();
                    let thread = thread.clone();
                    async move {
                        let mut spent = Duration::ZERO;
                        for _ in 0..iters {
                            // The in-memory store keeps every checkpoint: drop them, untimed.
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
        group.finish();
    }
    drop(stores);
    drop(server);
}

criterion_group!(checkpoint, codec, deltas, durable);
criterion_main!(checkpoint);
