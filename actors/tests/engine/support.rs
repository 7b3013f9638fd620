//! Shared helpers: runtimes with host kinds that record what they saw, workflow loading,
//! bounded waits (a regression fails instead of hanging) and compact event descriptions.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runvisor_actors::{
    Map, Message, NodeContext, NodeError, NodeHandler, NodeOutput, Role, RunEvent, RunHandle,
    RunOutcome, Runtime, RuntimeBuilder, ThreadId, ValidationErrors, Value, Workflow,
    WorkflowError, async_trait,
};
use tokio::sync::{Barrier, Notify};

/// How long any test waits for something that should happen at once before failing.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

pub(crate) fn runtime() -> Runtime {
    Runtime::builder().build()
}

pub(crate) fn thread(id: &str) -> ThreadId {
    ThreadId::new(id).expect("valid thread id")
}

pub(crate) fn inputs<const N: usize>(pairs: [(&str, Value); N]) -> Map {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A runtime config whose runs give a failing store 200 ms (instead of the default 10 s)
/// before they report what it did not take.
pub(crate) fn short_store_deadline() -> runvisor_actors::RuntimeConfig {
    runvisor_actors::RuntimeConfig {
        store_deadline: Duration::from_millis(200),
        ..runvisor_actors::RuntimeConfig::default()
    }
}

/// An engine value from JSON.
pub(crate) fn val(json: serde_json::Value) -> Value {
    Value::from(json)
}

/// The `text` field of a node's output.
pub(crate) fn text(outcome: &RunOutcome, node: &str) -> String {
    match outcome.output(node).and_then(|o| o.get("text")) {
        Some(Value::String(s)) => s.clone(),
        other => panic!("node {node} has no text output ({other:?}); outcome: {outcome:#?}"),
    }
}

/// The ids of the nodes that produced an output, sorted.
pub(crate) fn ran(outcome: &RunOutcome) -> Vec<String> {
    outcome
        .outputs()
        .keys()
        .map(|k| k.as_str().to_owned())
        .collect()
}

/// Validates a workflow given as JSON, panicking with every problem if it is invalid.
pub(crate) fn load(rt: &Runtime, json: serde_json::Value) -> Workflow {
    match rt.load_json(&json.to_string()) {
        Ok(wf) => wf,
        Err(e) => panic!("workflow should be valid: {e}"),
    }
}

/// The problems validation reports for a workflow given as JSON.
pub(crate) fn problems(rt: &Runtime, json: serde_json::Value) -> Vec<WorkflowError> {
    problems_text(rt, &json.to_string())
}

/// The problems validation reports for a workflow given as text.
pub(crate) fn problems_text(rt: &Runtime, text: &str) -> Vec<WorkflowError> {
    match rt.load_json(text) {
        Ok(wf) => panic!("workflow should be invalid: {wf:?}"),
        Err(errors) => ValidationErrors::errors(&errors).to_vec(),
    }
}

/// Awaits a future, failing the test if it takes longer than [`PATIENCE`].
pub(crate) async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not happen within {PATIENCE:?}"),
    }
}

/// Waits (bounded) for a run's outcome.
pub(crate) async fn finish(run: &RunHandle) -> RunOutcome {
    within("run end", run.wait()).await
}

/// Starts a run and waits (bounded) for its outcome.
pub(crate) async fn run_to_end(
    rt: &Runtime,
    wf: &Workflow,
    inputs: Map,
    thread: &str,
) -> RunOutcome {
    let run = rt
        .start(wf, inputs, self::thread(thread))
        .await
        .expect("run starts");
    finish(&run).await
}

/// Every event of a run, from its start until `RunFinished` (bounded).
pub(crate) async fn all_events(run: &RunHandle) -> Vec<RunEvent> {
    let mut stream = run.events();
    within("RunFinished", async {
        let mut events = Vec::new();
        while let Some(event) = stream.next().await {
            events.push(event);
        }
        events
    })
    .await
}

/// An event as short text: `run_started`, `started begin (begin)`, `chunk stream "He"`,
/// `finished greet`, `skipped other`, `failed bad`, `run_finished succeeded`.
pub(crate) fn describe(event: &RunEvent) -> String {
    match event {
        RunEvent::RunStarted { .. } => "run_started".into(),
        RunEvent::NodeStarted { path, kind } => format!("started {path} ({kind})"),
        RunEvent::NodeChunk { path, text } => format!("chunk {path} {text:?}"),
        RunEvent::NodeFinished { path, .. } => format!("finished {path}"),
        RunEvent::NodeSkipped { path } => format!("skipped {path}"),
        RunEvent::NodeFailed { path, .. } => format!("failed {path}"),
        RunEvent::NodeInterrupted { path, forced } => {
            format!("interrupted {path} forced={forced}")
        }
        RunEvent::Stopping { reason } => format!("stopping {reason}"),
        RunEvent::EventsMissed { count } => format!("missed {count}"),
        RunEvent::RunFinished { status, .. } => format!("run_finished {status}"),
        other => format!("{other:?}"),
    }
}

