//! History and events: `message` nodes persist their text after the user's query, a later run
//! on the same thread sees earlier messages, and the event stream reports each node's start,
//! chunks and finish with its path, ending with `RunFinished`.

use runvisor_actors::store::MemoryLeaseStore;
use std::sync::Arc;

use runvisor_actors::store::memory::MemoryHistoryStore;
use runvisor_actors::{Role, RunEvent, RunStatus, Runtime, Value};
use serde_json::json;

use super::support::*;

/// A thread's persisted history as (role, content, node).
async fn stored(rt: &Runtime, id: &str) -> Vec<(Role, String, Option<String>)> {
    rt.history_store()
        .load(&thread(id))
        .await
        .expect("history loads")
        .into_iter()
        .map(|m| (m.role, m.content, m.node_id.map(|n| n.as_str().to_owned())))
        .collect()
}

fn msg(role: Role, content: &str, node: Option<&str>) -> (Role, String, Option<String>) {
    (role, content.to_owned(), node.map(str::to_owned))
}

fn seen(role: Role, content: &str) -> (Role, String) {
    (role, content.to_owned())
}

/// Greets, counts the history its `look` node sees, and says how many it saw.
fn remember(rt: &Runtime) -> runvisor_actors::Workflow {
    load(
        rt,
        json!({"id": "remember", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "greet", "kind": "message", "params": {"template": "Hello, {{sys.query}}!"}},
            {"id": "look", "kind": "probe"},
            {"id": "reply", "kind": "message", "params": {"template": "I have seen {{look.count}}"}}
        ], "edges": [
            {"from": "start", "to": "greet"}, {"from": "greet", "to": "look"},
            {"from": "look", "to": "reply"}
        ]}),
    )
}

#[tokio::test]
async fn message_text_is_persisted_after_the_users_query_in_order() {
    let rt = runtime();
    let wf = load(
        &rt,
        json!({"id": "talk", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "greet", "kind": "message", "params": {"template": "Hello, {{sys.query}}!"}},
            {"id": "quiet", "kind": "template", "params": {"template": "not a message"}},
            {"id": "note", "kind": "template", "params": {
                "template": "noted {{greet.text}}", "append_message": true, "role": "system"}},
            {"id": "bye", "kind": "message", "params": {"template": "Bye."}}
        ], "edges": [
            {"from": "start", "to": "greet"}, {"from": "greet", "to": "quiet"},
            {"from": "quiet", "to": "note"}, {"from": "note", "to": "bye"}
        ]}),
    );
    let run = rt
        .start(&wf, inputs([("query", "world".into())]), thread("h1"))
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(text(&outcome, "greet"), "Hello, world!");
    assert_eq!(
        stored(&rt, "h1").await,
        [
            msg(Role::User, "world", None),
            msg(Role::Assistant, "Hello, world!", Some("greet")),
            msg(Role::System, "noted Hello, world!", Some("note")),
            msg(Role::Assistant, "Bye.", Some("bye")),
        ]
    );
    let persisted = &outcome.history().persisted;
    assert_eq!(persisted.len(), 4);
    assert!(persisted.iter().all(|m| m.run_id == Some(run.run_id())));
    assert!(persisted.iter().all(|m| !m.truncated));
    assert_eq!(
        &rt.history_store()
            .load(&thread("h1"))
            .await
            .expect("history loads"),
        persisted
    );
    // Another thread's history is untouched.
    assert!(stored(&rt, "h2").await.is_empty());
}

#[tokio::test]
async fn an_empty_query_adds_no_user_message() {
    let rt = runtime();
    let wf = load(
        &rt,
        json!({"id": "talk", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "greet", "kind": "message", "params": {"template": "[{{sys.query}}]"}}
        ], "edges": [{"from": "start", "to": "greet"}]}),
    );
    let outcome = run_to_end(&rt, &wf, inputs([("query", "".into())]), "empty").await;
    assert_eq!(text(&outcome, "greet"), "[]");
    assert_eq!(
        stored(&rt, "empty").await,
        [msg(Role::Assistant, "[]", Some("greet"))]
    );
}

