//! `NodeActor`: one per executing node, a linked child of the run's supervisor (or of its
//! loop's or parallel's actor). A node whose kind never blocks is first polled on that parent
//! ([`run_inline`]): when it finishes there it has no actor at all.
//!
//! The actor runs its handler as a separate tokio task, so it stays responsive (tree queries,
//! a force stop) while the handler works. Whatever way it ends (the handler finished or failed
//! or panicked, a force stop aborted it, or its parent stopped it), `post_stop` hands the
//! parent a [`NodeReport`] through a oneshot channel: the output or error, everything streamed
//! and every message appended. Only a kill skips `post_stop`; the parent then sees the channel
//! closed and knows the node's buffer is lost, which is why the engine never kills a node
//! before asking it to stop.
//!
//! A handler that has returned is finished, even when a force stop lands in the same instant:
//! its task puts the result in a slot shared with the actor before it tells the actor, and an
//! abort (or a stop from outside) reads that slot once the task is gone. Its output is kept,
//! with its messages, and it never runs again. An output nested deeper than
//! [`MAX_DEPTH`](crate::model::MAX_DEPTH) fails the node ([`NodeError::TooDeep`]) and is
//! dismantled in the task, never dropped by recursion.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::core::NodeIndex;
use crate::kinds::{NodeContext, NodeHandler};
use crate::model::{Interaction, Message, NodeError, NodeOutput, NodePath, StopMode, Usage, Value};
use crate::persist::snapshot::FrameState;
/// How long `post_stop` waits for an aborted handler task to unwind before reading its
/// buffer. A handler blocking its thread without awaiting cannot be cancelled at all; this
/// bound keeps the flush from hanging on it.
const ABORT_GRACE: Duration = Duration::from_millis(200);
/// How long a handler task that a probe stopped at its return waits for the stop to reach its
/// actor before it delivers its result anyway.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// What the handler returned, put there by its task before it tells the actor.
type Returned = Arc<Mutex<Option<Result<NodeOutput, NodeError>>>>;

/// A handler's run as a future of its result: a panic is the node's failure
/// ([`NodeError::Panicked`]), and so is an output nested too deep ([`NodeError::TooDeep`]).
pub(crate) type HandlerRun = Pin<Box<dyn Future<Output = Result<NodeOutput, NodeError>> + Send>>;

/// The run of `handler` on `input`, not yet polled.
pub(crate) fn handler_run(
    handler: Arc<dyn NodeHandler>,
    input: Value,
    ctx: NodeContext,
) -> HandlerRun {
    Box::pin(async move {
        AssertUnwindSafe(handler.run(input, ctx))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(NodeError::Panicked(panic_message(&*panic))))
            .and_then(checked_output)
    })
}

/// How a node ended, from what its handler returned: an error `Stopped` after a stop was
/// requested is an interruption, not a failure.
fn end_of(result: Result<NodeOutput, NodeError>, ctx: &NodeContext) -> NodeEnd {
    match result {
        Ok(output) => NodeEnd::Completed(output),
        Err(NodeError::Stopped) if ctx.stop_requested() => NodeEnd::interrupted(false),
        Err(error) => NodeEnd::failed(error),
    }
}

/// The report of a node that ended with `end`: everything its handler streamed and every
/// message it appended (taken from its buffer), recorded on its span.
fn report_of(node: NodeIndex, ctx: &NodeContext, end: NodeEnd, span: &tracing::Span) -> NodeReport {
    let (partial, chunks, messages, requested_stop) = {
        let mut buffer = ctx.buffer().lock().unwrap_or_else(|e| e.into_inner());
        (
            std::mem::take(&mut buffer.partial),
            buffer.chunks,
            std::mem::take(&mut buffer.messages),
            buffer.requested_stop,
        )
    };
    let usage = match &end {
        NodeEnd::Completed(output) => output.usage.clone(),
        _ => Usage::new(),
    };
    record_end(span, &end, &usage);
    NodeReport {
        node,
        end,
        partial,
        chunks,
        messages,
        requested_stop,
        usage,
    }
}

