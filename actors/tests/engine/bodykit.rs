//! Helpers for the loop, parallel and interactive tests: a runtime with host kinds that count
//! their invocations by path, report usage, gauge concurrency, fail or hold on demand and stop
//! the run after a number of completions; readers of loop and parallel outputs, of saved
//! frames and of pauses; and bounded resumes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runvisor_actors::snapshot::{FrameState, GraphState, LoopState, ParallelState, Snapshot};
use runvisor_actors::testkit::Script;
use runvisor_actors::{
    Interaction, InteractionId, Map, NodeContext, NodeError, NodeHandler, NodeOutput, NodePath,
    ResumeError, ResumeInput, RunHandle, RunOutcome, RunStatus, Runtime, StopMode, ThreadId, Usage,
    Value, async_trait,
};

use super::support::{Log, PATIENCE, finish, within};

/// What every completed call of a host kind of this file reports as `tokens`.
pub(crate) const TOKENS: f64 = 10.0;

/// What the host kinds saw: every call by path, completions in order, calls cut short by a
/// stop, and the peak number of `gauge` calls in flight at once.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// (node, path, input), in call order.
    calls: Mutex<Vec<(String, String, Value)>>,
    /// Paths of completed calls, in completion order.
    finished: Mutex<Vec<String>>,
    /// Paths of calls that returned `Stopped`.
    stopped: Mutex<Vec<String>>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// `hold_at` no longer holds (set before a resume).
    released: AtomicBool,
    /// Stop the run (gracefully) when this many `work` calls have completed (0: never).
    stop_after: AtomicUsize,
    /// The runtime to stop runs on; set only while a stop is armed (it is a cycle).
    runtime: Mutex<Option<Runtime>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tally {
    fn record(&self, ctx: &NodeContext, input: &Value) {
        lock(&self.calls).push((
            ctx.node_id().as_str().to_owned(),
            ctx.path().to_string(),
            input.clone(),
        ));
    }

    /// How many times a host kind ran at this path (`l/#1/w`).
    pub(crate) fn calls_at(&self, path: &str) -> usize {
        lock(&self.calls)
            .iter()
            .filter(|(_, p, _)| p == path)
            .count()
    }

    /// How many times a host kind ran as this node, at any path.
    pub(crate) fn calls_of(&self, node: &str) -> usize {
        lock(&self.calls)
            .iter()
            .filter(|(n, _, _)| n == node)
            .count()
    }

    /// The paths a node ran at, in call order.
    pub(crate) fn paths_of(&self, node: &str) -> Vec<String> {
        lock(&self.calls)
            .iter()
            .filter(|(n, _, _)| n == node)
            .map(|(_, p, _)| p.clone())
            .collect()
    }

    /// The inputs a node was called with, in call order.
    pub(crate) fn inputs_of(&self, node: &str) -> Vec<Value> {
        lock(&self.calls)
            .iter()
            .filter(|(n, _, _)| n == node)
            .map(|(_, _, v)| v.clone())
            .collect()
    }

    /// Every call's path, in call order.
    pub(crate) fn all_paths(&self) -> Vec<String> {
        lock(&self.calls)
            .iter()
            .map(|(_, p, _)| p.clone())
            .collect()
    }

    /// How many calls there were in all.
    pub(crate) fn total_calls(&self) -> usize {
        lock(&self.calls).len()
    }

    /// Paths of completed calls, in completion order.
    pub(crate) fn finished(&self) -> Vec<String> {
        lock(&self.finished).clone()
    }

    /// Paths of calls that gave up on a stop.
    pub(crate) fn stopped(&self) -> Vec<String> {
        lock(&self.stopped).clone()
    }

    /// The most `gauge` calls in flight at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// From now on `hold_at` never holds (the run resumed after the stop just runs).
    pub(crate) fn release_holds(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// Arms a graceful stop of the run once `n` `work` calls have completed.
    pub(crate) fn stop_after(&self, rt: &Runtime, n: usize) {
        *lock(&self.runtime) = Some(rt.clone());
        self.stop_after.store(n, Ordering::SeqCst);
    }

    fn completed(&self, ctx: &NodeContext, counts: bool) {
        let n = {
            let mut finished = lock(&self.finished);
            finished.push(ctx.path().to_string());
            finished.len()
        };
        if !counts || n != self.stop_after.load(Ordering::SeqCst) {
            return;
        }
        // The runtime is taken so the cycle runtime -> handler -> runtime is broken.
        if let Some(rt) = lock(&self.runtime).take() {
            let run = ctx.run_id();
            tokio::spawn(async move {
                let _ = rt
                    .stop(
                        run,
                        StopMode::Graceful {
                            timeout: Duration::from_secs(30),
                        },
                    )
                    .await;
            });
        }
    }
}

/// A runtime with these kinds, sharing a [`Tally`] and a [`Log`] (for marks):
/// - `work`: records its call; with `ms`, sleeps that long unless a stop comes first (then
///   returns `Stopped`); fails with `boom at AT` when `at` equals `fail_at`; when `at` equals
///   `hold_at`, the first time at this path and until [`Tally::release_holds`], marks
///   `held:PATH` and waits for the stop (then returns `Stopped`); else
///   returns its input, reporting [`TOKENS`] tokens;
/// - `add`: outputs `{"value": a + b}` (whole numbers), reporting [`TOKENS`] tokens;
/// - `gauge`: counts itself in flight (the tally keeps the peak), waits until at least two
///   gauges were in flight at once (bounded), sleeps `ms`, returns its input;
/// - `ordered`: sleeps `ms`, then waits for the mark `done:AFTER` if `after` is given, marks
///   `done:INDEX` and returns its input: it completes only after item `after` did.
#[derive(Debug)]
pub(crate) struct Bodies {
    pub(crate) rt: Runtime,
    pub(crate) tally: Arc<Tally>,
    pub(crate) log: Arc<Log>,
}

pub(crate) fn bodies() -> Bodies {
    bodies_with(Script::new())
}

/// Like [`bodies`], with a testkit script installed.
pub(crate) fn bodies_with(script: Script) -> Bodies {
    let tally = Arc::new(Tally::default());
    let log = Arc::new(Log::default());
    let kind = |behaviour| Kind {
        behaviour,
        tally: tally.clone(),
        log: log.clone(),
    };
    let rt = script
        .install(Runtime::builder())
        .handler("work", kind(Behaviour::Work))
        .handler("add", kind(Behaviour::Add))
        .handler("gauge", kind(Behaviour::Gauge))
        .handler("ordered", kind(Behaviour::Ordered))
        .build();
    Bodies { rt, tally, log }
}

#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Work,
    Add,
    Gauge,
    Ordered,
}

