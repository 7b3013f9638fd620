//! runvisor-actors: the engine. Workflow model and validation, the scheduler state machine,
//! the supervised actor tree that executes runs, the ports to the outside world and their
//! in-memory implementations (the embedded default).
//!
//! Hosts use the [`Runtime`]: register node kinds, validate workflows, start runs, follow
//! their events and wait for their outcomes. See the crate's ARCHITECTURE.md for the map.

pub mod event;
pub mod handler;
pub mod ids;
pub mod kinds;
pub mod message;
pub mod reference;
pub mod scheduler;
pub mod schema;
pub mod snapshot;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod value;
pub mod workflow;

mod body;
mod checkpointer;
mod exec;
mod interaction;
mod node;
mod outcome;
mod probe;
mod registry;
mod runtime;
mod stop;
mod supervisor;
mod watcher;

pub use checkpointer::Durability;
pub use event::{Frame, NodePath, RunEvent};
pub use handler::{NodeContext, NodeError, NodeHandler, NodeOutput, StopRequested, Usage};
pub use ids::{CheckpointId, InteractionId, InvalidId, MessageId, NodeId, RunId, ThreadId};
pub use interaction::Interaction;
pub use kinds::{KindError, Kinds};
pub use message::{Message, Role};
pub use outcome::{HistoryFlush, RunError, RunOutcome};
pub use probe::{Probe, ProbeStop};
pub use registry::{ActorTree, RunRegistry, RunSummary};
pub use runtime::{
    EventStream, QueryError, ResumeError, ResumeFrom, ResumeInput, RunHandle, Runtime,
    RuntimeBuilder, RuntimeConfig, StartError, StopRequest,
};
pub use scheduler::Route;
pub use schema::{ParamSchema, ParamType};
pub use stop::{FinishedRun, Interrupted, StopError, StopMode, StopReason, StopReply, StopResult};
pub use store::{Notice, RunStatus, Signal, StoreError};
pub use value::{Map, Value};
pub use watcher::{RunLabels, SignalConfig, render_key};
pub use workflow::{
    AnswerError, FieldType, FormField, InteractionKind, SelectOption, ValidationErrors, Workflow,
    WorkflowDef, WorkflowError,
};

/// Re-exported so host handlers need no direct dependency to implement [`NodeHandler`].
pub use async_trait::async_trait;
