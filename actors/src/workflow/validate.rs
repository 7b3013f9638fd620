//! Validation: turns a [`WorkflowDef`] into a [`Plan`], or lists every problem, each naming the
//! node (or edge) and the field it is about.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use crate::ids::NodeId;
use crate::kinds::{self, Kinds};
use crate::reference::{Root, SYS_KEYS, Template};
use crate::scheduler::{Edge, Graph};
use crate::value::{Map, Value};

use super::{EdgeDef, GraphPlan, InputDecl, InputType, NodeDef, Plan, PlannedNode, WorkflowDef};

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

const RESERVED_IDS: &[&str] = &["sys", "env"];

pub(super) fn validate(def: WorkflowDef, kinds: &Kinds) -> Result<Plan, ValidationErrors> {
    let mut errors = Vec::new();
    if def.id.trim().is_empty() {
        errors.push(WorkflowError::InvalidWorkflow {
            field: "id".into(),
            problem: "must not be empty".into(),
        });
    }
    let mut variables = Map::new();
    for (name, initial) in &def.variables {
        if !is_identifier(name) {
            errors.push(WorkflowError::InvalidWorkflow {
                field: format!("variables.{name}"),
                problem: "variable names are letters, digits, `_` and `-`".into(),
            });
        }
        variables.insert(name.clone(), Value::from(initial));
    }

    let mut seen = HashSet::new();
    let graph = check_graph(&def.nodes, &def.edges, kinds, &mut seen, &mut errors);

    let mut inputs = Vec::new();
    if let Some(graph) = &graph {
        let entries: Vec<&NodeDef> = def
            .nodes
            .iter()
            .filter(|n| n.kind == kinds::BEGIN)
            .collect();
        match entries.as_slice() {
            [] => errors.push(WorkflowError::NoEntry),
            [entry] => {
                inputs = begin_inputs(entry);
                check_inputs(entry, &inputs, &mut errors);
                check_structure(graph, entry, &def.nodes, &def.edges, &mut errors);
            }
            many => errors.push(WorkflowError::MultipleEntries {
                nodes: many.iter().map(|n| n.id.clone()).collect(),
            }),
        }
    }
    if errors.is_empty() {
        if let Some(graph) = &graph {
            check_references(graph, &def, &mut errors);
        }
    }
    match graph {
        Some(graph) if errors.is_empty() => Ok(Plan {
            def,
            variables,
            inputs,
            graph,
            def_json: Default::default(),
        }),
        _ => Err(ValidationErrors(errors)),
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks nodes and edges of one graph; returns its plan when nodes and edges are usable
/// (structure such as entries and cycles is checked afterwards).
fn check_graph(
    nodes: &[NodeDef],
    edges: &[EdgeDef],
    kinds: &Kinds,
    seen: &mut HashSet<String>,
    errors: &mut Vec<WorkflowError>,
) -> Option<GraphPlan> {
    let before = errors.len();
    let mut planned = Vec::with_capacity(nodes.len());
    let mut index = HashMap::with_capacity(nodes.len());
    for node in nodes {
        let id = check_node_id(node, seen, errors);
        let handler = kinds.get(&node.kind);
        if handler.is_none() {
            errors.push(WorkflowError::UnknownKind {
                node: node.id.clone(),
                kind: node.kind.clone(),
                known: kinds.names().map(str::to_owned).collect(),
            });
        }
        if let Some(handler) = handler {
            for issue in handler.params().check(&node.params) {
                let field = issue
                    .field
                    .strip_prefix("params")
                    .map_or(issue.field.clone(), |rest| {
                        rest.trim_start_matches('.').to_owned()
                    });
                errors.push(WorkflowError::InvalidParam {
                    node: node.id.clone(),
                    field: if field.is_empty() { "".into() } else { field },
                    problem: issue.problem,
                });
            }
        }
        if node.body.is_some() {
            errors.push(WorkflowError::BodyNotAllowed {
                node: node.id.clone(),
                kind: node.kind.clone(),
            });
        }
        let params = match Template::compile(&node.params) {
            Ok(t) => Some(t),
            Err((field, e)) => {
                errors.push(WorkflowError::InvalidParam {
                    node: node.id.clone(),
                    field,
                    problem: e.to_string(),
                });
                None
            }
        };
        if let (Some(id), Some(handler), Some(params)) = (id, handler, params) {
            index.insert(id.clone(), planned.len());
            planned.push(PlannedNode {
                id,
                kind: Arc::from(node.kind.as_str()),
                handler: handler.clone(),
                params,
            });
        }
    }

    let ids: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    let mut shape_edges = Vec::with_capacity(edges.len());
    for (i, edge) in edges.iter().enumerate() {
        let mut ends = [None, None];
        for (slot, (field, id)) in [("from", &edge.from), ("to", &edge.to)]
            .into_iter()
            .enumerate()
        {
            match ids.get(id.as_str()) {
                Some(&n) => ends[slot] = Some(n),
                None => errors.push(WorkflowError::DanglingEdge {
                    index: i,
                    from: edge.from.clone(),
                    to: edge.to.clone(),
                    field,
                    missing: id.clone(),
                }),
            }
        }
        let [Some(from), Some(to)] = ends else {
            continue;
        };
        check_branch(i, edge, &nodes[from], kinds, errors);
        shape_edges.push(Edge {
            from,
            to,
            branch: edge.branch.clone(),
        });
    }
    if errors.len() > before {
        return None;
    }
    // The entry index is set by `check_structure`; a placeholder keeps construction in one place.
    let entry = nodes
        .iter()
        .position(|n| n.kind == kinds::BEGIN)
        .unwrap_or(0);
    match Graph::new(planned.len(), entry, shape_edges) {
        Ok(shape) => Some(GraphPlan {
            nodes: planned,
            index,
            shape: Arc::new(shape),
        }),
        Err(e) => {
            errors.push(WorkflowError::InvalidWorkflow {
                field: "edges".into(),
                problem: e.to_string(),
            });
            None
        }
    }
}

fn check_node_id(
    node: &NodeDef,
    seen: &mut HashSet<String>,
    errors: &mut Vec<WorkflowError>,
) -> Option<NodeId> {
    let problem = if !is_identifier(&node.id) {
        Some("node ids are non-empty and made of letters, digits, `_` and `-`".to_owned())
    } else if RESERVED_IDS.contains(&node.id.as_str()) {
        Some(format!("`{}` is reserved for references", node.id))
    } else {
        None
    };
    if let Some(problem) = problem {
        errors.push(WorkflowError::InvalidNodeId {
            node: node.id.clone(),
            problem,
        });
        return None;
    }
    if !seen.insert(node.id.clone()) {
        errors.push(WorkflowError::DuplicateId {
            node: node.id.clone(),
        });
        return None;
    }
    match NodeId::new(&node.id) {
        Ok(id) => Some(id),
        Err(e) => {
            errors.push(WorkflowError::InvalidNodeId {
                node: node.id.clone(),
                problem: e.reason.into(),
            });
            None
        }
    }
}

fn check_branch(
    index: usize,
    edge: &EdgeDef,
    from: &NodeDef,
    kinds: &Kinds,
    errors: &mut Vec<WorkflowError>,
) {
    let Some(handler) = kinds.get(&from.kind) else {
        return;
    };
    let Some(allowed) = handler.branches(&from.params) else {
        return;
    };
    let problem = match &edge.branch {
        None if !allowed.is_empty() => Some(format!(
            "an edge leaving `{}` (kind `{}`) must name a branch: one of {}",
            from.id,
            from.kind,
            allowed.join(", ")
        )),
        Some(b) if allowed.is_empty() => Some(format!(
            "`{}` (kind `{}`) does not route; remove branch {b:?}",
            from.id, from.kind
        )),
        Some(b) if !allowed.contains(b) => Some(format!(
            "`{}` has no branch {b:?}; its branches are {}",
            from.id,
            allowed.join(", ")
        )),
        _ => None,
    };
    if let Some(problem) = problem {
        errors.push(WorkflowError::InvalidBranch {
            index,
            from: edge.from.clone(),
            to: edge.to.clone(),
            problem,
        });
    }
}

fn begin_inputs(entry: &NodeDef) -> Vec<InputDecl> {
    let Some(list) = entry.params.get("inputs").and_then(|v| v.as_array()) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|item| {
            let name = item.get("name")?.as_str()?.to_owned();
            let ty = item
                .get("type")
                .and_then(|t| t.as_str())
                .and_then(InputType::from_name)
                .unwrap_or(InputType::Any);
            Some(InputDecl {
                name,
                ty,
                required: item
                    .get("required")
                    .and_then(|r| r.as_bool())
                    .unwrap_or(false),
                default: item.get("default").map(Value::from),
            })
        })
        .collect()
}

/// Declared run inputs: unique names, defaults of the declared type.
fn check_inputs(entry: &NodeDef, inputs: &[InputDecl], errors: &mut Vec<WorkflowError>) {
    let mut names = HashSet::new();
    for (i, input) in inputs.iter().enumerate() {
        if !names.insert(input.name.as_str()) {
            errors.push(WorkflowError::InvalidParam {
                node: entry.id.clone(),
                field: format!("inputs[{i}].name"),
                problem: format!("input `{}` is declared twice", input.name),
            });
        }
        if let Some(default) = &input.default {
            if !input.ty.accepts(default) {
                errors.push(WorkflowError::InvalidParam {
                    node: entry.id.clone(),
                    field: format!("inputs[{i}].default"),
                    problem: format!(
                        "default of input `{}` is {}, but its type is {}",
                        input.name,
                        default.type_name(),
                        input.ty.name()
                    ),
                });
            }
        }
    }
}

/// Entry, cycles and reachability.
fn check_structure(
    graph: &GraphPlan,
    entry: &NodeDef,
    nodes: &[NodeDef],
    edges: &[EdgeDef],
    errors: &mut Vec<WorkflowError>,
) {
    if let Some(edge) = edges.iter().find(|e| e.to == entry.id) {
        errors.push(WorkflowError::EntryHasIncoming {
            node: entry.id.clone(),
            from: edge.from.clone(),
        });
    }
    if let Some(cycle) = find_cycle(graph) {
        errors.push(WorkflowError::Cycle {
            nodes: cycle.into_iter().map(|i| nodes[i].id.clone()).collect(),
        });
        return;
    }
    let Some(&entry_ix) = graph.index.get(entry.id.as_str()) else {
        return;
    };
    let mut reached = vec![false; graph.nodes.len()];
    let mut stack = vec![entry_ix];
    reached[entry_ix] = true;
    while let Some(n) = stack.pop() {
        for next in graph.shape.out_edges(n).iter().map(|e| e.to) {
            if !reached[next] {
                reached[next] = true;
                stack.push(next);
            }
        }
    }
    for (i, r) in reached.iter().enumerate() {
        if !r {
            errors.push(WorkflowError::Unreachable {
                node: nodes[i].id.clone(),
                entry: entry.id.clone(),
            });
        }
    }
}

/// A cycle, as node indices in edge order, if there is one (iterative DFS with colours).
fn find_cycle(graph: &GraphPlan) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    let n = graph.nodes.len();
    let mut colour = vec![Colour::White; n];
    for start in 0..n {
        if colour[start] != Colour::White {
            continue;
        }
        // Stack of (node, next successor position); `path` mirrors the grey nodes.
        let mut stack = vec![(start, 0usize)];
        colour[start] = Colour::Grey;
        while let Some(&mut (node, ref mut pos)) = stack.last_mut() {
            let succ = graph.shape.out_edges(node);
            if *pos < succ.len() {
                let next = succ[*pos].to;
                *pos += 1;
                match colour[next] {
                    Colour::White => {
                        colour[next] = Colour::Grey;
                        stack.push((next, 0));
                    }
                    Colour::Grey => {
                        let from = stack.iter().position(|&(m, _)| m == next).unwrap_or(0);
                        return Some(stack[from..].iter().map(|&(m, _)| m).collect());
                    }
                    Colour::Black => {}
                }
            } else {
                colour[node] = Colour::Black;
                stack.pop();
            }
        }
    }
    None
}

