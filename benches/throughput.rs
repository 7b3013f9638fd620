//! Throughput of many small runs against the actor floor, in one run so their ratio is
//! measured under the same load.
//!
//! - `throughput/runs_1000x10`: 1,000 runs of a chain of 10 trivial nodes after `begin`
//!   (`begin -> n1 -> ... -> n10`, each node resolving a reference to its predecessor),
//!   started at once on one default runtime (in-memory stores, default durability), all
//!   awaited, each checked to have completed with the expected last output. A batch counts
//!   10,000 node-steps (`begin` is not counted). The chain's `echo` says it never blocks, so
//!   its nodes run on their run's actor, with no child actor at all; with `BENCH_ECHO_TASK`
//!   set each runs in a node actor and a task of its own, the shape the floor below spawns.
//! - `throughput/actor_floor_1000x10`: what ractor alone costs for the same shape: 1,000
//!   parent actors started at once, each spawning 10 linked children one after another; each
//!   child messages its parent from `post_start` and stops, and the parent spawns the next one
//!   when the message arrives. 10,000 children per batch.
//!
//! Before the criterion group a summary is printed to stderr: the best and median of a few
//! batches of each, in ms per batch, µs per node-step and node-steps per second, and the ratio
//! of runs to the floor. `THROUGHPUT_BATCHES` (default 15) sets how many batches the summary
//! times.
//!
//! Both allocate with mimalloc, as the `runvisor` binary does; `--no-default-features` shows
//! the system allocator's figures.
//!
//! Run with `cargo bench --bench throughput`.

mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::future::join_all;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use runvisor::{Map, RunOutcome, Runtime, ThreadId, Value, Workflow};
use tokio::runtime::Runtime as Tokio;
use tokio::sync::oneshot;

use common::{ECHO, Echo, chain, tokio};

/// Runs started at once per batch.
const RUNS: usize = 1000;
/// Nodes per run after `begin`, each counted as one node-step.
const NODES: usize = 10;

/// One batch: [`RUNS`] runs of the chain started at once, one per thread, all awaited; panics
/// unless every one completed with the expected last output.
async fn runs_batch(runtime: &Runtime, workflow: &Workflow, threads: &[ThreadId]) {
    let last = format!("n{NODES}");
    let runs = threads.iter().map(|thread| async {
        let handle = runtime
            .start(workflow, Map::new(), thread.clone())
            .await
            .expect("run starts");
        handle.wait().await
    });
    for outcome in join_all(runs).await {
        match &outcome {
            RunOutcome::Completed { .. }
                if outcome.output(&last).and_then(|o| o.get("value")) == Some(&Value::Int(1)) => {}
            other => panic!("run did not complete as expected: {other:?}"),
        }
    }
}

/// A parent spawning [`NODES`] linked children in turn; tells `done` when the last one has
/// messaged back.
struct Parent;

/// A child: messages its parent from `post_start` and stops.
struct Child;

struct ParentState {
    left: usize,
    done: Option<oneshot::Sender<()>>,
}

#[derive(Debug)]
enum ParentMsg {
    /// A child has started and says so.
    Reported,
}

impl Actor for Parent {
    type Msg = ParentMsg;
    type State = ParentState;
    type Arguments = oneshot::Sender<()>;

