//! Workflows: the definition a host writes (JSON or Rust), and the validated [`Workflow`] a run
//! is started from.
//!
//! A [`WorkflowDef`] is plain data and may be wrong in any way. [`Workflow`] can only be made by
//! validation ([`Workflow::validate`]), so a run can only ever start from a workflow whose
//! graph, kinds, parameters and references were checked.

mod catalog;
mod condition;
mod def;
mod error;
mod graph;
mod inputs;
mod plan;
mod reference;
mod schema;
mod spec;
mod upstream;
mod validate;
mod validated;
mod visibility;

pub use catalog::KindCatalog;
pub(crate) use catalog::{
    BEGIN, INTERACTIVE, LOOP, MESSAGE, PARALLEL, SET_VARIABLE, SWITCH, TEMPLATE,
};
pub(crate) use condition::{OPS, case_matches};
pub use def::{BodyDef, EdgeDef, NodeDef, WorkflowDef};
pub use error::{ValidationErrors, WorkflowError};
#[cfg(test)]
pub(crate) use graph::{Edge, GraphError};
pub(crate) use graph::{Graph, NodeIndex};
pub use inputs::{InputDecl, InputError, InputType};
pub(crate) use plan::{GraphPlan, LoopMode, LoopSpec, NodeSpec, ParallelSpec, Plan};
pub(crate) use reference::{NodeLookup, Scope};
pub use schema::{Field, ParamIssue, ParamSchema, ParamType};
pub use spec::{DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_ITERATIONS};
pub use validated::Workflow;
