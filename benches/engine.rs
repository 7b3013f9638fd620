//! Engine overhead benchmarks: whole runs (start -> wait) of trivial-node workflows on the
//! in-memory stores, so what is measured is the engine's cost per node (actor spawn and
//! supervision, scheduling, reference resolution, events), not handler work.
//!
//! Run with `cargo bench --bench engine`. Each benchmark reports time per run; chains and
//! fan-outs also set `Throughput::Elements(nodes)` so criterion prints nodes per second, and
//! loops and parallels `Throughput::Elements(iterations or items)` (per-iteration cost is the
//! time per run divided by the iterations). `interactive/pause_resume` is one run paused at a
//! form plus the resume that answers it and completes. `validate/10k_nodes` and
//! `validate/100k_nodes` validate a chain (no run): the ratio of the two shows how validation
//! scales with the workflow's size.
//! Every run asserts it completed with the expected outputs, so a broken engine cannot report
//! fast numbers. The in-memory stores keep every run's record and final checkpoint, so memory
//! grows over a bench; that is part of what an embedded runtime pays.

mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main,
};
use runvisor::{
    Map, NodeDef, ResumeInput, RunOutcome, Runtime, ThreadId, Value, Workflow, WorkflowDef,
};
use serde_json::json;
use tokio::runtime::Runtime as Tokio;

use common::{ECHO, Echo, chain, chain_def, counted_loop, run_once, wide_parallel};

fn runtime() -> Runtime {
    Runtime::builder().handler(ECHO, Echo).build()
}

fn tokio() -> Tokio {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `begin -> p0..p{width-1} (parallel) -> join`; each parallel node has a literal `x`, the
/// join references one of them.
fn fanout(runtime: &Runtime, width: usize) -> Workflow {
    let mut def = WorkflowDef::new(format!("fanout-{width}"))
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef::new("join", ECHO).param("x", "{{p0.value}}"));
    for i in 0..width {
        let id = format!("p{i}");
        def = def
            .node(NodeDef::new(&id, ECHO).param("x", i))
            .edge("begin", &id)
            .edge(&id, "join");
    }
    runtime.validate(def).expect("fanout workflow is valid")
}

/// `begin -> src -> route (switch) -> refund | other`: the `refund` case matches, so `other`
/// is skipped.
fn switch(runtime: &Runtime) -> Workflow {
    let def = WorkflowDef::new("switch")
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef::new("src", ECHO).param("x", "refund"))
        .node(NodeDef::new("route", "switch").params(json!({
            "cases": [{"id": "refund", "conditions": [
                {"left": "{{src.value}}", "op": "eq", "right": "refund"}
            ]}]
        })))
        .node(NodeDef::new("refund", ECHO).param("x", "{{src.value}}"))
        .node(NodeDef::new("other", ECHO).param("x", 0))
        .edge("begin", "src")
        .edge("src", "route")
        .branch("route", "refund", "refund")
        .branch("route", "else", "other");
    runtime.validate(def).expect("switch workflow is valid")
}

/// `begin -> ask -> after`: `ask` is a one-field form; `after` reads the answer.
fn form(runtime: &Runtime) -> Workflow {
    let def = WorkflowDef::new("form")
        .node(NodeDef::new("begin", "begin"))
        .node(NodeDef::new("ask", "interactive").params(json!({
            "mode": "form_input",
            "fields": [{"name": "n", "type": "integer", "required": true}]
        })))
        .node(NodeDef::new("after", ECHO).param("x", "{{ask.n}}"))
        .edge("begin", "ask")
        .edge("ask", "after");
    runtime.validate(def).expect("form workflow is valid")
}

/// Starts a run that pauses at a form, resumes it with the answer and waits for the end;
/// panics unless the answer reached the node after the form.
async fn pause_and_answer(runtime: &Runtime, workflow: &Workflow, thread: &ThreadId) {
    let handle = runtime
        .start(workflow, Map::new(), thread.clone())
        .await
        .expect("run starts");
    let paused = handle.wait().await;
    let Some(asked) = paused.interaction() else {
        panic!("run did not pause at the form: {paused:?}");
    };
    let resumed = runtime
        .resume(
            thread.clone(),
            ResumeInput::Answer {
                interaction_id: asked.id,
                value: Value::from(json!({"n": 7})),
            },
        )
        .await
        .expect("the answer is taken");
    let outcome = resumed.wait().await;
    match &outcome {
        RunOutcome::Completed { .. } if value_of(&outcome, "after") == Some(Value::from(7)) => {}
        other => panic!("resumed run did not complete as expected: {other:?}"),
    }
    black_box(outcome);
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
}

fn value_of(outcome: &RunOutcome, node: &str) -> Option<Value> {
    outcome.output(node)?.get("value").cloned()
}

