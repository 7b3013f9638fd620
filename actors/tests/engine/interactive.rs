//! Human in the loop: the acceptance scenarios of pauses in loops and parallels (answers land
//! in the exact frame, finished iterations and items never run again, usage is counted once),
//! a stop in the middle of a parallel resumed without rerunning finished items, and answer
//! validation (each wrong answer is refused precisely and the run stays resumable).

use std::collections::BTreeSet;

use runvisor_actors::testkit::persisted;
use runvisor_actors::{
    AnswerError, FieldType, FormField, InteractionId, InteractionKind, QueryError, ResumeError,
    ResumeInput, RunId, RunStatus, SelectOption, Value,
};
use serde_json::json;

use super::bodykit::*;
use super::support::{finish, inputs, load, thread, val};

/// Starts a run and waits (bounded) for its outcome.
async fn start(
    b: &Bodies,
    wf: &runvisor_actors::Workflow,
    t: &runvisor_actors::ThreadId,
) -> runvisor_actors::RunOutcome {
    let run = b.rt.start(wf, inputs([]), t.clone()).await.expect("start");
    finish(&run).await
}

/// Scenario 1: a condition loop with a form in its body. Each answer lands in its iteration;
/// the node after the form reads the iteration's index and the answer; the history is whole.
#[tokio::test]
async fn scenario_1_a_form_in_a_condition_loop() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "s1", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "condition", "variables": {"sum": 0},
                "until": {"conditions": [{"left": "{{l.sum}}", "op": "gte", "right": 10}]},
                "output": {"index": "{{l.index}}", "n": "{{ask.n}}", "sum": "{{l.sum}}"}
            }, "body": {"nodes": [
                {"id": "ask", "kind": "interactive", "params": {
                    "mode": "form_input", "prompt": "Number #{{l.index}}? (sum {{l.sum}})",
                    "fields": [{"name": "n", "type": "integer", "required": true}]
                }},
                {"id": "seen", "kind": "work", "params": {"index": "{{l.index}}", "n": "{{ask.n}}"}},
                {"id": "add", "kind": "add", "params": {"a": "{{l.sum}}", "b": "{{ask.n}}"}},
                {"id": "set", "kind": "set_variable", "params": {"assignments": [
                    {"variable": "l.sum", "value": "{{add.value}}"}
                ]}}
            ], "edges": [
                {"from": "ask", "to": "seen"}, {"from": "seen", "to": "add"},
                {"from": "add", "to": "set"}
            ]}},
            {"id": "after", "kind": "work", "params": {"sum": "{{l.variables.sum}}"}}
        ], "edges": [{"from": "start", "to": "l"}, {"from": "l", "to": "after"}]}),
    );
    let t = thread("s1");
    let mut outcome = start(&b, &wf, &t).await;
    let prompts = [
        "Number #0? (sum 0)",
        "Number #1? (sum 3)",
        "Number #2? (sum 7)",
    ];
    for (i, (n, prompt)) in [3, 4, 5].into_iter().zip(prompts).enumerate() {
        let asked = paused(&outcome);
        assert_eq!(asked.path, at(&format!("l/#{i}/ask")));
        assert_eq!(asked.node.as_str(), "ask");
        assert_eq!(asked.prompt.as_deref(), Some(prompt));
        assert_eq!(
            asked.kind,
            InteractionKind::FormInput {
                fields: vec![FormField {
                    name: "n".into(),
                    ty: FieldType::Integer,
                    required: true,
                    label: None,
                    default: None,
                }]
            }
        );
        outcome = answer(&b.rt, &t, asked.id, val(json!({"n": n}))).await;
    }
    completed(&outcome);
    let l = out(&outcome, "l");
    assert_eq!(
        field(l, "history"),
        &val(json!([
            {"index": 0, "n": 3, "sum": 3},
            {"index": 1, "n": 4, "sum": 7},
            {"index": 2, "n": 5, "sum": 12}
        ]))
    );
    assert_eq!(field(l, "variables"), &val(json!({"sum": 12})));
    assert_eq!(details(l), same_details(3, &["ask", "seen", "add", "set"]));
    assert_eq!(
        b.tally.inputs_of("seen"),
        [
            val(json!({"index": 0, "n": 3})),
            val(json!({"index": 1, "n": 4})),
            val(json!({"index": 2, "n": 5}))
        ]
    );
    assert_eq!(
        b.tally.paths_of("seen"),
        ["l/#0/seen", "l/#1/seen", "l/#2/seen"]
    );
    assert_eq!(b.tally.calls_of("add"), 3);
    assert_eq!(out(&outcome, "after"), &val(json!({"sum": 12})));
}