#[derive(Debug)]
struct Kind {
    behaviour: Behaviour,
    tally: Arc<Tally>,
    log: Arc<Log>,
}

fn millis(input: &Value) -> Option<Duration> {
    let ms = input.get("ms")?.as_i64()?;
    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

fn whole(input: &Value, field: &str) -> Result<i64, NodeError> {
    input
        .get(field)
        .and_then(Value::as_i64)
        .ok_or_else(|| NodeError::invalid_input(field, "expected a whole number"))
}

#[async_trait]
impl NodeHandler for Kind {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let t = &self.tally;
        t.record(&ctx, &input);
        let path = ctx.path().to_string();
        match self.behaviour {
            Behaviour::Work => {
                let at = input.get("at");
                if at.is_some() && at == input.get("fail_at") {
                    let at = at.map(Value::render).unwrap_or_default();
                    return Err(NodeError::failed(format!("boom at {at}")));
                }
                let hold = format!("held:{path}");
                let released = t.released.load(Ordering::SeqCst);
                if at.is_some() && at == input.get("hold_at") && !released && !self.log.has(&hold) {
                    // Once per path: the run resumed after the stop completes it.
                    self.log.mark(hold);
                    if tokio::time::timeout(PATIENCE, ctx.stopped()).await.is_err() {
                        return Err(NodeError::failed("held, and no stop came"));
                    }
                    lock(&t.stopped).push(path);
                    return Err(NodeError::Stopped);
                }
                if let Some(d) = millis(&input) {
                    tokio::select! {
                        () = tokio::time::sleep(d) => {}
                        () = ctx.stopped() => {
                            lock(&t.stopped).push(path);
                            return Err(NodeError::Stopped);
                        }
                    }
                }
                t.completed(&ctx, true);
                Ok(NodeOutput::new(input).with_usage("tokens", TOKENS))
            }
            Behaviour::Add => {
                let sum = whole(&input, "a")? + whole(&input, "b")?;
                t.completed(&ctx, false);
                let out: Value = [("value", sum)].into_iter().collect();
                Ok(NodeOutput::new(out).with_usage("tokens", TOKENS))
            }
            Behaviour::Gauge => {
                let now = t.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                t.peak.fetch_max(now, Ordering::SeqCst);
                // No timing: wait until the engine has had two gauges in flight at once.
                let waited = within("two gauges in flight", async {
                    while t.peak.load(Ordering::SeqCst) < 2 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                });
                waited.await;
                if let Some(d) = millis(&input) {
                    tokio::time::sleep(d).await;
                }
                t.in_flight.fetch_sub(1, Ordering::SeqCst);
                t.completed(&ctx, false);
                Ok(NodeOutput::new(input))
            }
            Behaviour::Ordered => {
                if let Some(d) = millis(&input) {
                    tokio::time::sleep(d).await;
                }
                if let Some(after) = input.get("after").filter(|a| !a.is_null()) {
                    let name = format!("done:{}", after.render());
                    if !self.log.wait_mark(&name, PATIENCE).await {
                        return Err(NodeError::failed(format!("{name} never came")));
                    }
                }
                t.completed(&ctx, false);
                let index = input.get("index").map(Value::render).unwrap_or_default();
                self.log.mark(format!("done:{index}"));
                Ok(NodeOutput::new(input))
            }
        }
    }
}

