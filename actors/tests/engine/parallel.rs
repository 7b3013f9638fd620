//! Parallel nodes: at most `max_concurrency` items in flight, results in input order whatever
//! the completion order, and failing items collected (`on_error: collect`) or failing the run
//! (`fail_fast`) with the item's path.

use runvisor_actors::{NodeError, RunError, RunStatus};
use serde_json::json;

use super::bodykit::*;
use super::support::{inputs, load, run_to_end, val};

const ITEMS: i64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_concurrency_items_run_at_once() {
    let b = bodies();
    let wf = load(
        &b.rt,
        json!({"id": "bounded", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {
                "items": (0..ITEMS).collect::<Vec<_>>(), "max_concurrency": 4,
                "output": "{{g.n}}"
            }, "body": {"nodes": [
                {"id": "g", "kind": "gauge", "params": {"n": "{{p.item}}", "ms": 5}}
            ]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "par-bounded").await;
    completed(&outcome);
    let peak = b.tally.peak();
    assert!(peak <= 4, "{peak} items ran at once with max_concurrency 4");
    assert!(peak >= 2, "items never overlapped (peak {peak})");
    assert_eq!(
        out(&outcome, "p"),
        &val(json!({
            "results": (0..ITEMS).collect::<Vec<_>>(), "errors": [], "count": ITEMS
        }))
    );
    assert_eq!(b.tally.calls_of("g"), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_keep_input_order_when_later_items_finish_first() {
    let b = bodies();
    // Item i sleeps 20 - i ms, and completes only after item i + 1 did: completion order is
    // exactly the reverse of input order, whatever the machine's load.
    let items: Vec<_> = (0..ITEMS)
        .map(|i| {
            let after = if i + 1 < ITEMS {
                json!(i + 1)
            } else {
                json!(null)
            };
            json!({"i": i, "ms": ITEMS - i, "after": after})
        })
        .collect();
    let wf = load(
        &b.rt,
        json!({"id": "ordered", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {
                "items": items, "max_concurrency": ITEMS, "output": "r{{o.index}}"
            }, "body": {"nodes": [
                {"id": "o", "kind": "ordered", "params": {
                    "index": "{{p.item.i}}", "ms": "{{p.item.ms}}", "after": "{{p.item.after}}"
                }}
            ]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    );
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "par-ordered").await;
    completed(&outcome);
    let finished: Vec<String> = (0..ITEMS).rev().map(|i| format!("p/@{i}/o")).collect();
    assert_eq!(b.tally.finished(), finished);
    let results: Vec<String> = (0..ITEMS).map(|i| format!("r{i}")).collect();
    assert_eq!(
        out(&outcome, "p"),
        &val(json!({"results": results, "errors": [], "count": ITEMS}))
    );
}

fn six_items(on_error: &str) -> serde_json::Value {
    json!({"id": format!("par-{on_error}"), "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "p", "kind": "parallel", "params": {
            "items": ["a", "b", "c", "d", "e", "f"], "max_concurrency": 2,
            "on_error": on_error, "output": "{{w.item}}{{w.at}}"
        }, "body": {"nodes": [
            {"id": "w", "kind": "work", "params": {
                "at": "{{p.index}}", "item": "{{p.item}}", "fail_at": 3
            }}
        ]}},
        {"id": "after", "kind": "work", "params": {"errors": "{{p.errors}}"}}
    ], "edges": [{"from": "start", "to": "p"}, {"from": "p", "to": "after"}]})
}

#[tokio::test]
async fn collect_lists_failed_items_by_index_and_keeps_the_others() {
    let b = bodies();
    let wf = load(&b.rt, six_items("collect"));
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "par-collect").await;
    completed(&outcome);
    let errors = json!([{"index": 3, "error": "p/@3/w: boom at 3"}]);
    assert_eq!(
        out(&outcome, "p"),
        &val(json!({
            "results": ["a0", "b1", "c2", null, "e4", "f5"],
            "errors": errors,
            "count": 6
        }))
    );
    assert_eq!(out(&outcome, "after"), &val(json!({"errors": errors})));
    assert_eq!(b.tally.calls_of("w"), 6);
    // The failed item consumed nothing; every other item, once.
    assert_eq!(tokens(&outcome), 6.0 * TOKENS);
}

#[tokio::test]
async fn fail_fast_fails_the_run_naming_the_item() {
    let b = bodies();
    let wf = load(&b.rt, six_items("fail_fast"));
    let outcome = run_to_end(&b.rt, &wf, inputs([]), "par-fail-fast").await;
    assert_eq!(outcome.status(), RunStatus::Failed, "{outcome:#?}");
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: at("p/@3/w"),
            error: NodeError::Failed("boom at 3".into()),
        })
    );
    assert_eq!(b.tally.calls_at("p/@3/w"), 1);
    assert_eq!(b.tally.calls_of("after"), 0);
    assert_eq!(outcome.output("p"), None);
}
