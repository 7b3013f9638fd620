//! What a node hands back: its output (value, route, variable assignments, usage) or a typed
//! error. The handler contract itself (`NodeHandler`, `NodeContext`) is in the kinds layer.

use std::fmt;

use super::error::ResolveError;
use super::route::Route;
use super::usage::Usage;
use super::value::Value;

/// What a node produced.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeOutput {
    /// The output value, referenced downstream as `{{node_id.field}}`.
    pub value: Value,
    /// Which outgoing edges are active. [`Route::All`] unless the node routes.
    pub route: Route,
    /// Variables to assign when the node completes: `NAME` for a workflow variable
    /// (`{{env.NAME}}`), `loop_id.NAME` for a variable of an enclosing loop.
    pub variables: Vec<(String, Value)>,
    /// What the node consumed (tokens, calls, credits...), summed per run. A node restored
    /// from a checkpoint is not counted again.
    pub usage: Usage,
}

impl NodeOutput {
    /// An output that activates every outgoing edge.
    pub fn new(value: impl Into<Value>) -> Self {
        Self {
            value: value.into(),
            route: Route::All,
            variables: Vec::new(),
            usage: Usage::new(),
        }
    }

    /// Activates only the edges labelled with these branches (unlabelled edges stay active).
    pub fn with_branches<I, S>(mut self, branches: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.route = Route::Branches(branches.into_iter().map(Into::into).collect());
        self
    }

    /// Records an amount consumed (added to what the run reports in its outcome).
    pub fn with_usage(mut self, name: impl Into<String>, amount: f64) -> Self {
        *self.usage.entry(name.into()).or_insert(0.0) += amount;
        self
    }

    /// Assigns a workflow variable when the node completes.
    pub fn with_variable(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.variables.push((name.into(), value.into()));
        self
    }
}

impl From<Value> for NodeOutput {
    fn from(value: Value) -> Self {
        Self::new(value)
    }
}

/// Why a node did not produce an output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The handler failed.
    #[error("{0}")]
    Failed(String),
    /// An input field is missing or has the wrong type.
    #[error("input `{field}`: {reason}")]
    InvalidInput {
        /// The field, as named in `params`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A reference in the node's parameters could not be resolved.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The handler gave up because a stop was requested.
    #[error("stopped before finishing")]
    Stopped,
    /// The handler panicked.
    #[error("handler panicked: {0}")]
    Panicked(String),
}

impl NodeError {
    /// A failure with a message.
    pub fn failed(message: impl fmt::Display) -> Self {
        NodeError::Failed(message.to_string())
    }

    /// An invalid input field.
    pub fn invalid_input(field: impl Into<String>, reason: impl Into<String>) -> Self {
        NodeError::InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The stop was requested: the chunk was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a stop was requested; the chunk was not kept")]
pub struct StopRequested;
