//! The node handler contract: what the host implements for its own node kinds, and the
//! context the engine hands to every running node.
//!
//! A handler gets its parameters already resolved (references replaced by values) and a
//! [`NodeContext`]. The context says when a stop is requested (a flag and a future), streams
//! chunks (kept as the node's partial output, so a stop never loses them) and appends history
//! messages. The handler returns a [`NodeOutput`] or a typed [`NodeError`].

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use imbl::Vector;
use tokio_util::sync::CancellationToken;

use super::probe::{Probe, ProbeStop};
use crate::model::{
    Map, Message, NodeError, NodeId, NodeOutput, NodePath, RunEvent, RunId, StopMode, StopReason,
    StopRequested, ThreadId, Value,
};
use crate::workflow::{ParamIssue, ParamSchema};

/// The logic of a node kind. Registered by kind name on the runtime builder.
///
/// Contract:
/// - `run` may be aborted at any `.await` when a stop is forced; everything it streamed with
///   [`NodeContext::emit`] and appended with [`NodeContext::append_message`] before that is kept.
/// - On a graceful stop, [`NodeContext::stop_requested`] turns true and
///   [`NodeContext::stopped`] resolves; the handler may finish its work or return early with
///   [`NodeError::Stopped`]. `emit` refuses chunks once a stop is requested.
/// - A panic in `run` fails the run with the node id and the panic message.
#[async_trait]
pub trait NodeHandler: Send + Sync + 'static {
    /// The parameters this kind accepts, checked when a workflow is validated.
    /// The default accepts any object.
    fn params(&self) -> ParamSchema {
        ParamSchema::any()
    }

    /// The branch labels this kind may activate on its outgoing edges, given its raw
    /// parameters. `None` (the default) means any label is allowed.
    fn branches(&self, params: &serde_json::Value) -> Option<Vec<String>> {
        let _ = params;
        None
    }

    /// Checks of the raw parameters beyond the types of [`params`](Self::params), made when a
    /// workflow is validated (a literal URL's host, say); references are not resolved yet, so
    /// only literal values can be judged. Each issue names its field. None by default.
    fn check_params(&self, params: &serde_json::Value) -> Vec<ParamIssue> {
        let _ = params;
        Vec::new()
    }

    /// Whether [`run`](Self::run) never blocks its thread: no long synchronous work and no
    /// `block_in_place` before it first waits. The engine then polls it once on the actor
    /// running its graph (the run's, or its loop's or parallel's) before anything else: a run
    /// that finishes without waiting (a template, a switch) costs no actor and no task. That
    /// actor polls such nodes for at most 2 ms per message; after that the next one starts in
    /// a node actor, which polls it once first. Until a poll returns, the actor polling it
    /// answers neither stops, aborts nor queries. A run that waits goes on in a node actor
    /// and a task of its own, as any other. `false` (the default): the handler always runs in
    /// its own task.
    fn never_blocks(&self) -> bool {
        false
    }

    /// Runs the node.
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError>;
}

/// What a running node has produced so far, shared between its handler task and its actor.
#[derive(Debug, Default)]
pub(crate) struct NodeBuffer {
    /// Everything streamed with `emit`, in order.
    pub(crate) partial: String,
    /// How many chunks were streamed.
    pub(crate) chunks: u64,
    /// Messages appended with `append_message`.
    pub(crate) messages: Vec<Message>,
    /// The stop a probe requested at one of this node's chunks.
    pub(crate) requested_stop: ProbeStop,
}

/// Asks a run to stop (its supervisor, once it is up).
pub(crate) type StopHook = Box<dyn Fn(StopMode, StopReason) + Send + Sync>;

/// What every node of a run may read, and its way to ask the run to stop.
pub(crate) struct RunScope {
    pub(crate) run_id: RunId,
    pub(crate) thread: ThreadId,
    pub(crate) inputs: Arc<Map>,
    pub(crate) events: super::events::EventSender,
    pub(crate) probe: Option<Arc<dyn Probe>>,
    /// Set once the run's supervisor is up.
    pub(crate) stop: OnceLock<StopHook>,
}

impl fmt::Debug for RunScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunScope")
            .field("run_id", &self.run_id)
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

impl RunScope {
    /// Publishes an event; no subscriber is fine.
    pub(crate) fn emit(&self, event: RunEvent) {
        self.events.send(event);
    }

    /// Asks the run to stop; before its supervisor is up, nothing happens.
    pub(crate) fn request_stop(&self, mode: StopMode, reason: StopReason) {
        if let Some(stop) = self.stop.get() {
            stop(mode, reason);
        }
    }
}

/// The context of one running node.
#[derive(Clone)]
pub struct NodeContext {
    run: Arc<RunScope>,
    node: NodeId,
    path: NodePath,
    stop: CancellationToken,
    buffer: Arc<Mutex<NodeBuffer>>,
    history: Arc<HistoryView>,
}

/// The history a node sees: shared with the run (a persistent vector, so handing it to a node
/// copies nothing), laid out as a slice only when the node asks for it.
struct HistoryView {
    shared: Vector<Message>,
    slice: OnceLock<Vec<Message>>,
}