/// Scenario 2: two pauses in one iteration (a form, then a selection). Both answers land, and
/// each iteration's detail lists every body node once, those before the first pause included.
#[tokio::test]
async fn scenario_2_two_pauses_in_one_iteration() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "s2", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "array", "items": ["x", "y"],
                "output": "{{l.item}}:{{form.name}}:{{sel.value}}"
            }, "body": {"nodes": [
                {"id": "pre", "kind": "work", "params": {"at": "{{l.index}}"}},
                {"id": "form", "kind": "interactive", "params": {
                    "mode": "form_input", "fields": [{"name": "name", "required": true}]
                }},
                {"id": "mid", "kind": "work", "params": {"name": "{{form.name}}"}},
                {"id": "sel", "kind": "interactive", "params": {
                    "mode": "user_select", "prompt": "For {{form.name}}?",
                    "options": [{"value": "a", "label": "Alpha"}, "b"]
                }},
                {"id": "post", "kind": "work", "params": {
                    "index": "{{l.index}}", "name": "{{form.name}}",
                    "choice": "{{sel.value}}", "label": "{{sel.label}}"
                }}
            ], "edges": [
                {"from": "pre", "to": "form"}, {"from": "form", "to": "mid"},
                {"from": "mid", "to": "sel"}, {"from": "sel", "to": "post"}
            ]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let t = thread("s2");
    let mut outcome = start(&b, &wf, &t).await;
    let answers = [
        ("l/#0/form", json!({"name": "Ann"})),
        ("l/#0/sel", json!("a")),
        ("l/#1/form", json!({"name": "Bob"})),
        ("l/#1/sel", json!({"value": "b"})),
    ];
    for (i, (path, value)) in answers.into_iter().enumerate() {
        let asked = paused(&outcome);
        assert_eq!(asked.path, at(path));
        if i == 1 {
            // Paused at the selection: the iteration kept what ran before both pauses.
            assert_eq!(asked.prompt.as_deref(), Some("For Ann?"));
            let saved = persisted(&b.rt, &t).await;
            let l = loop_frame(&saved.snapshot().graph, "l");
            assert_eq!(l.iteration, 0);
            assert_eq!(done_nodes(&l.body), ["pre", "form", "mid"]);
            assert_eq!(saved_output(&l.body, "form"), &val(json!({"name": "Ann"})));
        }
        outcome = answer(&b.rt, &t, asked.id, val(value)).await;
    }
    completed(&outcome);
    let l = out(&outcome, "l");
    assert_eq!(field(l, "history"), &val(json!(["x:Ann:a", "y:Bob:b"])));
    assert_eq!(
        details(l),
        same_details(2, &["pre", "form", "mid", "sel", "post"])
    );
    assert_eq!(
        b.tally.inputs_of("post"),
        [
            val(json!({"index": 0, "name": "Ann", "choice": "a", "label": "Alpha"})),
            val(json!({"index": 1, "name": "Bob", "choice": "b", "label": "b"}))
        ]
    );
    for node in ["pre", "mid", "post"] {
        for i in 0..2 {
            assert_eq!(
                b.tally.calls_at(&format!("l/#{i}/{node}")),
                1,
                "{node} in #{i}"
            );
        }
    }
}

/// A condition loop of five iterations, `w1 -> gate -> (ask) -> w2`; `ask` runs only where
/// `case` holds.
fn gated_loop(
    mode: serde_json::Value,
    case: serde_json::Value,
    ask: serde_json::Value,
) -> serde_json::Value {
    let mut params = mode;
    params["output"] = json!({"i": "{{l.index}}", "item": "{{l.item}}", "answer": "{{ask.value}}"});
    json!({"id": "gated", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "l", "kind": "loop", "params": params, "body": {"nodes": [
            {"id": "w1", "kind": "work", "params": {"at": "{{l.index}}", "item": "{{l.item}}"}},
            {"id": "gate", "kind": "switch", "params": {"cases": [case]}},
            ask,
            {"id": "w2", "kind": "work", "params": {
                "i": "{{l.index}}", "item": "{{l.item}}", "answer": "{{ask.value}}"
            }}
        ], "edges": [
            {"from": "w1", "to": "gate"},
            {"from": "gate", "to": "ask", "branch": "ask"},
            {"from": "gate", "to": "w2", "branch": "else"},
            {"from": "ask", "to": "w2"}
        ]}}
    ], "edges": [{"from": "start", "to": "l"}]})
}

