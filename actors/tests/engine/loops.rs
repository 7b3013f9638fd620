//! Loops: condition and array modes, loop variables, `max_iterations`, empty arrays, nesting
//! with loops and parallels, failures named by iteration, workflow variables assigned in a
//! body, and a stop in the middle of an iteration that a resume continues without rerunning
//! finished iterations.

use runvisor_actors::testkit::{Interrupt, Script, persisted};
use runvisor_actors::{NodeError, RunError, RunStatus, StopMode};
use serde_json::json;

use super::bodykit::*;
use super::stopkit::{mark, stopped_reply};
use super::support::{finish, inputs, load, run_to_end, thread, val, within};

#[tokio::test]
async fn condition_loop_counts_a_loop_variable_until_its_condition_holds() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "count", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "condition",
                "variables": {"count": 0},
                "until": {"conditions": [{"left": "{{l.count}}", "op": "gte", "right": 3}]},
                "output": {"index": "{{l.index}}", "count": "{{l.count}}"}
            }, "body": {"nodes": [
                {"id": "inc", "kind": "add", "params": {"a": "{{l.count}}", "b": 1}},
                {"id": "set", "kind": "set_variable", "params": {"assignments": [
                    {"variable": "l.count", "value": "{{inc.value}}"}
                ]}}
            ], "edges": [{"from": "inc", "to": "set"}]}},
            {"id": "after", "kind": "work", "params": {
                "count": "{{l.variables.count}}", "iterations": "{{l.iterations}}"
            }}
        ], "edges": [{"from": "start", "to": "l"}, {"from": "l", "to": "after"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-condition").await;
    completed(&outcome);
    let l = out(&outcome, "l");
    assert_eq!(
        field(l, "history"),
        &val(json!([
            {"index": 0, "count": 1}, {"index": 1, "count": 2}, {"index": 2, "count": 3}
        ]))
    );
    assert_eq!(field(l, "variables"), &val(json!({"count": 3})));
    assert_eq!(field(l, "iterations"), &val(json!(3)));
    assert_eq!(details(l), same_details(3, &["inc", "set"]));
    // Each iteration read the value the previous one assigned.
    let a: Vec<_> = b
        .tally
        .inputs_of("inc")
        .iter()
        .map(|i| field(i, "a").clone())
        .collect();
    assert_eq!(a, [val(json!(0)), val(json!(1)), val(json!(2))]);
    assert_eq!(
        b.tally.paths_of("inc"),
        ["l/#0/inc", "l/#1/inc", "l/#2/inc"]
    );
    assert_eq!(
        out(&outcome, "after"),
        &val(json!({"count": 3, "iterations": 3}))
    );
    // Body nodes are not top-level outputs; the usage is every add and `after`, once.
    assert_eq!(
        outcome
            .outputs()
            .keys()
            .map(|k| k.as_str())
            .collect::<Vec<_>>(),
        ["after", "l", "start"]
    );
    assert_eq!(tokens(&outcome), 4.0 * TOKENS);
}

#[tokio::test]
async fn array_loop_runs_once_per_item_with_falsy_items_and_their_indexes() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "array", "nodes": [
            {"id": "start", "kind": "begin", "params": {"inputs": [
                {"name": "items", "type": "array", "required": true}
            ]}},
            {"id": "l", "kind": "loop", "params": {"mode": "array", "items": "{{start.items}}"},
             "body": {"nodes": [
                {"id": "w", "kind": "work", "params": {
                    "i": "{{l.index}}", "item": "{{l.item}}", "text": "#{{l.index}}={{l.item}}"
                }}
            ]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let items = val(json!([0, "", false, null, "x"]));
    let outcome = run_to_end(&b.rt, &wf, inputs([("items", items)]), "loop-array").await;
    completed(&outcome);
    let l = out(&outcome, "l");
    // Without `output`, an iteration's entry is the outputs of the body's sink nodes.
    let expected = [
        json!({"i": 0, "item": 0, "text": "#0=0"}),
        json!({"i": 1, "item": "", "text": "#1="}),
        json!({"i": 2, "item": false, "text": "#2=false"}),
        json!({"i": 3, "item": null, "text": "#3="}),
        json!({"i": 4, "item": "x", "text": "#4=x"}),
    ];
    let history: Vec<_> = expected.iter().map(|w| json!({"w": w})).collect();
    assert_eq!(field(l, "history"), &val(json!(history)));
    assert_eq!(field(l, "iterations"), &val(json!(5)));
    assert_eq!(field(l, "variables"), &val(json!({})));
    assert_eq!(details(l), same_details(5, &["w"]));
    let seen: Vec<_> = expected.into_iter().map(val).collect();
    assert_eq!(b.tally.inputs_of("w"), seen);
}

#[tokio::test]
async fn a_condition_loop_past_max_iterations_fails_naming_the_loop() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "forever", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "condition",
                "max_iterations": 3,
                "until": {"conditions": [{"left": "{{w.at}}", "op": "gte", "right": 100}]}
            }, "body": {"nodes": [
                {"id": "w", "kind": "work", "params": {"at": "{{l.index}}"}}
            ]}},
            {"id": "after", "kind": "work"}
        ], "edges": [{"from": "start", "to": "l"}, {"from": "l", "to": "after"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-max").await;
    assert_eq!(outcome.status(), RunStatus::Failed, "{outcome:#?}");
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: at("l"),
            error: NodeError::Failed(
                "loop `l` reached max_iterations (3) before its `until` condition held".into()
            ),
        })
    );
    assert_eq!(b.tally.paths_of("w"), ["l/#0/w", "l/#1/w", "l/#2/w"]);
    assert_eq!(b.tally.calls_of("after"), 0);
    assert!(outcome.output("l").is_none());
}

