//! The model: the engine's vocabulary. Ids, values, node paths, messages, statuses, labels,
//! stop modes and reasons, interactions, node outputs and errors, run outcomes and events.
//!
//! Plain data only: nothing here runs, waits or stores anything, and nothing here imports
//! another layer of the engine.

mod error;
mod event;
mod ids;
mod interaction;
mod labels;
mod lease;
mod map;
mod message;
mod node;
mod outcome;
mod path;
mod record;
mod route;
mod status;
mod stop;
mod tree;
mod usage;
mod value;

pub use error::{CheckpointError, ResolveError, StoreError};
pub use event::RunEvent;
pub use ids::{
    CheckpointId, InteractionId, InvalidId, MessageId, NodeId, RunId, ThreadId, WorkerId,
};
pub use interaction::{
    AnswerError, FieldType, FormField, Interaction, InteractionKind, SelectOption,
};
pub(crate) use labels::LabelsV2;
pub use labels::RunLabels;
pub(crate) use lease::hostname;
pub use lease::{Fence, Lease, LeaseError, LeaseHolder, WorkerInfo};
pub use map::ObjectMap;
pub(crate) use message::now_ms;
pub use message::{Message, Role};
pub use node::{NodeError, NodeOutput, StopRequested};
pub use outcome::{
    FinishedRun, HistoryFlush, Interrupted, Outputs, RunError, RunOutcome, Spill, StopError,
    StopReply, StopResult, Unpersisted,
};
pub use path::{Frame, NodePath};
pub use record::RunRecord;
pub use route::Route;
pub use status::{RunStatus, UnknownStatus};
pub use stop::{StopMode, StopReason};
pub use tree::ActorTree;
pub use usage::Usage;
pub(crate) use usage::add_usage;
pub(crate) use value::watch_depth;
pub use value::{MAX_DEPTH, Map, TooDeep, Value};