    async fn pre_start(
        &self,
        _myself: ActorRef<ParentMsg>,
        done: oneshot::Sender<()>,
    ) -> Result<ParentState, ActorProcessingErr> {
        Ok(ParentState {
            left: NODES,
            done: Some(done),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ParentMsg>,
        _state: &mut ParentState,
    ) -> Result<(), ActorProcessingErr> {
        Actor::spawn_linked(None, Child, myself.clone(), myself.get_cell()).await?;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ParentMsg>,
        ParentMsg::Reported: ParentMsg,
        state: &mut ParentState,
    ) -> Result<(), ActorProcessingErr> {
        state.left -= 1;
        if state.left == 0 {
            if let Some(done) = state.done.take() {
                let _ = done.send(());
            }
            myself.stop(None);
        } else {
            Actor::spawn_linked(None, Child, myself.clone(), myself.get_cell()).await?;
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<ParentMsg>,
        _event: SupervisionEvent,
        _state: &mut ParentState,
    ) -> Result<(), ActorProcessingErr> {
        // A child ending is expected; the default would stop the parent.
        Ok(())
    }
}

impl Actor for Child {
    type Msg = ();
    type State = ActorRef<ParentMsg>;
    type Arguments = ActorRef<ParentMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        parent: ActorRef<ParentMsg>,
    ) -> Result<ActorRef<ParentMsg>, ActorProcessingErr> {
        Ok(parent)
    }

    async fn post_start(
        &self,
        myself: ActorRef<()>,
        parent: &mut ActorRef<ParentMsg>,
    ) -> Result<(), ActorProcessingErr> {
        parent.send_message(ParentMsg::Reported)?;
        myself.stop(None);
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<()>,
        _message: (),
        _parent: &mut ActorRef<ParentMsg>,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

/// One batch of the floor: [`RUNS`] parents started at once, all awaited.
async fn floor_batch() {
    let parents = (0..RUNS).map(|_| async {
        let (done, finished) = oneshot::channel();
        let (_parent, join) = Actor::spawn(None, Parent, done).await.expect("spawns");
        finished.await.expect("the parent reports its children");
        join.await.expect("the parent ends");
    });
    join_all(parents).await;
}

/// Best and median of `times`.
fn best_and_median(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    (times[0], times[times.len() / 2])
}

fn print_line(name: &str, (best, median): (Duration, Duration)) {
    let steps = (RUNS * NODES) as f64;
    eprintln!(
        "throughput {name}: best {:.1} ms per batch ({:.2} µs per node-step, {:.0} node-steps/s), \
         median {:.1} ms",
        best.as_secs_f64() * 1e3,
        best.as_secs_f64() * 1e6 / steps,
        steps / best.as_secs_f64(),
        median.as_secs_f64() * 1e3,
    );
}

fn summary(rt: &Tokio, runtime: &Runtime, workflow: &Workflow, threads: &[ThreadId]) {
    let batches: usize = std::env::var("THROUGHPUT_BATCHES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(15)
        .max(1);
    // Warm both up first (allocator, tokio's worker threads).
    for _ in 0..2 {
        rt.block_on(runs_batch(runtime, workflow, threads));
        rt.block_on(floor_batch());
    }
    let (mut runs, mut floor) = (Vec::new(), Vec::new());
    // Interleaved, so a change in load hits both alike.
    for _ in 0..batches {
        let started = Instant::now();
        rt.block_on(runs_batch(runtime, workflow, threads));
        runs.push(started.elapsed());
        let started = Instant::now();
        rt.block_on(floor_batch());
        floor.push(started.elapsed());
    }
    let runs = best_and_median(runs);
    let floor = best_and_median(floor);
    print_line(&format!("runs {RUNS}x{NODES}"), runs);
    print_line(&format!("actor floor {RUNS}x{NODES}"), floor);
    eprintln!(
        "throughput: runs / actor floor = {:.2} (best), {:.2} (median)",
        runs.0.as_secs_f64() / floor.0.as_secs_f64(),
        runs.1.as_secs_f64() / floor.1.as_secs_f64(),
    );
}

fn throughput(c: &mut Criterion) {
    let rt = tokio();
    let runtime = Runtime::builder().handler(ECHO, Echo).build();
    let workflow = chain(&runtime, NODES);
    let threads: Vec<ThreadId> = (0..RUNS)
        .map(|i| ThreadId::new(format!("throughput-{i}")).expect("valid thread id"))
        .collect();
    summary(&rt, &runtime, &workflow, &threads);

    let mut group = c.benchmark_group("throughput");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements((RUNS * NODES) as u64));
    group.bench_function(format!("runs_{RUNS}x{NODES}"), |b| {
        b.to_async(&rt)
            .iter(|| runs_batch(&runtime, &workflow, &threads));
    });
    group.bench_function(format!("actor_floor_{RUNS}x{NODES}"), |b| {
        b.to_async(&rt).iter(floor_batch);
    });
    group.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
