//! Helpers for the stop and resume tests: a runtime with the testkit's `Streamer` and
//! `Stubborn` and host kinds that cooperate with, finish through, linger on, ignore or panic on
//! a stop, each counting its invocations and the stubborn ones marking how their call ended
//! (finished or dropped); and readers of what the stores hold.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runvisor_actors::testkit::{Script, Streamer, Stubborn};
use runvisor_actors::{
    Map, Message, MessageId, NodeContext, NodeError, NodeHandler, NodeId, NodeOutput, NodePath,
    RunEvent, RunHandle, RunId, RunOutcome, Runtime, RuntimeBuilder, StopReply, StopResult, Value,
    async_trait, store::RunRecord,
};

use super::support::{DropMark, Log, PATIENCE, within};

/// The words the `llm` kind streams, one chunk per word.
pub(crate) const WORDS: &str = "one two three four five six seven eight";

/// How long the `llm` kind waits between two words.
pub(crate) const WORD_INTERVAL: Duration = Duration::from_millis(20);

/// How long the `slow_llm` kind waits between two words.
pub(crate) const SLOW_WORD_INTERVAL: Duration = Duration::from_millis(200);

/// How long the `stubborn` and `append_sleep` kinds sleep, ignoring stops.
pub(crate) const STUBBORN_SLEEP: Duration = Duration::from_secs(10);

/// Invocation counts by node id, and the histories `record` nodes saw.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    counts: Mutex<BTreeMap<String, u64>>,
    histories: Mutex<Vec<(String, Vec<Message>)>>,
}

impl Calls {
    fn count(&self, ctx: &NodeContext) {
        *lock(&self.counts)
            .entry(ctx.node_id().as_str().to_owned())
            .or_default() += 1;
    }

    /// How many times the handler of `node` was invoked (host kinds of this file only).
    pub(crate) fn of(&self, node: &str) -> u64 {
        lock(&self.counts).get(node).copied().unwrap_or(0)
    }

    /// The histories `record` nodes saw, as (node, messages), in call order.
    pub(crate) fn histories(&self) -> Vec<(String, Vec<Message>)> {
        lock(&self.histories).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A runtime with a script installed and these kinds:
/// - `llm`: the testkit [`Streamer`] of [`WORDS`], a word every [`WORD_INTERVAL`];
/// - `slow_llm`: the same words, a word every [`SLOW_WORD_INTERVAL`];
/// - `stubborn`: the testkit [`Stubborn`], sleeping [`STUBBORN_SLEEP`] whatever happens,
///   [watched](Watched): marks `NODE:started`, then `NODE:finished` or `NODE:dropped`;
/// - `count`: appends the assistant message `NODE done`, outputs `{"node": NODE}`;
/// - `finish_on_stop`: marks `NODE:started`, waits for the stop, then still returns its
///   output `{"finished_after_stop": true}`;
/// - `linger`: marks `NODE:started`, waits for the stop, takes `ms` (default 300) to wind
///   down, then returns `Stopped`;
/// - `append_sleep`: appends the assistant message `message`, marks `NODE:started`, then
///   sleeps [`STUBBORN_SLEEP`] ignoring stops and marks `NODE:finished`; marks `NODE:dropped`
///   if cut short;
/// - `panic_on_stop`: marks `NODE:started`, waits for the stop, then panics with
///   `NODE panicked on stop`;
/// - `record`: records the history it sees (whole messages), outputs `{"count": n}`.
#[derive(Debug)]
pub(crate) struct Kit {
    pub(crate) rt: Runtime,
    pub(crate) script: Script,
    pub(crate) log: Arc<Log>,
    pub(crate) calls: Arc<Calls>,
    pub(crate) streamer: Streamer,
    pub(crate) slow_streamer: Streamer,
    pub(crate) stubborn: Stubborn,
}

pub(crate) fn kit(script: Script) -> Kit {
    kit_with(script, |b| b)
}

/// Like [`kit`], with more builder settings (stores, config) from `extra`.
pub(crate) fn kit_with(
    script: Script,
    extra: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder,
) -> Kit {
    let log = Arc::new(Log::default());
    let calls = Arc::new(Calls::default());
    let streamer = Streamer::new(WORDS, WORD_INTERVAL);
    let slow_streamer = Streamer::new(WORDS, SLOW_WORD_INTERVAL);
    let stubborn = Stubborn::new(STUBBORN_SLEEP);
    let kind = |behaviour| Kind {
        behaviour,
        log: log.clone(),
        calls: calls.clone(),
    };
    let builder = script
        .install(Runtime::builder())
        .handler("llm", streamer.clone())
        .handler("slow_llm", slow_streamer.clone())
        .handler(
            "stubborn",
            Watched {
                inner: stubborn.clone(),
                log: log.clone(),
            },
        )
        .handler("count", kind(Behaviour::Count))
        .handler("finish_on_stop", kind(Behaviour::FinishOnStop))
        .handler("linger", kind(Behaviour::Linger))
        .handler("append_sleep", kind(Behaviour::AppendSleep))
        .handler("panic_on_stop", kind(Behaviour::PanicOnStop))
        .handler("record", kind(Behaviour::Record));
    Kit {
        rt: extra(builder).build(),
        script,
        log,
        calls,
        streamer,
        slow_streamer,
        stubborn,
    }
}

#[derive(Debug, Clone, Copy)]
enum Behaviour {
    Count,
    FinishOnStop,
    Linger,
    AppendSleep,
    PanicOnStop,
    Record,
}

#[derive(Debug)]
struct Kind {
    behaviour: Behaviour,
    log: Arc<Log>,
    calls: Arc<Calls>,
}

fn object<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<Map>(),
    )
}