#[tokio::test]
async fn a_later_run_on_the_same_thread_sees_earlier_messages() {
    let h = host();
    let wf = remember(&h.rt);
    let first = run_to_end(&h.rt, &wf, inputs([("query", "first".into())]), "same").await;
    assert_eq!(text(&first, "reply"), "I have seen 2");
    let second = run_to_end(&h.rt, &wf, inputs([("query", "second".into())]), "same").await;
    assert_eq!(text(&second, "reply"), "I have seen 5");
    let other = run_to_end(&h.rt, &wf, inputs([("query", "third".into())]), "other").await;
    assert_eq!(text(&other, "reply"), "I have seen 2");

    assert_eq!(
        h.log.histories(),
        [
            (
                "look".to_owned(),
                vec![
                    seen(Role::User, "first"),
                    seen(Role::Assistant, "Hello, first!")
                ]
            ),
            (
                "look".to_owned(),
                vec![
                    seen(Role::User, "first"),
                    seen(Role::Assistant, "Hello, first!"),
                    seen(Role::Assistant, "I have seen 2"),
                    seen(Role::User, "second"),
                    seen(Role::Assistant, "Hello, second!"),
                ]
            ),
            (
                "look".to_owned(),
                vec![
                    seen(Role::User, "third"),
                    seen(Role::Assistant, "Hello, third!")
                ]
            ),
        ]
    );
    assert_eq!(
        stored(&h.rt, "same").await,
        [
            msg(Role::User, "first", None),
            msg(Role::Assistant, "Hello, first!", Some("greet")),
            msg(Role::Assistant, "I have seen 2", Some("reply")),
            msg(Role::User, "second", None),
            msg(Role::Assistant, "Hello, second!", Some("greet")),
            msg(Role::Assistant, "I have seen 5", Some("reply")),
        ]
    );
    let runs: Vec<_> =
        h.rt.history_store()
            .load(&thread("same"))
            .await
            .expect("history loads")
            .into_iter()
            .map(|m| m.run_id)
            .collect();
    let (a, b) = (Some(first.run_id()), Some(second.run_id()));
    assert_eq!(runs, [a, a, a, b, b, b]);
}

#[tokio::test]
async fn event_stream_reports_every_node_with_its_path_and_ends_with_run_finished() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "events", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "talk", "kind": "stream", "params": {"chunks": ["He", "llo", " world"]}},
            {"id": "greet", "kind": "message", "params": {"template": "{{talk.text}}!"}}
        ], "edges": [{"from": "start", "to": "talk"}, {"from": "talk", "to": "greet"}]}),
    );
    let run =
        h.rt.start(&wf, inputs([("query", "hi".into())]), thread("ev"))
            .await
            .expect("start");
    let events = all_events(&run).await;
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        events.iter().map(describe).collect::<Vec<_>>(),
        [
            "run_started",
            "started start (begin)",
            "finished start",
            "started talk (stream)",
            "chunk talk \"He\"",
            "chunk talk \"llo\"",
            "chunk talk \" world\"",
            "finished talk",
            "started greet (message)",
            "finished greet",
            "run_finished succeeded",
        ]
    );
    match events.first() {
        Some(RunEvent::RunStarted { run_id, thread: t }) => {
            assert_eq!(*run_id, run.run_id());
            assert_eq!(*t, thread("ev"));
        }
        other => panic!("first event should be RunStarted: {other:?}"),
    }
    match events.last() {
        Some(RunEvent::RunFinished { run_id, status, .. }) => {
            assert_eq!(*run_id, run.run_id());
            assert_eq!(*status, RunStatus::Succeeded);
        }
        other => panic!("last event should be RunFinished: {other:?}"),
    }
    let finished: Vec<(String, Value)> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::NodeFinished { path, output } => {
                assert_eq!(path.frames().len(), 1);
                Some((path.to_string(), Value::clone(output)))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        finished,
        [
            ("start".to_owned(), val(json!({"query": "hi"}))),
            ("talk".to_owned(), val(json!({"text": "Hello world"}))),
            ("greet".to_owned(), val(json!({"text": "Hello world!"}))),
        ]
    );
    for e in &events {
        if let RunEvent::NodeStarted { path, .. } | RunEvent::NodeChunk { path, .. } = e {
            assert_eq!(path.frames().len(), 1, "{e:?}");
            assert!(
                path.leaf()
                    .is_some_and(|n| ["start", "talk", "greet"].contains(&n.as_str()))
            );
        }
    }
    assert_eq!(
        stored(&h.rt, "ev").await,
        [
            msg(Role::User, "hi", None),
            msg(Role::Assistant, "Hello world", Some("talk")),
            msg(Role::Assistant, "Hello world!", Some("greet")),
        ]
    );
    // A subscriber after the end sees nothing more.
    let mut late = run.events();
    assert_eq!(
        tokio::time::timeout(std::time::Duration::from_millis(50), late.next())
            .await
            .ok()
            .flatten(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_events_are_ordered_per_node_on_a_multi_thread_runtime() {
    // A streaming node emits at once when it starts: its chunks must still come after its
    // NodeStarted and before its NodeFinished.
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "events-mt", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "s1", "kind": "stream", "params": {"chunks": ["a", "b"]}},
            {"id": "s2", "kind": "stream", "params": {"chunks": ["c", "d"]}},
            {"id": "s3", "kind": "stream", "params": {"chunks": ["e", "f"]}}
        ], "edges": [
            {"from": "start", "to": "s1"}, {"from": "start", "to": "s2"}, {"from": "start", "to": "s3"}
        ]}),
    );
    for round in 0..50 {
        let run =
            h.rt.start(&wf, Default::default(), thread("ev-mt"))
                .await
                .expect("start");
        let events = all_events(&run).await;
        for (node, kind, a, b) in [
            ("s1", "stream", "a", "b"),
            ("s2", "stream", "c", "d"),
            ("s3", "stream", "e", "f"),
        ] {
            assert_eq!(
                node_events(&events, node),
                [
                    format!("started {node} ({kind})"),
                    format!("chunk {node} {a:?}"),
                    format!("chunk {node} {b:?}"),
                    format!("finished {node}"),
                ],
                "round {round}: {:#?}",
                events.iter().map(describe).collect::<Vec<_>>()
            );
        }
        assert_eq!(
            events.last().map(describe).as_deref(),
            Some("run_finished succeeded")
        );
    }
}