#[tokio::test]
async fn an_array_longer_than_max_iterations_fails_before_any_iteration() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "too-long", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "array", "items": [1, 2, 3], "max_iterations": 2
            }, "body": {"nodes": [{"id": "w", "kind": "work"}]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-too-long").await;
    assert_eq!(outcome.status(), RunStatus::Failed, "{outcome:#?}");
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: at("l"),
            error: NodeError::InvalidInput {
                field: "items".into(),
                reason: "loop `l` has 3 items, more than its max_iterations (2)".into(),
            },
        })
    );
    assert_eq!(b.tally.total_calls(), 0);
}

#[tokio::test]
async fn an_array_loop_over_no_items_completes_with_an_empty_history() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "empty", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {"mode": "array", "items": []},
             "body": {"nodes": [{"id": "w", "kind": "work"}]}},
            {"id": "after", "kind": "work", "params": {"n": "{{l.iterations}}"}}
        ], "edges": [{"from": "start", "to": "l"}, {"from": "l", "to": "after"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-empty").await;
    completed(&outcome);
    assert_eq!(
        out(&outcome, "l"),
        &val(json!({"history": [], "variables": {}, "iterations": 0, "details": []}))
    );
    assert_eq!(b.tally.calls_of("w"), 0);
    assert_eq!(out(&outcome, "after"), &val(json!({"n": 0})));
}

#[tokio::test]
async fn a_nested_loop_reads_the_outer_index_and_item() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "nested", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "o", "kind": "loop", "params": {
                "mode": "array", "items": ["a", "b"], "output": "{{i.history}}"
            }, "body": {"nodes": [
                {"id": "i", "kind": "loop", "params": {
                    "mode": "array", "items": [10, 20, 30],
                    "output": "{{o.item}}{{cell.o}}-{{cell.i}}:{{l_item.v}}"
                }, "body": {"nodes": [
                    {"id": "cell", "kind": "work", "params": {
                        "o": "{{o.index}}", "i": "{{i.index}}"
                    }},
                    {"id": "l_item", "kind": "work", "params": {"v": "{{i.item}}"}}
                ], "edges": [{"from": "cell", "to": "l_item"}]}}
            ]}}
        ], "edges": [{"from": "start", "to": "o"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-nested").await;
    completed(&outcome);
    let o = out(&outcome, "o");
    assert_eq!(
        field(o, "history"),
        &val(json!([
            ["a0-0:10", "a0-1:20", "a0-2:30"],
            ["b1-0:10", "b1-1:20", "b1-2:30"]
        ]))
    );
    assert_eq!(details(o), same_details(2, &["i"]));
    assert_eq!(
        b.tally.paths_of("cell"),
        [
            "o/#0/i/#0/cell",
            "o/#0/i/#1/cell",
            "o/#0/i/#2/cell",
            "o/#1/i/#0/cell",
            "o/#1/i/#1/cell",
            "o/#1/i/#2/cell"
        ]
    );
}

#[tokio::test]
async fn an_inner_loop_assigning_an_outer_loop_variable_sees_its_own_assignments() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "outer-var", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "o", "kind": "loop", "params": {
                "mode": "array", "items": [1, 2], "variables": {"seen": 0},
                "output": "{{o.seen}}"
            }, "body": {"nodes": [
                {"id": "i", "kind": "loop", "params": {"mode": "array", "items": [1, 1, 1]},
                 "body": {"nodes": [
                    {"id": "bump", "kind": "add", "params": {"a": "{{o.seen}}", "b": 1}},
                    {"id": "set", "kind": "set_variable", "params": {"assignments": [
                        {"variable": "o.seen", "value": "{{bump.value}}"}
                    ]}}
                ], "edges": [{"from": "bump", "to": "set"}]}}
            ]}}
        ], "edges": [{"from": "start", "to": "o"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-outer-var").await;
    completed(&outcome);
    let o = out(&outcome, "o");
    // Each inner iteration reads what the previous one assigned, across outer iterations too.
    let a: Vec<_> = b
        .tally
        .inputs_of("bump")
        .iter()
        .map(|i| field(i, "a").clone())
        .collect();
    assert_eq!(a, (0..6).map(|n| val(json!(n))).collect::<Vec<_>>());
    assert_eq!(field(o, "history"), &val(json!([3, 6])));
    assert_eq!(field(o, "variables"), &val(json!({"seen": 6})));
}

#[tokio::test]
async fn outer_loop_variables_assigned_before_a_pause_in_an_inner_loop_survive_the_resume() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "outer-var-pause", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "o", "kind": "loop", "params": {
                "mode": "array", "items": [1, 2], "variables": {"seen": 0},
                "output": "{{o.seen}}"
            }, "body": {"nodes": [
                {"id": "i", "kind": "loop", "params": {"mode": "array", "items": [1, 1, 1]},
                 "body": {"nodes": [
                    {"id": "bump", "kind": "add", "params": {"a": "{{o.seen}}", "b": 1}},
                    {"id": "set", "kind": "set_variable", "params": {"assignments": [
                        {"variable": "o.seen", "value": "{{bump.value}}"}
                    ]}},
                    {"id": "gate", "kind": "switch", "params": {"cases": [
                        {"id": "ask", "conditions": [
                            {"left": "{{o.index}}", "op": "eq", "right": 0},
                            {"left": "{{i.index}}", "op": "eq", "right": 1}
                        ]}
                    ]}},
                    {"id": "ask", "kind": "interactive", "params": {
                        "mode": "user_select", "prompt": "seen {{o.seen}}", "options": ["ok"]
                    }},
                    {"id": "tail", "kind": "work", "params": {"seen": "{{o.seen}}"}}
                ], "edges": [
                    {"from": "bump", "to": "set"}, {"from": "set", "to": "gate"},
                    {"from": "gate", "to": "ask", "branch": "ask"},
                    {"from": "gate", "to": "tail", "branch": "else"},
                    {"from": "ask", "to": "tail"}
                ]}}
            ]}}
        ], "edges": [{"from": "start", "to": "o"}]}),
    );
    let t = thread("outer-var-pause");
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let first = finish(&run).await;
    let asked = paused(&first);
    assert_eq!(asked.path, at("o/#0/i/#1/ask"));
    assert_eq!(asked.prompt.as_deref(), Some("seen 2"));
    let outcome = answer(&b.rt, &t, asked.id, val(json!("ok"))).await;
    completed(&outcome);
    let a: Vec<_> = b
        .tally
        .inputs_of("bump")
        .iter()
        .map(|i| field(i, "a").clone())
        .collect();
    assert_eq!(a, (0..6).map(|n| val(json!(n))).collect::<Vec<_>>());
    let seen: Vec<_> = b
        .tally
        .inputs_of("tail")
        .iter()
        .map(|i| field(i, "seen").clone())
        .collect();
    assert_eq!(seen, (1..7).map(|n| val(json!(n))).collect::<Vec<_>>());
    let o = out(&outcome, "o");
    assert_eq!(field(o, "history"), &val(json!([3, 6])));
    assert_eq!(field(o, "variables"), &val(json!({"seen": 6})));
}

