//! `switch` routing: one case, `mode: "all"`, the `else` branch, edges sharing a branch label,
//! skipped nodes (no output, `NodeSkipped` events, skips propagating down a chain) and a join
//! after a switch that runs once with the untaken branch resolving to null / empty text.

use runvisor_actors::{RunEvent, RunOutcome, RunStatus, Workflow};
use serde_json::json;

use super::support::*;

/// start -> route; route has cases `refund` (query contains "refund") and `vip` (tier >= 3).
/// `refund -> r`, `vip -> v -> v2`, `else -> e`.
fn routing(h: &Host, mode: &str) -> Workflow {
    load(
        &h.rt,
        json!({"id": "routing", "nodes": [
            {"id": "start", "kind": "begin", "params": {"inputs": [
                {"name": "query", "type": "string", "required": true},
                {"name": "tier", "type": "integer", "default": 0}
            ]}},
            {"id": "route", "kind": "switch", "params": {"mode": mode, "cases": [
                {"id": "refund", "conditions": [
                    {"left": "{{sys.query}}", "op": "contains", "right": "refund"}]},
                {"id": "vip", "conditions": [
                    {"left": "{{start.tier}}", "op": "gte", "right": 3}]}
            ]}},
            {"id": "r", "kind": "echo", "params": {"handled": "refund"}},
            {"id": "v", "kind": "echo", "params": {"handled": "vip"}},
            {"id": "v2", "kind": "echo", "params": {"after": "{{v.handled}}"}},
            {"id": "e", "kind": "echo", "params": {"handled": "general"}}
        ], "edges": [
            {"from": "start", "to": "route"},
            {"from": "route", "to": "r", "branch": "refund"},
            {"from": "route", "to": "v", "branch": "vip"},
            {"from": "v", "to": "v2"},
            {"from": "route", "to": "e", "branch": "else"}
        ]}),
    )
}

async fn run_routing(h: &Host, mode: &str, query: &str, tier: i64) -> (RunOutcome, Vec<RunEvent>) {
    let wf = routing(h, mode);
    let run =
        h.rt.start(
            &wf,
            inputs([("query", query.into()), ("tier", tier.into())]),
            thread("switch"),
        )
        .await
        .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    (outcome, events)
}

