//! A run's actor tree, as each actor describes itself (for ops tooling).

use serde::Serialize;

use super::ids::NodeId;

/// One node of a run's actor tree, as the actor itself reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ActorTree {
    /// The ractor actor id (`0.42`).
    pub actor_id: String,
    /// `run_supervisor` or `node` (later also `loop` and `parallel`).
    pub kind: &'static str,
    /// The workflow node it executes, for node actors.
    pub node_id: Option<NodeId>,
    /// What the actor says it is doing: `running`, `stopping`, or `unresponsive` when it did
    /// not answer in time.
    pub status: String,
    /// Its supervised children.
    pub children: Vec<ActorTree>,
}