/// Scenario 3: a pause in the second of five iterations. The resumed run runs the rest of that
/// iteration and the three after it; the first iteration's record is intact; finished body
/// nodes never run again; usage is counted once.
#[tokio::test]
async fn scenario_3_a_pause_in_iteration_2_of_5() {
    let b = bodies();
    let wf = load(
        &b.rt,
        gated_loop(
            json!({"mode": "condition",
                   "until": {"conditions": [{"left": "{{l.index}}", "op": "gte", "right": 4}]}}),
            json!({"id": "ask", "conditions": [{"left": "{{l.index}}", "op": "eq", "right": 1}]}),
            json!({"id": "ask", "kind": "interactive", "params": {
                "mode": "user_select", "prompt": "Iteration {{l.index}}: go on?",
                "options": ["yes", "no"]
            }}),
        ),
    );
    let t = thread("s3");
    let first = start(&b, &wf, &t).await;
    let asked = paused(&first);
    assert_eq!(asked.path, at("l/#1/ask"));
    assert_eq!(asked.prompt.as_deref(), Some("Iteration 1: go on?"));
    // w1, w2 of #0 and w1 of #1.
    assert_eq!(tokens(&first), 3.0 * TOKENS);
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(
        &snapshot_with(saved.snapshot(), RunStatus::AwaitingInput).graph,
        "l",
    );
    assert_eq!(l.iteration, 1);
    assert_eq!(
        l.history,
        [val(json!({"i": 0, "item": null, "answer": null}))].into()
    );
    assert_eq!(done_nodes(&l.body), ["w1", "gate"]);
    let calls_at_pause = b.tally.total_calls();
    assert_eq!(calls_at_pause, 3);

    let outcome = answer(&b.rt, &t, asked.id, val(json!("yes"))).await;
    completed(&outcome);
    let out_l = out(&outcome, "l");
    let history: Vec<_> = (0..5)
        .map(|i| json!({"i": i, "item": null, "answer": if i == 1 { json!("yes") } else { json!(null) }}))
        .collect();
    assert_eq!(field(out_l, "history"), &val(json!(history)));
    let mut expected_details = same_details(5, &["w1", "gate", "w2"]);
    expected_details[1].1 = ["w1", "gate", "ask", "w2"].map(String::from).to_vec();
    assert_eq!(details(out_l), expected_details);
    for i in 0..5 {
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/w1")), 1, "w1 in #{i}");
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/w2")), 1, "w2 in #{i}");
    }
    assert_eq!(
        b.tally.inputs_of("w2")[1],
        val(json!({"i": 1, "item": null, "answer": "yes"}))
    );
    // w2 of #1, then w1 and w2 of #2, #3 and #4: nothing that ran before the pause.
    assert_eq!(tokens(&outcome), 7.0 * TOKENS);
    assert_eq!(tokens(&first) + tokens(&outcome), 10.0 * TOKENS);
}

/// Scenario 4: an array loop over falsy items, paused in iterations 0 and 2. The items,
/// index 0 and the finished iterations' records survive the snapshots.
#[tokio::test]
async fn scenario_4_pauses_in_an_array_loop_over_falsy_items() {
    let b = bodies();
    let wf = load(
        &b.rt,
        gated_loop(
            json!({"mode": "array", "items": [0, "", false, null]}),
            json!({"id": "ask", "logic": "or", "conditions": [
                {"left": "{{l.index}}", "op": "eq", "right": 0},
                {"left": "{{l.index}}", "op": "eq", "right": 2}
            ]}),
            json!({"id": "ask", "kind": "interactive", "params": {
                "mode": "user_select", "prompt": "Keep {{l.item}} (#{{l.index}})?",
                "options": ["keep", "drop"]
            }}),
        ),
    );
    let falsy = [
        val(json!(0)),
        val(json!("")),
        val(json!(false)),
        val(json!(null)),
    ];
    let t = thread("s4");
    let first = start(&b, &wf, &t).await;
    let asked = paused(&first);
    assert_eq!(asked.path, at("l/#0/ask"));
    assert_eq!(asked.prompt.as_deref(), Some("Keep 0 (#0)?"));
    assert_eq!(tokens(&first), TOKENS);
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(&saved.snapshot().graph, "l");
    assert_eq!(l.items.as_deref(), Some(&falsy[..]));
    assert_eq!(l.iteration, 0);
    assert!(l.history.is_empty());
    assert_eq!(done_nodes(&l.body), ["w1", "gate"]);
    assert_eq!(
        saved_output(&l.body, "w1"),
        &val(json!({"at": 0, "item": 0}))
    );

    let second = answer(&b.rt, &t, asked.id, val(json!("keep"))).await;
    let asked = paused(&second);
    assert_eq!(asked.path, at("l/#2/ask"));
    assert_eq!(asked.prompt.as_deref(), Some("Keep false (#2)?"));
    // w2 of #0, w1 and w2 of #1, w1 of #2.
    assert_eq!(tokens(&second), 4.0 * TOKENS);
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(&saved.snapshot().graph, "l");
    assert_eq!(l.items.as_deref(), Some(&falsy[..]));
    assert_eq!(l.iteration, 2);
    assert_eq!(
        l.history,
        [
            val(json!({"i": 0, "item": 0, "answer": "keep"})),
            val(json!({"i": 1, "item": "", "answer": null}))
        ]
        .into()
    );

    let outcome = answer(&b.rt, &t, asked.id, val(json!("drop"))).await;
    completed(&outcome);
    let out_l = out(&outcome, "l");
    assert_eq!(
        field(out_l, "history"),
        &val(json!([
            {"i": 0, "item": 0, "answer": "keep"},
            {"i": 1, "item": "", "answer": null},
            {"i": 2, "item": false, "answer": "drop"},
            {"i": 3, "item": null, "answer": null}
        ]))
    );
    let mut expected_details = same_details(4, &["w1", "gate", "w2"]);
    for i in [0, 2] {
        expected_details[i].1 = ["w1", "gate", "ask", "w2"].map(String::from).to_vec();
    }
    assert_eq!(details(out_l), expected_details);
    assert_eq!(
        b.tally.inputs_of("w1"),
        (0..4)
            .map(|i| obj([("at", Value::from(i)), ("item", falsy[i as usize].clone())]))
            .collect::<Vec<_>>()
    );
    for i in 0..4 {
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/w1")), 1, "w1 in #{i}");
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/w2")), 1, "w2 in #{i}");
    }
    // w2 of #2, w1 and w2 of #3.
    assert_eq!(tokens(&outcome), 3.0 * TOKENS);
}

