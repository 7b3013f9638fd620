//! runvisor-actors: the engine. Workflow model and validation, the pure state machines that
//! decide what a run does next, the supervised actor tree that carries those decisions out,
//! the ports to the outside world and their in-memory implementations (the embedded default).
//!
//! Hosts use the [`Runtime`]: register node kinds, validate workflows, start runs, follow
//! their events and wait for their outcomes. Store adapters implement the traits in
//! [`store`]. See the crate's ARCHITECTURE.md for the map.
//!
//! The engine is built in layers, each a folder that imports only the layers before it:
//! `model` -> `workflow` -> `core` -> `persist` -> `kinds` -> `exec` -> `service` ->
//! `runtime`, then `testkit`.

mod core;
mod exec;
mod kinds;
mod model;
mod persist;
mod runtime;
mod service;
#[cfg(feature = "testkit")]
pub mod testkit;
mod workflow;

pub use exec::{LeaseConfig, RuntimeConfig};
pub use kinds::{
    ELSE, KindError, Kinds, NodeContext, NodeHandler, Probe, ProbeStop, Switch, input_bool,
    input_duration, input_str,
};
pub use model::{
    ActorTree, AnswerError, CheckpointError, CheckpointId, Fence, FieldType, FinishedRun,
    FormField, Frame, HistoryFlush, Interaction, InteractionId, InteractionKind, Interrupted,
    InvalidId, Lease, LeaseError, LeaseHolder, MAX_DEPTH, Map, Message, MessageId, NodeError,
    NodeId, NodeOutput, NodePath, ObjectMap, Outputs, ResolveError, Role, Route, RunError,
    RunEvent, RunId, RunLabels, RunOutcome, RunRecord, RunStatus, SelectOption, Spill, StopError,
    StopMode, StopReason, StopReply, StopRequested, StopResult, StoreError, ThreadId, TooDeep,
    UnknownStatus, Unpersisted, Usage, Value, WorkerId, WorkerInfo,
};
pub use persist::{Durability, SignalConfig, escape_label, render_key};
pub use runtime::{
    Adoption, BuildError, EventStream, QueryError, ReplayError, Replayed, ResumeError, ResumeFrom,
    ResumeInput, ResumeOptions, RunHandle, RunQuery, RunView, Runtime, RuntimeBuilder, StartError,
    StopRequest, TraceContext, is_orphaned,
};
pub use service::{CheckpointObserver, RunRegistry, RunSummary};
pub use workflow::{
    BodyDef, DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_ITERATIONS, EdgeDef, Field, InputDecl,
    InputError, InputType, KindCatalog, NodeDef, ParamIssue, ParamSchema, ParamType,
    ValidationErrors, Workflow, WorkflowDef, WorkflowError,
};

/// The ports: what a store adapter implements (checkpoints, run records, history, stop and
/// cancel signals, leases, and the spill store that keeps what they did not take), the
/// in-memory implementations, and the records they keep.
pub mod store {
    pub use crate::model::{RunRecord, RunStatus, StoreError};
    pub use crate::persist::DeltaLink;
    pub use crate::persist::memory;
    pub use crate::persist::{
        Acquired, Begun, CheckpointStore, EndFailed, EndStep, EndStore, EndWritten, HistoryStore,
        HistoryTail, LeaseStore, MemoryLeaseStore, Notice, NoticeStream, RunStore, Signal,
        SignalSource, SpillStore, SpilledRun, StartStore, StoredCheckpoint, WholeEnd,
    };
}

/// The snapshot format: what a checkpoint holds and its versioned, checksummed envelope.
pub mod snapshot {
    pub use crate::persist::snapshot::*;
}

/// Incremental checkpoints: deltas of snapshots, and reading a checkpoint back whole.
pub mod delta {
    pub use crate::persist::delta::*;
}

/// Re-exported so host handlers need no direct dependency to implement [`NodeHandler`].
pub use async_trait::async_trait;
