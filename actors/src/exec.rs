//! Execution: the actors that carry out what `core` decides. The run supervisor, node actors,
//! and body actors for loops and parallels, with the graph execution they share.
//!
//! The only layer whose modules may import each other in a circle: a supervisor spawns
//! bodies, which spawn nodes and bodies, all of which report to their parent.

mod body;
mod config;
mod graph;
mod node;
mod run;
mod supervisor;

pub use config::{LeaseConfig, RuntimeConfig};
pub(crate) use run::{EndParts, EndReached, LiveRun, LiveState, RunInfo, RunServices};
pub(crate) use supervisor::{Restore, RunArgs, RunMsg, RunSupervisor};
