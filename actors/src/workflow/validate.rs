//! Validation: turns a [`WorkflowDef`] into a [`Plan`], or lists every problem, each naming the
//! node (or edge) and the field it is about.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::catalog::{self as kinds, KindCatalog};
use super::def::{EdgeDef, NodeDef, WorkflowDef};
use super::error::{ValidationErrors, WorkflowError};
use super::graph::{Edge, Graph};
use super::inputs::{InputDecl, InputType};
use super::plan::{GraphPlan, LoopMode, LoopSpec, NodeSpec, ParallelSpec, Plan, PlannedNode};
use super::reference::{Root, SYS_KEYS, Template};
use super::spec::{self, DEFAULT_MAX_ITERATIONS};
use crate::model::{Map, NodeId, Value};

const RESERVED_IDS: &[&str] = &["sys", "env"];

pub(super) fn validate(
    def: WorkflowDef,
    kinds: &dyn KindCatalog,
) -> Result<Plan, ValidationErrors> {
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
    let graph = check_graph(None, &def.nodes, &def.edges, kinds, &mut seen, &mut errors);

    let mut inputs = Vec::new();
    if let Some(entry) = def.nodes.iter().find(|n| n.kind == kinds::BEGIN) {
        inputs = begin_inputs(entry);
        check_inputs(entry, &inputs, &mut errors);
    }
    if errors.is_empty()
        && let Some(graph) = &graph
    {
        let scope = RefScope {
            outer: &HashSet::new(),
            frames: &[],
            all: &seen,
            variables: &def.variables,
        };
        check_references(graph, &def.nodes, &scope, &mut errors);
    }
    match graph {
        Some(graph) if errors.is_empty() => Ok(Plan {
            def,
            variables,
            inputs,
            graph: Arc::new(graph),
            def_json: Default::default(),
        }),
        _ => Err(ValidationErrors::from(errors)),
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks the nodes and edges of one graph (the workflow's when `owner` is `None`, else the
/// body of `owner`), recursing into bodies; returns its plan when it is usable.
fn check_graph(
    owner: Option<&NodeDef>,
    nodes: &[NodeDef],
    edges: &[EdgeDef],
    kinds: &dyn KindCatalog,
    seen: &mut HashSet<String>,
    errors: &mut Vec<WorkflowError>,
) -> Option<GraphPlan> {
    let before = errors.len();
    let mut planned = Vec::with_capacity(nodes.len());
    let mut index = HashMap::with_capacity(nodes.len());
    for node in nodes {
        if let Some(p) = check_node(node, kinds, seen, errors) {
            index.insert(p.id.clone(), planned.len());
            planned.push(p);
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
    let entry = find_entry(owner, nodes, edges, errors)?;
    let shape = match Graph::new(planned.len(), entry, shape_edges) {
        Ok(shape) => shape,
        Err(e) => {
            errors.push(WorkflowError::InvalidWorkflow {
                field: "edges".into(),
                problem: e.to_string(),
            });
            return None;
        }
    };
    let graph = GraphPlan {
        nodes: planned,
        index,
        shape: Arc::new(shape),
    };
    check_structure(&graph, &nodes[entry], nodes, errors);
    (errors.len() == before).then_some(graph)
}

/// One node: id, kind, parameters, and for engine-run kinds their spec and body.
fn check_node(
    node: &NodeDef,
    kinds: &dyn KindCatalog,
    seen: &mut HashSet<String>,
    errors: &mut Vec<WorkflowError>,
) -> Option<PlannedNode> {
    let before = errors.len();
    let id = check_node_id(node, seen, errors);
    let Some(schema) = kinds.params(&node.kind) else {
        errors.push(WorkflowError::UnknownKind {
            node: node.id.clone(),
            kind: node.kind.clone(),
            known: kinds.kind_names(),
        });
        return None;
    };
    for issue in schema.check(&node.params) {
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
        (Some(body), true) => {
            check_graph(Some(node), &body.nodes, &body.edges, kinds, seen, errors).map(Arc::new)
        }
        (None, false) => None,
    };
    // Fields of a loop or parallel evaluated at the end of each iteration or item, in the
    // body's scope; everything else resolves when the node starts.
    let mut outer = node.params.clone();
    let mut late = |field: &str| -> Option<Template> {
        let value = outer.as_object_mut()?.remove(field)?;
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
    };
    let (until, output) = if takes_body {
        (late("until"), late("output"))
    } else {
        (None, None)
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
    Some(PlannedNode {
        id: id?,
        kind: Arc::from(node.kind.as_str()),
        params: params?,
        spec: spec?,
    })
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
    kinds: &dyn KindCatalog,
    errors: &mut Vec<WorkflowError>,
) {
    let Some(allowed) = kinds.branches(&from.kind, &from.params) else {
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
    let roots: Vec<usize> = (0..nodes.len())
        .filter(|&i| !edges.iter().any(|e| e.to == nodes[i].id))
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
                many.iter()
                    .map(|&i| nodes[i].id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
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

/// What references may see at one level of nesting.
struct RefScope<'a> {
    /// Nodes outside this graph that are visible in it (upstream of the enclosing nodes).
    outer: &'a HashSet<String>,
    /// The enclosing loop and parallel nodes, innermost last.
    frames: &'a [FrameInfo],
    /// Every node id in the workflow.
    all: &'a HashSet<String>,
    /// The workflow's variables.
    variables: &'a serde_json::Map<String, serde_json::Value>,
}

/// An enclosing loop or parallel node, as references inside its body see it.
struct FrameInfo {
    node: String,
    /// The fields `{{node.X}}` may name: `index`, `item`, and a loop's variables.
    fields: Vec<String>,
    /// Whether `set_variable` may assign its variables (loops only).
    is_loop: bool,
}

/// Every node reference must name a node upstream of the referencing node (or a field of an
/// enclosing loop or parallel frame); `sys` keys must be known; `env` names must be declared
/// variables; `set_variable` may only assign declared variables. Recurses into bodies. Runs
/// only on graphs that are acyclic and reachable.
fn check_references(
    graph: &GraphPlan,
    defs: &[NodeDef],
    scope: &RefScope<'_>,
    errors: &mut Vec<WorkflowError>,
) {
    let ancestors = ancestor_sets(graph);
    for (i, node) in graph.nodes.iter().enumerate() {
        let upstream = |target: &NodeId| match graph.index.get(target) {
            Some(&t) => ancestors[i].contains(t),
            None => scope.outer.contains(target.as_str()),
        };
        for (field, reference) in node.params.references() {
            check_reference(node, &field, reference, &upstream, scope, errors);
        }
        if &*node.kind == kinds::SET_VARIABLE {
            check_assignments(node, &defs[i], scope, errors);
        }
        let (body, late): (&GraphPlan, Vec<(&str, &Template)>) = match &node.spec {
            NodeSpec::Loop(l) => (
                &l.body,
                [("until", &l.until), ("output", &l.output)]
                    .into_iter()
                    .filter_map(|(f, t)| Some((f, t.as_ref()?)))
                    .collect(),
            ),
            NodeSpec::Parallel(p) => (&p.body, p.output.iter().map(|t| ("output", t)).collect()),
            _ => continue,
        };
        // Inside the body: everything upstream of this node, and this node's frame.
        let mut outer: HashSet<String> = scope.outer.clone();
        for (t, planned) in graph.nodes.iter().enumerate() {
            if ancestors[i].contains(t) {
                outer.insert(planned.id.to_string());
            }
        }
        let mut frames: Vec<FrameInfo> = Vec::with_capacity(scope.frames.len() + 1);
        frames.extend(scope.frames.iter().map(|f| FrameInfo {
            node: f.node.clone(),
            fields: f.fields.clone(),
            is_loop: f.is_loop,
        }));
        let mut fields = vec!["index".to_owned(), "item".to_owned()];
        if let NodeSpec::Loop(l) = &node.spec {
            fields.extend(l.vars.iter().cloned());
        }
        frames.push(FrameInfo {
            node: node.id.to_string(),
            fields,
            is_loop: matches!(node.spec, NodeSpec::Loop(_)),
        });
        let inner = RefScope {
            outer: &outer,
            frames: &frames,
            all: scope.all,
            variables: scope.variables,
        };
        // `until` and `output` are evaluated at the end of an iteration: any body node (one
        // that did not run reads as null) and everything the body sees.
        for (name, template) in late {
            let visible = |target: &NodeId| {
                body.index.contains_key(target) || outer.contains(target.as_str())
            };
            for (at, reference) in template.references() {
                let field = if at.is_empty() {
                    name.to_owned()
                } else {
                    format!("{name}.{at}")
                };
                check_reference(node, &field, reference, &visible, &inner, errors);
            }
        }
        let body_defs = defs[i].body.as_ref().map_or(&[][..], |b| &b.nodes[..]);
        check_references(body, body_defs, &inner, errors);
    }
}

fn check_reference(
    node: &PlannedNode,
    field: &str,
    reference: &super::reference::Reference,
    visible: &dyn Fn(&NodeId) -> bool,
    scope: &RefScope<'_>,
    errors: &mut Vec<WorkflowError>,
) {
    let unknown = |problem: String| WorkflowError::UnknownReference {
        node: node.id.to_string(),
        field: field.to_owned(),
        reference: reference.to_string(),
        problem,
    };
    match reference.root() {
        Root::Node(target) => {
            if let Some(frame) = scope
                .frames
                .iter()
                .rev()
                .find(|f| f.node == target.as_str())
            {
                match reference.path().first() {
                    Some(name) if frame.fields.contains(name) => {}
                    other => errors.push(unknown(format!(
                        "inside the body of `{target}`, `{{{{{target}.X}}}}` names one of: {}{}",
                        frame.fields.join(", "),
                        other.map(|o| format!(" (not `{o}`)")).unwrap_or_default()
                    ))),
                }
            } else if visible(target) {
            } else if scope.all.contains(target.as_str()) {
                errors.push(WorkflowError::NotUpstream {
                    node: node.id.to_string(),
                    field: field.to_owned(),
                    reference: reference.to_string(),
                    target: target.to_string(),
                });
            } else {
                errors.push(unknown(format!("no node `{target}`")));
            }
        }
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
            if !scope.variables.contains_key(name) {
                errors.push(unknown(format!(
                    "no workflow variable `{name}`; declare it under `variables`"
                )));
            }
        }
    }
}

/// `set_variable` assigns a declared workflow variable (`name`) or a variable of an enclosing
/// loop (`loop_id.name`).
fn check_assignments(
    node: &PlannedNode,
    def: &NodeDef,
    scope: &RefScope<'_>,
    errors: &mut Vec<WorkflowError>,
) {
    let Some(list) = def.params.get("assignments").and_then(|a| a.as_array()) else {
        return;
    };
    for (i, item) in list.iter().enumerate() {
        let Some(name) = item.get("variable").and_then(|v| v.as_str()) else {
            continue;
        };
        let problem = match name.split_once('.') {
            None if scope.variables.contains_key(name) => None,
            None => Some(format!(
                "no workflow variable `{name}`; declare it under `variables`"
            )),
            Some((owner, var)) => match scope.frames.iter().rev().find(|f| f.node == owner) {
                Some(f) if f.is_loop && f.fields.iter().skip(2).any(|v| v == var) => None,
                Some(f) if f.is_loop => Some(format!(
                    "loop `{owner}` declares no variable `{var}` (declared: {})",
                    f.fields[2..].join(", ")
                )),
                _ => Some(format!(
                    "`{owner}` is not an enclosing loop; only the variables of loops around this node can be assigned"
                )),
            },
        };
        if let Some(problem) = problem {
            errors.push(WorkflowError::InvalidParam {
                node: node.id.to_string(),
                field: format!("assignments[{i}].variable"),
                problem,
            });
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
