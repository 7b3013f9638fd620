//! Validation of references across bodies: what a node inside a loop or parallel body may
//! name (its body's upstream nodes, the nodes upstream of every enclosing node, the fields of
//! its enclosing frames), what `until` and `output` may name, and the exact error for each
//! reference that breaks the rule. Also references on graphs that are not trees (diamonds,
//! skip edges), where "upstream" is reachability, not a parent chain.

use runvisor_actors::WorkflowError;
use serde_json::json;

use super::support::*;

fn tpl(id: &str, template: &str) -> serde_json::Value {
    json!({"id": id, "kind": "template", "params": {"template": template}})
}

fn not_upstream(node: &str, field: &str, target: &str, path: &str) -> WorkflowError {
    WorkflowError::NotUpstream {
        node: node.into(),
        field: field.into(),
        reference: format!("{{{{{target}.{path}}}}}"),
        target: target.into(),
    }
}

fn valid(rt: &runvisor_actors::Runtime, workflow: serde_json::Value) {
    if let Err(errors) = rt.load_json(&workflow.to_string()) {
        panic!("workflow should be valid: {errors}");
    }
}

/// `start -> {left, right} -> join -> tail`, with `skip: start -> tail`.
fn diamond(references: [(&str, &str); 5]) -> serde_json::Value {
    let [l, r, j, t, s] = references;
    json!({"id": "w", "nodes": [
        {"id": "start", "kind": "begin"},
        tpl(l.0, l.1), tpl(r.0, r.1), tpl(j.0, j.1), tpl(t.0, t.1), tpl(s.0, s.1)
    ], "edges": [
        {"from": "start", "to": "left"},
        {"from": "start", "to": "right"},
        {"from": "left", "to": "join"},
        {"from": "right", "to": "join"},
        {"from": "join", "to": "tail"},
        {"from": "start", "to": "skip"},
        {"from": "skip", "to": "tail"}
    ]})
}

#[test]
fn upstream_is_reachability_across_diamonds_and_skip_edges() {
    let rt = runtime();
    valid(
        &rt,
        diamond([
            ("left", "{{start.query}}"),
            ("right", "{{start.query}}"),
            ("join", "{{left.text}} {{right.text}} {{start.query}}"),
            (
                "tail",
                "{{join.text}} {{left.text}} {{right.text}} {{skip.text}}",
            ),
            ("skip", "{{start.query}}"),
        ]),
    );
    let errors = problems(
        &rt,
        diamond([
            ("left", "{{right.text}}"),
            ("right", "{{join.text}}"),
            ("join", "{{skip.text}}"),
            ("tail", "{{tail.text}}"),
            ("skip", "{{left.text}} {{tail.text}}"),
        ]),
    );
    assert_eq!(
        errors,
        [
            not_upstream("left", "template", "right", "text"),
            not_upstream("right", "template", "join", "text"),
            not_upstream("join", "template", "skip", "text"),
            not_upstream("tail", "template", "tail", "text"),
            not_upstream("skip", "template", "left", "text"),
            not_upstream("skip", "template", "tail", "text"),
        ]
    );
}

/// `start -> before -> l (loop) -> after`, `start -> side`; the body is `b1 -> b2`, then
/// `b1 -> inner (loop over i1 -> i2)`.
fn nested(refs: [(&str, &str); 5], until: &str, inner_output: &str) -> serde_json::Value {
    let [b1, b2, i1, i2, after] = refs;
    json!({"id": "w", "nodes": [
        {"id": "start", "kind": "begin"},
        tpl("before", "x"),
        tpl("side", "x"),
        {"id": "l", "kind": "loop", "params": {
            "mode": "condition",
            "variables": {"count": 0},
            "until": {"conditions": [{"left": until, "op": "eq", "right": 1}]}
        }, "body": {"nodes": [
            tpl(b1.0, b1.1),
            tpl(b2.0, b2.1),
            {"id": "inner", "kind": "parallel",
             "params": {"items": [1, 2], "output": inner_output},
             "body": {"nodes": [tpl(i1.0, i1.1), tpl(i2.0, i2.1)],
                      "edges": [{"from": "i1", "to": "i2"}]}}
        ], "edges": [{"from": "b1", "to": "b2"}, {"from": "b1", "to": "inner"}]}},
        tpl(after.0, after.1)
    ], "edges": [
        {"from": "start", "to": "before"},
        {"from": "before", "to": "l"},
        {"from": "l", "to": "after"},
        {"from": "start", "to": "side"}
    ]})
}

