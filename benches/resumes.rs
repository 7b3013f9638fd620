//! What a thread costs Redis after many stops and resumes: one thread of a loop agent, stopped
//! in every turn and resumed, 200 times, on a private Redis under `sync` and `async`
//! durability.
//!
//! The workflow is `begin -> turns`, a loop of up to 100,000 iterations whose body is one `turn`
//! node. A turn streams a few chunks and waits for the stop the first time it runs at a path;
//! when it runs at that path again (the resume continues the interrupted iteration) it
//! appends an assistant message of about 100 bytes and ends with it as its output. So each cycle
//! is a graceful stop in the middle of a turn (its partial text kept), then a resume that
//! finishes that turn and starts the next one: after 200 cycles the thread holds 200 finished
//! turns, their messages, and 201 runs.
//!
//! Before the criterion group, a summary goes to stderr per mode: `used_memory` growth from an
//! empty database after 200 cycles (measured after a warm-up cycle on another thread, so the
//! server's script cache and client buffers are there before; it still counts allocator
//! slack), then what the thread's keys hold, split by key kind (`MEMORY USAGE` of every key,
//! grouped by the kind in its name: checkpoint payloads, checkpoint index, checkpoint
//! sequences, run records, run indexes, history, leases and fences, workflow definitions),
//! and the bytes per cycle; then the least, mean and most the keys hold over the cycles around
//! it (every 10 from 3/4 to 5/4 of the count, the thread going on after the count's stop):
//! a chain's compaction falls at a different place in each, which moves what the thread
//! keeps. The criterion group
//! `resumes/<mode>` times one cycle (stop a turn, resume, wait until the next turn runs).
//!
//! `RESUMES` (default 200) sets the number of cycles; `BENCH_COMPACT` (`<every>,<percent>`) the
//! compaction of checkpoint chains, to compare policies. Run with `cargo bench --bench resumes`.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use criterion::{Criterion, criterion_group, criterion_main};
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::{
    BodyDef, Durability, Map, Message, NodeContext, NodeDef, NodeError, NodeHandler, NodeOutput,
    ResumeInput, RunHandle, Runtime, StopMode, ThreadId, Value, Workflow, WorkflowDef, async_trait,
};
use serde_json::json;
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

use common::redis_server::{PrivateRedis, by_kind, flush, info, raw};
use common::{tokio, with_durability};

const TURN: &str = "turn";

fn cycles() -> usize {
    std::env::var("RESUMES")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(200)
}

/// A turn of the agent: interrupted the first time it runs at a path, finished the second.
#[derive(Debug)]
struct Turn {
    /// Paths that already ran once (and were stopped).
    seen: Mutex<HashSet<String>>,
    /// Told each time a turn starts waiting for its stop.
    waiting: mpsc::UnboundedSender<()>,
}

#[async_trait]
impl NodeHandler for Turn {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let path = format!("{}/{}", ctx.thread(), ctx.path());
        let again = !self
            .seen
            .lock()
            .map_err(|_| NodeError::failed("poisoned"))?
            .insert(path.clone());
        if again {
            let text = format!("The answer of turn {path}, finished after the user resumed it.");
            ctx.append_message(Message::assistant(text.clone()));
            let mut out = Map::new();
            out.insert("text".to_owned(), Value::from(text));
            return Ok(NodeOutput::new(Value::Object(out)));
        }
        for chunk in ["Thinking ", "about ", "it"] {
            if ctx.emit(chunk).is_err() {
                return Err(NodeError::Stopped);
            }
        }
        let _ = self.waiting.send(());
        ctx.stopped().await;
        Err(NodeError::Stopped)
    }
}

fn turns(runtime: &Runtime) -> Workflow {
    let def = WorkflowDef::new("turns")
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef {
            params: json!({
                "mode": "condition",
                "max_iterations": 100_000,
                "until": {"conditions": [
                    {"left": "{{l.index}}", "op": "gte", "right": 99_999}
                ]},
                "output": "{{t.text}}"
            }),
            body: Some(BodyDef {
                nodes: vec![NodeDef::new("t", TURN)],
                edges: Vec::new(),
            }),
            ..NodeDef::new("l", "loop")
        })
        .edge("begin", "l");
    runtime.validate(def).expect("turns workflow is valid")
}

struct Agent {
    runtime: Runtime,
    workflow: Workflow,
    waiting: mpsc::UnboundedReceiver<()>,
}

fn agent(stores: &RedisStores, durability: Durability) -> Agent {
    let (tx, waiting) = mpsc::unbounded_channel();
    let runtime = stores
        .install(
            Runtime::builder()
                .handler(
                    TURN,
                    Turn {
                        seen: Mutex::new(HashSet::new()),
                        waiting: tx,
                    },
                )
                .config(with_durability(durability)),
        )
        .build();
    let workflow = turns(&runtime);
    Agent {
        runtime,
        workflow,
        waiting,
    }
}

impl Agent {
    /// Starts the thread and waits until its first turn waits for the stop.
    async fn begin(&mut self, thread: &ThreadId) -> RunHandle {
        let run = self
            .runtime
            .start(&self.workflow, Map::new(), thread.clone())
            .await
            .expect("start");
        self.waiting.recv().await.expect("a turn runs");
        run
    }

    /// Stops the run in its turn, resumes the thread, and waits until the next turn waits.
    async fn cycle(&mut self, run: RunHandle, thread: &ThreadId) -> RunHandle {
        run.stop(StopMode::graceful()).await.expect("stop");
        let outcome = run.wait().await;
        assert!(
            matches!(outcome, runvisor::RunOutcome::Stopped { .. }),
            "the run did not stop: {outcome:?}"
        );
        self.resume(thread).await
    }