/// A path from its text form (`l/#1/p/@2/ask`).
pub(crate) fn at(text: &str) -> NodePath {
    text.parse().expect("valid path")
}

/// The output of a node of an outcome (it must have one).
pub(crate) fn out<'a>(outcome: &'a RunOutcome, node: &str) -> &'a Value {
    match outcome.output(node) {
        Some(v) => v,
        None => panic!("node {node} has no output: {outcome:#?}"),
    }
}

/// A field of a value (it must exist).
pub(crate) fn field<'a>(value: &'a Value, name: &str) -> &'a Value {
    match value.get(name) {
        Some(v) => v,
        None => panic!("no field {name} in {value:?}"),
    }
}

/// A loop output's `details` as (index, body nodes).
pub(crate) fn details(loop_output: &Value) -> Vec<(i64, Vec<String>)> {
    field(loop_output, "details")
        .as_array()
        .expect("details is an array")
        .iter()
        .map(|d| {
            let index = field(d, "index").as_i64().expect("index is a number");
            let nodes = field(d, "nodes")
                .as_array()
                .expect("nodes is an array")
                .iter()
                .map(|n| n.as_str().expect("node ids are text").to_owned())
                .collect();
            (index, nodes)
        })
        .collect()
}

/// `details` of iterations that all ran the same body nodes.
pub(crate) fn same_details(iterations: usize, nodes: &[&str]) -> Vec<(i64, Vec<String>)> {
    (0..iterations)
        .map(|i| {
            (
                i64::try_from(i).expect("small"),
                nodes.iter().map(|n| (*n).to_owned()).collect(),
            )
        })
        .collect()
}

/// The run must have completed.
pub(crate) fn completed(outcome: &RunOutcome) {
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
}

/// The interaction a run paused at (it must have paused at exactly one).
pub(crate) fn paused(outcome: &RunOutcome) -> Interaction {
    match outcome {
        RunOutcome::AwaitingInput { interactions, .. } if interactions.len() == 1 => {
            interactions[0].clone()
        }
        other => panic!("the run should be waiting for one answer: {other:#?}"),
    }
}