#[tokio::test]
async fn a_parallel_inside_a_loop_sees_the_iteration_and_its_items() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "loop-par", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "array", "items": [[1, 2, 3], [4, 5]], "output": "{{p.results}}"
            }, "body": {"nodes": [
                {"id": "p", "kind": "parallel", "params": {
                    "items": "{{l.item}}", "max_concurrency": 2,
                    "output": "{{l.index}}/{{p.index}}={{w.v}}"
                }, "body": {"nodes": [
                    {"id": "w", "kind": "work", "params": {"v": "{{p.item}}"}}
                ]}}
            ]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-par").await;
    completed(&outcome);
    let l = out(&outcome, "l");
    assert_eq!(
        field(l, "history"),
        &val(json!([["0/0=1", "0/1=2", "0/2=3"], ["1/0=4", "1/1=5"]]))
    );
    assert_eq!(details(l), same_details(2, &["p"]));
    let mut paths = b.tally.paths_of("w");
    paths.sort();
    assert_eq!(
        paths,
        [
            "l/#0/p/@0/w",
            "l/#0/p/@1/w",
            "l/#0/p/@2/w",
            "l/#1/p/@0/w",
            "l/#1/p/@1/w"
        ]
    );
    assert_eq!(tokens(&outcome), 5.0 * TOKENS);
}