/// Polls a never-blocking handler's run once on the caller's task (a run's supervisor, or a
/// loop's or parallel's actor): a run that finishes within that poll is the node's report, with no actor and no task; one
/// that waits comes back, to go on in a node actor ([`NodeStart::Polled`]).
pub(crate) async fn run_inline(
    node: NodeIndex,
    mut run: HandlerRun,
    ctx: &NodeContext,
    span: &tracing::Span,
) -> Result<NodeReport, HandlerRun> {
    let first = std::future::poll_fn(|cx| {
        Poll::Ready(span.in_scope(|| {
            tracing::debug!("node started");
            run.as_mut().poll(cx)
        }))
    })
    .await;
    match first {
        Poll::Ready(result) => {
            span.in_scope(|| tracing::debug!(ok = result.is_ok(), "node returned"));
            Ok(report_of(node, ctx, end_of(result, ctx), span))
        }
        Poll::Pending => Err(run),
    }
}

/// How a node's execution ended.
#[derive(Debug)]
pub(crate) enum NodeEnd {
    /// The handler returned an output.
    Completed(NodeOutput),
    /// The handler returned an error or panicked. For a loop or parallel node, `path` names
    /// the body node that failed.
    Failed {
        path: Option<NodePath>,
        error: NodeError,
        /// A loop's or parallel's progress up to the failure (finished iterations and items
        /// are kept; a resume continues from there).
        frame: Option<FrameState>,
    },
    /// The node was stopped before it finished. `forced` is set when its handler task was
    /// aborted rather than allowed to return. A loop or parallel node hands over its progress
    /// (`frame`) and the interactions that paused it.
    Interrupted {
        forced: bool,
        frame: Option<FrameState>,
        interactions: Vec<Interaction>,
        /// The body nodes cut short inside it, by full path.
        inner: Vec<crate::model::Interrupted>,
    },
}

impl NodeEnd {
    pub(crate) fn interrupted(forced: bool) -> Self {
        NodeEnd::Interrupted {
            forced,
            frame: None,
            interactions: Vec::new(),
            inner: Vec::new(),
        }
    }

    pub(crate) fn failed(error: NodeError) -> Self {
        NodeEnd::Failed {
            path: None,
            error,
            frame: None,
        }
    }

    /// A completed output, or the node's failure when the output (or a variable it assigns)
    /// nests deeper than [`MAX_DEPTH`](crate::model::MAX_DEPTH); a refused output is
    /// dismantled without recursion.
    pub(crate) fn checked(output: NodeOutput) -> Self {
        match checked_output(output) {
            Ok(output) => NodeEnd::Completed(output),
            Err(error) => NodeEnd::failed(error),
        }
    }
}

/// The output, or [`NodeError::TooDeep`] (the output dismantled) when it nests too deep.
fn checked_output(output: NodeOutput) -> Result<NodeOutput, NodeError> {
    match output.check_depth() {
        Ok(()) => Ok(output),
        Err(error) => {
            output.dismantle();
            Err(error)
        }
    }
}

/// What a node hands its parent when it ends.
#[derive(Debug)]
pub(crate) struct NodeReport {
    pub(crate) node: NodeIndex,
    pub(crate) end: NodeEnd,
    /// Everything the handler streamed.
    pub(crate) partial: String,
    /// How many chunks it streamed.
    pub(crate) chunks: u64,
    /// Every message it appended.
    pub(crate) messages: Vec<Message>,
    /// The stop a probe requested at one of its chunks, if one did.
    pub(crate) requested_stop: crate::kinds::ProbeStop,
    /// What the node (a loop or parallel: its body nodes) consumed in this run.
    pub(crate) usage: Usage,
}

