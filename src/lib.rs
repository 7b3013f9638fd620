//! runvisor: supervised, stoppable, resumable agent workflows.
pub use runvisor_actors::*;
