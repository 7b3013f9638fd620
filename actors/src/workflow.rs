//! Workflows: the definition a host writes (JSON or Rust), and the validated [`Workflow`] a run
//! is started from.
//!
//! A [`WorkflowDef`] is plain data and may be wrong in any way. [`Workflow`] can only be made by
//! validation ([`Workflow::validate`]), so a run can only ever start from a workflow whose
//! graph, kinds, parameters and references were checked.

mod error;
mod spec;
mod validate;

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::handler::NodeHandler;
use crate::ids::NodeId;
use crate::kinds::Kinds;
use crate::reference::Template;
use crate::scheduler::Graph;
use crate::value::{Map, Value};

pub use error::{ValidationErrors, WorkflowError};
pub use spec::{
    AnswerError, DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_ITERATIONS, FieldType, FormField,
    InteractionKind, SelectOption,
};
pub(crate) use spec::{LoopMode, LoopSpec, NodeSpec, ParallelSpec};

/// A workflow as written: nodes, edges and variables. Load it with [`WorkflowDef::from_json`]
/// or build it with [`WorkflowDef::new`] and its builder methods.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowDef {
    /// The workflow's id (free text, shown in run records).
    pub id: String,
    /// A human name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Workflow variables and their initial values, read as `{{env.NAME}}` and assigned by
    /// `set_variable` nodes.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub variables: serde_json::Map<String, serde_json::Value>,
    /// The nodes.
    pub nodes: Vec<NodeDef>,
    /// The edges between them.
    #[serde(default)]
    pub edges: Vec<EdgeDef>,
}

/// One node as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDef {
    /// Unique within the workflow, body nodes included: letters, digits, `_` and `-`.
    pub id: String,
    /// The kind: a built-in (`begin`, `template`, `message`, `switch`, `set_variable`) or a
    /// kind the host registered.
    pub kind: String,
    /// A human name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The kind's parameters; strings may hold references.
    #[serde(default = "empty_object")]
    pub params: serde_json::Value,
    /// A sub-graph owned by this node (for kinds that run a body, such as loops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<BodyDef>,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// A sub-graph owned by a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodyDef {
    /// The body's nodes.
    pub nodes: Vec<NodeDef>,
    /// The edges between them.
    #[serde(default)]
    pub edges: Vec<EdgeDef>,
}

/// A directed edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeDef {
    /// The upstream node.
    pub from: String,
    /// The downstream node.
    pub to: String,
    /// For edges leaving a routing node (`switch`): the branch that activates this edge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

impl WorkflowDef {
    /// An empty workflow with an id.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            name: None,
            variables: serde_json::Map::new(),
            nodes: Vec::new(),
            edges: Vec::new(),
        }
    }

    /// Parses JSON. Syntax and shape errors carry the line and column.
    pub fn from_json(text: &str) -> Result<Self, WorkflowError> {
        serde_json::from_str(text).map_err(|e| {
            // serde_json's text ends with the position, which the error states itself.
            let message = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            WorkflowError::Json {
                line: e.line(),
                column: e.column(),
                message: message
                    .strip_suffix(&suffix)
                    .map_or(message.clone(), str::to_owned),
            }
        })
    }

    /// The definition as pretty JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Adds a node.
    pub fn node(mut self, node: NodeDef) -> Self {
        self.nodes.push(node);
        self
    }

    /// Adds an edge.
    pub fn edge(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.edges.push(EdgeDef {
            from: from.into(),
            to: to.into(),
            branch: None,
        });
        self
    }

    /// Adds an edge that is active when `from` takes `branch`.
    pub fn branch(
        mut self,
        from: impl Into<String>,
        branch: impl Into<String>,
        to: impl Into<String>,
    ) -> Self {
        self.edges.push(EdgeDef {
            from: from.into(),
            to: to.into(),
            branch: Some(branch.into()),
        });
        self
    }

    /// Declares a workflow variable with its initial value.
    pub fn variable(mut self, name: impl Into<String>, initial: serde_json::Value) -> Self {
        self.variables.insert(name.into(), initial);
        self
    }
}

impl NodeDef {
    /// A node with no parameters.
    pub fn new(id: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: kind.into(),
            name: None,
            params: empty_object(),
            body: None,
        }
    }

    /// Sets the parameters.
    pub fn params(mut self, params: serde_json::Value) -> Self {
        self.params = params;
        self
    }

    /// Sets one parameter (params must be an object; anything else is replaced by one).
    pub fn param(mut self, name: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        if !self.params.is_object() {
            self.params = empty_object();
        }
        if let serde_json::Value::Object(m) = &mut self.params {
            m.insert(name.into(), value.into());
        }
        self
    }
}

/// A run input declared by the `begin` node.
#[derive(Debug, Clone, PartialEq)]
pub struct InputDecl {
    /// The input's name.
    pub name: String,
    /// Its type.
    pub ty: InputType,
    /// Whether a run must provide it (unless it has a default).
    pub required: bool,
    /// The value used when a run does not provide it.
    pub default: Option<Value>,
}