/// With a history window, a run's nodes see the thread's newest messages within it (then the
/// run's own), while the whole history stays stored and every checkpoint says how many
/// messages the thread held (what a fork from it copies).
#[tokio::test]
async fn a_history_window_shows_the_newest_messages_and_keeps_the_whole_history() {
    let h = host_with(|b, _| {
        b.config(runvisor_actors::RuntimeConfig {
            history_window: Some(3),
            ..Default::default()
        })
    });
    let wf = remember(&h.rt);
    for (query, seen_count) in [("first", 2), ("second", 5), ("third", 5)] {
        let outcome = run_to_end(&h.rt, &wf, inputs([("query", query.into())]), "window").await;
        assert_eq!(text(&outcome, "reply"), format!("I have seen {seen_count}"));
    }
    let histories = h.log.histories();
    assert_eq!(
        histories.last().map(|(_, seen)| seen.clone()),
        Some(vec![
            seen(Role::User, "second"),
            seen(Role::Assistant, "Hello, second!"),
            seen(Role::Assistant, "I have seen 5"),
            seen(Role::User, "third"),
            seen(Role::Assistant, "Hello, third!"),
        ])
    );
    // Stored whole: nine messages, three per run.
    assert_eq!(stored(&h.rt, "window").await.len(), 9);
    // The last run started on six messages, and its checkpoint says so.
    let t = thread("window");
    let newest =
        h.rt.checkpoint_store()
            .latest(&t)
            .await
            .expect("latest")
            .expect("a checkpoint");
    let snapshot =
        runvisor_actors::delta::materialize(h.rt.checkpoint_store().as_ref(), &t, &newest)
            .await
            .expect("the checkpoint reads back whole");
    assert_eq!(snapshot.history_len, Some(6));
}

#[tokio::test]
async fn messages_the_history_store_refuses_are_reported_not_lost() {
    let store = Arc::new(MemoryHistoryStore::new());
    store.fail_appends(true);
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .history_store(store.clone())
        .config(short_store_deadline())
        .build();
    let wf = load(
        &rt,
        json!({"id": "refused", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "greet", "kind": "message", "params": {"template": "Hello, {{sys.query}}!"}}
        ], "edges": [{"from": "start", "to": "greet"}]}),
    );
    let outcome = run_to_end(&rt, &wf, inputs([("query", "world".into())]), "refused").await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let flush = outcome.history();
    assert!(flush.persisted.is_empty());
    let kept: Vec<(Role, &str)> = flush
        .not_persisted
        .iter()
        .map(|m| (m.role, m.content.as_str()))
        .collect();
    assert_eq!(
        kept,
        [(Role::User, "world"), (Role::Assistant, "Hello, world!")]
    );
    assert_eq!(
        flush.error.as_ref().map(ToString::to_string).as_deref(),
        Some("store unavailable: history store is failing appends")
    );
    let record = rt
        .run_store()
        .get(outcome.run_id())
        .await
        .expect("run store answers")
        .expect("run recorded");
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(
        record.unpersisted.as_deref(),
        Some("2 message(s) not persisted: store unavailable: history store is failing appends")
    );
    store.fail_appends(false);
    assert!(stored(&rt, "refused").await.is_empty());
}