#[tokio::test]
async fn a_loop_inside_a_parallel_runs_per_item() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "par-loop", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {
                "items": [2, 3, 1], "output": {"item": "{{p.item}}", "loop": "{{l.variables}}",
                                               "n": "{{l.iterations}}"}
            }, "body": {"nodes": [
                {"id": "l", "kind": "loop", "params": {
                    "mode": "condition",
                    "variables": {"count": 0},
                    "until": {"conditions": [
                        {"left": "{{l.count}}", "op": "gte", "right": "{{p.item}}"}
                    ]}
                }, "body": {"nodes": [
                    {"id": "inc", "kind": "add", "params": {"a": "{{l.count}}", "b": 1}},
                    {"id": "set", "kind": "set_variable", "params": {"assignments": [
                        {"variable": "l.count", "value": "{{inc.value}}"}
                    ]}}
                ], "edges": [{"from": "inc", "to": "set"}]}}
            ]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "par-loop").await;
    completed(&outcome);
    assert_eq!(
        out(&outcome, "p"),
        &val(json!({"results": [
            {"item": 2, "loop": {"count": 2}, "n": 2},
            {"item": 3, "loop": {"count": 3}, "n": 3},
            {"item": 1, "loop": {"count": 1}, "n": 1}
        ], "errors": [], "count": 3}))
    );
    let mut paths = b.tally.paths_of("inc");
    paths.sort();
    assert_eq!(
        paths,
        [
            "p/@0/l/#0/inc",
            "p/@0/l/#1/inc",
            "p/@1/l/#0/inc",
            "p/@1/l/#1/inc",
            "p/@1/l/#2/inc",
            "p/@2/l/#0/inc"
        ]
    );
}