/// Scenario 5: a parallel of 20 items, 4 at a time, stopped when the 7th item completes; the
/// resume runs only the items that had not finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_5_a_stopped_parallel_resumes_only_unfinished_items() {
    let b = bodies();
    // Items 0..7 complete at once; later items hold until the stop (in the first run only),
    // so exactly items 0..7 complete before the stop, whatever the machine's load.
    let items: Vec<_> = (0..20)
        .map(|i| json!({"i": i, "hold": if i >= 7 { json!(i) } else { json!(-1) }}))
        .collect();
    let wf = load(
        &b.rt,
        json!({"id": "s5", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {
                "items": items, "max_concurrency": 4, "output": "{{w.at}}"
            }, "body": {"nodes": [
                {"id": "w", "kind": "work", "params": {"at": "{{p.item.i}}", "hold_at": "{{p.item.hold}}"}}
            ]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    );
    b.tally.stop_after(&b.rt, 7);
    let t = thread("s5");
    let first = start(&b, &wf, &t).await;
    assert_eq!(first.status(), RunStatus::Stopped, "{first:#?}");
    let finished_first: BTreeSet<String> = b.tally.finished().into_iter().collect();
    let expected: BTreeSet<String> = (0..7).map(|i| format!("p/@{i}/w")).collect();
    assert_eq!(finished_first, expected);
    assert_eq!(tokens(&first), 7.0 * TOKENS);
    // Items in flight at the stop gave up on it: some of items 7..=10 (the slots the first
    // items freed; how many had started when the stop arrived depends on timing).
    let stopped = b.tally.stopped();
    let stopped_set: BTreeSet<String> = stopped.iter().cloned().collect();
    assert_eq!(stopped.len(), stopped_set.len());
    let may: BTreeSet<String> = (7..11).map(|i| format!("p/@{i}/w")).collect();
    assert!(stopped_set.is_subset(&may), "{stopped:?}");
    assert_eq!(b.tally.total_calls(), 7 + stopped.len());

    // The checkpoint knows every finished item, recorded or still in flight.
    let saved = persisted(&b.rt, &t).await;
    let p = parallel_frame(
        &snapshot_with(saved.snapshot(), RunStatus::Stopped).graph,
        "p",
    );
    assert_eq!(p.items.len(), 20);
    for i in 0..20u32 {
        let recorded = p.done[i as usize];
        let in_flight_done = p
            .in_progress
            .iter()
            .any(|s| s.index == i && done_nodes(&s.body) == ["w"]);
        assert_eq!(recorded || in_flight_done, i < 7, "item {i}: {p:#?}");
        if recorded {
            assert_eq!(p.results[i as usize], Some(val(json!(i))));
        }
    }
    // Items cut short are saved in progress, to run again from their start.
    for s in &p.in_progress {
        let path = format!("p/@{}/w", s.index);
        if stopped_set.contains(&path) {
            assert!(s.body.completed.is_empty(), "{s:#?}");
            assert_eq!(s.body.frontier.len(), 1, "{s:#?}");
        } else {
            assert!(s.index < 7, "{s:#?}");
        }
    }
    for path in &stopped {
        assert!(
            p.in_progress
                .iter()
                .any(|s| format!("p/@{}/w", s.index) == *path),
            "{path} is not saved in progress: {p:#?}"
        );
    }

    b.tally.release_holds();
    let resumed = resume_continue(&b.rt, &t).await;
    let outcome = finish(&resumed).await;
    completed(&outcome);
    assert_eq!(
        out(&outcome, "p"),
        &val(json!({"results": (0..20).collect::<Vec<_>>(), "errors": [], "count": 20}))
    );
    // Finished items never ran again; items cut short ran again once; the rest once.
    for i in 0..20 {
        let path = format!("p/@{i}/w");
        let expected = if stopped_set.contains(&path) { 2 } else { 1 };
        assert_eq!(b.tally.calls_at(&path), expected, "{path}");
    }
    assert_eq!(b.tally.total_calls(), 20 + stopped.len());
    assert_eq!(tokens(&outcome), 13.0 * TOKENS);
}

/// Scenario 6: a pause inside a parallel item inside a loop iteration. The interaction names
/// the full path, and the answer lands in that item of that iteration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_6_a_pause_in_a_parallel_item_in_a_loop() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "s6", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {
                "mode": "array", "items": ["x", "y"], "output": "{{p.results}}"
            }, "body": {"nodes": [
                {"id": "p", "kind": "parallel", "params": {
                    "items": [10, 11, 12, 13], "max_concurrency": 4,
                    "output": "{{l.index}}/{{p.index}}:{{after.note}}"
                }, "body": {"nodes": [
                    {"id": "pre", "kind": "work", "params": {"at": "{{p.index}}"}},
                    {"id": "gate", "kind": "switch", "params": {"cases": [
                        {"id": "ask", "conditions": [
                            {"left": "{{l.index}}", "op": "eq", "right": 1},
                            {"left": "{{p.index}}", "op": "eq", "right": 2}
                        ]}
                    ]}},
                    {"id": "ask", "kind": "interactive", "params": {
                        "mode": "form_input", "prompt": "Note for {{l.item}}/{{p.item}}",
                        "fields": [{"name": "note", "type": "string", "required": true}]
                    }},
                    {"id": "after", "kind": "work", "params": {
                        "l": "{{l.index}}", "p": "{{p.index}}", "item": "{{p.item}}",
                        "note": "{{ask.note}}"
                    }},
                    {"id": "other", "kind": "work", "params": {"l": "{{l.index}}", "p": "{{p.index}}"}}
                ], "edges": [
                    {"from": "pre", "to": "gate"},
                    {"from": "gate", "to": "ask", "branch": "ask"},
                    {"from": "gate", "to": "other", "branch": "else"},
                    {"from": "ask", "to": "after"}
                ]}}
            ]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let t = thread("s6");
    let first = start(&b, &wf, &t).await;
    let asked = paused(&first);
    assert_eq!(asked.path, at("l/#1/p/@2/ask"));
    assert_eq!(asked.path.to_string(), "l/#1/p/@2/ask");
    assert_eq!(asked.prompt.as_deref(), Some("Note for y/12"));
    let saved = persisted(&b.rt, &t).await;
    let snapshot = snapshot_with(saved.snapshot(), RunStatus::AwaitingInput);
    assert_eq!(snapshot.interactions, std::slice::from_ref(&asked));
    let l = loop_frame(&snapshot.graph, "l");
    assert_eq!(l.iteration, 1);
    assert_eq!(
        l.history,
        [val(json!(["0/0:", "0/1:", "0/2:", "0/3:"]))].into()
    );
    let p = parallel_frame(&l.body, "p");
    let item = p
        .in_progress
        .iter()
        .find(|s| s.index == 2)
        .unwrap_or_else(|| panic!("item 2 is in progress: {p:#?}"));
    assert_eq!(done_nodes(&item.body), ["pre", "gate"]);
    assert_eq!(b.tally.calls_of("after"), 0);

    let outcome = answer(&b.rt, &t, asked.id, val(json!({"note": "hello"}))).await;
    completed(&outcome);
    assert_eq!(
        field(out(&outcome, "l"), "history"),
        &val(json!([
            ["0/0:", "0/1:", "0/2:", "0/3:"],
            ["1/0:", "1/1:", "1/2:hello", "1/3:"]
        ]))
    );
    assert_eq!(
        b.tally.inputs_of("after"),
        [val(json!({"l": 1, "p": 2, "item": 12, "note": "hello"}))]
    );
    assert_eq!(b.tally.paths_of("after"), ["l/#1/p/@2/after"]);
    // Every body node ran exactly once across both runs: 4 items x 2 nodes x 2 iterations.
    let calls = calls_by_path(&b.tally, |_| true);
    assert_eq!(calls.len(), 16, "{calls:#?}");
    assert!(calls.values().all(|&n| n == 1), "{calls:#?}");
    assert_eq!(tokens(&first) + tokens(&outcome), 16.0 * TOKENS);
}

/// A loop of one iteration whose body asks a form, then a selection.
fn form_then_select() -> serde_json::Value {
    json!({"id": "answers", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "l", "kind": "loop", "params": {"mode": "array", "items": ["only"]},
         "body": {"nodes": [
            {"id": "form", "kind": "interactive", "params": {
                "mode": "form_input", "prompt": "Who?",
                "fields": [
                    {"name": "name", "type": "string", "required": true, "label": "Name"},
                    {"name": "age", "type": "integer", "default": 30}
                ]
            }},
            {"id": "sel", "kind": "interactive", "params": {
                "mode": "user_select", "options": [{"value": "a", "label": "Alpha"}, "b"]
            }},
            {"id": "after", "kind": "work", "params": {
                "name": "{{form.name}}", "age": "{{form.age}}",
                "choice": "{{sel.value}}", "label": "{{sel.label}}"
            }}
        ], "edges": [{"from": "form", "to": "sel"}, {"from": "sel", "to": "after"}]}}
    ], "edges": [{"from": "start", "to": "l"}]})
}

