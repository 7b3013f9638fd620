//! What a reference may name, checked once a workflow's graphs are acyclic and reachable: a
//! node upstream of the referencing node in its graph, or upstream of an enclosing loop or
//! parallel node in theirs; a field of an enclosing frame; a known `sys` key; a declared
//! variable. Also what `set_variable` may assign.
//!
//! A body's scope is the chain of its enclosing frames, each holding its graph's reachability
//! index ([`Upstream`]): a reference to a node outside the body is answered by the index of the
//! graph that node belongs to, so nothing is copied per body or per node.

use std::collections::HashSet;

use super::catalog as kinds;
use super::def::NodeDef;
use super::error::{WorkflowError, listing};
use super::plan::{GraphPlan, NodeSpec, PlannedNode};
use super::reference::{Reference, Root, SYS_KEYS, Template};
use super::upstream::Upstream;
use crate::model::NodeId;

/// How many names a problem lists (loop variables, frame fields) before "and N more".
const NAMED: usize = 20;

/// The fields every frame has, before a loop's variables.
const FRAME_FIELDS: [&str; 2] = ["index", "item"];

/// What holds for the whole workflow.
pub(super) struct WorkflowScope<'a> {
    /// Every node id in the workflow.
    pub(super) all: &'a HashSet<&'a str>,
    /// The workflow's variables.
    pub(super) variables: &'a serde_json::Map<String, serde_json::Value>,
}

/// An enclosing loop or parallel node, as references inside its body see it. Frames chain
/// outwards through `parent`.
struct Frame<'a> {
    /// The loop or parallel node.
    node: &'a PlannedNode,
    /// The graph it belongs to, that graph's index, and its position there: what is upstream
    /// of it is visible in its body.
    graph: &'a GraphPlan,
    upstream: &'a Upstream<'a>,
    position: usize,
    /// A loop's variables (a parallel has none): with `index` and `item`, the fields
    /// `{{node.X}}` may name.
    vars: &'a [String],
    /// Whether `set_variable` may assign its variables.
    is_loop: bool,
    /// The frame around this one.
    parent: Option<&'a Frame<'a>>,
}

impl<'a> Frame<'a> {
    /// This frame and those around it, innermost first.
    fn outwards(frame: Option<&'a Frame<'a>>) -> impl Iterator<Item = &'a Frame<'a>> {
        std::iter::successors(frame, |f| f.parent)
    }

    fn has_field(&self, name: &str) -> bool {
        FRAME_FIELDS.contains(&name) || self.vars.iter().any(|v| v == name)
    }

    fn fields(&self) -> Vec<&str> {
        FRAME_FIELDS
            .iter()
            .copied()
            .chain(self.vars.iter().map(String::as_str))
            .collect()
    }
}

/// Whether `target`, a node outside the graph being checked, is upstream of one of the nodes
/// enclosing it: found in the graph it belongs to (ids are unique in a workflow), then asked of
/// that graph's index.
fn upstream_of_frames(frame: Option<&Frame<'_>>, target: &NodeId) -> bool {
    for f in Frame::outwards(frame) {
        if let Some(&t) = f.graph.index.get(target) {
            return f.upstream.reaches(t, f.position);
        }
    }
    false
}

/// Checks every reference of the workflow's graph and, recursively, of its bodies.
pub(super) fn check(
    graph: &GraphPlan,
    defs: &[NodeDef],
    workflow: &WorkflowScope<'_>,
    errors: &mut Vec<WorkflowError>,
) {
    check_graph(graph, defs, None, workflow, errors);
}

