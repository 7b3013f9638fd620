//! Persistence: the snapshot format and its envelope, the ports (the traits every store
//! implements), their in-memory implementations, durability modes, the naming of signal
//! keys, retrying a failing store until a deadline (`retry.rs`), and the spill store that
//! keeps what the stores did not take (`spill.rs`).
//!
//! The engine reaches everything outside the process through these ports; the `runvisor`
//! crate implements them on Redis.

mod check;
pub(crate) mod delta;
mod durability;
mod keys;
mod leases;
pub mod memory;
pub use leases::MemoryLeaseStore;
mod ports;
pub(crate) mod retry;
pub(crate) mod snapshot;
mod spill;

pub(crate) use check::check_graph;
pub use durability::Durability;
pub(crate) use keys::WatchedKeys;
pub use keys::{SignalConfig, escape_label, render_key};
pub use ports::{
    Acquired, Begun, CheckpointStore, DeltaLink, EndFailed, EndStep, EndStore, EndWritten,
    HistoryStore, HistoryTail, LeaseStore, Notice, NoticeStream, RunStore, Signal, SignalSource,
    StartStore, StoredCheckpoint, WholeEnd,
};
pub(crate) use snapshot::Snapshot;
pub use spill::{SpillStore, SpilledRun};
