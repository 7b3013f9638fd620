//! A run's actor tree, as each actor describes itself (for ops tooling).

use serde::{Deserialize, Serialize};

use super::ids::NodeId;
use super::path::NodePath;

/// One node of a run's actor tree, as the actor itself reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ActorTree {
    /// The ractor actor id (`0.42`), meaningful in the process that runs the run.
    pub actor_id: String,
    /// `run_supervisor`, `node`, `loop` or `parallel`.
    pub kind: String,
    /// The workflow node it executes (none for the supervisor).
    pub node_id: Option<NodeId>,
    /// Where it runs, through loop iterations and parallel items (`l/#3/b`); none for the
    /// supervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<NodePath>,
    /// What the actor says it is doing: `running`, `stopping`, or `unresponsive` when it did
    /// not answer in time.
    pub status: String,
    /// For a loop, the iteration running (its index, from 0, as paths show it: `l/#0/...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u32>,
    /// For a parallel, the items in flight (by input index, from 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<u32>,
    /// Its supervised children.
    pub children: Vec<ActorTree>,
}

impl ActorTree {
    /// An actor with no children yet.
    pub(crate) fn new(
        actor_id: String,
        kind: &str,
        node_id: Option<NodeId>,
        status: impl Into<String>,
    ) -> Self {
        Self {
            actor_id,
            kind: kind.to_owned(),
            node_id,
            path: None,
            status: status.into(),
            iteration: None,
            items: Vec::new(),
            children: Vec::new(),
        }
    }
}
