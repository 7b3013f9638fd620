//! Workflow definitions as written: nodes, edges, bodies and variables, loaded from JSON or
//! built in Rust. A definition may be wrong in any way; validation says how.

use serde::{Deserialize, Serialize};

use super::error::WorkflowError;

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
        let parsed: Result<Self, _> = serde_json::from_str(text);
        parsed.map(Self::without_spare_capacity).map_err(|e| {
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

    /// Drops the spare capacity parsing leaves in node and edge lists (up to half of them on
    /// a large workflow), which the definition would otherwise hold for its whole life.
    fn without_spare_capacity(mut self) -> Self {
        fn shrink(nodes: &mut Vec<NodeDef>, edges: &mut Vec<EdgeDef>) {
            nodes.shrink_to_fit();
            edges.shrink_to_fit();
            for body in nodes.iter_mut().filter_map(|n| n.body.as_mut()) {
                shrink(&mut body.nodes, &mut body.edges);
            }
        }
        shrink(&mut self.nodes, &mut self.edges);
        self
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
