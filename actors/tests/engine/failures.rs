//! Failures: a handler error, a panic and a reference that does not resolve each fail the run
//! naming the node; a failure while a sibling still runs ends the run without waiting for it,
//! aborts the sibling and keeps what it appended; the run record says failed and why.

use std::time::Duration;

use runvisor_actors::ResolveError;
use runvisor_actors::{
    NodeError, NodeId, NodePath, Role, RunError, RunOutcome, RunStatus, Runtime, Value,
};
use serde_json::json;

use super::support::*;

fn path(node: &str) -> NodePath {
    NodePath::node(NodeId::new(node).expect("node id"))
}

/// The run store's record of a run: (status, failure_reason).
async fn record(rt: &Runtime, outcome: &RunOutcome) -> (RunStatus, Option<String>) {
    let record = rt
        .run_store()
        .get(outcome.run_id())
        .await
        .expect("run store answers")
        .expect("the run is recorded");
    assert!(record.finished_at_ms.is_some(), "{record:#?}");
    (record.status, record.failure_reason)
}

#[tokio::test]
async fn handler_error_fails_the_run_naming_the_node() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "fails", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "ok", "kind": "echo", "params": {"fine": true}},
            {"id": "bad", "kind": "fail", "params": {"message": "upstream broke: {{ok.fine}}"}},
            {"id": "after", "kind": "echo"}
        ], "edges": [
            {"from": "start", "to": "ok"}, {"from": "ok", "to": "bad"}, {"from": "bad", "to": "after"}
        ]}),
    );
    let run =
        h.rt.start(&wf, Default::default(), thread("fails"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("bad"),
            error: NodeError::Failed("upstream broke: true".into()),
        })
    );
    assert_eq!(outcome.status(), RunStatus::Failed);
    assert_eq!(ran(&outcome), ["ok", "start"]);
    assert_eq!(h.log.called(), ["ok", "bad"]);
    assert_eq!(
        node_events(&events, "bad"),
        ["started bad (fail)", "failed bad"]
    );
    assert!(node_events(&events, "after").is_empty(), "{events:#?}");
    assert_eq!(
        events.last().map(describe).as_deref(),
        Some("run_finished failed")
    );
    assert_eq!(
        record(&h.rt, &outcome).await,
        (
            RunStatus::Failed,
            Some("node `bad` failed: upstream broke: true".into())
        )
    );
    assert!(h.rt.registry().is_empty());
}

/// A panic fails the run naming the node, whether the handler runs in a task of its own or,
/// saying it never blocks, on the run's actor.
#[tokio::test]
async fn panicking_handler_fails_the_run_with_the_panic_message() {
    for kind in ["panic", "quick_panic"] {
        let h = host();
        let wf = load(
            &h.rt,
            json!({"id": "panics", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "boom", "kind": kind, "params": {"message": "kaboom {{sys.query}}"}},
                {"id": "after", "kind": "echo"}
            ], "edges": [{"from": "start", "to": "boom"}, {"from": "boom", "to": "after"}]}),
        );
        let outcome = run_to_end(&h.rt, &wf, inputs([("query", "42".into())]), "panics").await;
        assert_eq!(
            outcome.error(),
            Some(&RunError::Node {
                path: path("boom"),
                error: NodeError::Panicked("kaboom 42".into()),
            }),
            "{kind}"
        );
        assert_eq!(ran(&outcome), ["start"], "{kind}");
        assert_eq!(
            record(&h.rt, &outcome).await,
            (
                RunStatus::Failed,
                Some("node `boom` failed: handler panicked: kaboom 42".into())
            ),
            "{kind}"
        );
        assert!(h.rt.registry().is_empty(), "{kind}");
    }
}