fn benches(c: &mut Criterion) {
    let rt = tokio();
    let runtime = runtime();
    let thread = ThreadId::new("bench").expect("valid thread id");

    let mut group = c.benchmark_group("chain");
    configure(&mut group);
    for len in [100, 1000] {
        let wf = chain(&runtime, len);
        let last = format!("n{len}");
        group.throughput(Throughput::Elements(len as u64));
        group.bench_function(len.to_string(), |b| {
            b.to_async(&rt).iter(|| {
                run_once(&runtime, &wf, &thread, |o| {
                    value_of(o, &last) == Some(Value::from(1))
                })
            });
        });
    }
    group.finish();

    let mut group = c.benchmark_group("fanout");
    configure(&mut group);
    let width = 100;
    let wf = fanout(&runtime, width);
    let last = format!("p{}", width - 1);
    // The parallel nodes and the join.
    group.throughput(Throughput::Elements(width as u64 + 1));
    group.bench_function(width.to_string(), |b| {
        b.to_async(&rt).iter(|| {
            run_once(&runtime, &wf, &thread, |o| {
                value_of(o, "join") == Some(Value::from(0))
                    && value_of(o, &last) == Some(Value::from(width - 1))
            })
        });
    });
    group.finish();

    let mut group = c.benchmark_group("switch");
    configure(&mut group);
    let wf = switch(&runtime);
    group.bench_function("route", |b| {
        b.to_async(&rt).iter(|| {
            run_once(&runtime, &wf, &thread, |o| {
                value_of(o, "refund") == Some(Value::from("refund")) && o.output("other").is_none()
            })
        });
    });
    group.finish();
}

/// Loops and parallels: one body node per iteration or item, so what is measured is the body
/// actor's cost per iteration (a graph execution, an actor spawn, references to the frame).
fn bodies(c: &mut Criterion) {
    let rt = tokio();
    let runtime = runtime();
    let thread = ThreadId::new("bench").expect("valid thread id");

    let mut group = c.benchmark_group("loop");
    configure(&mut group);
    for (name, iterations) in [
        ("1000_iterations", 1000),
        ("10k", 10_000),
        ("100k", 100_000),
    ] {
        if iterations >= 10_000 {
            // Long runs: fewer samples, each a whole run; the per-iteration time is what is
            // compared (100k should cost about 10x 10k).
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(if iterations > 10_000 {
                    30
                } else {
                    8
                }));
        }
        let wf = counted_loop(&runtime, iterations);
        group.throughput(Throughput::Elements(u64::from(iterations)));
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| {
                run_once(&runtime, &wf, &thread, |o| {
                    let l = o.output("l");
                    l.and_then(|l| l.get("iterations")) == Some(&Value::from(iterations))
                        && l.and_then(|l| l.get("history"))
                            .and_then(|h| h.as_array())
                            .and_then(|h| h.last())
                            == Some(&Value::from(iterations - 1))
                })
            });
        });
    }
    group.finish();

    let mut group = c.benchmark_group("parallel");
    configure(&mut group);
    let concurrency = 16;
    for (name, items) in [
        (format!("1000_items_c{concurrency}"), 1000),
        ("10k".to_owned(), 10_000),
        ("100k".to_owned(), 100_000),
    ] {
        if items >= 10_000 {
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(if items > 10_000 { 30 } else { 8 }));
        }
        let wf = wide_parallel(&runtime, items, concurrency);
        group.throughput(Throughput::Elements(items as u64));
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| {
                run_once(&runtime, &wf, &thread, |o| {
                    let p = o.output("p");
                    p.and_then(|p| p.get("count")) == Some(&Value::from(items))
                        && p.and_then(|p| p.get("results"))
                            .and_then(|r| r.as_array())
                            .and_then(|r| r.last())
                            == Some(&Value::from(items - 1))
                })
            });
        });
    }
    group.finish();

    let mut group = c.benchmark_group("interactive");
    configure(&mut group);
    let wf = form(&runtime);
    group.bench_function("pause_resume", |b| {
        b.to_async(&rt)
            .iter(|| pause_and_answer(&runtime, &wf, &thread));
    });
    group.finish();
}

/// Validation alone: a chain of `n` nodes (each referencing its predecessor) validated into a
/// `Workflow`. The definition is cloned outside the measurement.
fn validation(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("validate");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));
    for (name, len) in [("10k_nodes", 10_000), ("100k_nodes", 100_000)] {
        let def = chain_def(len - 1);
        group.throughput(Throughput::Elements(len as u64));
        group.bench_function(name, |b| {
            b.iter_batched(
                || def.clone(),
                |def| {
                    let workflow = runtime.validate(def).expect("chain workflow is valid");
                    assert_eq!(workflow.node_ids().count(), len);
                    workflow
                },
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

criterion_group!(engine, benches, bodies, validation);
criterion_main!(engine);