fn invalid(interaction: InteractionId, field: &str, problem: &str) -> ResumeError {
    ResumeError::InvalidAnswer {
        interaction,
        error: AnswerError {
            field: field.into(),
            problem: problem.into(),
        },
    }
}

fn answer_input(interaction: InteractionId, value: serde_json::Value) -> ResumeInput {
    ResumeInput::Answer {
        interaction_id: interaction,
        value: val(value),
    }
}

#[tokio::test]
async fn wrong_answers_are_refused_precisely_and_the_run_stays_resumable() {
    let b = bodies();
    let wf = load(&b.rt, form_then_select());
    let t = thread("answers");
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let first = finish(&run).await;
    let form = paused(&first);
    let cp1 = checkpoint_of(&first);
    assert_eq!(form.path, at("l/#0/form"));
    assert_eq!(
        form.kind,
        InteractionKind::FormInput {
            fields: vec![
                FormField {
                    name: "name".into(),
                    ty: FieldType::String,
                    required: true,
                    label: Some("Name".into()),
                    default: None,
                },
                FormField {
                    name: "age".into(),
                    ty: FieldType::Integer,
                    required: false,
                    label: None,
                    default: Some(val(json!(30))),
                },
            ]
        }
    );

    // While it waits, the run is listed as awaiting input and holds no actors.
    let waiting = |expected_run| {
        let runs = b.rt.runs();
        assert_eq!(runs.len(), 1, "{runs:#?}");
        assert_eq!(runs[0].run_id, expected_run);
        assert_eq!(runs[0].status, RunStatus::AwaitingInput);
        assert_eq!(runs[0].status.to_string(), "awaiting_input");
        assert!(runs[0].running_nodes.is_empty(), "{runs:#?}");
    };
    waiting(run.run_id());
    assert_eq!(
        b.rt.tree(run.run_id()).await,
        Err(QueryError::NotRunning(
            run.run_id(),
            RunStatus::AwaitingInput
        ))
    );
    let saved = persisted(&b.rt, &t).await;
    let snapshot = snapshot_with(saved.snapshot(), RunStatus::AwaitingInput);
    assert_eq!(snapshot.interactions, std::slice::from_ref(&form));
    assert_eq!(saved.checkpoint.as_ref().map(|(id, _)| *id), Some(cp1));
    assert_eq!(
        saved.record.as_ref().map(|r| r.status),
        Some(RunStatus::AwaitingInput)
    );

    let required = ResumeError::AnswerRequired {
        checkpoint: cp1,
        interaction: Box::new(form.clone()),
    };
    assert_eq!(refused(&b.rt, &t, ResumeInput::Continue).await, required);
    assert_eq!(
        refused(&b.rt, &t, ResumeInput::Instruction("go".into())).await,
        required
    );
    let f = form.id;
    let cases = [
        (
            json!({"name": 5}),
            invalid(f, "name", "expected string, found integer"),
        ),
        (
            json!({"name": "Ann", "age": "old"}),
            invalid(f, "age", "expected integer, found string"),
        ),
        (json!({"age": 3}), invalid(f, "name", "is required")),
        (json!({"name": null}), invalid(f, "name", "is required")),
        (
            json!({"name": "Ann", "zip": "x"}),
            invalid(f, "zip", "is not a field of this form"),
        ),
        (
            json!("Ann"),
            invalid(f, "answer", "expected an object, found string"),
        ),
    ];
    for (value, expected) in cases {
        assert_eq!(
            refused(&b.rt, &t, answer_input(f, value.clone())).await,
            expected,
            "answer {value}"
        );
    }
    let unknown = InteractionId::new();
    assert_eq!(
        refused(&b.rt, &t, answer_input(unknown, json!({"name": "Ann"}))).await,
        ResumeError::UnknownInteraction {
            checkpoint: cp1,
            interaction: unknown,
            pending: vec![f],
        }
    );
    // Nothing changed: the same run waits on the same checkpoint; nothing ran.
    waiting(run.run_id());
    let saved = persisted(&b.rt, &t).await;
    assert_eq!(saved.checkpoint.as_ref().map(|(id, _)| *id), Some(cp1));
    assert_eq!(b.tally.total_calls(), 0);

    let second = answer(&b.rt, &t, f, val(json!({"name": "Ann"}))).await;
    let sel = paused(&second);
    let cp2 = checkpoint_of(&second);
    assert_ne!(cp1, cp2);
    assert_eq!(sel.path, at("l/#0/sel"));
    assert_eq!(
        sel.kind,
        InteractionKind::UserSelect {
            options: vec![
                SelectOption {
                    value: "a".into(),
                    label: "Alpha".into()
                },
                SelectOption {
                    value: "b".into(),
                    label: "b".into()
                },
            ]
        }
    );
    waiting(second.run_id());
    // In the run store too, which operators of other processes read: the first run was
    // answered, and only the second waits.
    let open_in_store = |expected: Vec<RunId>| {
        let rt = b.rt.clone();
        async move {
            let open = rt.run_store().list_open().await.expect("open runs");
            let open: Vec<RunId> = open.iter().map(|r| r.run_id).collect();
            assert_eq!(open, expected);
        }
    };
    let status_in_store = |id: RunId| {
        let rt = b.rt.clone();
        async move {
            let record = rt.run_store().get(id).await.expect("record read");
            record.expect("recorded").status
        }
    };
    assert_eq!(status_in_store(run.run_id()).await, RunStatus::Answered);
    open_in_store(vec![second.run_id()]).await;
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(&saved.snapshot().graph, "l");
    // The optional field took its default.
    assert_eq!(
        saved_output(&l.body, "form"),
        &val(json!({"name": "Ann", "age": 30}))
    );

    // The form's id is stale now.
    assert_eq!(
        refused(&b.rt, &t, answer_input(f, json!({"name": "Bob"}))).await,
        ResumeError::UnknownInteraction {
            checkpoint: cp2,
            interaction: f,
            pending: vec![sel.id],
        }
    );
    let s = sel.id;
    assert_eq!(
        refused(&b.rt, &t, answer_input(s, json!("c"))).await,
        invalid(s, "value", "\"c\" is not an option (options: a, b)")
    );
    assert_eq!(
        refused(&b.rt, &t, answer_input(s, json!({"value": "Alpha"}))).await,
        invalid(s, "value", "\"Alpha\" is not an option (options: a, b)")
    );
    assert_eq!(
        refused(&b.rt, &t, answer_input(s, json!(7))).await,
        invalid(s, "value", "expected an option's value, found integer")
    );
    assert_eq!(
        refused(&b.rt, &t, ResumeInput::Continue).await,
        ResumeError::AnswerRequired {
            checkpoint: cp2,
            interaction: Box::new(sel.clone()),
        }
    );
    waiting(second.run_id());
    // Answers refused change no record.
    assert_eq!(
        status_in_store(second.run_id()).await,
        RunStatus::AwaitingInput
    );
    open_in_store(vec![second.run_id()]).await;

    let outcome = answer(&b.rt, &t, s, val(json!("a"))).await;
    completed(&outcome);
    assert_eq!(status_in_store(second.run_id()).await, RunStatus::Answered);
    assert_eq!(status_in_store(run.run_id()).await, RunStatus::Answered);
    assert_eq!(
        status_in_store(outcome.run_id()).await,
        RunStatus::Succeeded
    );
    open_in_store(Vec::new()).await;
    assert_eq!(
        b.tally.inputs_of("after"),
        [val(
            json!({"name": "Ann", "age": 30, "choice": "a", "label": "Alpha"})
        )]
    );
    assert!(b.rt.runs().is_empty(), "{:#?}", b.rt.runs());
    assert_eq!(
        refused(&b.rt, &t, answer_input(s, json!("a"))).await,
        ResumeError::NothingToResume {
            checkpoint: persisted(&b.rt, &t)
                .await
                .checkpoint
                .map(|(id, _)| id)
                .expect("checkpoint"),
            run: outcome.run_id(),
            status: RunStatus::Succeeded,
        }
    );
}

