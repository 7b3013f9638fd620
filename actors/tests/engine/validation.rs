//! Validation: one test per problem kind, each checking the exact variant and the node, edge
//! and field it names; several problems reported at once; and run inputs checked at start
//! (missing, wrong type, undeclared, defaults applied).

use runvisor_actors::{RunStatus, StartError, WorkflowError};
use serde_json::json;

use super::support::*;

const BUILTIN: [&str; 8] = [
    "begin",
    "interactive",
    "loop",
    "message",
    "parallel",
    "set_variable",
    "switch",
    "template",
];

fn owned(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn tpl(id: &str, template: serde_json::Value) -> serde_json::Value {
    json!({"id": id, "kind": "template", "params": {"template": template}})
}

#[test]
fn malformed_json_reports_line_and_column() {
    let rt = runtime();
    let text = "{\n  \"id\": \"bad\",\n  \"nodes\": [\n    {\"id\": \"start\" \"kind\": \"begin\"}\n  ]\n}";
    let errors = problems_text(&rt, text);
    let [
        WorkflowError::Json {
            line,
            column,
            message,
        },
    ] = errors.as_slice()
    else {
        panic!("expected one Json error, got {errors:#?}");
    };
    assert_eq!((*line, *column), (4, 20), "{message}");
    assert!(message.contains("expected `,` or `}`"), "{message}");
}

#[test]
fn json_of_the_wrong_shape_reports_line_and_column() {
    let rt = runtime();
    let text = "{\"id\": \"x\",\n \"nodes\": [],\n \"edgez\": []}";
    let errors = problems_text(&rt, text);
    let [WorkflowError::Json { line, message, .. }] = errors.as_slice() else {
        panic!("expected one Json error, got {errors:#?}");
    };
    assert_eq!(*line, 3, "{message}");
    assert!(message.contains("unknown field `edgez`"), "{message}");
}

#[test]
fn unknown_kind() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "llm", "kind": "gpt"}
        ], "edges": [{"from": "start", "to": "llm"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::UnknownKind {
            kind: "gpt".into(),
            nodes: owned(&["llm"]),
            known: owned(&BUILTIN),
        }]
    );
}

#[test]
fn unknown_kind_lists_host_kinds_too() {
    let h = host();
    let errors = problems(
        &h.rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "llm", "kind": "Echo"}
        ], "edges": [{"from": "start", "to": "llm"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::UnknownKind {
            kind: "Echo".into(),
            nodes: owned(&["llm"]),
            known: owned(&[
                "begin",
                "echo",
                "fail",
                "hold",
                "interactive",
                "loop",
                "message",
                "panic",
                "parallel",
                "probe",
                "quick_panic",
                "set_variable",
                "sleep",
                "stream",
                "switch",
                "template"
            ]),
        }]
    );
}

#[test]
fn duplicate_id() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("one")),
            tpl("a", json!("two"))
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    assert_eq!(errors, [WorkflowError::DuplicateId { node: "a".into() }]);
}

#[test]
fn dangling_edges_name_the_missing_end() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("x"))
        ], "edges": [
            {"from": "start", "to": "a"},
            {"from": "start", "to": "ghost"},
            {"from": "nowhere", "to": "a"}
        ]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::DanglingEdge {
                index: 1,
                from: "start".into(),
                to: "ghost".into(),
                field: "to",
                missing: "ghost".into(),
            },
            WorkflowError::DanglingEdge {
                index: 2,
                from: "nowhere".into(),
                to: "a".into(),
                field: "from",
                missing: "nowhere".into(),
            },
        ]
    );
}

#[test]
fn no_entry() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [tpl("a", json!("x")), tpl("b", json!("y"))],
               "edges": [{"from": "a", "to": "b"}]}),
    );
    assert_eq!(errors, [WorkflowError::NoEntry]);
}

#[test]
fn two_entries() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "s1", "kind": "begin"},
            {"id": "s2", "kind": "begin"},
            tpl("a", json!("x"))
        ], "edges": [{"from": "s1", "to": "a"}, {"from": "s2", "to": "a"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::MultipleEntries {
            nodes: owned(&["s1", "s2"])
        }]
    );
}

