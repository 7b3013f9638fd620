//! Validation: turns a [`WorkflowDef`] into a [`Plan`], or lists every problem, each naming the
//! node (or edge) and the field it is about. Every step is linear in the workflow's nodes,
//! edges and references; references are checked in `visibility`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::catalog::{self as kinds, KindCatalog};
use super::def::{EdgeDef, NodeDef, WorkflowDef};
use super::error::{ValidationErrors, WorkflowError, listing};
use super::graph::{Edge, Graph};
use super::inputs::{InputDecl, InputType};
use super::plan::{GraphPlan, LoopMode, LoopSpec, NodeSpec, ParallelSpec, Plan, PlannedNode};
use super::reference::Template;
use super::spec::{self, DEFAULT_MAX_ITERATIONS};
use super::visibility::{self, WorkflowScope};
use crate::model::{Map, NodeId, Value};

/// How many names a problem lists (branches, entry nodes) before "and N more".
const NAMED: usize = 20;

const RESERVED_IDS: &[&str] = &["sys", "env"];

pub(super) fn validate(
    def: WorkflowDef,
    kinds: &dyn KindCatalog,
) -> Result<Plan, ValidationErrors> {
    let mut checker = Checker {
        kinds,
        seen: HashSet::new(),
        kind_names: HashMap::new(),
        errors: Vec::new(),
        unknown_kinds: HashMap::new(),
    };
    if def.id.trim().is_empty() {
        checker.errors.push(WorkflowError::InvalidWorkflow {
            field: "id".into(),
            problem: "must not be empty".into(),
        });
    }
    let mut variables = Map::new();
    for (name, initial) in &def.variables {
        if !is_identifier(name) {
            checker.errors.push(WorkflowError::InvalidWorkflow {
                field: format!("variables.{name}"),
                problem: "variable names are letters, digits, `_` and `-`".into(),
            });
        }
        variables.insert(name.clone(), Value::from(initial));
    }

    let graph = checker.check_graph(None, &def.nodes, &def.edges);
    let Checker {
        seen, mut errors, ..
    } = checker;

    let mut inputs = Vec::new();
    if let Some(entry) = def.nodes.iter().find(|n| n.kind == kinds::BEGIN) {
        inputs = begin_inputs(entry);
        check_inputs(entry, &inputs, &mut errors);
    }
    if errors.is_empty()
        && let Some(graph) = &graph
    {
        let workflow = WorkflowScope {
            all: &seen,
            variables: &def.variables,
        };
        visibility::check(graph, &def.nodes, &workflow, &mut errors);
    }
    match graph {
        Some(graph) if errors.is_empty() => Ok(Plan {
            def,
            variables,
            inputs,
            graph: Arc::new(graph),
            def_json: Default::default(),
            def_hash: Default::default(),
        }),
        _ => Err(ValidationErrors::from(errors)),
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What the checks of nodes and graphs share across the whole workflow (`'d`), bodies
/// included.
struct Checker<'d, 'k> {
    kinds: &'k dyn KindCatalog,
    /// Every node id met so far (ids are unique in the workflow, body nodes included).
    seen: HashSet<&'d str>,
    /// Each kind's name, shared by the nodes of that kind.
    kind_names: HashMap<&'d str, Arc<str>>,
    errors: Vec<WorkflowError>,
    /// Where in `errors` each unknown kind is reported: one problem per kind names all its
    /// nodes, however many use it.
    unknown_kinds: HashMap<String, usize>,
}

impl<'d> Checker<'d, '_> {
    /// Checks the nodes and edges of one graph (the workflow's when `owner` is `None`, else
    /// the body of `owner`), recursing into bodies; returns its plan when it is usable.
    fn check_graph(
        &mut self,
        owner: Option<&'d NodeDef>,
        nodes: &'d [NodeDef],
        edges: &'d [EdgeDef],
    ) -> Option<GraphPlan> {
        let before = self.errors.len();
        let mut planned = Vec::with_capacity(nodes.len());
        for node in nodes {
            if let Some(p) = self.check_node(node) {
                planned.push(p);
            }
        }
        let shape_edges = self.check_edges(nodes, edges);
        // A node without a plan was reported (possibly under a problem found before, such as
        // its unknown kind): the graph cannot be built.
        if self.errors.len() > before || planned.len() != nodes.len() {
            return None;
        }
        let entry = find_entry(owner, nodes, edges, &mut self.errors)?;
        let shape = match Graph::new(planned.len(), entry, shape_edges) {
            Ok(shape) => shape,
            Err(e) => {
                self.errors.push(WorkflowError::InvalidWorkflow {
                    field: "edges".into(),
                    problem: e.to_string(),
                });
                return None;
            }
        };
        let index = planned
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.clone(), i))
            .collect();
        let graph = GraphPlan {
            nodes: planned,
            index,
            shape: Arc::new(shape),
        };
        check_structure(&graph, &nodes[entry], nodes, &mut self.errors);
        (self.errors.len() == before).then_some(graph)
    }

    /// Every edge names two nodes of its graph and a branch its source may take; returns the
    /// edges whose ends exist, by node position.
    fn check_edges(&mut self, nodes: &[NodeDef], edges: &[EdgeDef]) -> Vec<Edge> {
        let ids: HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect();
        // The branches a source node may take, asked of its kind once per node: kept for the
        // nodes with several out-edges (a switch's cases), asked afresh for the others.
        let mut out_degree = vec![0u32; nodes.len()];
        for edge in edges {
            if let Some(&from) = ids.get(edge.from.as_str()) {
                out_degree[from] = out_degree[from].saturating_add(1);
            }
        }
        let mut branches: HashMap<usize, Option<Branches>> = HashMap::new();
        let mut shape_edges = Vec::with_capacity(edges.len());
        for (i, edge) in edges.iter().enumerate() {
            let mut ends = [None, None];
            for (slot, (field, id)) in [("from", &edge.from), ("to", &edge.to)]
                .into_iter()
                .enumerate()
            {
                match ids.get(id.as_str()) {
                    Some(&n) => ends[slot] = Some(n),
                    None => self.errors.push(WorkflowError::DanglingEdge {
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
            let source = &nodes[from];
            let ask = || {
                self.kinds
                    .branches(&source.kind, &source.params)
                    .map(Branches::new)
            };
            let fresh;
            let allowed = if out_degree[from] > 1 {
                branches.entry(from).or_insert_with(ask).as_ref()
            } else {
                fresh = ask();
                fresh.as_ref()
            };
            if let Some(allowed) = allowed {
                check_branch(i, edge, source, allowed, &mut self.errors);
            }
            shape_edges.push(Edge {
                from,
                to,
                branch: edge.branch.clone(),
            });
        }
        shape_edges
    }

    /// One node: id, kind, parameters, and for engine-run kinds their spec and body.
    fn check_node(&mut self, node: &'d NodeDef) -> Option<PlannedNode> {
        let before = self.errors.len();
        let id = check_node_id(node, &mut self.seen, &mut self.errors);
        let Some(schema) = self.kinds.params(&node.kind) else {
            self.unknown_kind(node);
            return None;
        };
        let errors = &mut self.errors;
        let mut issues = schema.check(&node.params);
        issues.extend(self.kinds.check_params(&node.kind, &node.params));
        for issue in issues {
            let field = issue
                .field
                .strip_prefix("params")
                .map_or(issue.field.clone(), |rest| {
                    rest.trim_start_matches('.').to_owned()
                });
            errors.push(WorkflowError::InvalidParam {
                node: node.id.clone(),
                field,
                problem: issue.problem,
            });
        }
        let takes_body = matches!(node.kind.as_str(), kinds::LOOP | kinds::PARALLEL);
        let body = match (&node.body, takes_body) {
            (Some(_), false) => {
                errors.push(WorkflowError::BodyNotAllowed {
                    node: node.id.clone(),
                    kind: node.kind.clone(),
                });
                None
            }
            (None, true) => {
                errors.push(WorkflowError::MissingBody {
                    node: node.id.clone(),
                    kind: node.kind.clone(),
                });
                None
            }
            (Some(body), true) => self
                .check_graph(Some(node), &body.nodes, &body.edges)
                .map(Arc::new),
            (None, false) => None,
        };
        let errors = &mut self.errors;
        // Fields of a loop or parallel evaluated at the end of each iteration or item, in the
        // body's scope; everything else resolves when the node starts.
        let (outer, until, output) = if takes_body {
            let mut outer = node.params.clone();
            let until = late_field(&mut outer, "until", node, errors);
            let output = late_field(&mut outer, "output", node, errors);
            (Cow::Owned(outer), until, output)
        } else {
            (Cow::Borrowed(&node.params), None, None)
        };
        let params = match Template::compile(&outer) {
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
        let spec = node_spec(node, body, until, output, errors);
        if errors.len() > before {
            return None;
        }
        let kind = self
            .kind_names
            .entry(&node.kind)
            .or_insert_with(|| Arc::from(node.kind.as_str()))
            .clone();
        let id = id?;
        let operation = super::plan::operation_of(&kind);
        Some(PlannedNode {
            span_name: format!("{} {id}", operation.unwrap_or("node")).into(),
            operation,
            id,
            kind,
            params: params?,
            spec: spec?,
        })
    }

    /// Reports `node`'s kind as unknown: the first node of a kind opens its problem (listing
    /// the known kinds once), later nodes of that kind are added to it.
    fn unknown_kind(&mut self, node: &NodeDef) {
        if let Some(&at) = self.unknown_kinds.get(&node.kind)
            && let Some(WorkflowError::UnknownKind { nodes, .. }) = self.errors.get_mut(at)
        {
            nodes.push(node.id.clone());
            return;
        }
        self.unknown_kinds
            .insert(node.kind.clone(), self.errors.len());
        self.errors.push(WorkflowError::UnknownKind {
            kind: node.kind.clone(),
            nodes: vec![node.id.clone()],
            known: self.kinds.kind_names(),
        });
    }
}

/// Takes `field` out of a loop's or parallel's parameters and compiles it on its own.
fn late_field(
    params: &mut serde_json::Value,
    field: &str,
    node: &NodeDef,
    errors: &mut Vec<WorkflowError>,
) -> Option<Template> {
    let value = params.as_object_mut()?.remove(field)?;
    match Template::compile(&value) {
        Ok(t) => Some(t),
        Err((at, e)) => {
            errors.push(WorkflowError::InvalidParam {
                node: node.id.clone(),
                field: if at.is_empty() {
                    field.to_owned()
                } else {
                    format!("{field}.{at}")
                },
                problem: e.to_string(),
            });
            None
        }
    }
}

fn node_spec(
    node: &NodeDef,
    body: Option<Arc<GraphPlan>>,
    until: Option<Template>,
    output: Option<Template>,
    errors: &mut Vec<WorkflowError>,
) -> Option<NodeSpec> {
    let mut issue = |(field, problem): spec::SpecIssue| {
        errors.push(WorkflowError::InvalidParam {
            node: node.id.clone(),
            field,
            problem,
        })
    };
    let p = &node.params;
    match node.kind.as_str() {
        kinds::LOOP => {
            let mode = match p.get("mode").and_then(|m| m.as_str()) {
                Some("array") => LoopMode::Array,
                _ => LoopMode::Condition,
            };
            if mode == LoopMode::Array && p.get("items").is_none() {
                issue(("items".into(), "an array loop needs `items`".into()));
            }
            if mode == LoopMode::Condition && until.is_none() {
                issue((
                    "until".into(),
                    "a condition loop needs an `until` condition (checked after each iteration)"
                        .into(),
                ));
            }
            let max = spec::positive(p, "max_iterations", u64::from(DEFAULT_MAX_ITERATIONS))
                .map_err(&mut issue)
                .ok()
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
            let mut vars = Vec::new();
            if let Some(declared) = p.get("variables").and_then(|v| v.as_object()) {
                for name in declared.keys() {
                    if !is_identifier(name) || spec::FRAME_FIELDS.contains(&name.as_str()) {
                        issue((
                            format!("variables.{name}"),
                            "loop variable names are letters, digits, `_` and `-`, and not `index` or `item`"
                                .into(),
                        ));
                    }
                    vars.push(name.clone());
                }
            }
            Some(NodeSpec::Loop(Arc::new(LoopSpec {
                mode,
                max_iterations: max?,
                vars,
                until,
                output,
                body: body?,
            })))
        }
        kinds::PARALLEL => {
            let max = spec::positive(p, "max_concurrency", spec::DEFAULT_MAX_CONCURRENCY as u64)
                .map_err(&mut issue)
                .ok()
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            Some(NodeSpec::Parallel(Arc::new(ParallelSpec {
                max_concurrency: max?,
                fail_fast: p.get("on_error").and_then(|v| v.as_str()) != Some("collect"),
                output,
                body: body?,
            })))
        }
        kinds::INTERACTIVE => match spec::interaction(p) {
            Ok(kind) => Some(NodeSpec::Interactive(Arc::new(kind))),
            Err(issues) => {
                for i in issues {
                    issue(i);
                }
                None
            }
        },
        _ => Some(NodeSpec::Task),
    }
}

fn check_node_id<'d>(
    node: &'d NodeDef,
    seen: &mut HashSet<&'d str>,
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
    if !seen.insert(&node.id) {
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

/// The branch labels a node may take: in order (for messages) and as a set (for lookups).
struct Branches {
    names: Vec<String>,
    set: HashSet<String>,
}

impl Branches {
    fn new(names: Vec<String>) -> Self {
        let set = names.iter().cloned().collect();
        Self { names, set }
    }
}

fn check_branch(
    index: usize,
    edge: &EdgeDef,
    from: &NodeDef,
    allowed: &Branches,
    errors: &mut Vec<WorkflowError>,
) {
    let problem = match &edge.branch {
        None if !allowed.names.is_empty() => Some(format!(
            "an edge leaving `{}` (kind `{}`) must name a branch: one of {}",
            from.id,
            from.kind,
            listing(&allowed.names, NAMED)
        )),
        Some(b) if allowed.names.is_empty() => Some(format!(
            "`{}` (kind `{}`) does not route; remove branch {b:?}",
            from.id, from.kind
        )),
        Some(b) if !allowed.set.contains(b) => Some(format!(
            "`{}` has no branch {b:?}; its branches are {}",
            from.id,
            listing(&allowed.names, NAMED)
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
        if let Some(default) = &input.default
            && !input.ty.accepts(default)
        {
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

/// The entry of a graph: the `begin` node at the top level; in a body, its one node without
/// incoming edges.
fn find_entry(
    owner: Option<&NodeDef>,
    nodes: &[NodeDef],
    edges: &[EdgeDef],
    errors: &mut Vec<WorkflowError>,
) -> Option<usize> {
    let begins: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].kind == kinds::BEGIN)
        .collect();
    let Some(owner) = owner else {
        return match begins.as_slice() {
            [] => {
                errors.push(WorkflowError::NoEntry);
                None
            }
            [one] => Some(*one),
            many => {
                errors.push(WorkflowError::MultipleEntries {
                    nodes: many.iter().map(|&i| nodes[i].id.clone()).collect(),
                });
                None
            }
        };
    };
    let body_error = |problem: String| WorkflowError::BodyEntry {
        node: owner.id.clone(),
        problem,
    };
    if let Some(&b) = begins.first() {
        errors.push(body_error(format!(
            "`{}` is a `begin` node; `begin` is only allowed at the top level",
            nodes[b].id
        )));
        return None;
    }
    let targets: HashSet<&str> = edges.iter().map(|e| e.to.as_str()).collect();
    let roots: Vec<usize> = (0..nodes.len())
        .filter(|&i| !targets.contains(nodes[i].id.as_str()))
        .collect();
    match roots.as_slice() {
        [one] => Some(*one),
        [] if nodes.is_empty() => {
            errors.push(body_error("the body has no nodes".into()));
            None
        }
        [] => {
            // Every node has an incoming edge: the body is a cycle; report it as one.
            Some(0)
        }
        many => {
            errors.push(body_error(format!(
                "the body has {} entry nodes ({}); it must have exactly one node without incoming edges",
                many.len(),
                listing(
                    &many
                        .iter()
                        .map(|&i| nodes[i].id.as_str())
                        .collect::<Vec<_>>(),
                    NAMED
                )
            )));
            None
        }
    }
}

/// Entry, cycles and reachability.
fn check_structure(
    graph: &GraphPlan,
    entry: &NodeDef,
    nodes: &[NodeDef],
    errors: &mut Vec<WorkflowError>,
) {
    let entry_ix = graph.shape.entry();
    if let Some(from) =
        (0..graph.nodes.len()).find(|&i| graph.shape.out_edges(i).iter().any(|e| e.to == entry_ix))
    {
        errors.push(WorkflowError::EntryHasIncoming {
            node: entry.id.clone(),
            from: nodes[from].id.clone(),
        });
    }
    if let Some(cycle) = find_cycle(graph) {
        errors.push(WorkflowError::Cycle {
            nodes: cycle.into_iter().map(|i| nodes[i].id.clone()).collect(),
        });
        return;
    }
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