#[tokio::test]
async fn a_failing_body_node_fails_the_run_with_its_iteration_in_the_path() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "fails", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {"mode": "array", "items": ["a", "b", "c"]},
             "body": {"nodes": [
                {"id": "ok", "kind": "work", "params": {"at": "{{l.index}}"}},
                {"id": "bad", "kind": "work", "params": {"at": "{{l.index}}", "fail_at": 1}}
            ], "edges": [{"from": "ok", "to": "bad"}]}},
            {"id": "after", "kind": "work"}
        ], "edges": [{"from": "start", "to": "l"}, {"from": "l", "to": "after"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-fails").await;
    assert_eq!(outcome.status(), RunStatus::Failed, "{outcome:#?}");
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: at("l/#1/bad"),
            error: NodeError::Failed("boom at 1".into()),
        })
    );
    assert_eq!(
        outcome.error().map(ToString::to_string).as_deref(),
        Some("node `l/#1/bad` failed: boom at 1")
    );
    // Iteration 2 never started; nothing after the loop ran.
    assert_eq!(b.tally.paths_of("ok"), ["l/#0/ok", "l/#1/ok"]);
    assert_eq!(b.tally.paths_of("bad"), ["l/#0/bad", "l/#1/bad"]);
    assert_eq!(b.tally.calls_of("after"), 0);
    assert_eq!(outcome.output("l"), None);
    assert_eq!(tokens(&outcome), 3.0 * TOKENS);
}

#[tokio::test]
async fn a_workflow_variable_assigned_in_the_body_is_visible_after_the_loop() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "total", "variables": {"total": 0}, "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "array", "items": [1, 2, 3], "output": "{{env.total}}"
            }, "body": {"nodes": [
                {"id": "acc", "kind": "add", "params": {"a": "{{env.total}}", "b": "{{l.item}}"}},
                {"id": "set", "kind": "set_variable", "params": {"assignments": [
                    {"variable": "total", "value": "{{acc.value}}"}
                ]}}
            ], "edges": [{"from": "acc", "to": "set"}]}},
            {"id": "after", "kind": "work", "params": {"total": "{{env.total}}"}}
        ], "edges": [{"from": "start", "to": "l"}, {"from": "l", "to": "after"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "loop-total").await;
    completed(&outcome);
    assert_eq!(field(out(&outcome, "l"), "history"), &val(json!([1, 3, 6])));
    assert_eq!(out(&outcome, "after"), &val(json!({"total": 6})));
    match &outcome {
        runvisor_actors::RunOutcome::Completed { variables, .. } => {
            assert_eq!(variables.get("total"), Some(&val(json!(6))));
        }
        other => panic!("completed: {other:#?}"),
    }
}

