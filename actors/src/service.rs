//! Services: the actors and tables a runtime holds once for all its runs. The registry of
//! live runs, the checkpointer (background snapshot writes, and the awaited writes runs make
//! in their own tasks against the chains it shares), the stop watcher (the only reader of stop
//! and cancel flags) and the lease keeper (the worker's heartbeat and its runs' leases).

pub(crate) mod checkpointer;
pub(crate) mod keeper;
mod registry;
pub(crate) mod watcher;

pub use checkpointer::CheckpointObserver;
pub(crate) use registry::ThreadClaim;
pub use registry::{RunRegistry, RunSummary};