/// A run store that fails, for a moment, the write saying a paused run was answered.
struct BlinksAtAnswered {
    inner: runvisor_actors::store::memory::MemoryRunStore,
    failures: std::sync::atomic::AtomicU32,
}

#[runvisor_actors::async_trait]
impl runvisor_actors::store::RunStore for BlinksAtAnswered {
    async fn put(
        &self,
        record: &runvisor_actors::RunRecord,
        fence: Option<runvisor_actors::Fence>,
    ) -> Result<(), runvisor_actors::StoreError> {
        use std::sync::atomic::Ordering;
        if record.status == RunStatus::Answered
            && self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(runvisor_actors::StoreError::Timeout(
                std::time::Duration::from_millis(100),
            ));
        }
        self.inner.put(record, fence).await
    }
    async fn get(
        &self,
        run: RunId,
    ) -> Result<Option<runvisor_actors::RunRecord>, runvisor_actors::StoreError> {
        self.inner.get(run).await
    }
    async fn list_thread(
        &self,
        thread: &runvisor_actors::ThreadId,
    ) -> Result<Vec<runvisor_actors::RunRecord>, runvisor_actors::StoreError> {
        self.inner.list_thread(thread).await
    }
    async fn list_open(
        &self,
    ) -> Result<Vec<runvisor_actors::RunRecord>, runvisor_actors::StoreError> {
        self.inner.list_open().await
    }
    async fn list_recent(
        &self,
        limit: usize,
    ) -> Result<Vec<runvisor_actors::RunRecord>, runvisor_actors::StoreError> {
        self.inner.list_recent(limit).await
    }
}

