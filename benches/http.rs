//! The service over HTTP on loopback, in one process with its client (in-memory stores):
//!
//! - `http/ten_nodes`: start-to-finish of a 10-node run: the library call
//!   (`Runtime::start` + `wait` of a validated workflow) against `POST /v1/runs` with
//!   `"wait": true` (the request carries the workflow, which the service parses and validates);
//!   their difference is what the service adds;
//! - 1,000 streamed runs held at once (`"stream": true`): each run's node emits a chunk every
//!   100 ms for 5 s, stamped with when it was emitted; the client reads every stream and
//!   measures each chunk's delay from its emission to its arrival (p50, p99, max), and the
//!   resident memory the 1,000 held runs add (server and client together: an upper bound of
//!   the service's share);
//! - stop via FastGPT's `POST /api/v2/chat/stop` with 1,000 live runs: 2,000 runs are started
//!   (each with its own `chatId`), then 1,000 of them are stopped one after another, each
//!   answer arriving once its run ended (quiesced): p50, p99 and max of the answer time, while
//!   at least 1,000 other runs stay live.
//!
//! The streamed-runs and stop figures are printed to stderr before the criterion group
//! (criterion reports medians and means, not tails). Run with `cargo bench --bench http`.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use runvisor::serve::{ServeConfig, Service};
use runvisor::{
    NodeContext, NodeDef, NodeError, NodeHandler, NodeOutput, RunStatus, Runtime, ThreadId, Value,
    Workflow, WorkflowDef, async_trait,
};
use serde_json::json;
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

use common::{COOPERATIVE, Cooperative, ECHO, Echo, chain_def};

/// The kind of the streamed runs' node.
const TICKER: &str = "ticker";
/// How many runs are held or live at once.
const RUNS: usize = 1000;
/// The pause between two chunks of a streamed run.
const TICK: Duration = Duration::from_millis(100);
/// How many chunks each streamed run emits.
const TICKS: u32 = 50;

/// Emits `TICKS` chunks, `TICK` apart, each the nanoseconds since `epoch` when it was emitted.
#[derive(Debug)]
struct Ticker {
    epoch: Instant,
}

#[async_trait]
impl NodeHandler for Ticker {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let mut next = tokio::time::Instant::now();
        for _ in 0..TICKS {
            next += TICK;
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = ctx.stopped() => return Err(NodeError::Stopped),
            }
            let _ = ctx.emit(self.epoch.elapsed().as_nanos().to_string());
        }
        Ok(NodeOutput::new(json!({"ticks": TICKS})))
    }
}

/// A service on a loopback port, and a client for it.
struct Host {
    service: Service,
    address: SocketAddr,
    client: reqwest::Client,
    epoch: Instant,
    running: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
}

