//! Durability modes: when a run's snapshots are written.

use serde::{Deserialize, Serialize};

/// When snapshots are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// After every node, before its dependents start: a crash loses no completed node.
    Sync,
    /// After every node, in the background, coalesced per run: a crash may lose the nodes
    /// that finished after the last stored snapshot.
    #[default]
    Async,
    /// Only when the run pauses, stops, fails or finishes.
    Exit,
}
