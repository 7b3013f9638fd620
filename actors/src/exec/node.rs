//! `NodeActor`: one per executing node, a linked child of the run's supervisor.
//!
//! The actor runs its handler as a separate tokio task, so it stays responsive (tree queries,
//! a force stop) while the handler works. Whatever way it ends (the handler finished or failed
//! or panicked, a force stop aborted it, or its parent stopped it), `post_stop` hands the
//! parent a [`NodeReport`] through a oneshot channel: the output or error, everything streamed
//! and every message appended. Only a kill skips `post_stop`; the parent then sees the channel
//! closed and knows the node's buffer is lost, which is why the engine never kills a node
//! before asking it to stop.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::core::NodeIndex;
use crate::kinds::{NodeContext, NodeHandler};
use crate::model::{Interaction, Message, NodeError, NodeOutput, NodePath, Usage, Value};
use crate::persist::snapshot::FrameState;
/// How long `post_stop` waits for an aborted handler task to unwind before reading its
/// buffer. A handler blocking its thread without awaiting cannot be cancelled at all; this
/// bound keeps the flush from hanging on it.
const ABORT_GRACE: Duration = Duration::from_millis(200);

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
    /// The handler task ended.
    Finished(Result<NodeOutput, NodeError>),
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

pub(crate) struct NodeArgs {
    pub(crate) node: NodeIndex,
    pub(crate) handler: Arc<dyn NodeHandler>,
    pub(crate) input: Value,
    pub(crate) ctx: NodeContext,
    pub(crate) report: oneshot::Sender<NodeReport>,
    pub(crate) span: tracing::Span,
}

pub(crate) struct NodeState {
    node: NodeIndex,
    ctx: NodeContext,
    report: Option<oneshot::Sender<NodeReport>>,
    task: Option<JoinHandle<()>>,
    start: Option<(Arc<dyn NodeHandler>, Value, tracing::Span)>,
    end: Option<NodeEnd>,
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
            start: Some((args.handler, args.input, args.span)),
            end: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some((handler, input, span)) = state.start.take() else {
            return Ok(());
        };
        let ctx = state.ctx.clone();
        state.task = Some(tokio::spawn(
            async move {
                let result = AssertUnwindSafe(handler.run(input, ctx))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| Err(NodeError::Panicked(panic_message(&*panic))));
                // The actor may be gone already (aborted run): nothing to tell then.
                let _ = myself.send_message(NodeMsg::Finished(result));
            }
            .instrument(span),
        ));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            NodeMsg::Finished(result) => {
                state.task = None;
                state.end = Some(match result {
                    Ok(output) => NodeEnd::Completed(output),
                    Err(NodeError::Stopped) if state.ctx.stop_requested() => {
                        NodeEnd::interrupted(false)
                    }
                    Err(error) => NodeEnd::failed(error),
                });
                myself.stop(None);
            }
            NodeMsg::Abort => {
                if state.end.is_none() {
                    abort_task(state).await;
                    state.end = Some(NodeEnd::interrupted(true));
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
            // Stopped from outside before the handler returned.
            let forced = state.task.is_some();
            abort_task(state).await;
            state.end = Some(NodeEnd::interrupted(forced));
        }
        let (partial, chunks, messages, requested_stop) = {
            let mut buffer = state.ctx.buffer().lock().unwrap_or_else(|e| e.into_inner());
            (
                std::mem::take(&mut buffer.partial),
                buffer.chunks,
                std::mem::take(&mut buffer.messages),
                buffer.requested_stop,
            )
        };
        let end = state.end.take().unwrap_or(NodeEnd::interrupted(true));
        let usage = match &end {
            NodeEnd::Completed(output) => output.usage.clone(),
            _ => Usage::new(),
        };
        let report = NodeReport {
            node: state.node,
            end,
            partial,
            chunks,
            messages,
            requested_stop,
            usage,
        };
        if let Some(tx) = state.report.take() {
            // The parent may have given up waiting: the report then has no reader.
            let _ = tx.send(report);
        }
        Ok(())
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