#[async_trait]
impl NodeHandler for Kind {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.calls.count(&ctx);
        let node = ctx.node_id().as_str().to_owned();
        match self.behaviour {
            Behaviour::Count => {
                ctx.append_message(Message::assistant(format!("{node} done")));
                Ok(NodeOutput::new(object([("node", Value::from(node))])))
            }
            Behaviour::FinishOnStop => {
                self.log.mark(format!("{node}:started"));
                if tokio::time::timeout(PATIENCE, ctx.stopped()).await.is_err() {
                    return Err(NodeError::failed("no stop came"));
                }
                Ok(NodeOutput::new(object([(
                    "finished_after_stop",
                    Value::Bool(true),
                )])))
            }
            Behaviour::Linger => {
                self.log.mark(format!("{node}:started"));
                if tokio::time::timeout(PATIENCE, ctx.stopped()).await.is_err() {
                    return Err(NodeError::failed("no stop came"));
                }
                let ms = input.get("ms").and_then(Value::as_i64).unwrap_or(300);
                tokio::time::sleep(Duration::from_millis(u64::try_from(ms).unwrap_or(0))).await;
                Err(NodeError::Stopped)
            }
            Behaviour::AppendSleep => {
                let text = input
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("working")
                    .to_owned();
                let guard = DropMark::new(self.log.clone(), &node);
                ctx.append_message(Message::assistant(text));
                self.log.mark(format!("{node}:started"));
                tokio::time::sleep(STUBBORN_SLEEP).await;
                guard.defuse();
                self.log.mark(format!("{node}:finished"));
                Ok(NodeOutput::new(object([("slept", Value::Bool(true))])))
            }
            Behaviour::PanicOnStop => {
                self.log.mark(format!("{node}:started"));
                if tokio::time::timeout(PATIENCE, ctx.stopped()).await.is_err() {
                    return Err(NodeError::failed("no stop came"));
                }
                panic!("{node} panicked on stop");
            }
            Behaviour::Record => {
                let seen = ctx.history().to_vec();
                let count = seen.len();
                lock(&self.calls.histories).push((node, seen));
                Ok(NodeOutput::new(object([("count", Value::from(count))])))
            }
        }
    }
}

/// The testkit's [`Stubborn`], its calls leaving marks: `NODE:started` when called,
/// `NODE:finished` when its sleep ended, `NODE:dropped` when the call was dropped before
/// (aborted). A call aborted before it was first polled leaves no mark at all.
#[derive(Debug)]
struct Watched {
    inner: Stubborn,
    log: Arc<Log>,
}

#[async_trait]
impl NodeHandler for Watched {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let node = ctx.node_id().as_str().to_owned();
        let guard = DropMark::new(self.log.clone(), &node);
        self.log.mark(format!("{node}:started"));
        let result = self.inner.run(input, ctx).await;
        guard.defuse();
        self.log.mark(format!("{node}:finished"));
        result
    }
}

pub(crate) fn node(id: &str) -> NodeId {
    NodeId::new(id).expect("valid node id")
}

pub(crate) fn nodes(ids: &[&str]) -> Vec<NodeId> {
    ids.iter().map(|id| node(id)).collect()
}

pub(crate) fn path(id: &str) -> NodePath {
    NodePath::node(node(id))
}

/// The run store's record of a run (it must exist).
pub(crate) async fn record(rt: &Runtime, run: RunId) -> RunRecord {
    rt.run_store()
        .get(run)
        .await
        .expect("run store answers")
        .expect("the run is recorded")
}

/// The stop result of an outcome that must be a stop.
pub(crate) fn stopped(outcome: &RunOutcome) -> &StopResult {
    match outcome.stop_result() {
        Some(stop) => stop,
        None => panic!("the run should have stopped: {outcome:#?}"),
    }
}

/// The stop result of a reply that must be `Stopped`.
pub(crate) fn stopped_reply(reply: StopReply) -> StopResult {
    match reply {
        StopReply::Stopped(stop) => stop,
        other => panic!("the stop should have stopped the run: {other:#?}"),
    }
}

/// Asserts that no two messages share an id.
pub(crate) fn assert_unique_ids(history: &[Message]) {
    let mut ids: HashSet<MessageId> = HashSet::new();
    for m in history {
        assert!(
            ids.insert(m.id),
            "message {:?} appears twice: {history:#?}",
            m.id
        );
    }
}

/// Waits (bounded) until a mark is set.
pub(crate) async fn mark(log: &Log, name: &str) {
    assert!(
        log.wait_mark(name, PATIENCE).await,
        "mark {name} was not set within {PATIENCE:?}"
    );
}

/// Waits (bounded) for the first event of a run that `pred` accepts.
pub(crate) async fn event(
    events: &mut runvisor_actors::EventStream,
    what: &str,
    pred: impl Fn(&RunEvent) -> bool,
) -> RunEvent {
    within(what, async {
        loop {
            match events.next().await {
                Some(e) if pred(&e) => return e,
                Some(_) => {}
                None => panic!("the run ended before {what}"),
            }
        }
    })
    .await
}

/// Waits (bounded) until a run has started `node`.
pub(crate) async fn started(
    run: &RunHandle,
    events: &mut runvisor_actors::EventStream,
    node: &str,
) {
    let want = path(node);
    event(
        events,
        &format!("{} starting {node}", run.run_id()),
        |e| matches!(e, RunEvent::NodeStarted { path, .. } if *path == want),
    )
    .await;
}
