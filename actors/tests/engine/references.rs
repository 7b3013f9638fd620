//! References at run time: node fields with array indices, `sys` values, workflow variables
//! assigned by `set_variable`, and falsy values keeping their type through a single-reference
//! parameter while rendering as themselves in text.

use runvisor_actors::{RunOutcome, RunStatus};
use serde_json::json;

use super::support::*;

#[tokio::test]
async fn node_field_paths_with_array_indices() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "paths", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "src", "kind": "echo", "params": {
                "items": [{"name": "a", "tags": ["x", "y"]}, {"name": "b", "tags": ["z"]}],
                "meta": {"deep": {"er": 42}}
            }},
            {"id": "use", "kind": "echo", "params": {
                "second": "{{src.items.1.name}}",
                "first_item": "{{src.items.0}}",
                "tag": "{{src.items.0.tags.1}}",
                "deep": "{{ src.meta.deep.er }}",
                "line": "{{src.items.0.name}}-{{src.items.1.tags.0}}-{{src.meta.deep.er}}"
            }}
        ], "edges": [{"from": "start", "to": "src"}, {"from": "src", "to": "use"}]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "paths").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("use"),
        Some(&val(json!({
            "second": "b",
            "first_item": {"name": "a", "tags": ["x", "y"]},
            "tag": "y",
            "deep": 42,
            "line": "a-z-42"
        })))
    );
}

#[tokio::test]
async fn sys_values_query_run_id_thread_and_workflow() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "sys-values", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "use", "kind": "echo", "params": {
                "query": "{{sys.query}}",
                "run": "{{sys.run_id}}",
                "thread": "{{sys.thread_id}}",
                "workflow": "{{sys.workflow_id}}",
                "line": "{{sys.query}} @ {{sys.thread_id}}"
            }}
        ], "edges": [{"from": "start", "to": "use"}]}),
    );
    let run =
        h.rt.start(
            &wf,
            inputs([("query", "what now?".into())]),
            thread("t-sys"),
        )
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("use"),
        Some(&val(json!({
            "query": "what now?",
            "run": run.run_id().to_string(),
            "thread": "t-sys",
            "workflow": "sys-values",
            "line": "what now? @ t-sys"
        })))
    );
    assert_eq!(outcome.run_id(), run.run_id());
}

#[tokio::test]
async fn env_variable_updated_by_set_variable_before_a_template_reads_it() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "vars", "variables": {"greeting": "hello", "count": 1, "untouched": "same"},
        "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "before", "kind": "template", "params": {"template": "{{env.greeting}} x{{env.count}}"}},
            {"id": "set", "kind": "set_variable", "params": {"assignments": [
                {"variable": "greeting", "value": "hi {{sys.query}}"},
                {"variable": "count", "value": "{{env.count}}"}
            ]}},
            {"id": "bump", "kind": "set_variable", "params": {"assignments": [
                {"variable": "count", "value": 2}
            ]}},
            {"id": "after", "kind": "template", "params": {
                "template": "{{env.greeting}} x{{env.count}} {{env.untouched}}"}},
            {"id": "typed", "kind": "echo", "params": {"count": "{{env.count}}"}}
        ], "edges": [
            {"from": "start", "to": "before"},
            {"from": "before", "to": "set"},
            {"from": "set", "to": "bump"},
            {"from": "bump", "to": "after"},
            {"from": "after", "to": "typed"}
        ]}),
    );
    let outcome = run_to_end(&h.rt, &wf, inputs([("query", "ann".into())]), "vars").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(text(&outcome, "before"), "hello x1");
    assert_eq!(
        outcome.output("set"),
        Some(&val(json!({"greeting": "hi ann", "count": 1})))
    );
    assert_eq!(text(&outcome, "after"), "hi ann x2 same");
    assert_eq!(outcome.output("typed"), Some(&val(json!({"count": 2}))));
    let RunOutcome::Completed { variables, .. } = &outcome else {
        panic!("run should complete: {outcome:#?}");
    };
    assert_eq!(
        variables,
        &inputs([
            ("count", 2.into()),
            ("greeting", "hi ann".into()),
            ("untouched", "same".into())
        ])
    );
}

