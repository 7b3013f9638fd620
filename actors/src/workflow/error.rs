//! What validation reports: one [`WorkflowError`] per problem, each naming the node (or edge)
//! and the field it is about, collected in [`ValidationErrors`].

use std::fmt;

/// One problem in a workflow definition.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkflowError {
    /// The JSON does not parse or does not have the workflow's shape.
    #[error("malformed workflow JSON at line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the parser said.
        message: String,
    },
    /// A workflow-level field is wrong.
    #[error("workflow: field `{field}`: {problem}")]
    InvalidWorkflow {
        /// The field (`id`, `variables.NAME`).
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// A node id is not acceptable.
    #[error("node `{node}`: field `id`: {problem}")]
    InvalidNodeId {
        /// The id as written.
        node: String,
        /// What is wrong.
        problem: String,
    },
    /// Two nodes have the same id.
    #[error("node `{node}`: field `id`: duplicate id (node ids must be unique in the workflow)")]
    DuplicateId {
        /// The repeated id.
        node: String,
    },
    /// No handler is registered for a node's kind.
    #[error("node `{node}`: field `kind`: unknown kind `{kind}` (known: {})", known.join(", "))]
    UnknownKind {
        /// The node.
        node: String,
        /// The kind as written.
        kind: String,
        /// The kinds the runtime knows.
        known: Vec<String>,
    },
    /// A parameter is missing, unknown, or of the wrong type.
    #[error("node `{node}`: field `params.{field}`: {problem}")]
    InvalidParam {
        /// The node.
        node: String,
        /// The parameter's path within `params`.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// A reference names something that does not exist.
    #[error("node `{node}`: field `params.{field}`: unknown reference {reference}: {problem}")]
    UnknownReference {
        /// The node holding the reference.
        node: String,
        /// The parameter holding it.
        field: String,
        /// The reference as written.
        reference: String,
        /// What is unknown.
        problem: String,
    },
    /// A reference names a node that cannot have run before the referencing node.
    #[error(
        "node `{node}`: field `params.{field}`: reference {reference} to node `{target}`, \
         which is not upstream of `{node}` (it cannot have run before it)"
    )]
    NotUpstream {
        /// The node holding the reference.
        node: String,
        /// The parameter holding it.
        field: String,
        /// The reference as written.
        reference: String,
        /// The node referenced.
        target: String,
    },
    /// An edge names a node that does not exist.
    #[error("edge #{index} ({from} -> {to}): field `{field}`: no node `{missing}` in this graph")]
    DanglingEdge {
        /// Position of the edge in `edges`.
        index: usize,
        /// Its `from`.
        from: String,
        /// Its `to`.
        to: String,
        /// `from` or `to`.
        field: &'static str,
        /// The id that does not exist.
        missing: String,
    },
    /// An edge's branch label does not fit the node it leaves.
    #[error("edge #{index} ({from} -> {to}): field `branch`: {problem}")]
    InvalidBranch {
        /// Position of the edge in `edges`.
        index: usize,
        /// Its `from`.
        from: String,
        /// Its `to`.
        to: String,
        /// What is wrong.
        problem: String,
    },
    /// The workflow has no `begin` node.
    #[error("workflow: field `nodes`: no entry; add exactly one node of kind `begin`")]
    NoEntry,
    /// The workflow has several `begin` nodes.
    #[error(
        "workflow: field `nodes`: {} entries ({}); exactly one node of kind `begin` is allowed",
        nodes.len(), nodes.join(", ")
    )]
    MultipleEntries {
        /// The `begin` nodes.
        nodes: Vec<String>,
    },
    /// An edge leads into the entry node.
    #[error(
        "node `{node}`: field `kind`: the entry node cannot have incoming edges (one comes from `{from}`)"
    )]
    EntryHasIncoming {
        /// The entry node.
        node: String,
        /// The upstream node of the offending edge.
        from: String,
    },
    /// The edges form a cycle.
    #[error("node `{}`: field `edges`: cycle {}", nodes[0], cycle_text(nodes))]
    Cycle {
        /// The nodes of the cycle, in edge order, starting anywhere.
        nodes: Vec<String>,
    },
    /// A node can never run: no path leads to it from the entry.
    #[error("node `{node}`: field `edges`: not reachable from the entry node `{entry}`")]
    Unreachable {
        /// The node.
        node: String,
        /// The entry node.
        entry: String,
    },
    /// A loop or parallel node has no body.
    #[error("node `{node}`: field `body`: kind `{kind}` needs a body sub-graph")]
    MissingBody {
        /// The node.
        node: String,
        /// Its kind.
        kind: String,
    },
    /// A body's entry is missing or ambiguous.
    #[error("node `{node}`: field `body`: {problem}")]
    BodyEntry {
        /// The node owning the body.
        node: String,
        /// What is wrong.
        problem: String,
    },
    /// A node has a body but its kind does not run one.
    #[error("node `{node}`: field `body`: kind `{kind}` does not take a body sub-graph")]
    BodyNotAllowed {
        /// The node.
        node: String,
        /// Its kind.
        kind: String,
    },
}

fn cycle_text(nodes: &[String]) -> String {
    let mut text = nodes.join(" -> ");
    if let Some(first) = nodes.first() {
        text.push_str(" -> ");
        text.push_str(first);
    }
    text
}

/// Every problem found in a workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationErrors(Vec<WorkflowError>);

impl ValidationErrors {
    /// The problems, in the order found.
    pub fn errors(&self) -> &[WorkflowError] {
        &self.0
    }
}

impl From<Vec<WorkflowError>> for ValidationErrors {
    fn from(errors: Vec<WorkflowError>) -> Self {
        Self(errors)
    }
}

impl IntoIterator for ValidationErrors {
    type Item = WorkflowError;
    type IntoIter = std::vec::IntoIter<WorkflowError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                write!(f, "{} problems in workflow:", many.len())?;
                for e in many {
                    write!(f, "\n  - {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ValidationErrors {}