/// The described events that concern one node (`started x (kind)`, `finished x`, ...).
pub(crate) fn node_events(events: &[RunEvent], node: &str) -> Vec<String> {
    events
        .iter()
        .map(describe)
        .filter(|d| d.split(' ').nth(1) == Some(node))
        .collect()
}

/// The history a `probe` node saw: its node id and each message's role and content.
pub(crate) type SeenHistory = (String, Vec<(Role, String)>);

/// What host handlers saw: each call's node and resolved input, and named marks that tests
/// and handlers can wait for.
#[derive(Debug, Default)]
pub(crate) struct Log {
    calls: Mutex<Vec<(String, Value)>>,
    histories: Mutex<Vec<SeenHistory>>,
    marks: Mutex<BTreeSet<String>>,
    marked: Notify,
}

impl Log {
    fn record(&self, ctx: &NodeContext, input: &Value) {
        lock(&self.calls).push((ctx.node_id().as_str().to_owned(), input.clone()));
    }

    /// The inputs a node's handler was called with, in call order.
    pub(crate) fn inputs(&self, node: &str) -> Vec<Value> {
        lock(&self.calls)
            .iter()
            .filter(|(n, _)| n == node)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The nodes whose handlers were called, in call order.
    pub(crate) fn called(&self) -> Vec<String> {
        lock(&self.calls).iter().map(|(n, _)| n.clone()).collect()
    }

    /// The histories `probe` nodes saw, as (node, [(role, content)]).
    pub(crate) fn histories(&self) -> Vec<SeenHistory> {
        lock(&self.histories).clone()
    }

    /// Sets a mark and wakes whoever waits for it.
    pub(crate) fn mark(&self, name: impl Into<String>) {
        lock(&self.marks).insert(name.into());
        self.marked.notify_waiters();
    }

    /// Whether a mark is set.
    pub(crate) fn has(&self, name: &str) -> bool {
        lock(&self.marks).contains(name)
    }

    /// Waits until a mark is set; `false` if it was not within `limit`.
    pub(crate) async fn wait_mark(&self, name: &str, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.marked.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.has(name) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn param_str<'a>(input: &'a Value, field: &str) -> Option<&'a str> {
    input.get(field).and_then(Value::as_str)
}

/// A runtime with the host kinds below registered, sharing one [`Log`]:
/// - `echo`: records its input and returns it as its output;
/// - `fail`: appends an assistant message with `append` (if any), waits for the mark named in
///   `after` (if any), then fails with `message`;
/// - `panic`: panics with `message`;
/// - `sleep`: appends an assistant message with `message` (if any), marks `NODE:started`,
///   sleeps `ms` milliseconds, marks `NODE:finished`; marks `NODE:dropped` if cut short;
/// - `stream`: emits each string of `chunks`, then fails with `then_fail` if given, else
///   appends their concatenation as an assistant message and outputs it as `text`;
/// - `hold`: marks `NODE:started`, waits for the mark `NODE:release`, returns its input;
/// - `probe`: records the history it sees and outputs `{"count": n}`.
#[derive(Debug)]
pub(crate) struct Host {
    pub(crate) rt: Runtime,
    pub(crate) log: Arc<Log>,
}

pub(crate) fn host() -> Host {
    host_with(|b, _| b)
}

/// Like [`host`], with more kinds registered by `extra`.
pub(crate) fn host_with(extra: impl FnOnce(RuntimeBuilder, Arc<Log>) -> RuntimeBuilder) -> Host {
    let log = Arc::new(Log::default());
    let builder = Runtime::builder()
        .handler("echo", Echo(log.clone()))
        .handler("fail", Fail(log.clone()))
        .handler("panic", Panic(log.clone()))
        .handler("quick_panic", QuickPanic(log.clone()))
        .handler("sleep", Sleep(log.clone()))
        .handler("stream", Stream(log.clone()))
        .handler("hold", Hold(log.clone()))
        .handler("probe", Probe(log.clone()));
    let rt = extra(builder, log.clone()).build();
    Host { rt, log }
}

struct Echo(Arc<Log>);

#[async_trait]
impl NodeHandler for Echo {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.record(&ctx, &input);
        Ok(NodeOutput::new(input))
    }
}

struct Fail(Arc<Log>);

#[async_trait]
impl NodeHandler for Fail {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.record(&ctx, &input);
        if let Some(text) = param_str(&input, "append") {
            ctx.append_message(Message::assistant(text));
        }
        if let Some(mark) = param_str(&input, "after")
            && !self.0.wait_mark(mark, PATIENCE).await
        {
            return Err(NodeError::failed(format!("mark {mark} never came")));
        }
        Err(NodeError::failed(
            param_str(&input, "message").unwrap_or("boom"),
        ))
    }
}