/// A runtime on memory stores whose run store fails the first `failures` writes saying a
/// paused run was answered, and a workflow pausing for a form.
fn blinking(
    failures: u32,
    config: runvisor_actors::RuntimeConfig,
) -> (
    runvisor_actors::Runtime,
    std::sync::Arc<BlinksAtAnswered>,
    runvisor_actors::Workflow,
) {
    use runvisor_actors::store::MemoryLeaseStore;
    use runvisor_actors::store::memory::{
        MemoryCheckpointStore, MemoryHistoryStore, MemoryRunStore,
    };
    use std::sync::Arc;
    let leases = Arc::new(MemoryLeaseStore::new());
    let runs = Arc::new(BlinksAtAnswered {
        inner: MemoryRunStore::new().fenced_by(leases.clone()),
        failures: std::sync::atomic::AtomicU32::new(failures),
    });
    let rt = runvisor_actors::Runtime::builder()
        .config(config)
        .lease_store(leases.clone())
        .checkpoint_store(Arc::new(
            MemoryCheckpointStore::new().fenced_by(leases.clone()),
        ))
        .history_store(Arc::new(
            MemoryHistoryStore::new().fenced_by(leases.clone()),
        ))
        .run_store(runs.clone())
        .build();
    let wf = load(
        &rt,
        json!({"id": "blink", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "ask", "kind": "interactive", "params": {
                "mode": "form_input", "prompt": "Name?",
                "fields": [{"name": "name", "required": true}]
            }}
        ], "edges": [{"from": "start", "to": "ask"}]}),
    );
    (rt, runs, wf)
}