#[test]
fn cycle_names_its_nodes() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("x")),
            tpl("b", json!("x")),
            tpl("c", json!("x"))
        ], "edges": [
            {"from": "start", "to": "a"},
            {"from": "a", "to": "b"},
            {"from": "b", "to": "c"},
            {"from": "c", "to": "a"}
        ]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::Cycle {
            nodes: owned(&["a", "b", "c"])
        }]
    );
    assert_eq!(
        errors[0].to_string(),
        "node `a`: field `edges`: cycle a -> b -> c -> a"
    );
}

#[test]
fn edge_into_the_entry() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("x", json!("x")),
            tpl("a", json!("a"))
        ], "edges": [{"from": "x", "to": "start"}, {"from": "start", "to": "a"}]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::EntryHasIncoming {
                node: "start".into(),
                from: "x".into(),
            },
            WorkflowError::Unreachable {
                node: "x".into(),
                entry: "start".into(),
            },
        ]
    );
}

#[test]
fn unreachable_nodes() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("x")),
            tpl("island", json!("x")),
            tpl("after_island", json!("x"))
        ], "edges": [
            {"from": "start", "to": "a"},
            {"from": "island", "to": "after_island"}
        ]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::Unreachable {
                node: "island".into(),
                entry: "start".into(),
            },
            WorkflowError::Unreachable {
                node: "after_island".into(),
                entry: "start".into(),
            },
        ]
    );
}

#[test]
fn reference_to_an_unknown_node() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("Hi {{ghost.text}}"))
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::UnknownReference {
            node: "a".into(),
            field: "template".into(),
            reference: "{{ghost.text}}".into(),
            problem: "no node `ghost`".into(),
        }]
    );
}

#[test]
fn reference_to_a_node_that_is_not_upstream() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("{{b.text}}")),
            tpl("b", json!("b")),
            tpl("c", json!("{{d.text}}")),
            tpl("d", json!("{{d.text}}"))
        ], "edges": [
            {"from": "start", "to": "a"},
            {"from": "start", "to": "b"},
            {"from": "b", "to": "c"},
            {"from": "c", "to": "d"}
        ]}),
    );
    assert_eq!(
        errors,
        [
            // A sibling branch.
            WorkflowError::NotUpstream {
                node: "a".into(),
                field: "template".into(),
                reference: "{{b.text}}".into(),
                target: "b".into(),
            },
            // A downstream node.
            WorkflowError::NotUpstream {
                node: "c".into(),
                field: "template".into(),
                reference: "{{d.text}}".into(),
                target: "d".into(),
            },
            // Itself.
            WorkflowError::NotUpstream {
                node: "d".into(),
                field: "template".into(),
                reference: "{{d.text}}".into(),
                target: "d".into(),
            },
        ]
    );
}

#[test]
fn unknown_sys_key() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("{{sys.user}}"))
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::UnknownReference {
            node: "a".into(),
            field: "template".into(),
            reference: "{{sys.user}}".into(),
            problem: "no `sys.user`; known: query, run_id, thread_id, workflow_id".into(),
        }]
    );
}

#[test]
fn undeclared_env_variable() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "variables": {"declared": 1}, "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("{{env.mood}} {{env.declared}}")),
            {"id": "set", "kind": "set_variable", "params": {"assignments": [
                {"variable": "declared", "value": 2},
                {"variable": "other", "value": 3}
            ]}}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "set"}]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::UnknownReference {
                node: "a".into(),
                field: "template".into(),
                reference: "{{env.mood}}".into(),
                problem: "no workflow variable `mood`; declare it under `variables`".into(),
            },
            WorkflowError::InvalidParam {
                node: "set".into(),
                field: "assignments[1].variable".into(),
                problem: "no workflow variable `other`; declare it under `variables`".into(),
            },
        ]
    );
}

