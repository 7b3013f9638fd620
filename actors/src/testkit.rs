//! Testkit (cargo feature `testkit`): scripted interrupts and persisted-state inspection, for
//! host services that want to prove their workflows survive a stop at any point.
//!
//! An interrupt names its node by id (`"b"`: wherever `b` runs) or by path (`"l/#3/b"`: `b` in
//! iteration 3 of loop `l`; `"p/@*/w"`: `w` in any item of parallel `p`); see [`At`].
//!
//! ```no_run
//! # async fn demo(workflow: runvisor_actors::Workflow) {
//! use runvisor_actors::testkit::{Interrupt, Script, persisted};
//! use runvisor_actors::{Map, Runtime, StopMode, ThreadId};
//! let script = Script::new().interrupt(Interrupt::after_chunks("llm", 3));
//! let runtime = script.install(Runtime::builder()).build();
//! let thread = ThreadId::new("t1").unwrap();
//! let run = runtime.start(&workflow, Map::new(), thread.clone()).await.unwrap();
//! let outcome = run.wait().await;
//! let stop = outcome.stop_result().expect("stopped by the script");
//! assert_eq!(stop.partial_response.as_deref(), Some("one two three"));
//! let state = persisted(&runtime, &thread).await;
//! assert!(state.history.iter().any(|m| m.truncated));
//! # }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::kinds::{NodeContext, NodeHandler, Probe, ProbeStop};
use crate::model::{
    CheckpointId, Fence, Frame, Map, Message, NodeError, NodeId, NodeOutput, NodePath, RunId,
    RunRecord, StopMode, StopReason, StoreError, ThreadId, Value,
};
use crate::persist::snapshot::SnapshotError;
use crate::persist::{CheckpointStore, DeltaLink, Snapshot, StoredCheckpoint};
use crate::runtime::{Runtime, RuntimeBuilder};
/// Where an interrupt fires: a moment in the life of the nodes its target names.
///
/// The target is the text the interrupt was made with:
/// - without `/`, a node id: the node wherever it runs, at the top level or in any iteration or
///   item at any depth (`"b"`);
/// - with `/`, a path in [`NodePath`]'s text form, matching exactly that path: node ids, `#N`
///   for iteration N of the loop before it, `@N` for item N of the parallel before it
///   (`"l/#3/b"`, `"l/#1/p/@7/w"`). A step `*` matches any one step, `#*` any iteration and
///   `@*` any item (`"p/@*/w"`: `w` in whichever item gets there first). A leading `/` anchors
///   a node of the workflow's own graph: `"/b"` is the top-level `b` only. A step that is none
///   of these (not a valid node id, a bad number) matches nothing.
///
/// An interrupt fires once, at the first path its target matches.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum At {
    /// Just before the node would start: it never starts.
    BeforeNode(String),
    /// Right after the node's handler task was spawned: the handler sees the stop at once.
    DuringNode(String),
    /// After the node streamed this many chunks (all kept); the next chunk is refused.
    AfterChunks(String, u64),
    /// At the instant the node's completion is recorded, before its successors start.
    OnCompletion(String),
    /// Right after the node's handler returned, before its actor learns of it: the stop
    /// reaches the node first (a force stop aborts it), racing the handler's result.
    OnReturn(String),
}

impl At {
    /// The target text.
    fn target(&self) -> &str {
        match self {
            At::BeforeNode(t)
            | At::DuringNode(t)
            | At::AfterChunks(t, _)
            | At::OnCompletion(t)
            | At::OnReturn(t) => t,
        }
    }

    /// Whether this is the moment a probe reports.
    fn is(&self, moment: Moment) -> bool {
        match (self, moment) {
            (At::BeforeNode(_), Moment::Before)
            | (At::DuringNode(_), Moment::Started)
            | (At::OnCompletion(_), Moment::Completed)
            | (At::OnReturn(_), Moment::Returned) => true,
            (At::AfterChunks(_, n), Moment::Chunk(count)) => *n == count,
            _ => false,
        }
    }
}