/// Every node reference must name a node upstream of the referencing node; `sys` keys must be
/// known; `env` names must be declared variables. Runs only on an acyclic, reachable graph.
fn check_references(graph: &GraphPlan, def: &WorkflowDef, errors: &mut Vec<WorkflowError>) {
    let ancestors = ancestor_sets(graph);
    for (i, node) in graph.nodes.iter().enumerate() {
        for (field, reference) in node.params.references() {
            let field = if field.is_empty() {
                "".to_owned()
            } else {
                field
            };
            let unknown = |problem: String| WorkflowError::UnknownReference {
                node: node.id.to_string(),
                field: field.clone(),
                reference: reference.to_string(),
                problem,
            };
            match reference.root() {
                Root::Node(target) => match graph.index.get(target) {
                    None => errors.push(unknown(format!("no node `{target}`"))),
                    Some(&t) if !ancestors[i].contains(t) => {
                        errors.push(WorkflowError::NotUpstream {
                            node: node.id.to_string(),
                            field: field.clone(),
                            reference: reference.to_string(),
                            target: target.to_string(),
                        })
                    }
                    Some(_) => {}
                },
                Root::Sys => {
                    let key = &reference.path()[0];
                    if !SYS_KEYS.contains(&key.as_str()) {
                        errors.push(unknown(format!(
                            "no `sys.{key}`; known: {}",
                            SYS_KEYS.join(", ")
                        )));
                    }
                }
                Root::Env => {
                    let name = &reference.path()[0];
                    if !def.variables.contains_key(name) {
                        errors.push(unknown(format!(
                            "no workflow variable `{name}`; declare it under `variables`"
                        )));
                    }
                }
            }
        }
        if &*node.kind == kinds::SET_VARIABLE {
            check_assignments(node, def, errors);
        }
    }
}