impl fmt::Debug for NodeContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeContext")
            .field("run_id", &self.run.run_id)
            .field("path", &self.path)
            .field("stop_requested", &self.stop.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl NodeContext {
    pub(crate) fn new(
        run: Arc<RunScope>,
        node: NodeId,
        path: NodePath,
        stop: CancellationToken,
        history: Vector<Message>,
    ) -> Self {
        Self {
            run,
            node,
            path,
            stop,
            buffer: Arc::default(),
            history: Arc::new(HistoryView {
                shared: history,
                slice: OnceLock::new(),
            }),
        }
    }

    /// The run this node belongs to.
    pub fn run_id(&self) -> RunId {
        self.run.run_id
    }

    /// The thread (conversation) of the run.
    pub fn thread(&self) -> &ThreadId {
        &self.run.thread
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.node
    }

    /// Where this node runs, through loop iterations and parallel items.
    pub fn path(&self) -> &NodePath {
        &self.path
    }

    /// The run's inputs, as given to `start` (defaults applied).
    pub fn inputs(&self) -> &Map {
        &self.run.inputs
    }

    /// The thread's history as this node sees it: what was persisted before the run, then the
    /// messages of the nodes that completed before this one started.
    pub fn history(&self) -> &[Message] {
        self.history
            .slice
            .get_or_init(|| self.history.shared.iter().cloned().collect())
    }

    /// Whether a stop was requested.
    pub fn stop_requested(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Resolves when a stop is requested (at once if it already was).
    pub async fn stopped(&self) {
        self.stop.cancelled().await
    }

    /// Streams a chunk of output: it is published as an event and kept as the node's partial
    /// output. Once a stop is requested the chunk is refused and [`StopRequested`] returned;
    /// a streaming handler should then return (or, to finish its work within a graceful
    /// stop's timeout, go on with [`emit_while_stopping`](Self::emit_while_stopping)).
    pub fn emit(&self, chunk: impl Into<String>) -> Result<(), StopRequested> {
        if self.stop.is_cancelled() {
            return Err(StopRequested);
        }
        self.emit_while_stopping(chunk);
        Ok(())
    }

    /// Streams a chunk of output even once a stop is requested: for a handler that finishes
    /// what it is doing during a graceful stop (a call whose answer is still arriving) rather
    /// than returning at once. Like [`emit`](Self::emit), the chunk is published and kept as
    /// the node's partial output, so if the stop is forced before the handler returns, what it
    /// streamed until then is still kept.
    pub fn emit_while_stopping(&self, chunk: impl Into<String>) {
        let chunk: String = chunk.into();
        let count = {
            let mut buffer = self.lock();
            buffer.partial.push_str(&chunk);
            buffer.chunks += 1;
            buffer.chunks
        };
        // No subscriber is fine: events are for whoever listens.
        self.run.events.send(RunEvent::NodeChunk {
            path: self.path.clone(),
            text: Arc::from(chunk),
        });
        if let Some((mode, reason)) = self
            .run
            .probe
            .as_ref()
            .and_then(|p| p.chunk(self.run.run_id, &self.path, count))
        {
            // This node sees the stop at once (its next chunk is refused); the run learns of
            // it through its supervisor, or through this node's report if that comes first.
            self.lock().requested_stop.get_or_insert((mode, reason));
            self.stop.cancel();
            self.run.request_stop(mode, reason);
        }
    }

    /// Appends a message to the thread's history. It is persisted with the run's other
    /// messages when the run finishes, pauses, fails or stops, even if this node is cut short.
    pub fn append_message(&self, mut message: Message) {
        message.run_id = Some(self.run.run_id);
        message.node_id.get_or_insert_with(|| self.node.clone());
        self.lock().messages.push(message);
    }

    /// Everything streamed so far.
    pub fn partial_output(&self) -> String {
        self.lock().partial.clone()
    }

    /// The handler returned: asks the run's probe whether to stop the run at this instant,
    /// and requests that stop if it says so.
    pub(crate) fn probe_returned(&self) -> ProbeStop {
        let (mode, reason) = self
            .run
            .probe
            .as_ref()
            .and_then(|p| p.handler_returned(self.run.run_id, &self.path))?;
        self.run.request_stop(mode, reason);
        Some((mode, reason))
    }

    pub(crate) fn buffer(&self) -> &Arc<Mutex<NodeBuffer>> {
        &self.buffer
    }

    fn lock(&self) -> MutexGuard<'_, NodeBuffer> {
        // A handler that panicked while holding the lock left consistent data (plain pushes).
        self.buffer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Reads a required string field from a resolved input.
pub fn input_str<'a>(input: &'a Value, field: &str) -> Result<&'a str, NodeError> {
    match input.get(field) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(NodeError::invalid_input(
            field,
            format!("expected a string, found {}", other.type_name()),
        )),
        None => Err(NodeError::invalid_input(field, "is required")),
    }
}

/// Reads an optional duration field from a resolved input, written as humantime reads it
/// (`"250ms"`, `"1m 30s"`).
pub fn input_duration(input: &Value, field: &str) -> Result<Option<Duration>, NodeError> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => humantime::parse_duration(s)
            .map(Some)
            .map_err(|e| NodeError::invalid_input(field, format!("{s:?} is not a duration ({e})"))),
        Some(other) => Err(NodeError::invalid_input(
            field,
            format!(
                "expected a duration such as \"250ms\" or \"30s\", found {}",
                other.type_name()
            ),
        )),
    }
}

/// Reads an optional boolean field from a resolved input.
pub fn input_bool(input: &Value, field: &str, default: bool) -> Result<bool, NodeError> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(NodeError::invalid_input(
            field,
            format!("expected a boolean, found {}", other.type_name()),
        )),
    }
}