#[test]
fn param_of_the_wrong_type() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!(3)),
            {"id": "b", "kind": "template", "params": {"template": "x", "append_message": "yes"}},
            {"id": "c", "kind": "template"},
            {"id": "route", "kind": "switch", "params": {"cases": [
                {"id": "k", "conditions": [{"left": 1, "op": "equals"}]}
            ]}},
            tpl("d", json!("d"))
        ], "edges": [
            {"from": "start", "to": "a"},
            {"from": "start", "to": "b"},
            {"from": "start", "to": "c"},
            {"from": "start", "to": "route"},
            {"from": "route", "to": "d", "branch": "k"}
        ]}),
    );
    let invalid = |node: &str, field: &str, problem: &str| WorkflowError::InvalidParam {
        node: node.into(),
        field: field.into(),
        problem: problem.into(),
    };
    assert_eq!(
        errors,
        [
            invalid("a", "template", "expected a string, found an integer"),
            invalid("b", "append_message", "expected a boolean, found a string"),
            invalid("c", "template", "is required (a string)"),
            invalid(
                "route",
                "cases[0].conditions[0].op",
                "\"equals\" is not one of eq, ne, gt, gte, lt, lte, contains, not_contains, \
                 starts_with, ends_with, empty, not_empty"
            ),
        ]
    );
}

#[test]
fn unknown_param_field() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin", "params": {"input": []}},
            {"id": "a", "kind": "template", "params": {"template": "x", "colour": "red"}}
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::InvalidParam {
                node: "start".into(),
                field: "input".into(),
                problem: "is not a known field (known: inputs)".into(),
            },
            WorkflowError::InvalidParam {
                node: "a".into(),
                field: "colour".into(),
                problem: "is not a known field (known: template, append_message, role)".into(),
            },
        ]
    );
}

#[test]
fn malformed_reference_names_the_field() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("a", json!("Hi {{start..name}}"))
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::InvalidParam {
            node: "a".into(),
            field: "template".into(),
            problem: "bad reference \"start..name\": each dot-separated part must be letters, \
                      digits, `_` or `-`"
                .into(),
        }]
    );
}

fn switch_with_edges(edges: serde_json::Value) -> serde_json::Value {
    json!({"id": "w", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "route", "kind": "switch", "params": {"cases": [
            {"id": "yes", "conditions": [{"left": "{{sys.query}}", "op": "eq", "right": "y"}]}
        ]}},
        tpl("a", json!("a")),
        tpl("b", json!("b"))
    ], "edges": edges})
}

#[test]
fn bad_switch_branch_label() {
    let rt = runtime();
    let errors = problems(
        &rt,
        switch_with_edges(json!([
            {"from": "start", "to": "route"},
            {"from": "route", "to": "a", "branch": "yes"},
            {"from": "route", "to": "b", "branch": "maybe"}
        ])),
    );
    assert_eq!(
        errors,
        [WorkflowError::InvalidBranch {
            index: 2,
            from: "route".into(),
            to: "b".into(),
            problem: "`route` has no branch \"maybe\"; its branches are yes, else".into(),
        }]
    );
}

#[test]
fn edge_from_switch_without_branch() {
    let rt = runtime();
    let errors = problems(
        &rt,
        switch_with_edges(json!([
            {"from": "start", "to": "route"},
            {"from": "route", "to": "a"},
            {"from": "route", "to": "b", "branch": "else"}
        ])),
    );
    assert_eq!(
        errors,
        [WorkflowError::InvalidBranch {
            index: 1,
            from: "route".into(),
            to: "a".into(),
            problem: "an edge leaving `route` (kind `switch`) must name a branch: one of yes, else"
                .into(),
        }]
    );
}

#[test]
fn branch_on_an_edge_from_a_node_that_does_not_route() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [{"id": "start", "kind": "begin"}, tpl("a", json!("a"))],
               "edges": [{"from": "start", "to": "a", "branch": "yes"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::InvalidBranch {
            index: 0,
            from: "start".into(),
            to: "a".into(),
            problem: "`start` (kind `begin`) does not route; remove branch \"yes\"".into(),
        }]
    );
}

#[test]
fn body_on_a_kind_that_takes_none() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "template", "params": {"template": "x"},
             "body": {"nodes": [tpl("inner", json!("y"))]}}
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    assert_eq!(
        errors,
        [WorkflowError::BodyNotAllowed {
            node: "a".into(),
            kind: "template".into(),
        }]
    );
}