/// The type of a run input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputType {
    /// Text.
    String,
    /// A whole number.
    Integer,
    /// Any number.
    Number,
    /// A boolean.
    Bool,
    /// A list.
    Array,
    /// An object.
    Object,
    /// Anything.
    Any,
}

impl InputType {
    /// The names accepted in a `begin` node's `inputs[].type`.
    pub const NAMES: &'static [&'static str] = &[
        "string", "integer", "number", "bool", "array", "object", "any",
    ];

    /// The name used in `inputs[].type`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::Bool => "bool",
            Self::Array => "array",
            Self::Object => "object",
            Self::Any => "any",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "string" => Self::String,
            "integer" => Self::Integer,
            "number" => Self::Number,
            "bool" => Self::Bool,
            "array" => Self::Array,
            "object" => Self::Object,
            "any" => Self::Any,
            _ => return None,
        })
    }

    /// Whether a value has this type.
    pub fn accepts(&self, value: &Value) -> bool {
        match self {
            Self::Any => true,
            Self::String => matches!(value, Value::String(_)),
            Self::Integer => value.as_i64().is_some(),
            Self::Number => value.as_f64().is_some(),
            Self::Bool => matches!(value, Value::Bool(_)),
            Self::Array => matches!(value, Value::Array(_)),
            Self::Object => matches!(value, Value::Object(_)),
        }
    }

    /// Reads a value of this type from command-line text: strings as they are, other types
    /// as JSON.
    pub fn parse_text(&self, text: &str) -> Result<Value, String> {
        if *self == Self::String {
            return Ok(Value::from(text));
        }
        let value: Value = serde_json::from_str::<serde_json::Value>(text)
            .map(Value::from)
            .or_else(|e| {
                if *self == Self::Any {
                    Ok(Value::from(text))
                } else {
                    Err(format!("not valid JSON: {e}"))
                }
            })?;
        if self.accepts(&value) {
            Ok(value)
        } else {
            Err(format!(
                "expected {}, found {}",
                self.name(),
                value.type_name()
            ))
        }
    }
}

/// A validated workflow, ready to run. Cheap to clone.
#[derive(Clone)]
pub struct Workflow(Arc<Plan>);

impl std::fmt::Debug for Workflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workflow")
            .field("id", &self.0.def.id)
            .field("nodes", &self.0.graph.nodes.len())
            .finish_non_exhaustive()
    }
}

/// What validation produces: everything a run needs, precomputed.
pub(crate) struct Plan {
    pub(crate) def: WorkflowDef,
    pub(crate) variables: Map,
    pub(crate) inputs: Vec<InputDecl>,
    pub(crate) graph: Arc<GraphPlan>,
    /// The definition as compact JSON, made once for the snapshots that carry it.
    pub(crate) def_json: std::sync::OnceLock<Arc<str>>,
}

impl Plan {
    pub(crate) fn def_json(&self) -> Arc<str> {
        self.def_json
            .get_or_init(|| Arc::from(serde_json::to_string(&self.def).unwrap_or_default()))
            .clone()
    }

    /// The content hash of the definition's JSON: 128-bit xxh3, as hex.
    pub(crate) fn def_hash(&self) -> String {
        format!(
            "{:032x}",
            xxhash_rust::xxh3::xxh3_128(self.def_json().as_bytes())
        )
    }
}

/// A validated graph (the workflow's, or a body's).
pub(crate) struct GraphPlan {
    pub(crate) nodes: Vec<PlannedNode>,
    pub(crate) index: HashMap<NodeId, usize>,
    pub(crate) shape: Arc<Graph>,
}

/// A validated node.
pub(crate) struct PlannedNode {
    pub(crate) id: NodeId,
    pub(crate) kind: Arc<str>,
    pub(crate) handler: Arc<dyn NodeHandler>,
    /// Parameters resolved when the node starts (for loops and parallels: all but `until`
    /// and `output`, which belong to the body's scope).
    pub(crate) params: Template,
    pub(crate) spec: NodeSpec,
}

impl Workflow {
    /// Validates a definition against the kinds a runtime knows. Returns every problem found.
    pub fn validate(def: WorkflowDef, kinds: &Kinds) -> Result<Self, ValidationErrors> {
        validate::validate(def, kinds).map(|plan| Self(Arc::new(plan)))
    }

    /// Parses and validates JSON.
    pub fn from_json(text: &str, kinds: &Kinds) -> Result<Self, ValidationErrors> {
        let def = WorkflowDef::from_json(text).map_err(|e| ValidationErrors::from(vec![e]))?;
        Self::validate(def, kinds)
    }

    /// The workflow's id.
    pub fn id(&self) -> &str {
        &self.0.def.id
    }

    /// The definition it was validated from.
    pub fn def(&self) -> &WorkflowDef {
        &self.0.def
    }

    /// The run inputs its `begin` node declares.
    pub fn inputs(&self) -> &[InputDecl] {
        &self.0.inputs
    }

    /// The ids of its top-level nodes, in definition order.
    pub fn node_ids(&self) -> impl Iterator<Item = &NodeId> {
        self.0.graph.nodes.iter().map(|n| &n.id)
    }

    pub(crate) fn plan(&self) -> &Arc<Plan> {
        &self.0
    }
}
