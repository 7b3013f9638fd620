//! Services: the actors and tables a runtime holds once for all its runs. The registry of
//! live runs, the checkpointer (the only writer of snapshots) and the stop watcher (the only
//! reader of stop and cancel flags).

pub(crate) mod checkpointer;
mod registry;
pub(crate) mod watcher;

pub use registry::{RunRegistry, RunSummary};