/// The checkpoint holding a pause or a stop.
pub(crate) fn checkpoint_of(outcome: &RunOutcome) -> runvisor_actors::CheckpointId {
    let id = match outcome {
        RunOutcome::AwaitingInput { checkpoint_id, .. } => *checkpoint_id,
        RunOutcome::Stopped(stop) => stop.checkpoint_id,
        _ => None,
    };
    id.unwrap_or_else(|| panic!("no checkpoint written: {outcome:#?}"))
}

/// The `tokens` a run's outcome reports.
pub(crate) fn tokens(outcome: &RunOutcome) -> f64 {
    let usage: &Usage = outcome.usage();
    usage.get("tokens").copied().unwrap_or(0.0)
}

/// Resumes a thread with an answer and waits (bounded) for the outcome.
pub(crate) async fn answer(
    rt: &Runtime,
    thread: &ThreadId,
    interaction: InteractionId,
    value: Value,
) -> RunOutcome {
    let run = within(
        "resume with an answer",
        rt.resume(
            thread.clone(),
            ResumeInput::Answer {
                interaction_id: interaction,
                value,
            },
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("the answer should be taken: {e}"));
    finish(&run).await
}

/// Resumes a thread with `input`; the resume must be refused.
pub(crate) async fn refused(rt: &Runtime, thread: &ThreadId, input: ResumeInput) -> ResumeError {
    match within("a refused resume", rt.resume(thread.clone(), input)).await {
        Ok(run) => {
            let outcome = finish(&run).await;
            panic!("the resume should have been refused; it ran: {outcome:#?}")
        }
        Err(e) => e,
    }
}

/// Resumes a thread with `Continue` and returns the new run.
pub(crate) async fn resume_continue(rt: &Runtime, thread: &ThreadId) -> RunHandle {
    within("resume", rt.resume(thread.clone(), ResumeInput::Continue))
        .await
        .unwrap_or_else(|e| panic!("the thread should be resumable: {e}"))
}

/// The saved progress of a loop or parallel node in a graph's state (it must be there).
pub(crate) fn frame<'a>(graph: &'a GraphState, node: &str) -> &'a FrameState {
    match graph.frames.iter().find(|f| f.node.as_str() == node) {
        Some(f) => &f.state,
        None => panic!("no saved frame of {node} in {graph:#?}"),
    }
}

/// The saved progress of a loop node (it must be a loop's).
pub(crate) fn loop_frame<'a>(graph: &'a GraphState, node: &str) -> &'a LoopState {
    match frame(graph, node) {
        FrameState::Loop(l) => l,
        other => panic!("{node} saved a parallel's progress: {other:#?}"),
    }
}

/// The saved progress of a parallel node (it must be a parallel's).
pub(crate) fn parallel_frame<'a>(graph: &'a GraphState, node: &str) -> &'a ParallelState {
    match frame(graph, node) {
        FrameState::Parallel(p) => p,
        other => panic!("{node} saved a loop's progress: {other:#?}"),
    }
}

/// The nodes completed in a graph's state, in order.
pub(crate) fn done_nodes(graph: &GraphState) -> Vec<String> {
    graph
        .completed
        .iter()
        .map(|c| c.node.as_str().to_owned())
        .collect()
}

/// The recorded output of a completed node of a graph's state.
pub(crate) fn saved_output<'a>(graph: &'a GraphState, node: &str) -> &'a Value {
    match graph.completed.iter().find(|c| c.node.as_str() == node) {
        Some(c) => &c.output,
        None => panic!("{node} is not completed in {graph:#?}"),
    }
}

/// The snapshot of a paused or stopped run (status checked).
pub(crate) fn snapshot_with(snapshot: &Snapshot, status: RunStatus) -> &Snapshot {
    assert_eq!(snapshot.status, status, "{snapshot:#?}");
    snapshot
}

/// Calls per path, for paths matching `pred`.
pub(crate) fn calls_by_path(tally: &Tally, pred: impl Fn(&str) -> bool) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in tally.all_paths() {
        if pred(&p) {
            *out.entry(p).or_default() += 1;
        }
    }
    out
}

/// An object value from pairs.
pub(crate) fn obj<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<Map>(),
    )
}