fn skipped(events: &[RunEvent]) -> Vec<String> {
    let mut out: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::NodeSkipped { path } => Some(path.to_string()),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

fn started(events: &[RunEvent]) -> Vec<String> {
    let mut out: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::NodeStarted { path, .. } => Some(path.to_string()),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn first_mode_takes_only_the_first_matching_case() {
    let h = host();
    // Both cases match; `first` takes `refund` only.
    let (outcome, events) = run_routing(&h, "first", "I want a refund", 5).await;
    assert_eq!(
        outcome.output("route"),
        Some(&val(json!({"matched": ["refund"], "branch": "refund"})))
    );
    assert_eq!(ran(&outcome), ["r", "route", "start"]);
    assert_eq!(h.log.called(), ["r"]);
    assert_eq!(skipped(&events), ["e", "v", "v2"]);
    assert_eq!(started(&events), ["r", "route", "start"]);
}

#[tokio::test]
async fn all_mode_activates_every_matching_case() {
    let h = host();
    let (outcome, events) = run_routing(&h, "all", "I want a refund", 5).await;
    assert_eq!(
        outcome.output("route"),
        Some(&val(
            json!({"matched": ["refund", "vip"], "branch": "refund"})
        ))
    );
    assert_eq!(ran(&outcome), ["r", "route", "start", "v", "v2"]);
    assert_eq!(
        outcome.output("r"),
        Some(&val(json!({"handled": "refund"})))
    );
    assert_eq!(outcome.output("v2"), Some(&val(json!({"after": "vip"}))));
    assert_eq!(skipped(&events), ["e"]);
    let mut called = h.log.called();
    called.sort();
    assert_eq!(called, ["r", "v", "v2"]);
}

#[tokio::test]
async fn all_mode_with_one_match_runs_only_that_case() {
    let h = host();
    // The default tier (0) does not make the vip case match.
    let wf = routing(&h, "all");
    let run =
        h.rt.start(&wf, inputs([("query", "refund".into())]), thread("switch"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(
        outcome.output("route"),
        Some(&val(json!({"matched": ["refund"], "branch": "refund"})))
    );
    assert_eq!(ran(&outcome), ["r", "route", "start"]);
    assert_eq!(skipped(&events), ["e", "v", "v2"]);
}

#[tokio::test]
async fn no_matching_case_takes_else() {
    let h = host();
    let (outcome, events) = run_routing(&h, "first", "hello there", 1).await;
    assert_eq!(
        outcome.output("route"),
        Some(&val(json!({"matched": [], "branch": "else"})))
    );
    assert_eq!(ran(&outcome), ["e", "route", "start"]);
    assert_eq!(
        outcome.output("e"),
        Some(&val(json!({"handled": "general"})))
    );
    assert_eq!(h.log.called(), ["e"]);
    assert_eq!(skipped(&events), ["r", "v", "v2"]);
    for node in ["r", "v", "v2"] {
        assert_eq!(node_events(&events, node), [format!("skipped {node}")]);
    }
}

#[tokio::test]
async fn edges_sharing_a_branch_label_all_run() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "shared-label", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "route", "kind": "switch", "params": {"cases": [
                {"id": "yes", "conditions": [{"left": "{{sys.query}}", "op": "eq", "right": "y"}]}
            ]}},
            {"id": "one", "kind": "echo", "params": {"n": 1}},
            {"id": "two", "kind": "echo", "params": {"n": 2}},
            {"id": "three", "kind": "echo", "params": {"n": 3}},
            {"id": "no", "kind": "echo", "params": {"n": 0}}
        ], "edges": [
            {"from": "start", "to": "route"},
            {"from": "route", "to": "one", "branch": "yes"},
            {"from": "route", "to": "two", "branch": "yes"},
            {"from": "route", "to": "three", "branch": "yes"},
            {"from": "route", "to": "no", "branch": "else"}
        ]}),
    );
    let run =
        h.rt.start(&wf, inputs([("query", "y".into())]), thread("shared"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(ran(&outcome), ["one", "route", "start", "three", "two"]);
    assert_eq!(outcome.output("two"), Some(&val(json!({"n": 2}))));
    assert_eq!(skipped(&events), ["no"]);
    assert!(outcome.output("no").is_none());
}

#[tokio::test]
async fn join_after_switch_runs_once_and_sees_the_untaken_branch_as_null() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "join-after-switch", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "route", "kind": "switch", "params": {"cases": [
                {"id": "refund", "conditions": [
                    {"left": "{{sys.query}}", "op": "contains", "right": "refund"}]}
            ]}},
            {"id": "r", "kind": "template", "params": {"template": "refund handled"}},
            {"id": "e", "kind": "template", "params": {"template": "general"}},
            {"id": "join", "kind": "echo", "params": {
                "r": "{{r.text}}",
                "e": "{{e.text}}",
                "e_whole": "{{e}}",
                "line": "[{{r.text}}|{{e.text}}]"
            }},
            {"id": "say", "kind": "template", "params": {"template": "{{join.line}}"}}
        ], "edges": [
            {"from": "start", "to": "route"},
            {"from": "route", "to": "r", "branch": "refund"},
            {"from": "route", "to": "e", "branch": "else"},
            {"from": "r", "to": "join"},
            {"from": "e", "to": "join"},
            {"from": "join", "to": "say"}
        ]}),
    );
    let run =
        h.rt.start(&wf, inputs([("query", "refund me".into())]), thread("join"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let want = val(json!({
        "r": "refund handled",
        "e": null,
        "e_whole": null,
        "line": "[refund handled|]"
    }));
    assert_eq!(outcome.output("join"), Some(&want));
    assert_eq!(h.log.inputs("join"), [want]);
    assert_eq!(
        node_events(&events, "join"),
        ["started join (echo)", "finished join"]
    );
    assert_eq!(node_events(&events, "e"), ["skipped e"]);
    assert!(outcome.output("e").is_none());
    assert_eq!(text(&outcome, "say"), "[refund handled|]");
    assert_eq!(ran(&outcome), ["join", "r", "route", "say", "start"]);
}

#[tokio::test]
async fn a_join_whose_inputs_are_all_skipped_is_skipped_too() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "dead-join", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "route", "kind": "switch", "params": {"cases": [
                {"id": "a", "conditions": [{"left": "{{sys.query}}", "op": "eq", "right": "a"}]},
                {"id": "b", "conditions": [{"left": "{{sys.query}}", "op": "eq", "right": "b"}]}
            ]}},
            {"id": "x", "kind": "echo"},
            {"id": "y", "kind": "echo"},
            {"id": "join", "kind": "echo"},
            {"id": "after", "kind": "echo"},
            {"id": "fallback", "kind": "template", "params": {"template": "none of them"}}
        ], "edges": [
            {"from": "start", "to": "route"},
            {"from": "route", "to": "x", "branch": "a"},
            {"from": "route", "to": "y", "branch": "b"},
            {"from": "x", "to": "join"},
            {"from": "y", "to": "join"},
            {"from": "join", "to": "after"},
            {"from": "route", "to": "fallback", "branch": "else"}
        ]}),
    );
    let run =
        h.rt.start(&wf, inputs([("query", "c".into())]), thread("dead"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(ran(&outcome), ["fallback", "route", "start"]);
    assert_eq!(text(&outcome, "fallback"), "none of them");
    assert_eq!(skipped(&events), ["after", "join", "x", "y"]);
    assert!(h.log.called().is_empty());
}