/// Messages a node actor handles.
#[derive(Debug)]
pub(crate) enum NodeMsg {
    /// The handler task ended; its result is in the slot.
    Finished,
    /// Abort the handler task now and end (a force stop).
    Abort,
    /// Describe this actor for a tree query.
    Describe(RpcReplyPort<NodeStatus>),
}

/// What a node actor says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeStatus {
    /// The handler is running.
    Running,
    /// A stop was requested; the handler is finishing.
    Stopping,
}

impl NodeStatus {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            NodeStatus::Running => "running",
            NodeStatus::Stopping => "stopping",
        }
    }
}

pub(crate) struct NodeActor;

/// What a node actor runs.
pub(crate) enum NodeStart {
    /// The handler, from the start.
    Fresh {
        handler: Arc<dyn NodeHandler>,
        input: Value,
    },
    /// A never-blocking handler's run that its parent polled once ([`run_inline`]) and that
    /// waits: it goes on in the actor's task.
    Polled(HandlerRun),
}

pub(crate) struct NodeArgs {
    pub(crate) node: NodeIndex,
    pub(crate) start: NodeStart,
    pub(crate) ctx: NodeContext,
    pub(crate) report: oneshot::Sender<NodeReport>,
    pub(crate) span: tracing::Span,
}

pub(crate) struct NodeState {
    node: NodeIndex,
    ctx: NodeContext,
    report: Option<oneshot::Sender<NodeReport>>,
    task: Option<JoinHandle<()>>,
    start: Option<(NodeStart, tracing::Span)>,
    end: Option<NodeEnd>,
    /// What the handler returned, once it has.
    returned: Returned,
    /// Told when an abort begins (a probe that stopped the run at the handler's return waits
    /// for it, so the abort meets a handler that has returned).
    aborting: Arc<Notify>,
    /// The node's span (its run, thread and fencing token).
    span: tracing::Span,
}

impl NodeState {
    /// How the node ended, from what its handler returned; `None` if it has not returned.
    fn take_returned(&self) -> Option<NodeEnd> {
        let result = self
            .returned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        Some(end_of(result, &self.ctx))
    }
}

