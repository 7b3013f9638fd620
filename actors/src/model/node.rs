//! What a node hands back: its output (value, route, variable assignments, usage) or a typed
//! error. The handler contract itself (`NodeHandler`, `NodeContext`) is in the kinds layer.

use std::fmt;

use super::error::ResolveError;
use super::route::Route;
use super::usage::Usage;
use super::value::{TooDeep, Value};

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
    /// The model the node called, when it called one (an LLM's name, as the provider gives
    /// it): its span reports it as the GenAI conventions' `gen_ai.request.model`.
    pub model: Option<String>,
}

impl NodeOutput {
    /// An output that activates every outgoing edge.
    pub fn new(value: impl Into<Value>) -> Self {
        Self {
            value: value.into(),
            route: Route::All,
            variables: Vec::new(),
            usage: Usage::new(),
            model: None,
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

    /// Names the model the node called (reported on its span as `gen_ai.request.model`).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Assigns a workflow variable when the node completes.
    pub fn with_variable(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.variables.push((name.into(), value.into()));
        self
    }
}

impl NodeOutput {
    /// Checks the output's value and every variable it assigns against
    /// [`MAX_DEPTH`](super::value::MAX_DEPTH), without recursion.
    pub fn check_depth(&self) -> Result<(), NodeError> {
        self.value
            .check_depth()
            .map_err(|e| NodeError::too_deep("the output", e))?;
        for (name, value) in &self.variables {
            value
                .check_depth()
                .map_err(|e| NodeError::too_deep(format!("variable `{name}`"), e))?;
        }
        Ok(())
    }

    /// Drops the output without recursion (see [`Value::dismantle`]).
    pub fn dismantle(self) {
        self.value.dismantle();
        for (_, value) in self.variables {
            value.dismantle();
        }
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
    /// A value the node produced nests deeper than the limit,
    /// [`MAX_DEPTH`](super::value::MAX_DEPTH).
    #[error("{what} is nested deeper than {limit} levels of arrays and objects (the limit)")]
    TooDeep {
        /// What was too deep: `the output`, `variable `x``, `the iteration's output`.
        what: String,
        /// The limit.
        limit: usize,
    },
}

impl NodeError {
    /// A failure with a message.
    pub fn failed(message: impl fmt::Display) -> Self {
        NodeError::Failed(message.to_string())
    }

    /// A value nested past the limit.
    pub fn too_deep(what: impl Into<String>, error: TooDeep) -> Self {
        NodeError::TooDeep {
            what: what.into(),
            limit: error.limit,
        }
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