#[test]
fn reserved_and_invalid_node_ids() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            tpl("sys", json!("x")),
            tpl("env", json!("x")),
            tpl("a.b", json!("x")),
            tpl("with space", json!("x")),
            tpl("", json!("x"))
        ], "edges": [
            {"from": "start", "to": "sys"},
            {"from": "start", "to": "env"},
            {"from": "start", "to": "a.b"},
            {"from": "start", "to": "with space"},
            {"from": "start", "to": ""}
        ]}),
    );
    let charset = "node ids are non-empty and made of letters, digits, `_` and `-`";
    let invalid = |node: &str, problem: &str| WorkflowError::InvalidNodeId {
        node: node.into(),
        problem: problem.into(),
    };
    assert_eq!(
        errors,
        [
            invalid("sys", "`sys` is reserved for references"),
            invalid("env", "`env` is reserved for references"),
            invalid("a.b", charset),
            invalid("with space", charset),
            invalid("", charset),
        ]
    );
}

#[test]
fn invalid_workflow_fields() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": " ", "variables": {"bad name": 1}, "nodes": [
            {"id": "start", "kind": "begin"}
        ]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::InvalidWorkflow {
                field: "id".into(),
                problem: "must not be empty".into(),
            },
            WorkflowError::InvalidWorkflow {
                field: "variables.bad name".into(),
                problem: "variable names are letters, digits, `_` and `-`".into(),
            },
        ]
    );
}

#[test]
fn several_node_and_edge_problems_are_reported_at_once() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "gpt"},
            {"id": "b", "kind": "template", "params": {"template": 3, "colour": "red"}},
            tpl("b", json!("again")),
            tpl("env", json!("x"))
        ], "edges": [
            {"from": "start", "to": "a"},
            {"from": "start", "to": "b"},
            {"from": "b", "to": "ghost"}
        ]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::UnknownKind {
                kind: "gpt".into(),
                nodes: owned(&["a"]),
                known: owned(&BUILTIN),
            },
            WorkflowError::InvalidParam {
                node: "b".into(),
                field: "template".into(),
                problem: "expected a string, found an integer".into(),
            },
            WorkflowError::InvalidParam {
                node: "b".into(),
                field: "colour".into(),
                problem: "is not a known field (known: template, append_message, role)".into(),
            },
            WorkflowError::DuplicateId { node: "b".into() },
            WorkflowError::InvalidNodeId {
                node: "env".into(),
                problem: "`env` is reserved for references".into(),
            },
            WorkflowError::DanglingEdge {
                index: 2,
                from: "b".into(),
                to: "ghost".into(),
                field: "to",
                missing: "ghost".into(),
            },
        ]
    );
}

#[test]
fn several_reference_problems_are_reported_at_once() {
    let rt = runtime();
    let errors = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "switch", "params": {"cases": [
                {"id": "k", "conditions": [
                    {"left": "{{ghost.x}}", "op": "eq", "right": "{{sys.nope}}"},
                    {"left": "{{env.mood}}", "op": "empty"}
                ]}
            ]}},
            tpl("b", json!("{{a.branch}}"))
        ], "edges": [
            {"from": "start", "to": "a"},
            {"from": "a", "to": "b", "branch": "k"}
        ]}),
    );
    assert_eq!(
        errors,
        [
            WorkflowError::UnknownReference {
                node: "a".into(),
                field: "cases[0].conditions[0].left".into(),
                reference: "{{ghost.x}}".into(),
                problem: "no node `ghost`".into(),
            },
            WorkflowError::UnknownReference {
                node: "a".into(),
                field: "cases[0].conditions[0].right".into(),
                reference: "{{sys.nope}}".into(),
                problem: "no `sys.nope`; known: query, run_id, thread_id, workflow_id".into(),
            },
            WorkflowError::UnknownReference {
                node: "a".into(),
                field: "cases[0].conditions[1].left".into(),
                reference: "{{env.mood}}".into(),
                problem: "no workflow variable `mood`; declare it under `variables`".into(),
            },
        ]
    );
}

