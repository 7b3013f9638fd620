//! The core: pure state machines that decide what a run does next. Graph scheduling (which
//! nodes are ready, which are skipped), loop iteration, parallel items, the run's lifecycle
//! and the save gate.
//!
//! No actors, no tasks, no clocks, no IO: every machine takes events and returns what to do,
//! and is tested by data. The actors in `exec` carry its decisions out.

mod assign;
pub(crate) mod dag;
pub(crate) mod items;
pub(crate) mod iteration;
pub(crate) mod lifecycle;
pub(crate) mod save_gate;
#[cfg(test)]
mod testing;

pub(crate) use dag::{NodeIndex, NodeState, Schedule};
pub use items::ItemError;
pub use iteration::IterationDetail;