impl Host {
    async fn start() -> Self {
        let epoch = Instant::now();
        let (tx, rx) = mpsc::unbounded_channel();
        let runtime = Runtime::builder()
            .handler(ECHO, Echo)
            .handler(COOPERATIVE, Cooperative { running: tx })
            .handler(TICKER, Ticker { epoch })
            .build();
        let service = Service::new(runtime, None, &ServeConfig::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("bound address");
        let router = service.router();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .await
                .expect("the bench service serves");
        });
        Self {
            service,
            address,
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(2 * RUNS)
                .build()
                .expect("an HTTP client"),
            epoch,
            running: tokio::sync::Mutex::new(rx),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    fn runtime(&self) -> &Runtime {
        self.service.runtime()
    }

    /// `POST /v1/runs` with `body`; the JSON answer.
    async fn post(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let response = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("the service answers");
        assert!(
            response.status().is_success(),
            "{path} answered {}",
            response.status()
        );
        response.json().await.expect("a JSON answer")
    }

    /// Waits until `count` cooperative nodes run.
    async fn wait_running(&self, count: usize) {
        let mut running = self.running.lock().await;
        for _ in 0..count {
            tokio::time::timeout(Duration::from_secs(60), running.recv())
                .await
                .expect("the node runs within 60 s")
                .expect("the runtime holds the sender");
        }
    }
}

/// The resident memory of this process, in bytes (Linux), or 0 where it cannot be read.
fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// The value at quantile `q` of sorted `values`.
fn quantile(values: &[Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let index = ((values.len() - 1) as f64 * q).round() as usize;
    values[index.min(values.len() - 1)]
}

fn print_quantiles(what: &str, values: &mut [Duration]) {
    values.sort_unstable();
    eprintln!(
        "{what}: n={} p50={:?} p99={:?} max={:?}",
        values.len(),
        quantile(values, 0.5),
        quantile(values, 0.99),
        values.last().copied().unwrap_or_default(),
    );
}

/// Reads one SSE stream to its end; the delays of its `node_chunk` events.
async fn read_stream(response: reqwest::Response, epoch: Instant) -> Vec<Duration> {
    let mut delays = Vec::with_capacity(TICKS as usize);
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    while let Some(Ok(bytes)) = body.next().await {
        let arrived = epoch.elapsed();
        buffer.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if !block.contains("event: node_chunk") {
                continue;
            }
            let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<serde_json::Value>(data) else {
                continue;
            };
            let Some(emitted) = event["text"].as_str().and_then(|t| t.parse::<u64>().ok()) else {
                continue;
            };
            delays.push(arrived.saturating_sub(Duration::from_nanos(emitted)));
        }
    }
    delays
}

/// 1,000 streamed runs held at once: the chunk delays and the memory they add.
async fn streamed_runs(host: &Arc<Host>) {
    let workflow = WorkflowDef::new("ticker")
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef::new("tick", TICKER))
        .edge("begin", "tick");
    let body = json!({"workflow": workflow, "stream": true});
    let before = rss_bytes();
    let mut streams = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let response = host
            .client
            .post(host.url("/v1/runs"))
            .json(&body)
            .send()
            .await
            .expect("the service answers");
        assert!(
            response.status().is_success(),
            "start: {}",
            response.status()
        );
        let epoch = host.epoch;
        streams.push(tokio::spawn(read_stream(response, epoch)));
    }
    // Every run holds its stream while its node ticks: read the memory half-way through.
    tokio::time::sleep(TICK * TICKS / 2).await;
    let held = rss_bytes().saturating_sub(before);
    let mut delays = Vec::with_capacity(RUNS * TICKS as usize);
    for stream in streams {
        delays.extend(stream.await.expect("the reader ends"));
    }
    eprintln!(
        "http/sse_1000_runs: {} streams held, {:.1} KiB resident per run (server and client)",
        RUNS,
        held as f64 / 1024.0 / RUNS as f64
    );
    print_quantiles("http/sse_1000_runs chunk delay", &mut delays);
}

/// FastGPT stops with at least 1,000 other runs live: the time to each answer.
async fn fastgpt_stops(host: &Arc<Host>) {
    let workflow = WorkflowDef::new("wait")
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef::new("wait", COOPERATIVE))
        .edge("begin", "wait");
    for i in 0..2 * RUNS {
        let body = json!({"workflow": workflow, "app": "bench", "chat": format!("c{i}")});
        host.post("/v1/runs", &body).await;
    }
    host.wait_running(2 * RUNS).await;
    let mut answers = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let body = json!({"appId": "bench", "chatId": format!("c{i}")});
        let started = Instant::now();
        let answer = host.post("/api/v2/chat/stop", &body).await;
        answers.push(started.elapsed());
        assert_eq!(answer, json!({"success": true}), "stop of c{i}");
    }
    print_quantiles(
        "http/fastgpt_stop with 1000 live runs (request to run quiesced)",
        &mut answers,
    );
    for (run, reply) in host.runtime().shutdown().await {
        reply.unwrap_or_else(|e| panic!("run {run} did not stop: {e}"));
    }
}

fn bench(c: &mut Criterion) {
    let tokio = Tokio::new().expect("tokio runtime");
    let host = Arc::new(tokio.block_on(Host::start()));

    tokio.block_on(streamed_runs(&host));
    tokio.block_on(fastgpt_stops(&host));

    let def = chain_def(9);
    let workflow: Workflow = host
        .runtime()
        .validate(def.clone())
        .expect("chain workflow is valid");
    let body = json!({"workflow": def, "wait": true});
    let mut group = c.benchmark_group("http/ten_nodes");
    group.bench_function("library", |b| {
        b.to_async(&tokio).iter(|| async {
            let run = host
                .runtime()
                .start(&workflow, Default::default(), ThreadId::generate())
                .await
                .expect("run starts");
            let outcome = run.wait().await;
            assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:?}");
        });
    });
    group.bench_function("http_wait", |b| {
        b.to_async(&tokio).iter(|| async {
            let answer = host.post("/v1/runs", &body).await;
            assert_eq!(answer["status"], "succeeded", "{answer}");
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