/// A moment a probe reports, for any node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    Before,
    Started,
    Chunk(u64),
    Completed,
    Returned,
}

/// What an interrupt's target matches, read once from its text (see [`At`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A node id: the path's leaf.
    Leaf(String),
    /// A path, step by step.
    Path(Vec<Step>),
}

/// One step of a path target.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// `*`: any step.
    Any,
    /// `#*`: any iteration.
    AnyIteration,
    /// `@*`: any item.
    AnyItem,
    /// A node id, `#N` or `@N`.
    Exact(Frame),
    /// Not a valid step: matches nothing.
    Never,
}

impl Target {
    fn parse(text: &str) -> Self {
        if !text.contains('/') {
            return Target::Leaf(text.to_owned());
        }
        let anchored = text.strip_prefix('/').unwrap_or(text);
        Target::Path(anchored.split('/').map(Step::parse).collect())
    }

    fn matches(&self, path: &NodePath) -> bool {
        match self {
            Target::Leaf(id) => path.leaf().is_some_and(|leaf| leaf.as_str() == id),
            Target::Path(steps) => {
                let frames = path.frames();
                steps.len() == frames.len()
                    && steps
                        .iter()
                        .zip(frames)
                        .all(|(step, frame)| step.matches(frame))
            }
        }
    }
}

impl Step {
    fn parse(text: &str) -> Self {
        let number = |n: &str| n.parse::<u32>().ok();
        match text {
            "*" => Step::Any,
            "#*" => Step::AnyIteration,
            "@*" => Step::AnyItem,
            _ => {
                let frame = if let Some(n) = text.strip_prefix('#') {
                    number(n).map(Frame::Iteration)
                } else if let Some(n) = text.strip_prefix('@') {
                    number(n).map(Frame::Item)
                } else {
                    NodeId::new(text).ok().map(Frame::Node)
                };
                frame.map_or(Step::Never, Step::Exact)
            }
        }
    }

    fn matches(&self, frame: &Frame) -> bool {
        match self {
            Step::Any => true,
            Step::AnyIteration => matches!(frame, Frame::Iteration(_)),
            Step::AnyItem => matches!(frame, Frame::Item(_)),
            Step::Exact(step) => step == frame,
            Step::Never => false,
        }
    }
}

/// One scripted stop. Fires once.
#[derive(Debug)]
pub struct Interrupt {
    at: At,
    target: Target,
    mode: StopMode,
    reason: StopReason,
    fired: AtomicBool,
}

impl Clone for Interrupt {
    fn clone(&self) -> Self {
        Self {
            at: self.at.clone(),
            target: self.target.clone(),
            mode: self.mode,
            reason: self.reason,
            fired: AtomicBool::new(self.fired.load(Ordering::SeqCst)),
        }
    }
}

impl Interrupt {
    fn new(at: At) -> Self {
        Self {
            target: Target::parse(at.target()),
            at,
            mode: StopMode::graceful(),
            reason: StopReason::UserInterrupted,
            fired: AtomicBool::new(false),
        }
    }

    /// Stop before `node` starts (a node id or a path: see [`At`]).
    pub fn before(node: impl Into<String>) -> Self {
        Self::new(At::BeforeNode(node.into()))
    }

    /// Stop while `node` runs (a node id or a path: see [`At`]).
    pub fn during(node: impl Into<String>) -> Self {
        Self::new(At::DuringNode(node.into()))
    }

    /// Stop after `node` streamed `chunks` chunks (a node id or a path: see [`At`]).
    pub fn after_chunks(node: impl Into<String>, chunks: u64) -> Self {
        Self::new(At::AfterChunks(node.into(), chunks))
    }

    /// Stop at the instant `node` completes (a node id or a path: see [`At`]).
    pub fn on_completion(node: impl Into<String>) -> Self {
        Self::new(At::OnCompletion(node.into()))
    }