#[test]
fn bodies_see_what_is_upstream_of_every_enclosing_node() {
    let rt = runtime();
    valid(
        &rt,
        nested(
            [
                (
                    "b1",
                    "{{before.text}} {{start.query}} {{l.index}} {{l.count}}",
                ),
                ("b2", "{{b1.text}} {{l.item}}"),
                (
                    "i1",
                    "{{b1.text}} {{before.text}} {{inner.item}} {{l.count}}",
                ),
                ("i2", "{{i1.text}} {{inner.index}} {{l.index}}"),
                ("after", "{{l.text}} {{before.text}}"),
            ],
            "{{b2.text}}",
            "{{i2.text}}",
        ),
    );
}

#[test]
fn bodies_do_not_see_siblings_downstream_nodes_or_other_bodies() {
    let rt = runtime();
    let errors = problems(
        &rt,
        nested(
            [
                ("b1", "{{side.text}} {{after.text}} {{b2.text}}"),
                ("b2", "{{i1.text}} {{l.bogus}}"),
                ("i1", "{{b2.text}} {{l.text}} {{i2.text}}"),
                ("i2", "{{inner.text}} {{inner.count}}"),
                ("after", "{{b1.text}}"),
            ],
            "{{after.text}}",
            "{{b2.text}}",
        ),
    );
    assert_eq!(
        errors,
        [
            not_upstream("l", "until.conditions[0].left", "after", "text"),
            not_upstream("b1", "template", "side", "text"),
            not_upstream("b1", "template", "after", "text"),
            not_upstream("b1", "template", "b2", "text"),
            not_upstream("b2", "template", "i1", "text"),
            WorkflowError::UnknownReference {
                node: "b2".into(),
                field: "template".into(),
                reference: "{{l.bogus}}".into(),
                problem: "inside the body of `l`, `{{l.X}}` names one of: index, item, count \
                          (not `bogus`)"
                    .into(),
            },
            not_upstream("inner", "output", "b2", "text"),
            not_upstream("i1", "template", "b2", "text"),
            WorkflowError::UnknownReference {
                node: "i1".into(),
                field: "template".into(),
                reference: "{{l.text}}".into(),
                problem: "inside the body of `l`, `{{l.X}}` names one of: index, item, count \
                          (not `text`)"
                    .into(),
            },
            not_upstream("i1", "template", "i2", "text"),
            WorkflowError::UnknownReference {
                node: "i2".into(),
                field: "template".into(),
                reference: "{{inner.text}}".into(),
                problem: "inside the body of `inner`, `{{inner.X}}` names one of: index, item \
                          (not `text`)"
                    .into(),
            },
            WorkflowError::UnknownReference {
                node: "i2".into(),
                field: "template".into(),
                reference: "{{inner.count}}".into(),
                problem: "inside the body of `inner`, `{{inner.X}}` names one of: index, item \
                          (not `count`)"
                    .into(),
            },
            not_upstream("after", "template", "b1", "text"),
        ]
    );
}

#[test]
fn set_variable_in_nested_bodies_assigns_only_enclosing_loops() {
    let rt = runtime();
    let set = |id: &str, variable: &str| {
        json!({"id": id, "kind": "set_variable",
               "params": {"assignments": [{"variable": variable, "value": 1}]}})
    };
    let errors = problems(
        &rt,
        json!({"id": "w", "variables": {"total": 0}, "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "outer", "kind": "loop", "params": {"mode": "array", "items": [1],
                                                        "variables": {"n": 0}},
             "body": {"nodes": [
                {"id": "p", "kind": "parallel", "params": {"items": [1]},
                 "body": {"nodes": [
                    {"id": "in", "kind": "loop", "params": {"mode": "array", "items": [1]},
                     "body": {"nodes": [set("ok1", "outer.n")], "edges": []}},
                 ], "edges": []}},
                set("ok2", "total"),
             ], "edges": [{"from": "p", "to": "ok2"}]}},
            set("bad1", "outer.n"),
        ], "edges": [{"from": "start", "to": "outer"}, {"from": "outer", "to": "bad1"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::InvalidParam {
            node: "bad1".into(),
            field: "assignments[0].variable".into(),
            problem: "`outer` is not an enclosing loop; only the variables of loops around this \
                      node can be assigned"
                .into(),
        }]
    );
}