    /// Resumes the stopped thread and waits until its next turn waits.
    async fn resume(&mut self, thread: &ThreadId) -> RunHandle {
        let resumed = self
            .runtime
            .resume(thread.clone(), ResumeInput::Continue)
            .await
            .expect("resume");
        self.waiting.recv().await.expect("the next turn runs");
        resumed
    }
}

/// The sum of `MEMORY USAGE` over every key.
async fn keys_total(con: &mut MultiplexedConnection) -> u64 {
    by_kind(con).await.values().map(|(b, _)| b).sum()
}

fn summary(rt: &Tokio, stores: &RedisStores, con: &MultiplexedConnection) {
    let n = cycles();
    let thread = ThreadId::new("resumed").expect("id");
    for (name, durability) in [("sync", Durability::Sync), ("async", Durability::Async)] {
        let mut con = con.clone();
        let mut agent = agent(stores, durability);
        rt.block_on(async {
            // A first cycle on a thread of its own, then an empty database: what the server
            // keeps for any client (its scripts, its buffers) is not counted as the thread's.
            let warm = ThreadId::new("warm-up").expect("id");
            let run = agent.begin(&warm).await;
            let run = agent.cycle(run, &warm).await;
            run.stop(StopMode::graceful()).await.expect("warm-up stop");
            let _ = run.wait().await;
            flush(&mut con).await;
            let before = info(&mut con, "memory", "used_memory").await;
            // The keys' sum every 10 cycles from n - n/4 to n + n/4 (the run waiting in a
            // turn): where in a chain's compaction cycle the count stops moves what the
            // thread keeps (a kept checkpoint keeps its chain back to its base).
            let window = n / 4;
            let in_sweep = |i: usize| i + window >= n && (i + window - n).is_multiple_of(10);
            let mut sweep = Vec::new();
            let started = Instant::now();
            let mut run = agent.begin(&thread).await;
            for i in 1..=n {
                run = agent.cycle(run, &thread).await;
                if in_sweep(i) {
                    sweep.push(keys_total(&mut con).await);
                }
            }
            let took = started.elapsed();
            run.stop(StopMode::graceful()).await.expect("last stop");
            let _ = run.wait().await;
            let after = info(&mut con, "memory", "used_memory").await;
            let held = after.saturating_sub(before);
            eprintln!(
                "resumes {name}: {n} stops and resumes of one thread in {:.1} ms ({:.2} ms each); \
                 Redis holds {:.3} MB for it ({:.0} bytes per cycle, used_memory growth)",
                took.as_secs_f64() * 1e3,
                took.as_secs_f64() * 1e3 / n as f64,
                held as f64 / 1e6,
                held as f64 / n as f64,
            );
            let kinds = by_kind(&mut con).await;
            let total: u64 = kinds.values().map(|(b, _)| b).sum();
            for (kind, (bytes, keys)) in &kinds {
                eprintln!("resumes {name}:   {kind:>10}: {bytes:>8} bytes in {keys:>4} keys");
            }
            eprintln!(
                "resumes {name}: MEMORY USAGE of every key: {:.3} MB",
                total as f64 / 1e6
            );
            run = agent.resume(&thread).await;
            for i in n + 1..=n + window {
                run = agent.cycle(run, &thread).await;
                if in_sweep(i) {
                    sweep.push(keys_total(&mut con).await);
                }
            }
            run.stop(StopMode::graceful())
                .await
                .expect("sweep's last stop");
            let _ = run.wait().await;
            let mb = |b: u64| b as f64 / 1e6;
            eprintln!(
                "resumes {name}: MEMORY USAGE of every key after cycles {} to {} (every 10, a \
                 turn running): min {:.3}, mean {:.3}, max {:.3} MB",
                n - window,
                n + window,
                mb(sweep.iter().copied().min().unwrap_or(0)),
                mb(sweep.iter().sum::<u64>()) / sweep.len().max(1) as f64,
                mb(sweep.iter().copied().max().unwrap_or(0)),
            );
        });
    }
}

fn resumes(c: &mut Criterion) {
    let server = PrivateRedis::start();
    let url = server.url();
    let rt = tokio();
    let stores = rt
        .block_on(RedisStores::connect(RedisConfig::new(url.clone())))
        .expect("connect to the private redis-server");
    let con = rt.block_on(raw(&url));
    summary(&rt, &stores, &con);

    let mut group = c.benchmark_group("resumes");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    for (name, durability) in [("sync", Durability::Sync), ("async", Durability::Async)] {
        let agent = Arc::new(tokio::sync::Mutex::new(agent(&stores, durability)));
        let con = con.clone();
        let samples = Arc::new(std::sync::atomic::AtomicU64::new(0));
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let agent = agent.clone();
                let sample = samples.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut con = con.clone();
                async move {
                    let mut agent = agent.lock().await;
                    // Untimed: an empty database and a thread's first turn.
                    flush(&mut con).await;
                    let thread = ThreadId::new(format!("timed-{sample}")).expect("id");
                    let mut run = agent.begin(&thread).await;
                    let started = Instant::now();
                    for _ in 0..iters {
                        run = agent.cycle(run, &thread).await;
                    }
                    let spent = started.elapsed();
                    run.stop(StopMode::graceful()).await.expect("stop");
                    let _ = run.wait().await;
                    spent
                }
            });
        });
    }
    group.finish();
    drop(stores);
    drop(server);
}

criterion_group!(benches, resumes);
criterion_main!(benches);