struct Panic(Arc<Log>);

#[async_trait]
impl NodeHandler for Panic {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.record(&ctx, &input);
        let message = param_str(&input, "message").unwrap_or("panic").to_owned();
        panic!("{message}");
    }
}

/// [`Panic`], saying it never blocks: it panics on the actor polling it first.
struct QuickPanic(Arc<Log>);

#[async_trait]
impl NodeHandler for QuickPanic {
    fn never_blocks(&self) -> bool {
        true
    }

    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        Panic(self.0.clone()).run(input, ctx).await
    }
}

/// Marks `NODE:dropped` unless defused: proves a handler future was dropped (aborted).
pub(crate) struct DropMark {
    log: Arc<Log>,
    name: Option<String>,
}

impl DropMark {
    /// Sets the mark `NODE:dropped` when dropped before [`DropMark::defuse`].
    pub(crate) fn new(log: Arc<Log>, node: &str) -> Self {
        Self {
            log,
            name: Some(format!("{node}:dropped")),
        }
    }

    /// The guarded work completed: dropping sets no mark.
    pub(crate) fn defuse(mut self) {
        self.name = None;
    }
}

impl Drop for DropMark {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            self.log.mark(name);
        }
    }
}

struct Sleep(Arc<Log>);

#[async_trait]
impl NodeHandler for Sleep {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.record(&ctx, &input);
        let node = ctx.node_id().as_str().to_owned();
        let guard = DropMark::new(self.0.clone(), &node);
        if let Some(message) = param_str(&input, "message") {
            ctx.append_message(Message::assistant(message));
        }
        self.0.mark(format!("{node}:started"));
        let ms = input.get("ms").and_then(Value::as_i64).unwrap_or(60_000);
        tokio::time::sleep(Duration::from_millis(u64::try_from(ms).unwrap_or(0))).await;
        guard.defuse();
        self.0.mark(format!("{node}:finished"));
        Ok(NodeOutput::new(input))
    }
}

struct Stream(Arc<Log>);

#[async_trait]
impl NodeHandler for Stream {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.record(&ctx, &input);
        let chunks = input
            .get("chunks")
            .and_then(Value::as_array)
            .ok_or_else(|| NodeError::invalid_input("chunks", "expected an array"))?;
        let mut all = String::new();
        for chunk in chunks.iter().filter_map(Value::as_str) {
            ctx.emit(chunk).map_err(|_| NodeError::Stopped)?;
            all.push_str(chunk);
            tokio::task::yield_now().await;
        }
        if let Some(message) = param_str(&input, "then_fail") {
            return Err(NodeError::failed(message));
        }
        ctx.append_message(Message::assistant(all.clone()));
        let out: Value = [("text", all)].into_iter().collect();
        Ok(NodeOutput::new(out))
    }
}

struct Hold(Arc<Log>);

#[async_trait]
impl NodeHandler for Hold {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.record(&ctx, &input);
        let node = ctx.node_id().as_str().to_owned();
        self.0.mark(format!("{node}:started"));
        if self.0.wait_mark(&format!("{node}:release"), PATIENCE).await {
            Ok(NodeOutput::new(input))
        } else {
            Err(NodeError::failed("never released"))
        }
    }
}

struct Probe(Arc<Log>);

#[async_trait]
impl NodeHandler for Probe {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.record(&ctx, &input);
        let seen: Vec<(Role, String)> = ctx
            .history()
            .iter()
            .map(|m| (m.role, m.content.clone()))
            .collect();
        let count = seen.len();
        lock(&self.0.histories).push((ctx.node_id().as_str().to_owned(), seen));
        let out: Value = [("count", count)].into_iter().collect();
        Ok(NodeOutput::new(out))
    }
}

/// A kind whose every call waits on one shared barrier (bounded by [`PATIENCE`]): two nodes
/// of this kind finish only if they run at the same time.
#[derive(Debug)]
pub(crate) struct BarrierKind {
    barrier: Arc<Barrier>,
    log: Arc<Log>,
}

impl BarrierKind {
    pub(crate) fn new(parties: usize, log: Arc<Log>) -> Self {
        Self {
            barrier: Arc::new(Barrier::new(parties)),
            log,
        }
    }
}

#[async_trait]
impl NodeHandler for BarrierKind {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.log.record(&ctx, &input);
        match tokio::time::timeout(PATIENCE, self.barrier.wait()).await {
            Ok(_) => Ok(NodeOutput::new(input)),
            Err(_) => Err(NodeError::failed(
                "the other branch never reached the barrier: branches did not run concurrently",
            )),
        }
    }
}