#[test]
fn begin_inputs_are_unique_and_their_defaults_typed() {
    let rt = runtime();
    let got = problems(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin", "params": {"inputs": [
                {"name": "n", "type": "integer", "default": "abc"},
                {"name": "n", "type": "string"},
                {"name": "ok", "type": "bool", "default": false}
            ]}}
        ]}),
    );
    assert_eq!(
        got,
        [
            WorkflowError::InvalidParam {
                node: "start".into(),
                field: "inputs[0].default".into(),
                problem: "default of input `n` is string, but its type is integer".into(),
            },
            WorkflowError::InvalidParam {
                node: "start".into(),
                field: "inputs[1].name".into(),
                problem: "input `n` is declared twice".into(),
            },
        ]
    );
}

fn with_inputs() -> serde_json::Value {
    json!({"id": "inputs", "nodes": [
        {"id": "start", "kind": "begin", "params": {"inputs": [
            {"name": "name", "type": "string", "required": true},
            {"name": "age", "type": "integer"},
            {"name": "greeting", "type": "string", "default": "hi"},
            {"name": "tags", "type": "array", "default": []}
        ]}},
        tpl("say", json!("{{start.greeting}} {{start.name}} {{start.tags}}"))
    ], "edges": [{"from": "start", "to": "say"}]})
}

#[tokio::test]
async fn start_rejects_a_missing_required_input() {
    let rt = runtime();
    let wf = load(&rt, with_inputs());
    let err = rt
        .start(&wf, inputs([("age", 3.into())]), thread("in"))
        .await
        .expect_err("name is required");
    assert_eq!(
        err,
        StartError::InvalidInput {
            input: "name".into(),
            problem: "is required".into(),
        }
    );
}

#[tokio::test]
async fn start_rejects_an_input_of_the_wrong_type() {
    let rt = runtime();
    let wf = load(&rt, with_inputs());
    let err = rt
        .start(
            &wf,
            inputs([("name", "ann".into()), ("age", "three".into())]),
            thread("in"),
        )
        .await
        .expect_err("age is an integer");
    assert_eq!(
        err,
        StartError::InvalidInput {
            input: "age".into(),
            problem: "expected integer, found string".into(),
        }
    );
}

#[tokio::test]
async fn start_rejects_an_undeclared_input() {
    let rt = runtime();
    let wf = load(&rt, with_inputs());
    let err = rt
        .start(
            &wf,
            inputs([("name", "ann".into()), ("nickname", "a".into())]),
            thread("in"),
        )
        .await
        .expect_err("nickname is not declared");
    assert_eq!(
        err,
        StartError::InvalidInput {
            input: "nickname".into(),
            problem: "not declared by the begin node (declared: name, age, greeting, tags)".into(),
        }
    );
    // Nothing was started.
    assert!(rt.registry().is_empty());
}

#[tokio::test]
async fn start_applies_input_defaults() {
    let rt = runtime();
    let wf = load(&rt, with_inputs());
    let outcome = run_to_end(&rt, &wf, inputs([("name", "ann".into())]), "in").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("start"),
        Some(&val(json!({"name": "ann", "greeting": "hi", "tags": []})))
    );
    assert_eq!(text(&outcome, "say"), "hi ann []");
    // A provided value wins over the default.
    let outcome = run_to_end(
        &rt,
        &wf,
        inputs([
            ("name", "bob".into()),
            ("greeting", "yo".into()),
            ("age", 40.into()),
        ]),
        "in",
    )
    .await;
    assert_eq!(
        outcome.output("start"),
        Some(&val(
            json!({"name": "bob", "greeting": "yo", "age": 40, "tags": []})
        ))
    );
    assert_eq!(text(&outcome, "say"), "yo bob []");
}

#[tokio::test]
async fn start_rejects_a_workflow_with_a_kind_the_runtime_does_not_know() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "w", "nodes": [{"id": "start", "kind": "begin"}, {"id": "e", "kind": "echo"}],
               "edges": [{"from": "start", "to": "e"}]}),
    );
    let other = runtime();
    let err = other
        .start(&wf, Default::default(), thread("k"))
        .await
        .expect_err("echo is not registered on `other`");
    assert_eq!(err, StartError::UnknownKind("echo".into()));
}
