//! runvisor-actors: the engine. Workflow model and validation, the scheduler state machine,
//! the supervised actor tree that executes runs, the ports to the outside world and their
//! in-memory implementations (the embedded default).

pub mod event;
pub mod handler;
pub mod ids;
pub mod kinds;
pub mod message;
pub mod reference;
pub mod scheduler;
pub mod schema;
pub mod store;
pub mod value;
pub mod workflow;