/// On the paused clock: a run that waited for the sleeping sibling would let its minute end.
#[tokio::test(start_paused = true)]
async fn failure_while_a_sibling_runs_aborts_it_and_keeps_its_messages() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "sibling", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "slow", "kind": "sleep", "params": {"ms": 60_000, "message": "working on it"}},
            {"id": "bad", "kind": "fail", "params": {"after": "slow:started", "message": "gave up"}},
            {"id": "join", "kind": "echo"}
        ], "edges": [
            {"from": "start", "to": "slow"}, {"from": "start", "to": "bad"},
            {"from": "slow", "to": "join"}, {"from": "bad", "to": "join"}
        ]}),
    );
    let run =
        h.rt.start(&wf, inputs([("query", "do it".into())]), thread("sibling"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    // The aborted sibling is closed in the event stream, not left "running".
    assert_eq!(
        node_events(&events, "slow"),
        ["started slow (sleep)", "interrupted slow forced=true"]
    );
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("bad"),
            error: NodeError::Failed("gave up".into()),
        })
    );
    assert_eq!(ran(&outcome), ["start"]);
    // The sibling was aborted: its handler future was dropped before its sleep ended.
    assert!(
        h.log.wait_mark("slow:dropped", PATIENCE).await,
        "sleeping sibling was not aborted"
    );
    // Not even once its minute would have passed.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(!h.log.has("slow:finished"));
    assert!(h.log.inputs("join").is_empty());

    // What it appended before it was aborted is persisted, after the user's query.
    let stored =
        h.rt.history_store()
            .load(&thread("sibling"))
            .await
            .expect("history loads");
    let seen: Vec<(Role, &str, Option<&str>)> = stored
        .iter()
        .map(|m| {
            (
                m.role,
                m.content.as_str(),
                m.node_id.as_ref().map(NodeId::as_str),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (Role::User, "do it", None),
            (Role::Assistant, "working on it", Some("slow")),
        ]
    );
    assert!(stored.iter().all(|m| m.run_id == Some(run.run_id())));
    assert_eq!(outcome.history().persisted, stored);
    assert!(outcome.history().not_persisted.is_empty());
    assert_eq!(
        record(&h.rt, &outcome).await,
        (RunStatus::Failed, Some("node `bad` failed: gave up".into()))
    );
    assert!(h.rt.registry().is_empty());
}

#[tokio::test]
async fn unresolvable_reference_fails_the_run_naming_the_node() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "resolve", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "src", "kind": "echo", "params": {"a": 1}},
            {"id": "use", "kind": "template", "params": {"template": "value: {{src.missing}}"}}
        ], "edges": [{"from": "start", "to": "src"}, {"from": "src", "to": "use"}]}),
    );
    let run =
        h.rt.start(&wf, Default::default(), thread("resolve"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("use"),
            error: NodeError::Resolve(ResolveError {
                reference: "{{src.missing}}".into(),
                reason: "the value (object) has no field `missing`".into(),
            }),
        })
    );
    assert_eq!(outcome.output("src"), Some(&val(json!({"a": 1}))));
    assert_eq!(ran(&outcome), ["src", "start"]);
    // The node never started: it failed while its parameters were resolved.
    assert_eq!(node_events(&events, "use"), ["failed use"]);
    assert_eq!(
        record(&h.rt, &outcome).await,
        (
            RunStatus::Failed,
            Some(
                "node `use` failed: cannot resolve {{src.missing}}: the value (object) has no \
                 field `missing`"
                    .into()
            )
        )
    );
}

#[tokio::test]
async fn unresolvable_nested_field_and_missing_sys_value_name_the_reference() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "resolve2", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "src", "kind": "echo", "params": {"a": 1, "list": [10]}},
            {"id": "deep", "kind": "echo", "params": {"x": "{{src.a.b}}"}}
        ], "edges": [{"from": "start", "to": "src"}, {"from": "src", "to": "deep"}]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "resolve2").await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("deep"),
            error: NodeError::Resolve(ResolveError {
                reference: "{{src.a.b}}".into(),
                reason: "`a` (integer) has no field `b`".into(),
            }),
        })
    );

    // `sys.query` is a known key, but a run started without a query has no value for it.
    let wf = load(
        &h.rt,
        json!({"id": "noquery", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "say", "kind": "template", "params": {"template": "you said {{sys.query}}"}}
        ], "edges": [{"from": "start", "to": "say"}]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "noquery").await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("say"),
            error: NodeError::Resolve(ResolveError {
                reference: "{{sys.query}}".into(),
                reason: "this run has no such value".into(),
            }),
        })
    );
    assert_eq!(
        outcome.output("start"),
        Some(&Value::Object(Default::default()))
    );
}

