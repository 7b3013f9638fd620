//! Host kinds and workflows the benchmarks share: a trivial `echo` node, chains of them, and a
//! `cooperative` node that waits for the stop; and the allocator they all use.

// Each bench target uses part of this module.
#![allow(dead_code)]

/// The benches allocate as the `runvisor` binary does (feature `mimalloc`, on by default);
/// `--no-default-features` measures the system allocator instead.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub(crate) mod placement;
pub(crate) mod redis_server;

use runvisor::{
    BodyDef, Map, NodeContext, NodeDef, NodeError, NodeHandler, NodeOutput, RunOutcome, Runtime,
    ThreadId, Value, Workflow, WorkflowDef, async_trait,
};
use serde_json::json;
use tokio::sync::mpsc;

/// The host kind every trivial node uses.
pub(crate) const ECHO: &str = "echo";

/// The cooperative host kind.
pub(crate) const COOPERATIVE: &str = "cooperative";

/// A trivial host handler: outputs `{"value": <its resolved "x" param>}`. It never waits, and
/// says so ([`NodeHandler::never_blocks`]), as a host's cheap step does; with `BENCH_ECHO_TASK`
/// set it does not, and every echo runs in a task of its own, as a host kind that may block.
#[derive(Debug)]
pub(crate) struct Echo;

/// Whether `BENCH_ECHO_TASK` is set.
static ECHO_IN_TASK: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("BENCH_ECHO_TASK").is_some());

#[async_trait]
impl NodeHandler for Echo {
    fn never_blocks(&self) -> bool {
        !*ECHO_IN_TASK
    }

    async fn run(&self, input: Value, _ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let mut out = Map::new();
        out.insert(
            "value".to_owned(),
            input.get("x").cloned().unwrap_or_default(),
        );
        Ok(NodeOutput::new(Value::Object(out)))
    }
}

/// `begin -> n1 -> ... -> n{len}`; `n1` has `x: 1`, every later node `x: "{{n<i-1>.value}}"`,
/// so every node resolves a reference to its predecessor's output.
pub(crate) fn chain(runtime: &Runtime, len: usize) -> Workflow {
    runtime
        .validate(chain_def(len))
        .expect("chain workflow is valid")
}

/// The definition [`chain`] validates.
pub(crate) fn chain_def(len: usize) -> WorkflowDef {
    let mut def = WorkflowDef::new(format!("chain-{len}")).node(NodeDef::new("begin", "begin"));
    let mut prev = "begin".to_owned();
    for i in 1..=len {
        let id = format!("n{i}");
        let x = if i == 1 {
            json!(1)
        } else {
            json!(format!("{{{{{prev}.value}}}}"))
        };
        def = def
            .node(NodeDef::new(&id, ECHO).param("x", x))
            .edge(&prev, &id);
        prev = id;
    }
    def
}

/// Says it is running, waits for the stop, and returns `Stopped` at once.
#[derive(Debug)]
pub(crate) struct Cooperative {
    pub(crate) running: mpsc::UnboundedSender<()>,
}

#[async_trait]
impl NodeHandler for Cooperative {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let _ = self.running.send(());
        ctx.stopped().await;
        Err(NodeError::Stopped)
    }
}

/// A multi-threaded tokio runtime for a bench.
pub(crate) fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The default runtime settings with this durability, and the compaction of checkpoint
/// chains `BENCH_COMPACT` names when set (see [`compact_from_env`]).
pub(crate) fn with_durability(durability: runvisor::Durability) -> runvisor::RuntimeConfig {
    let mut config = runvisor::RuntimeConfig {
        durability,
        ..runvisor::RuntimeConfig::default()
    };
    compact_from_env("BENCH_COMPACT", &mut config);
    config
}

/// Sets the compaction of checkpoint chains from the variable `var`, `<every>,<percent>`
/// (`checkpoint_compact_every`, `checkpoint_compact_percent`), when it is set: `64,100`
/// compacts every 64 deltas or once they outweigh their base.
pub(crate) fn compact_from_env(var: &str, config: &mut runvisor::RuntimeConfig) {
    let Ok(compact) = std::env::var(var) else {
        return;
    };
    let mut parts = compact.split(',').map(|n| n.trim().parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(every)), Some(Ok(percent))) => {
            config.checkpoint_compact_every = every;
            config.checkpoint_compact_percent = percent;
        }
        _ => panic!("{var} is `<every>,<percent>`, not {compact:?}"),
    }
}

/// One run of [`chain`] of `len` nodes; panics unless it completed with the expected last
/// output.
pub(crate) async fn run_chain(
    runtime: &Runtime,
    workflow: &Workflow,
    thread: &runvisor::ThreadId,
    len: usize,
) {
    let run = runtime
        .start(workflow, Map::new(), thread.clone())
        .await
        .expect("start");
    let outcome = run.wait().await;
    let last = format!("n{len}");
    match &outcome {
        runvisor::RunOutcome::Completed { .. }
            if outcome.output(&last).and_then(|o| o.get("value")) == Some(&Value::Int(1)) => {}
        other => panic!("the chain did not complete: {other:?}"),
    }
}

/// One whole run; panics unless it completed and `check` holds for its outcome, so a broken
/// engine cannot report fast numbers.
pub(crate) async fn run_once(
    runtime: &Runtime,
    workflow: &Workflow,
    thread: &ThreadId,
    check: impl Fn(&RunOutcome) -> bool,
) {
    let handle = runtime
        .start(workflow, Map::new(), thread.clone())
        .await
        .expect("run starts");
    let outcome = handle.wait().await;
    match &outcome {
        RunOutcome::Completed { .. } if check(&outcome) => {}
        other => panic!("run did not complete as expected: {other:?}"),
    }
    std::hint::black_box(outcome);
}

/// `begin -> l`: a condition loop of `iterations` iterations (`until` its index reaches the
/// last one), whose body is one trivial node reading the iteration's index.
pub(crate) fn counted_loop(runtime: &Runtime, iterations: u32) -> Workflow {
    let def = WorkflowDef::new(format!("loop-{iterations}"))
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef {
            params: json!({
                "mode": "condition",
                "max_iterations": iterations,
                "until": {"conditions": [
                    {"left": "{{l.index}}", "op": "gte", "right": iterations - 1}
                ]},
                "output": "{{b.value}}"
            }),
            body: Some(BodyDef {
                nodes: vec![NodeDef::new("b", ECHO).param("x", "{{l.index}}")],
                edges: Vec::new(),
            }),
            ..NodeDef::new("l", "loop")
        })
        .edge("begin", "l");
    runtime.validate(def).expect("loop workflow is valid")
}

/// `begin -> p`: a parallel over `items` numbers, `concurrency` at a time, whose body is one
/// trivial node reading the item.
pub(crate) fn wide_parallel(runtime: &Runtime, items: usize, concurrency: usize) -> Workflow {
    let def = WorkflowDef::new(format!("parallel-{items}"))
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef {
            params: json!({
                "items": (0..items).collect::<Vec<_>>(),
                "max_concurrency": concurrency,
                "output": "{{b.value}}"
            }),
            body: Some(BodyDef {
                nodes: vec![NodeDef::new("b", ECHO).param("x", "{{p.item}}")],
                edges: Vec::new(),
            }),
            ..NodeDef::new("p", "parallel")
        })
        .edge("begin", "p");
    runtime.validate(def).expect("parallel workflow is valid")
}