/// Runs `wf` in thread `id` until it pauses for its form, then answers it: the paused run's
/// outcome and the answering run's (completed).
async fn paused_then_answered(
    rt: &runvisor_actors::Runtime,
    wf: &runvisor_actors::Workflow,
    id: &str,
) -> (runvisor_actors::RunOutcome, runvisor_actors::RunOutcome) {
    let t = thread(id);
    let run = rt.start(wf, inputs([]), t.clone()).await.expect("start");
    let first = finish(&run).await;
    let form = paused(&first);
    let second = answer(rt, &t, form.id, val(json!({"name": "Ann"}))).await;
    completed(&second);
    (first, second)
}

/// The status a run's record has in `runs`.
async fn recorded_status(runs: &BlinksAtAnswered, id: RunId) -> RunStatus {
    let read = runvisor_actors::store::RunStore::get(&runs.inner, id).await;
    read.expect("read").expect("recorded").status
}

/// The write that says a paused run was answered is tried again while the run store fails
/// for a moment: the paused run is not left listed as waiting.
#[tokio::test]
async fn a_paused_run_is_marked_answered_through_a_run_store_blink() {
    let (rt, runs, wf) = blinking(2, runvisor_actors::RuntimeConfig::default());
    let (first, second) = paused_then_answered(&rt, &wf, "blink").await;
    assert_eq!(
        recorded_status(&runs, first.run_id()).await,
        RunStatus::Answered
    );
    assert_eq!(
        recorded_status(&runs, second.run_id()).await,
        RunStatus::Succeeded
    );
    assert_eq!(
        runs.failures.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "both failures were met and tried past"
    );
}

/// A run store still failing at the store deadline: the resumed run goes on, and the write
/// that says the paused run was answered is tried on in the background until it lands.
#[tokio::test]
async fn a_paused_run_is_marked_answered_once_the_run_store_is_back_after_the_deadline() {
    use std::sync::atomic::Ordering;
    // 200 ms of store deadline fit about four attempts; eight failures outlast them.
    let (rt, runs, wf) = blinking(8, super::support::short_store_deadline());
    let (first, _) = paused_then_answered(&rt, &wf, "blink-long").await;
    assert!(
        runs.failures.load(Ordering::SeqCst) > 0,
        "the resume gave up waiting before the store was back"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while recorded_status(&runs, first.run_id()).await != RunStatus::Answered {
        assert!(
            std::time::Instant::now() < deadline,
            "still {:?} with {} failures to go",
            recorded_status(&runs, first.run_id()).await,
            runs.failures.load(Ordering::SeqCst)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(runs.failures.load(Ordering::SeqCst), 0);
}