    /// Stop right after `node`'s handler returned, before the node's actor learns of it (a
    /// node id or a path: see [`At`]). With
    /// [`force`](Self::force), the abort reaches the node while its result is on its way: the
    /// race between a handler's return and a force stop, made to happen every time. A handler
    /// that returned is finished, so the node completes (its output and messages kept) and a
    /// resume never runs it again.
    pub fn on_return(node: impl Into<String>) -> Self {
        Self::new(At::OnReturn(node.into()))
    }

    /// Make it a force stop (default: graceful, 30 s).
    pub fn force(mut self) -> Self {
        self.mode = StopMode::Force;
        self
    }

    /// Make it a graceful stop with this timeout.
    pub fn graceful(mut self, timeout: Duration) -> Self {
        self.mode = StopMode::Graceful { timeout };
        self
    }

    /// Stop for this reason (default `UserInterrupted`).
    pub fn reason(mut self, reason: StopReason) -> Self {
        self.reason = reason;
        self
    }

    fn fire(&self, moment: Moment, path: &NodePath) -> ProbeStop {
        if self.at.is(moment)
            && self.target.matches(path)
            && !self.fired.swap(true, Ordering::SeqCst)
        {
            Some((self.mode, self.reason))
        } else {
            None
        }
    }
}

/// A set of scripted interrupts, installed on a runtime as its probe.
#[derive(Debug, Clone, Default)]
pub struct Script {
    interrupts: Arc<Vec<Interrupt>>,
}

impl Script {
    /// No interrupts yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an interrupt. (Add them all before [`install`](Self::install).)
    pub fn interrupt(mut self, interrupt: Interrupt) -> Self {
        Arc::make_mut(&mut self.interrupts).push(interrupt);
        self
    }

    /// Installs the script on a runtime builder.
    pub fn install(&self, builder: RuntimeBuilder) -> RuntimeBuilder {
        builder.probe(Arc::new(self.clone()))
    }

    /// The interrupts that have fired.
    pub fn fired(&self) -> Vec<At> {
        self.interrupts
            .iter()
            .filter(|i| i.fired.load(Ordering::SeqCst))
            .map(|i| i.at.clone())
            .collect()
    }

    fn check(&self, moment: Moment, path: &NodePath) -> ProbeStop {
        self.interrupts.iter().find_map(|i| i.fire(moment, path))
    }
}

impl Probe for Script {
    fn before_node(&self, _run: RunId, path: &NodePath) -> ProbeStop {
        self.check(Moment::Before, path)
    }

    fn node_started(&self, _run: RunId, path: &NodePath) -> ProbeStop {
        self.check(Moment::Started, path)
    }

    fn chunk(&self, _run: RunId, path: &NodePath, count: u64) -> ProbeStop {
        self.check(Moment::Chunk(count), path)
    }

    fn node_completed(&self, _run: RunId, path: &NodePath) -> ProbeStop {
        self.check(Moment::Completed, path)
    }

    fn handler_returned(&self, _run: RunId, path: &NodePath) -> ProbeStop {
        self.check(Moment::Returned, path)
    }
}

/// What the stores hold for a thread: its history, its newest checkpoint and the record of the
/// run that wrote it.
#[derive(Debug, Clone)]
pub struct Persisted {
    /// The thread's history, oldest first.
    pub history: Vec<Message>,
    /// The newest checkpoint, decoded.
    pub checkpoint: Option<(CheckpointId, Result<Snapshot, SnapshotError>)>,
    /// The record of the run that wrote the newest checkpoint.
    pub record: Option<RunRecord>,
}

impl Persisted {
    /// The decoded newest snapshot. Panics (this is a test helper) if there is none.
    pub fn snapshot(&self) -> &Snapshot {
        match &self.checkpoint {
            Some((_, Ok(snapshot))) => snapshot,
            Some((id, Err(e))) => panic!("checkpoint {id} does not decode: {e}"),
            None => panic!("the thread has no checkpoint"),
        }
    }