fn check_graph(
    graph: &GraphPlan,
    defs: &[NodeDef],
    frame: Option<&Frame<'_>>,
    workflow: &WorkflowScope<'_>,
    errors: &mut Vec<WorkflowError>,
) {
    let upstream = Upstream::new(&graph.shape);
    for (i, node) in graph.nodes.iter().enumerate() {
        let visible = |target: &NodeId| match graph.index.get(target) {
            Some(&t) => upstream.reaches(t, i),
            None => upstream_of_frames(frame, target),
        };
        for (field, reference) in node.params.references() {
            check_reference(node, &field, reference, &visible, frame, workflow, errors);
        }
        let def = defs.get(i);
        if &*node.kind == kinds::SET_VARIABLE
            && let Some(def) = def
        {
            check_assignments(node, def, frame, workflow, errors);
        }
        let (body, vars, late): (&GraphPlan, &[String], Vec<(&str, &Template)>) = match &node.spec {
            NodeSpec::Loop(l) => (
                &l.body,
                &l.vars,
                [("until", &l.until), ("output", &l.output)]
                    .into_iter()
                    .filter_map(|(f, t)| Some((f, t.as_ref()?)))
                    .collect(),
            ),
            NodeSpec::Parallel(p) => (
                &p.body,
                &[],
                p.output.iter().map(|t| ("output", t)).collect(),
            ),
            _ => continue,
        };
        // Inside the body: everything upstream of this node, and this node's frame.
        let inner = Frame {
            node,
            graph,
            upstream: &upstream,
            position: i,
            vars,
            is_loop: matches!(node.spec, NodeSpec::Loop(_)),
            parent: frame,
        };
        // `until` and `output` are evaluated at the end of an iteration: any body node (one
        // that did not run reads as null) and everything the body sees.
        let visible = |target: &NodeId| {
            body.index.contains_key(target) || upstream_of_frames(Some(&inner), target)
        };
        for (name, template) in late {
            for (at, reference) in template.references() {
                let field = if at.is_empty() {
                    name.to_owned()
                } else {
                    format!("{name}.{at}")
                };
                check_reference(
                    node,
                    &field,
                    reference,
                    &visible,
                    Some(&inner),
                    workflow,
                    errors,
                );
            }
        }
        let body_defs = def
            .and_then(|d| d.body.as_ref())
            .map_or(&[][..], |b| &b.nodes[..]);
        check_graph(body, body_defs, Some(&inner), workflow, errors);
    }
}

fn check_reference(
    node: &PlannedNode,
    field: &str,
    reference: &Reference,
    visible: &dyn Fn(&NodeId) -> bool,
    frame: Option<&Frame<'_>>,
    workflow: &WorkflowScope<'_>,
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
            if let Some(frame) = Frame::outwards(frame).find(|f| f.node.id == *target) {
                match reference.steps().next() {
                    Some(name) if frame.has_field(name) => {}
                    other => errors.push(unknown(format!(
                        "inside the body of `{target}`, `{{{{{target}.X}}}}` names one of: {}{}",
                        listing(&frame.fields(), NAMED),
                        other.map(|o| format!(" (not `{o}`)")).unwrap_or_default()
                    ))),
                }
            } else if visible(target) {
            } else if workflow.all.contains(target.as_str()) {
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
            let key = reference.steps().next().unwrap_or_default();
            if !SYS_KEYS.contains(&key) {
                errors.push(unknown(format!(
                    "no `sys.{key}`; known: {}",
                    SYS_KEYS.join(", ")
                )));
            }
        }
        Root::Env => {
            let name = reference.steps().next().unwrap_or_default();
            if !workflow.variables.contains_key(name) {
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
    frame: Option<&Frame<'_>>,
    workflow: &WorkflowScope<'_>,
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
            None if workflow.variables.contains_key(name) => None,
            None => Some(format!(
                "no workflow variable `{name}`; declare it under `variables`"
            )),
            Some((owner, var)) => {
                match Frame::outwards(frame).find(|f| f.node.id.as_str() == owner) {
                    Some(f) if f.is_loop && f.vars.iter().any(|v| v == var) => None,
                    Some(f) if f.is_loop => Some(format!(
                        "loop `{owner}` declares no variable `{var}` (declared: {})",
                        listing(f.vars, NAMED)
                    )),
                    _ => Some(format!(
                        "`{owner}` is not an enclosing loop; only the variables of loops around this node can be assigned"
                    )),
                }
            }
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
