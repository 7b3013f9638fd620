//! What validation reports: one [`WorkflowError`] per problem, each naming the node (or edge)
//! and the field it is about, collected in [`ValidationErrors`]. Reports are bounded whatever
//! the workflow's size: each distinct problem once, lists inside one problem cut after a few
//! items, and at most [`ValidationErrors::LISTED`] problems listed before "and N more".

use std::collections::HashSet;
use std::fmt;

/// How many nodes a problem about several nodes names before "and N more".
const NAMED: usize = 10;

/// One problem in a workflow definition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
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
    /// No handler is registered for a kind; one problem per kind, naming every node of it.
    #[error("{}: field `kind`: unknown kind `{kind}` (known: {})", nodes_text(nodes), known.join(", "))]
    UnknownKind {
        /// The kind as written.
        kind: String,
        /// The nodes of that kind, in the order found (shown: the first ten, then a count).
        nodes: Vec<String>,
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
        nodes.len(), listing(nodes, NAMED)
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

/// `node `a``, or `nodes `a`, `b` and 3 more`.
fn nodes_text(nodes: &[String]) -> String {
    match nodes {
        [] => "no node".to_owned(),
        [one] => format!("node `{one}`"),
        many => {
            let shown: Vec<String> = many.iter().take(NAMED).map(|n| format!("`{n}`")).collect();
            let mut text = format!("nodes {}", shown.join(", "));
            if many.len() > NAMED {
                text.push_str(&format!(" and {} more", many.len() - NAMED));
            }
            text
        }
    }
}

/// `a -> b -> c -> a`; a long cycle shows its first nodes, a count, and closes on the first.
fn cycle_text(nodes: &[String]) -> String {
    let mut text = nodes
        .iter()
        .take(NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" -> ");
    if nodes.len() > NAMED {
        text.push_str(&format!(" -> ... ({} more)", nodes.len() - NAMED));
    }
    if let Some(first) = nodes.first() {
        text.push_str(" -> ");
        text.push_str(first);
    }
    text
}

/// `a, b, c`, or past `max` items `a, b, c and 7 more`: lists in messages stay short however
/// long the workflow's lists are.
pub(crate) fn listing<T: AsRef<str>>(items: &[T], max: usize) -> String {
    let shown: Vec<&str> = items.iter().take(max).map(AsRef::as_ref).collect();
    let mut text = shown.join(", ");
    if items.len() > max {
        text.push_str(&format!(" and {} more", items.len() - max));
    }
    text
}

/// Every problem found in a workflow, each distinct problem once, in the order found.
///
/// It keeps them all ([`errors`](Self::errors)); its `Display` lists the first
/// [`LISTED`](Self::LISTED) and counts the rest, so a report stays small for any workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationErrors(Vec<WorkflowError>);

impl ValidationErrors {
    /// How many problems a report lists before "and N more".
    pub const LISTED: usize = 100;

    /// The problems, in the order found.
    pub fn errors(&self) -> &[WorkflowError] {
        &self.0
    }

    /// How many distinct problems there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (never the case for an error returned by validation).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The problems a report lists: the first [`LISTED`](Self::LISTED).
    pub fn listed(&self) -> &[WorkflowError] {
        &self.0[..self.0.len().min(Self::LISTED)]
    }

    /// How many problems a report leaves out after [`listed`](Self::listed).
    pub fn unlisted(&self) -> usize {
        self.0.len().saturating_sub(Self::LISTED)
    }
}

impl From<Vec<WorkflowError>> for ValidationErrors {
    /// Keeps the first of identical problems, in order.
    fn from(errors: Vec<WorkflowError>) -> Self {
        let first: Vec<bool> = {
            let mut seen = HashSet::with_capacity(errors.len());
            errors.iter().map(|e| seen.insert(e)).collect()
        };
        Self(
            errors
                .into_iter()
                .zip(first)
                .filter_map(|(e, first)| first.then_some(e))
                .collect(),
        )
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
            all => {
                write!(f, "{} problems in workflow:", all.len())?;
                for e in self.listed() {
                    write!(f, "\n  - {e}")?;
                }
                match self.unlisted() {
                    0 => Ok(()),
                    more => write!(f, "\n  and {more} more"),
                }
            }
        }
    }
}

impl std::error::Error for ValidationErrors {}