#[tokio::test]
async fn falsy_values_keep_their_type_and_render_as_themselves() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "falsy", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "src", "kind": "echo", "params": {
                "zero": 0, "empty": "", "no": false, "none": [], "nothing": null
            }},
            {"id": "typed", "kind": "echo", "params": {
                "zero": "{{src.zero}}",
                "empty": "{{src.empty}}",
                "no": "{{src.no}}",
                "none": "{{src.none}}",
                "nothing": "{{src.nothing}}"
            }},
            {"id": "line", "kind": "template", "params": {
                "template": "[{{src.zero}}|{{src.empty}}|{{src.no}}|{{src.none}}|{{src.nothing}}]"}},
            {"id": "zero", "kind": "template", "params": {"template": "{{src.zero}}"}},
            {"id": "empty", "kind": "template", "params": {"template": "{{src.empty}}"}},
            {"id": "no", "kind": "template", "params": {"template": "{{src.no}}"}},
            {"id": "none", "kind": "template", "params": {"template": "{{src.none}}"}},
            {"id": "nothing", "kind": "template", "params": {"template": "{{src.nothing}}"}}
        ], "edges": [
            {"from": "start", "to": "src"},
            {"from": "src", "to": "typed"},
            {"from": "src", "to": "line"},
            {"from": "src", "to": "zero"},
            {"from": "src", "to": "empty"},
            {"from": "src", "to": "no"},
            {"from": "src", "to": "none"},
            {"from": "src", "to": "nothing"}
        ]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "falsy").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let want = val(json!({"zero": 0, "empty": "", "no": false, "none": [], "nothing": null}));
    assert_eq!(outcome.output("typed"), Some(&want));
    // The handler got the typed values too, not text.
    assert_eq!(h.log.inputs("typed"), [want]);
    assert_eq!(text(&outcome, "line"), "[0||false|[]|]");
    for (node, rendered) in [
        ("zero", "0"),
        ("empty", ""),
        ("no", "false"),
        ("none", "[]"),
        ("nothing", ""),
    ] {
        assert_eq!(text(&outcome, node), rendered, "node {node}");
    }
}

#[tokio::test]
async fn falsy_values_flow_through_run_inputs_and_switch_conditions() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "falsy-inputs", "nodes": [
            {"id": "start", "kind": "begin", "params": {"inputs": [
                {"name": "n", "type": "integer"},
                {"name": "flag", "type": "bool"},
                {"name": "list", "type": "array"}
            ]}},
            {"id": "route", "kind": "switch", "params": {"mode": "all", "cases": [
                {"id": "zero", "conditions": [{"left": "{{start.n}}", "op": "eq", "right": 0}]},
                {"id": "off", "conditions": [{"left": "{{start.flag}}", "op": "eq", "right": false}]},
                {"id": "nonempty", "conditions": [{"left": "{{start.n}}", "op": "not_empty"}]},
                {"id": "emptylist", "conditions": [{"left": "{{start.list}}", "op": "empty"}]}
            ]}},
            {"id": "out", "kind": "echo", "params": {"n": "{{start.n}}", "flag": "{{start.flag}}", "list": "{{start.list}}"}}
        ], "edges": [
            {"from": "start", "to": "route"},
            {"from": "route", "to": "out", "branch": "zero"}
        ]}),
    );
    let outcome = run_to_end(
        &h.rt,
        &wf,
        inputs([
            ("n", 0.into()),
            ("flag", false.into()),
            ("list", val(json!([]))),
        ]),
        "falsy-inputs",
    )
    .await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("route"),
        Some(&val(json!({
            "matched": ["zero", "off", "nonempty", "emptylist"],
            "branch": "zero"
        })))
    );
    assert_eq!(
        outcome.output("out"),
        Some(&val(json!({"n": 0, "flag": false, "list": []})))
    );
}