#[tokio::test]
async fn invalid_input_error_from_a_builtin_handler_fails_the_run() {
    // `switch` checks the types it compares at run time: a string is not ordered against a
    // number. The error names the case and condition.
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "bad-compare", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "route", "kind": "switch", "params": {"cases": [
                {"id": "big", "conditions": [{"left": "{{sys.query}}", "op": "gt", "right": 3}]}
            ]}},
            {"id": "x", "kind": "echo"}
        ], "edges": [
            {"from": "start", "to": "route"},
            {"from": "route", "to": "x", "branch": "big"}
        ]}),
    );
    let outcome = run_to_end(&h.rt, &wf, inputs([("query", "five".into())]), "cmp").await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("route"),
            error: NodeError::InvalidInput {
                field: "cases[0].conditions[0]".into(),
                reason: "`gt` cannot compare string with integer".into(),
            },
        })
    );
    assert!(h.log.called().is_empty());
}

#[tokio::test]
async fn a_failed_node_keeps_what_it_appended_and_streamed() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "partial", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "talk", "kind": "stream", "params": {
                "chunks": ["Hel", "lo"], "then_fail": "lost connection"}}
        ], "edges": [{"from": "start", "to": "talk"}]}),
    );
    let run =
        h.rt.start(&wf, inputs([("query", "say hi".into())]), thread("partial"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("talk"),
            error: NodeError::Failed("lost connection".into()),
        })
    );
    assert_eq!(
        node_events(&events, "talk"),
        [
            "started talk (stream)",
            "chunk talk \"Hel\"",
            "chunk talk \"lo\"",
            "failed talk"
        ]
    );
    let stored =
        h.rt.history_store()
            .load(&thread("partial"))
            .await
            .expect("history loads");
    let seen: Vec<(Role, &str, bool)> = stored
        .iter()
        .map(|m| (m.role, m.content.as_str(), m.truncated))
        .collect();
    // The streamed text is kept, marked as cut short.
    assert_eq!(
        seen,
        [
            (Role::User, "say hi", false),
            (Role::Assistant, "Hello", true)
        ]
    );
    assert_eq!(stored[1].node_id, Some(NodeId::new("talk").expect("id")));
    assert_eq!(outcome.history().persisted, stored);

    let wf = load(
        &h.rt,
        json!({"id": "appended", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "bad", "kind": "fail", "params": {"append": "half an answer", "message": "nope"}}
        ], "edges": [{"from": "start", "to": "bad"}]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "appended").await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("bad"),
            error: NodeError::Failed("nope".into()),
        })
    );
    let stored =
        h.rt.history_store()
            .load(&thread("appended"))
            .await
            .expect("history loads");
    let seen: Vec<(Role, &str, bool)> = stored
        .iter()
        .map(|m| (m.role, m.content.as_str(), m.truncated))
        .collect();
    assert_eq!(seen, [(Role::Assistant, "half an answer", false)]);
}

/// On the paused clock: a run that waited for `slow` would let its minute-long sleep end.
#[tokio::test(start_paused = true)]
async fn a_resolution_failure_while_launching_stops_an_already_started_sibling() {
    // `slow` and `broken` become ready together; `slow` is started first, then `broken`'s
    // parameters fail to resolve. The run must not wait for `slow`'s minute-long sleep.
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "launch-fail", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "slow", "kind": "sleep", "params": {"ms": 60_000}},
            {"id": "broken", "kind": "template", "params": {"template": "{{start.missing}}"}}
        ], "edges": [{"from": "start", "to": "slow"}, {"from": "start", "to": "broken"}]}),
    );
    let outcome = run_to_end(&h.rt, &wf, Default::default(), "launch-fail").await;
    assert_eq!(
        outcome.error(),
        Some(&RunError::Node {
            path: path("broken"),
            error: NodeError::Resolve(ResolveError {
                reference: "{{start.missing}}".into(),
                reason: "the value (object) has no field `missing`".into(),
            }),
        })
    );
    assert_eq!(ran(&outcome), ["start"]);
    assert!(!h.log.has("slow:finished"));
    // `slow` was aborted, not left behind: if its handler began, it was cut, and it never
    // finishes, not even once its minute would have passed.
    if h.log.has("slow:started") {
        assert!(h.log.wait_mark("slow:dropped", PATIENCE).await);
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(!h.log.has("slow:finished"));
    assert!(h.rt.registry().is_empty());
}
