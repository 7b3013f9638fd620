//! Many runs at once on one runtime: each finishes with its own outputs, records and no
//! leftovers in the registry.

use std::collections::HashSet;

use runvisor_actors::{RunOutcome, RunStatus};
use serde_json::json;

use super::support::*;

const RUNS: i64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_runs_each_get_their_own_outputs() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "many", "nodes": [
            {"id": "start", "kind": "begin", "params": {"inputs": [
                {"name": "n", "type": "integer", "required": true}
            ]}},
            {"id": "tag", "kind": "echo", "params": {"tag": "a{{start.n}}", "n": "{{start.n}}"}},
            {"id": "wait", "kind": "sleep", "params": {"ms": 5, "n": "{{start.n}}"}},
            {"id": "label", "kind": "template", "params": {"template": "#{{start.n}}"}},
            {"id": "join", "kind": "template", "params": {
                "template": "{{tag.tag}}/{{label.text}}/{{wait.n}}/{{sys.thread_id}}"}}
        ], "edges": [
            {"from": "start", "to": "tag"}, {"from": "start", "to": "wait"},
            {"from": "start", "to": "label"},
            {"from": "tag", "to": "join"}, {"from": "wait", "to": "join"},
            {"from": "label", "to": "join"}
        ]}),
    );
    let tasks: Vec<_> = (0..RUNS)
        .map(|n| {
            let rt = h.rt.clone();
            let wf = wf.clone();
            tokio::spawn(async move {
                let run = rt
                    .start(&wf, inputs([("n", n.into())]), thread(&format!("c{n}")))
                    .await
                    .expect("start");
                let run_id = run.run_id();
                (n, run_id, finish(&run).await)
            })
        })
        .collect();
    let mut outcomes: Vec<(i64, RunOutcome)> = Vec::new();
    let mut ids = HashSet::new();
    for task in tasks {
        let (n, run_id, outcome) = within("a run task", task).await.expect("task joins");
        assert_eq!(outcome.run_id(), run_id);
        assert!(ids.insert(run_id), "run id {run_id} used twice");
        outcomes.push((n, outcome));
    }
    assert_eq!(outcomes.len(), 200);
    for (n, outcome) in &outcomes {
        assert_eq!(
            outcome.status(),
            RunStatus::Succeeded,
            "run {n}: {outcome:#?}"
        );
        assert_eq!(
            text(outcome, "join"),
            format!("a{n}/#{n}/{n}/c{n}"),
            "run {n}"
        );
        assert_eq!(
            outcome.output("tag"),
            Some(&val(json!({"tag": format!("a{n}"), "n": n}))),
            "run {n}"
        );
        assert_eq!(
            outcome.output("start"),
            Some(&val(json!({"n": n}))),
            "run {n}"
        );
        let record =
            h.rt.run_store()
                .get(outcome.run_id())
                .await
                .expect("run store answers")
                .expect("run recorded");
        assert_eq!(record.status, RunStatus::Succeeded, "run {n}");
        assert_eq!(record.thread.as_str(), format!("c{n}"));
    }
    // Every handler call saw its own run's input.
    let mut seen: Vec<i64> = h
        .log
        .inputs("tag")
        .iter()
        .filter_map(|v| v.get("n").and_then(|n| n.as_i64()))
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..RUNS).collect::<Vec<_>>());
    assert!(h.rt.registry().is_empty(), "left over: {:?}", h.rt.runs());
    assert!(h.rt.runs().is_empty());
}