impl Actor for NodeActor {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: NodeArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(NodeState {
            node: args.node,
            ctx: args.ctx,
            report: Some(args.report),
            task: None,
            span: args.span.clone(),
            start: Some((args.start, args.span)),
            end: None,
            returned: Arc::default(),
            aborting: Arc::new(Notify::new()),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some((start, span)) = state.start.take() else {
            return Ok(());
        };
        let ctx = state.ctx.clone();
        let returned = state.returned.clone();
        let aborting = state.aborting.clone();
        // A run its parent polled already goes straight to a task of its own.
        let (run, inline, fresh) = match start {
            NodeStart::Fresh { handler, input } => {
                let inline = handler.never_blocks();
                (handler_run(handler, input, ctx.clone()), inline, true)
            }
            NodeStart::Polled(run) => (run, false, false),
        };
        let mut task = Box::pin(
            async move {
                // Each execution of a node, within its run's span (run, thread and fencing
                // token): what an audit of who ran what, and when, reads.
                if fresh {
                    tracing::debug!("node started");
                }
                let result = run.await;
                // No await between the handler's return and this: an abort either came before
                // the return or finds the result here.
                tracing::debug!(ok = result.is_ok(), "node returned");
                *returned.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                if let Some((mode, _)) = ctx.probe_returned() {
                    // A probe stopped the run at this instant: let the stop reach the actor
                    // before the result does (a force stop aborts this task meanwhile).
                    let _ = tokio::time::timeout(PROBE_WAIT, async {
                        match mode {
                            StopMode::Force => aborting.notified().await,
                            StopMode::Graceful { .. } => ctx.stopped().await,
                        }
                    })
                    .await;
                }
                // The actor may be gone already (aborted run): nothing to tell then.
                let _ = myself.send_message(NodeMsg::Finished);
            }
            .instrument(span),
        );
        // A handler that never blocks is polled once here first: if it finishes without
        // waiting it costs no task, and its `Finished` is this actor's next message. One that
        // waits goes on in its own task, so this actor answers aborts and queries meanwhile
        // (that task's first poll moves the handler's wake-ups to it).
        if inline {
            let first = std::future::poll_fn(|cx| Poll::Ready(task.as_mut().poll(cx)));
            if first.await.is_ready() {
                return Ok(());
            }
        }
        state.task = Some(tokio::spawn(task));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            NodeMsg::Finished => {
                state.task = None;
                if state.end.is_none() {
                    state.end = state.take_returned();
                }
                myself.stop(None);
            }
            NodeMsg::Abort => {
                if state.end.is_none() {
                    state.aborting.notify_one();
                    abort_task(state).await;
                    tracing::debug!(parent: &state.span, "node aborted");
                    // A handler that returned before the abort took effect is finished.
                    state.end = Some(state.take_returned().unwrap_or(NodeEnd::interrupted(true)));
                }
                myself.stop(Some("aborted".into()));
            }
            NodeMsg::Describe(reply) => {
                let status = if state.ctx.stop_requested() {
                    NodeStatus::Stopping
                } else {
                    NodeStatus::Running
                };
                let _ = reply.send(status);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if state.end.is_none() {
            // Stopped from outside before the actor learnt of the handler's return: the
            // handler may still have returned before its task was aborted.
            let forced = state.task.is_some();
            abort_task(state).await;
            state.end = Some(
                state
                    .take_returned()
                    .unwrap_or(NodeEnd::interrupted(forced)),
            );
        }
        let end = state.end.take().unwrap_or(NodeEnd::interrupted(true));
        let report = report_of(state.node, &state.ctx, end, &state.span);
        if let Some(tx) = state.report.take() {
            // The parent may have given up waiting: the report then has no reader.
            let _ = tx.send(report);
        }
        Ok(())
    }
}

/// Records how a node ended on its span: the outcome, the error (with the span's status),
/// and the model and tokens it reports, under the GenAI conventions' names.
pub(crate) fn record_end(span: &tracing::Span, end: &NodeEnd, usage: &Usage) {
    let outcome = match end {
        NodeEnd::Completed(_) => "completed",
        NodeEnd::Failed { .. } => "failed",
        NodeEnd::Interrupted { forced: true, .. } => "aborted",
        NodeEnd::Interrupted { .. } => "stopped",
    };
    span.record("runvisor.node.outcome", outcome);
    if let NodeEnd::Completed(NodeOutput {
        model: Some(model), ..
    }) = end
    {
        span.record("gen_ai.request.model", model.as_str());
    }
    if let NodeEnd::Failed { error, .. } = end {
        let kind = match error {
            NodeError::Failed(_) => "failed",
            NodeError::InvalidInput { .. } => "invalid_input",
            NodeError::Resolve(_) => "resolve",
            NodeError::Stopped => "stopped",
            NodeError::Panicked(_) => "panicked",
            NodeError::TooDeep { .. } => "too_deep",
        };
        span.record("error.type", kind);
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", error.to_string());
    }
    for (names, field) in [
        (
            ["input_tokens", "prompt_tokens"],
            "gen_ai.usage.input_tokens",
        ),
        (
            ["output_tokens", "completion_tokens"],
            "gen_ai.usage.output_tokens",
        ),
    ] {
        if let Some(amount) = names.iter().find_map(|n| usage.get(*n)) {
            span.record(field, *amount as u64);
        }
    }
}

/// Aborts the handler task and waits (briefly) until it is gone, so its buffer is final.
async fn abort_task(state: &mut NodeState) {
    if let Some(task) = state.task.take() {
        task.abort();
        let _ = tokio::time::timeout(ABORT_GRACE, task).await;
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-text panic payload".to_owned()
    }
}