fn check_assignments(node: &PlannedNode, def: &WorkflowDef, errors: &mut Vec<WorkflowError>) {
    let Some(list) = def
        .nodes
        .iter()
        .find(|n| n.id == node.id.as_str())
        .and_then(|n| n.params.get("assignments"))
        .and_then(|a| a.as_array())
    else {
        return;
    };
    for (i, item) in list.iter().enumerate() {
        if let Some(name) = item.get("variable").and_then(|v| v.as_str()) {
            if !def.variables.contains_key(name) {
                errors.push(WorkflowError::InvalidParam {
                    node: node.id.to_string(),
                    field: format!("assignments[{i}].variable"),
                    problem: format!("no workflow variable `{name}`; declare it under `variables`"),
                });
            }
        }
    }
}

/// A set of node indices as a bit set.
#[derive(Clone)]
struct BitSet(Vec<u64>);

impl BitSet {
    fn new(n: usize) -> Self {
        Self(vec![0; n.div_ceil(64)])
    }
    fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn union_with(&mut self, other: &BitSet) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
}

/// For each node, the set of nodes with a path to it (Kahn order; the graph is acyclic here).
fn ancestor_sets(graph: &GraphPlan) -> Vec<BitSet> {
    let n = graph.nodes.len();
    let mut indegree = vec![0usize; n];
    for i in 0..n {
        for s in graph.shape.out_edges(i).iter().map(|e| e.to) {
            indegree[s] += 1;
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut head = 0;
    while head < order.len() {
        let i = order[head];
        head += 1;
        for s in graph.shape.out_edges(i).iter().map(|e| e.to) {
            indegree[s] -= 1;
            if indegree[s] == 0 {
                order.push(s);
            }
        }
    }
    let mut sets = vec![BitSet::new(n); n];
    for &i in &order {
        let mut mine = sets[i].clone();
        mine.insert(i);
        for s in graph.shape.out_edges(i).iter().map(|e| e.to) {
            sets[s].union_with(&mine);
        }
    }
    sets
}