    /// The nodes a resume would start.
    pub fn frontier(&self) -> Vec<String> {
        self.snapshot()
            .graph
            .frontier
            .iter()
            .map(NodeId::to_string)
            .collect()
    }

    /// The completed nodes, in completion order.
    pub fn completed(&self) -> Vec<String> {
        self.snapshot()
            .graph
            .completed
            .iter()
            .map(|c| c.node.to_string())
            .collect()
    }

    /// The recorded output of a completed node.
    pub fn output(&self, node: &str) -> Option<&Value> {
        self.snapshot()
            .graph
            .completed
            .iter()
            .find(|c| c.node.as_str() == node)
            .map(|c| &*c.output)
    }

    /// The texts of the history, in order.
    pub fn texts(&self) -> Vec<&str> {
        self.history.iter().map(|m| m.content.as_str()).collect()
    }
}

/// Reads what the stores of `runtime` hold for `thread`. Store errors read as empty (this is
/// for assertions; a failing store shows up as missing data).
pub async fn persisted(runtime: &Runtime, thread: &ThreadId) -> Persisted {
    let history = runtime
        .history_store()
        .load(thread)
        .await
        .unwrap_or_default();
    let stored = runtime
        .checkpoint_store()
        .latest(thread)
        .await
        .ok()
        .flatten();
    let checkpoint = match stored {
        Some(s) => {
            use crate::persist::delta::{MaterializeError, materialize};
            match materialize(runtime.checkpoint_store().as_ref(), thread, &s).await {
                Ok(snapshot) => Some((s.id, Ok(snapshot))),
                Err(MaterializeError::Snapshot(error)) => Some((s.id, Err(error))),
                Err(MaterializeError::Store(_)) => None,
            }
        }
        None => None,
    };
    let record = match &checkpoint {
        Some((_, Ok(snapshot))) => runtime
            .run_store()
            .get(snapshot.run_id)
            .await
            .ok()
            .flatten(),
        _ => None,
    };
    Persisted {
        history,
        checkpoint,
        record,
    }
}

/// Stores checkpoint `id` of `thread` again, whole, under an id of the same run `ahead` of
/// this process's clock, as a process whose clock runs that far ahead would have written it
/// (its sequence one past the checkpoint's, unfenced); answers the new id, now the thread's
/// newest. For tests of what runs continuing such a checkpoint write.
pub async fn stored_again_ahead(
    store: &dyn CheckpointStore,
    thread: &ThreadId,
    id: CheckpointId,
    ahead: Duration,
) -> Result<CheckpointId, String> {
    use crate::persist::delta::materialize;
    let stored = store
        .get(thread, id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("checkpoint {id} is not stored"))?;
    let whole = materialize(store, thread, &stored)
        .await
        .map_err(|e| e.to_string())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?;
    let millis = (now + ahead).as_millis();
    let later: CheckpointId = format!(
        "{:08x}-{:04x}-7000-8000-000000000001",
        millis >> 16,
        millis & 0xffff
    )
    .parse()
    .map_err(|e: crate::model::InvalidId| e.to_string())?;
    let checkpoint = StoredCheckpoint {
        id: later,
        run: stored.run,
        sequence: stored.sequence + 1,
        bytes: whole.encode().map_err(|e| e.to_string())?,
        link: None,
    };
    store
        .put(thread, checkpoint, None)
        .await
        .map_err(|e| e.to_string())?;
    Ok(later)
}

/// A handler that streams `text` word by word (one chunk per word, `interval` apart), honours
/// stops at each chunk, appends the whole text as an assistant message and outputs
/// `{"text": ...}`. Counts its invocations.
#[derive(Debug, Clone)]
pub struct Streamer {
    words: Arc<Vec<String>>,
    interval: Duration,
    calls: Arc<std::sync::atomic::AtomicU64>,
}

impl Streamer {
    /// Streams `text`, a word every `interval`.
    pub fn new(text: &str, interval: Duration) -> Self {
        Self {
            words: Arc::new(text.split_whitespace().map(str::to_owned).collect()),
            interval,
            calls: Arc::default(),
        }
    }