/// A loop of four iterations whose body is `a -> b`; `b` holds (until the stop) at `hold_at`.
fn four_iterations(hold_at: i64) -> serde_json::Value {
    json!({"id": "stop-in-loop", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "l", "kind": "loop", "params": {
            "mode": "array", "items": ["w", "x", "y", "z"], "output": "{{b.item}}{{l.index}}"
        }, "body": {"nodes": [
            {"id": "a", "kind": "work", "params": {"at": "{{l.index}}"}},
            {"id": "b", "kind": "work", "params": {
                "at": "{{l.index}}", "hold_at": hold_at, "item": "{{l.item}}"
            }}
        ], "edges": [{"from": "a", "to": "b"}]}},
        {"id": "after", "kind": "work", "params": {"n": "{{l.iterations}}"}}
    ], "edges": [{"from": "start", "to": "l"}, {"from": "l", "to": "after"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_inside_an_iteration_resumes_without_rerunning_finished_iterations() {
    let b = bodies();
    let wf = load(&b.rt, four_iterations(2));
    let t = thread("loop-stop");
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    mark(&b.log, "held:l/#2/b").await;
    let stop = stopped_reply(
        within("stop", b.rt.stop(run.run_id(), StopMode::graceful()))
            .await
            .expect("the run is live"),
    );
    // Where it stopped is named inside the loop: node `b` of iteration 2.
    assert_eq!(stop.interrupted.len(), 1, "{stop:#?}");
    assert_eq!(stop.interrupted[0].path, at("l/#2/b"));
    assert_eq!(stop.stopped_at(), [at("l/#2/b")]);
    let first = finish(&run).await;
    assert_eq!(first.status(), RunStatus::Stopped);
    assert_eq!(tokens(&first), 5.0 * TOKENS);

    // The checkpoint holds two finished iterations and the third's progress.
    let saved = persisted(&b.rt, &t).await;
    let snapshot = snapshot_with(saved.snapshot(), RunStatus::Stopped);
    assert_eq!(snapshot.graph.frontier.len(), 1);
    let l = loop_frame(&snapshot.graph, "l");
    assert_eq!(l.iteration, 2);
    assert_eq!(l.history, [val(json!("w0")), val(json!("x1"))].into());
    assert_eq!(l.details.len(), 2);
    assert_eq!(done_nodes(&l.body), ["a"]);
    assert_eq!(l.body.frontier.len(), 1);
    assert_eq!(l.body.frontier[0].as_str(), "b");

    let resumed = resume_continue(&b.rt, &t).await;
    let outcome = finish(&resumed).await;
    completed(&outcome);
    let out_l = out(&outcome, "l");
    assert_eq!(
        field(out_l, "history"),
        &val(json!(["w0", "x1", "y2", "z3"]))
    );
    assert_eq!(details(out_l), same_details(4, &["a", "b"]));
    assert_eq!(out(&outcome, "after"), &val(json!({"n": 4})));
    // Finished iterations and the finished part of the stopped one never ran again.
    for i in 0..4 {
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/a")), 1, "a in #{i}");
        let expected = if i == 2 { 2 } else { 1 };
        assert_eq!(
            b.tally.calls_at(&format!("l/#{i}/b")),
            expected,
            "b in #{i}"
        );
    }
    assert_eq!(b.tally.stopped(), ["l/#2/b"]);
    // The resumed run counts only what it ran: b of #2, then #3, then `after`.
    assert_eq!(tokens(&outcome), 4.0 * TOKENS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_stop_during_a_body_node_resumes_in_the_same_iteration() {
    let b = bodies_with(Script::new().interrupt(Interrupt::during("b")));
    let wf = load(&b.rt, four_iterations(0));
    let t = thread("loop-scripted-stop");
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let first = finish(&run).await;
    let Some(stop) = first.stop_result() else {
        panic!("the script should have stopped the run: {first:#?}");
    };
    assert_eq!(stop.frontier.len(), 1);
    assert_eq!(stop.frontier[0].as_str(), "l");
    assert_eq!(b.tally.stopped(), ["l/#0/b"]);
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(&saved.snapshot().graph, "l");
    assert_eq!((l.iteration, l.history.len()), (0, 0));
    assert_eq!(done_nodes(&l.body), ["a"]);
    assert_eq!(saved_output(&l.body, "a"), &val(json!({"at": 0})));

    let resumed = resume_continue(&b.rt, &t).await;
    let outcome = finish(&resumed).await;
    completed(&outcome);
    assert_eq!(
        field(out(&outcome, "l"), "history"),
        &val(json!(["w0", "x1", "y2", "z3"]))
    );
    assert_eq!(b.tally.calls_at("l/#0/a"), 1);
    assert_eq!(b.tally.calls_at("l/#0/b"), 2);
    assert_eq!(b.tally.calls_of("a"), 4);
    assert_eq!(b.tally.calls_of("b"), 5);
}
