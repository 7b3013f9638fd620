//! DAG execution: chains run in order, fan-out branches run concurrently, a join runs once and
//! sees every branch's output.

use runvisor_actors::RunStatus;
use serde_json::json;

use super::support::*;

#[tokio::test]
async fn chain_runs_in_order_and_each_node_sees_its_predecessor() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "chain", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "echo", "params": {"step": 1, "q": "{{sys.query}}"}},
            {"id": "b", "kind": "echo", "params": {"step": 2, "prev": "{{a.step}}"}},
            {"id": "c", "kind": "template", "params": {"template": "{{a.q}}/{{b.prev}}/{{b.step}}"}}
        ], "edges": [
            {"from": "start", "to": "a"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"}
        ]}),
    );
    let outcome = run_to_end(&h.rt, &wf, inputs([("query", "go".into())]), "chain").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(h.log.called(), ["a", "b"]);
    assert_eq!(h.log.inputs("b"), [val(json!({"step": 2, "prev": 1}))]);
    assert_eq!(text(&outcome, "c"), "go/1/2");
    assert_eq!(ran(&outcome), ["a", "b", "c", "start"]);
}

#[tokio::test]
async fn fan_out_and_join_sees_both_branch_outputs() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "fan", "nodes": [
            {"id": "start", "kind": "begin", "params": {"inputs": [{"name": "x", "type": "integer"}]}},
            {"id": "left", "kind": "echo", "params": {"side": "left", "n": "{{start.x}}"}},
            {"id": "right", "kind": "template", "params": {"template": "right got {{start.x}}"}},
            {"id": "join", "kind": "echo", "params": {
                "left": "{{left}}",
                "right": "{{right.text}}",
                "summary": "{{left.side}}={{left.n}}; {{right.text}}"
            }}
        ], "edges": [
            {"from": "start", "to": "left"}, {"from": "start", "to": "right"},
            {"from": "left", "to": "join"}, {"from": "right", "to": "join"}
        ]}),
    );
    let run =
        h.rt.start(&wf, inputs([("x", 7.into())]), thread("fan"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let want = val(json!({
        "left": {"side": "left", "n": 7},
        "right": "right got 7",
        "summary": "left=7; right got 7"
    }));
    assert_eq!(outcome.output("join"), Some(&want));
    // The join ran exactly once, after both branches.
    assert_eq!(h.log.inputs("join"), [want]);
    assert_eq!(
        node_events(&events, "join"),
        ["started join (echo)", "finished join"]
    );
    let order: Vec<String> = events.iter().map(describe).collect();
    let pos = |s: &str| {
        order
            .iter()
            .position(|e| e == s)
            .unwrap_or_else(|| panic!("no event {s:?} in {order:#?}"))
    };
    assert!(pos("finished left") < pos("started join (echo)"));
    assert!(pos("finished right") < pos("started join (echo)"));
    assert_eq!(ran(&outcome), ["join", "left", "right", "start"]);
}

#[tokio::test]
async fn independent_branches_run_concurrently() {
    // Both branches wait on one barrier of two: if the engine ran them one after the other the
    // first would time out and fail the run.
    let h = host_with(|b, log| b.handler("rendezvous", BarrierKind::new(2, log)));
    let wf = load(
        &h.rt,
        json!({"id": "concurrent", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "rendezvous", "params": {"who": "a"}},
            {"id": "b", "kind": "rendezvous", "params": {"who": "b"}},
            {"id": "join", "kind": "template", "params": {"template": "{{a.who}}&{{b.who}}"}}
        ], "edges": [
            {"from": "start", "to": "a"}, {"from": "start", "to": "b"},
            {"from": "a", "to": "join"}, {"from": "b", "to": "join"}
        ]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "concurrent").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.output("a"), Some(&val(json!({"who": "a"}))));
    assert_eq!(outcome.output("b"), Some(&val(json!({"who": "b"}))));
    assert_eq!(text(&outcome, "join"), "a&b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn independent_branches_run_concurrently_on_a_multi_thread_runtime() {
    let h = host_with(|b, log| b.handler("rendezvous", BarrierKind::new(3, log)));
    let wf = load(
        &h.rt,
        json!({"id": "concurrent3", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "rendezvous", "params": {"n": 1}},
            {"id": "b", "kind": "rendezvous", "params": {"n": 2}},
            {"id": "c", "kind": "rendezvous", "params": {"n": 3}},
            {"id": "join", "kind": "template", "params": {"template": "{{a.n}}{{b.n}}{{c.n}}"}}
        ], "edges": [
            {"from": "start", "to": "a"}, {"from": "start", "to": "b"}, {"from": "start", "to": "c"},
            {"from": "a", "to": "join"}, {"from": "b", "to": "join"}, {"from": "c", "to": "join"}
        ]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "concurrent3").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(text(&outcome, "join"), "123");
}