    /// How many times the handler was invoked.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl NodeHandler for Streamer {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut text = String::new();
        for (i, word) in self.words.iter().enumerate() {
            if i > 0 {
                tokio::select! {
                    () = tokio::time::sleep(self.interval) => {}
                    () = ctx.stopped() => return Err(NodeError::Stopped),
                }
            }
            let chunk = if i == 0 {
                word.clone()
            } else {
                format!(" {word}")
            };
            ctx.emit(chunk.clone()).map_err(|_| NodeError::Stopped)?;
            text.push_str(&chunk);
        }
        ctx.append_message(Message::assistant(text.clone()));
        let mut out = Map::new();
        out.insert("text".into(), Value::String(text));
        Ok(NodeOutput::new(Value::Object(out)))
    }
}

/// A handler that ignores stops: it sleeps `duration` without looking at the stop flag, then
/// outputs `{"slept": true}`. Only a force stop (or the graceful timeout) cuts it.
#[derive(Debug, Clone)]
pub struct Stubborn {
    duration: Duration,
    calls: Arc<std::sync::atomic::AtomicU64>,
}

impl Stubborn {
    /// Sleeps this long.
    pub fn new(duration: Duration) -> Self {
        Self {
            duration,
            calls: Arc::default(),
        }
    }

    /// How many times the handler was invoked.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl NodeHandler for Stubborn {
    async fn run(&self, _input: Value, _ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.duration).await;
        let mut out = Map::new();
        out.insert("slept".into(), Value::Bool(true));
        Ok(NodeOutput::new(Value::Object(out)))
    }
}

/// What a [`WatchedCheckpoints`] does around each `put` of the store it wraps: fail it, hold
/// it, count it or record its answer. Both steps do nothing unless overridden.
#[async_trait]
pub trait PutWatch: Send + Sync {
    /// Before the put reaches the store; an error is the put's answer (nothing is stored).
    async fn before(
        &self,
        _thread: &ThreadId,
        _checkpoint: &StoredCheckpoint,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// Once the store answered the put of checkpoint `id` (with `link`, a delta's).
    fn after(
        &self,
        _thread: &ThreadId,
        _id: CheckpointId,
        _link: Option<DeltaLink>,
        _answer: &Result<(), StoreError>,
    ) {
    }
}

/// A checkpoint store that passes every call on to `inner`, with a [`PutWatch`] around each
/// `put`: for tests of what the engine does when writes fail, stall or race.
pub struct WatchedCheckpoints<W> {
    inner: Arc<dyn CheckpointStore>,
    watch: W,
}

impl<W: std::fmt::Debug> std::fmt::Debug for WatchedCheckpoints<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedCheckpoints")
            .field("watch", &self.watch)
            .finish_non_exhaustive()
    }
}

impl<W: PutWatch> WatchedCheckpoints<W> {
    /// `inner` with `watch` around its puts.
    pub fn new(inner: Arc<dyn CheckpointStore>, watch: W) -> Self {
        Self { inner, watch }
    }

    /// The store the calls go to.
    pub fn inner(&self) -> &Arc<dyn CheckpointStore> {
        &self.inner
    }

    /// The watch around the puts.
    pub fn watch(&self) -> &W {
        &self.watch
    }
}

