//! The children of a graph execution: node and body actors, how to stop, abort or query them,
//! and how their end reaches the host.

use super::*;

/// A child actor of a host, executing one node of a graph.
#[derive(Clone)]
pub(crate) enum ChildRef {
    Node(ActorRef<NodeMsg>),
    Body(ActorRef<BodyMsg>),
}

impl ChildRef {
    pub(super) fn id(&self) -> ActorId {
        match self {
            ChildRef::Node(a) => a.get_id(),
            ChildRef::Body(a) => a.get_id(),
        }
    }

    /// Aborts the child's work now; it still reports.
    pub(crate) fn abort(&self) {
        let _ = match self {
            ChildRef::Node(a) => a.send_message(NodeMsg::Abort).map_err(|_| ()),
            ChildRef::Body(a) => a
                .send_message(BodyMsg::Stop(StopMode::Force))
                .map_err(|_| ()),
        };
    }

    /// Asks a body child to stop gracefully (a node child sees its stop flag instead).
    pub(super) fn stop_gracefully(&self) {
        if let ChildRef::Body(a) = self {
            let _ = a.send_message(BodyMsg::Stop(StopMode::graceful()));
        }
    }

    pub(crate) fn kill(&self) {
        match self {
            ChildRef::Node(a) => a.kill(),
            ChildRef::Body(a) => a.kill(),
        }
    }

    /// Asks the child to describe itself (and, for a body, its own children).
    pub(crate) async fn describe(&self, path: NodePath, timeout: std::time::Duration) -> ActorTree {
        let actor_id = self.id().to_string();
        let node = path.leaf().cloned();
        let answer = match self {
            ChildRef::Node(a) => match a.call(NodeMsg::Describe, Some(timeout)).await {
                Ok(ractor::rpc::CallResult::Success(status)) => Some(ActorTree::new(
                    actor_id.clone(),
                    "node",
                    node.clone(),
                    status.as_str(),
                )),
                _ => None,
            },
            ChildRef::Body(a) => match a.call(BodyMsg::Describe, Some(timeout * 2)).await {
                Ok(ractor::rpc::CallResult::Success(tree)) => Some(tree),
                _ => None,
            },
        };
        let mut tree = answer.unwrap_or_else(|| {
            let kind = match self {
                ChildRef::Node(_) => "node",
                ChildRef::Body(_) => "body",
            };
            ActorTree::new(actor_id, kind, node, "unresponsive")
        });
        tree.path = Some(path);
        tree
    }
}

pub(crate) struct Child {
    pub(crate) node: NodeIndex,
    pub(crate) actor: ChildRef,
    pub(super) stop: CancellationToken,
    pub(crate) report: oneshot::Receiver<NodeReport>,
}

/// A child actor that ended, as a supervision event tells it.
#[derive(Debug)]
pub(crate) struct Ended {
    pub(crate) id: ActorId,
    /// Why it failed, if it did not end normally.
    pub(crate) failure: Option<String>,
}

impl Ended {
    /// The ending a supervision event reports, if it reports one.
    pub(crate) fn from_event(event: ractor::SupervisionEvent) -> Option<Self> {
        match event {
            ractor::SupervisionEvent::ActorTerminated(cell, _, _) => Some(Self {
                id: cell.get_id(),
                failure: None,
            }),
            ractor::SupervisionEvent::ActorFailed(cell, e) => Some(Self {
                id: cell.get_id(),
                failure: Some(format!("node actor failed: {e}")),
            }),
            _ => None,
        }
    }
}