#[async_trait]
impl<W: PutWatch + 'static> CheckpointStore for WatchedCheckpoints<W> {
    async fn put(
        &self,
        thread: &ThreadId,
        checkpoint: StoredCheckpoint,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        self.watch.before(thread, &checkpoint).await?;
        let (id, link) = (checkpoint.id, checkpoint.link);
        let answer = self.inner.put(thread, checkpoint, fence).await;
        self.watch.after(thread, id, link, &answer);
        answer
    }
    async fn get(
        &self,
        thread: &ThreadId,
        id: CheckpointId,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.inner.get(thread, id).await
    }
    async fn chain(
        &self,
        thread: &ThreadId,
        from: CheckpointId,
        max: usize,
    ) -> Result<Vec<StoredCheckpoint>, StoreError> {
        self.inner.chain(thread, from, max).await
    }
    async fn prune_skipped(&self, thread: &ThreadId) -> Result<usize, StoreError> {
        self.inner.prune_skipped(thread).await
    }
    async fn latest(&self, thread: &ThreadId) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.inner.latest(thread).await
    }
    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointId>, StoreError> {
        self.inner.list(thread).await
    }
    async fn prune(&self, thread: &ThreadId, keep: usize) -> Result<usize, StoreError> {
        self.inner.prune(thread, keep).await
    }
    async fn put_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
        definition: &str,
    ) -> Result<(), StoreError> {
        self.inner.put_workflow(thread, hash, definition).await
    }
    async fn get_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
    ) -> Result<Option<String>, StoreError> {
        self.inner.get_workflow(thread, hash).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> NodePath {
        text.parse().expect("valid path")
    }

    #[test]
    fn targets_match_a_leaf_anywhere_or_a_path_exactly() {
        let cases: &[(&str, &str, bool)] = &[
            // A node id: the leaf, at any depth.
            ("b", "b", true),
            ("b", "l/#3/b", true),
            ("b", "l/#3/p/@1/b", true),
            ("b", "l/#3/bb", false),
            // A path: exactly that path.
            ("l/#3/b", "l/#3/b", true),
            ("l/#3/b", "l/#2/b", false),
            ("l/#3/b", "l/#3/p/@0/b", false),
            ("l/#3/b", "m/#3/b", false),
            ("l/#3", "l/#3/b", false),
            ("p/@7/w", "p/@7/w", true),
            ("p/@7/w", "p/#7/w", false),
            // Wildcards: one step each.
            ("p/@*/w", "p/@0/w", true),
            ("p/@*/w", "p/@12/w", true),
            ("p/@*/w", "p/#0/w", false),
            ("l/#*/w", "l/#5/w", true),
            ("l/#*/w", "l/@5/w", false),
            ("l/*/w", "l/@5/w", true),
            ("l/*/w", "l/#5/w", true),
            ("*/#2/p/@*/w", "l/#2/p/@9/w", true),
            ("*/#2/p/@*/w", "l/#1/p/@9/w", false),
            ("l/*/w", "l/#5/x/w", false),
            // A leading `/` anchors a top-level node.
            ("/b", "b", true),
            ("/b", "l/#0/b", false),
            // Steps that are no step match nothing.
            ("l/#x/b", "l/#0/b", false),
            ("l//b", "l/#0/b", false),
            ("l/#-1/b", "l/#0/b", false),
        ];
        for (target, at, expected) in cases {
            assert_eq!(
                Target::parse(target).matches(&path(at)),
                *expected,
                "target {target:?} at {at:?}"
            );
        }
    }

    #[test]
    fn an_interrupt_fires_once_at_its_moment_and_target() {
        let script = Script::new()
            .interrupt(Interrupt::before("l/#1/b"))
            .interrupt(Interrupt::after_chunks("p/@*/llm", 2));
        let run = RunId::new();
        assert_eq!(script.before_node(run, &path("l/#0/b")), None);
        assert_eq!(script.node_started(run, &path("l/#1/b")), None);
        assert!(script.before_node(run, &path("l/#1/b")).is_some());
        assert_eq!(script.before_node(run, &path("l/#1/b")), None, "fired once");
        assert_eq!(script.chunk(run, &path("p/@3/llm"), 1), None);
        assert!(script.chunk(run, &path("p/@3/llm"), 2).is_some());
        assert_eq!(script.chunk(run, &path("p/@4/llm"), 2), None, "fired once");
        assert_eq!(
            script.fired(),
            [
                At::BeforeNode("l/#1/b".into()),
                At::AfterChunks("p/@*/llm".into(), 2)
            ]
        );
    }
}
