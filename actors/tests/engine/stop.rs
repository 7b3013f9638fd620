//! Stops: graceful and forced, scripted at exact points and requested from outside, with the
//! history, checkpoint and run record each one persists; escalation; concurrent callers; stops
//! racing completion; a failing history store; a handler panicking during a stop.

use runvisor_actors::store::MemoryLeaseStore;
use std::sync::Arc;
use std::time::Duration;

use runvisor_actors::store::memory::MemoryHistoryStore;
use runvisor_actors::testkit::{At, Interrupt, Script, persisted};
use runvisor_actors::{
    Interrupted, Map, ResumeInput, Role, RunEvent, RunId, RunOutcome, RunStatus, StopError,
    StopMode, StopReason, StopReply, Value,
};
use serde_json::json;

use super::stopkit::*;
use super::support::{finish, inputs, load, short_store_deadline, thread, val, within};

/// `start -> llm`.
fn chat(k: &Kit) -> runvisor_actors::Workflow {
    load(
        &k.rt,
        json!({"id": "chat", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "llm", "kind": "llm"}
        ], "edges": [{"from": "start", "to": "llm"}]}),
    )
}

/// `start -> a -> b`, both counting.
fn chain(k: &Kit) -> runvisor_actors::Workflow {
    load(
        &k.rt,
        json!({"id": "chain", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "count"},
            {"id": "b", "kind": "count"}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]}),
    )
}

/// `start -> NODE` with NODE of `kind`.
fn single(k: &Kit, node: &str, kind: &str, params: serde_json::Value) -> runvisor_actors::Workflow {
    load(
        &k.rt,
        json!({"id": format!("single-{kind}"), "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": node, "kind": kind, "params": params}
        ], "edges": [{"from": "start", "to": node}]}),
    )
}

#[tokio::test]
async fn graceful_stop_after_k_chunks_keeps_exactly_those_words() {
    let k = kit(Script::new().interrupt(Interrupt::after_chunks("llm", 3)));
    let wf = chat(&k);
    let t = thread("stop-after-chunks");
    let run =
        k.rt.start(&wf, inputs([("query", "tell me".into())]), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    assert_eq!(stop.run_id, run.run_id());
    assert_eq!(stop.reason, StopReason::UserInterrupted);
    assert_eq!(
        stop.interrupted,
        [Interrupted {
            path: path("llm"),
            forced: false,
            partial: Some("one two three".into()),
            chunks: 3,
            error: None,
        }]
    );
    assert!(stop.forced.is_empty(), "{stop:#?}");
    assert_eq!(stop.partial_response.as_deref(), Some("one two three"));
    assert_eq!(stop.finished, nodes(&["start"]));
    assert_eq!(stop.frontier, nodes(&["llm"]));
    assert_eq!(stop.stopped_at(), [path("llm")]);
    assert_eq!(k.streamer.calls(), 1);
    assert_eq!(k.script.fired(), [At::AfterChunks("llm".into(), 3)]);

    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.history.len(), 2, "{:#?}", p.history);
    let (user, partial) = (&p.history[0], &p.history[1]);
    assert_eq!(
        (user.role, user.content.as_str(), user.truncated),
        (Role::User, "tell me", false)
    );
    assert_eq!(user.run_id, Some(run.run_id()));
    assert_eq!(
        (partial.role, partial.content.as_str(), partial.truncated),
        (Role::Assistant, "one two three", true)
    );
    assert_eq!(partial.node_id, Some(node("llm")));
    assert_eq!(partial.run_id, Some(run.run_id()));
    assert_eq!(stop.messages.persisted, p.history);
    assert!(stop.messages.not_persisted.is_empty());
    assert_eq!(stop.messages.error, None);

    let (cp, _) = p.checkpoint.as_ref().expect("a checkpoint was written");
    assert_eq!(stop.checkpoint_id, Some(*cp));
    assert_eq!(stop.checkpoint_error, None);
    let snap = p.snapshot();
    assert_eq!(snap.run_id, run.run_id());
    assert_eq!(snap.status, RunStatus::Stopped);
    assert_eq!(snap.stop_reason, Some(StopReason::UserInterrupted));
    assert_eq!(snap.query, Some(Value::from("tell me")));
    // The stop checkpoint carries the run's messages as pending (it is written before the
    // history); the history has every one of them.
    assert!(
        snap.pending_messages
            .iter()
            .all(|m| p.history.iter().any(|h| h.id == m.id))
    );
    assert_eq!(p.frontier(), ["llm"]);
    assert_eq!(p.completed(), ["start"]);

    let rec = p
        .record
        .expect("the run that wrote the checkpoint is recorded");
    assert_eq!(rec, record(&k.rt, run.run_id()).await);
    assert_eq!(rec.status, RunStatus::Stopped);
    assert_eq!(rec.stop_reason.as_deref(), Some("user_interrupted"));
    assert_eq!(rec.checkpoint_id, Some(*cp));
    assert_eq!(rec.parent_run_id, None);
    assert_eq!(rec.unpersisted, None);
    assert_eq!(rec.failure_reason, None);
    assert!(rec.finished_at_ms.is_some());
    assert!(k.rt.registry().is_empty());
}

#[tokio::test]
async fn stop_before_a_node_means_it_never_runs() {
    let k = kit(Script::new().interrupt(Interrupt::before("b")));
    let wf = chain(&k);
    let t = thread("stop-before");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    assert_eq!((k.calls.of("a"), k.calls.of("b")), (1, 0));
    assert_eq!(k.script.fired(), [At::BeforeNode("b".into())]);
    assert_eq!(stop.finished, nodes(&["start", "a"]));
    assert_eq!(stop.frontier, nodes(&["b"]));
    assert!(stop.interrupted.is_empty(), "{stop:#?}");
    assert!(stop.forced.is_empty());
    assert_eq!(stop.partial_response, None);
    assert_eq!(stop.stopped_at(), [path("b")]);
    assert_eq!(
        stop.outputs.get("a").map(|v| &**v),
        Some(&val(json!({"node": "a"})))
    );
    assert!(!stop.outputs.contains_key("b"));

    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.frontier(), ["b"]);
    assert_eq!(p.completed(), ["start", "a"]);
    assert_eq!(p.output("a"), Some(&val(json!({"node": "a"}))));
    assert_eq!(p.texts(), ["a done"]);
    assert_eq!(stop.messages.persisted, p.history);
    let rec = p.record.expect("recorded");
    assert_eq!(rec.status, RunStatus::Stopped);
    assert_eq!(rec.stop_reason.as_deref(), Some("user_interrupted"));
    assert_eq!(rec.checkpoint_id, stop.checkpoint_id);
}

/// On the paused clock: a handler that ignored the stop would stream all its words (20 ms
/// apart) or be forced when the graceful timeout (30 s) runs out; neither happens.
#[tokio::test(start_paused = true)]
async fn stop_during_a_cooperative_stream_interrupts_it_without_force() {
    let k = kit(Script::new().interrupt(Interrupt::during("llm")));
    let wf = chat(&k);
    let t = thread("stop-during");
    let run =
        k.rt.start(&wf, inputs([("query", "go".into())]), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    assert_eq!(stop.interrupted.len(), 1, "{stop:#?}");
    let i = &stop.interrupted[0];
    assert_eq!(i.path, path("llm"));
    assert!(
        !i.forced,
        "a cooperative handler ends the stop, not the timeout: {i:#?}"
    );
    assert_eq!(i.error, None);
    // The handler sees the stop as it starts: at most its first word got out.
    assert!(i.chunks <= 1, "{i:#?}");
    assert!(stop.forced.is_empty());
    assert_eq!(stop.frontier, nodes(&["llm"]));
    assert_eq!(stop.finished, nodes(&["start"]));
    assert_eq!(k.streamer.calls(), 1);

    let p = persisted(&k.rt, &t).await;
    let assistant: Vec<(&str, bool)> = p
        .history
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| (m.content.as_str(), m.truncated))
        .collect();
    if i.chunks == 1 {
        assert_eq!(i.partial.as_deref(), Some("one"));
        assert_eq!(assistant, [("one", true)]);
    } else {
        assert_eq!(i.partial, None);
        assert!(assistant.is_empty(), "{:#?}", p.history);
    }
    assert_eq!(p.texts()[0], "go");
    assert_eq!(p.frontier(), ["llm"]);
    assert_eq!(p.record.expect("recorded").status, RunStatus::Stopped);
}

/// On the paused clock a run that waited for the stubborn node would let its sleep end: the
/// node would finish instead of being forced.
#[tokio::test(start_paused = true)]
async fn force_stop_aborts_a_stubborn_node_without_waiting_for_it() {
    let k = kit(Script::new().interrupt(Interrupt::during("slow").force()));
    let wf = single(&k, "slow", "stubborn", json!({}));
    let t = thread("force-stubborn");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    assert_eq!(stop.forced, nodes(&["slow"]));
    assert_eq!(
        stop.interrupted,
        [Interrupted {
            path: path("slow"),
            forced: true,
            partial: None,
            chunks: 0,
            error: None,
        }]
    );
    assert!(!stop.outputs.contains_key("slow"), "{stop:#?}");
    assert_eq!(stop.frontier, nodes(&["slow"]));
    // The abort may land before the handler was first polled (no call, no mark); a call that
    // began was cut: it never finishes, not even once its sleep would have ended.
    assert!(k.stubborn.calls() <= 1);
    if k.stubborn.calls() == 1 {
        mark(&k.log, "slow:dropped").await;
    }
    tokio::time::sleep(STUBBORN_SLEEP * 2).await;
    assert!(!k.log.has("slow:finished"));
    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.frontier(), ["slow"]);
    assert_eq!(p.completed(), ["start"]);
    assert!(p.history.is_empty(), "{:#?}", p.history);
    let rec = p.record.expect("recorded");
    assert_eq!(rec.status, RunStatus::Stopped);
    assert_eq!(rec.checkpoint_id, stop.checkpoint_id);
}

#[tokio::test(start_paused = true)]
async fn force_stop_keeps_what_a_stubborn_node_appended() {
    let k = kit(Script::new());
    let wf = single(
        &k,
        "slow",
        "append_sleep",
        json!({"message": "working on it"}),
    );
    let t = thread("force-appended");
    let run =
        k.rt.start(&wf, inputs([("query", "please".into())]), t.clone())
            .await
            .expect("start");
    mark(&k.log, "slow:started").await;
    let reply = within("force stop", k.rt.stop(run.run_id(), StopMode::Force))
        .await
        .expect("the run is live");
    let stop = stopped_reply(reply);

    assert_eq!(stop.forced, nodes(&["slow"]));
    assert_eq!(stop.interrupted.len(), 1);
    assert!(stop.interrupted[0].forced);
    assert_eq!(stop.interrupted[0].error, None);
    assert_eq!(k.calls.of("slow"), 1);
    // The stop did not wait for the sleep (on the paused clock it would have ended): the
    // handler was cut in it.
    mark(&k.log, "slow:dropped").await;
    assert!(!k.log.has("slow:finished"));
    assert_eq!(finish(&run).await.stop_result(), Some(&stop));

    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.texts(), ["please", "working on it"]);
    let kept = &p.history[1];
    assert_eq!(
        (kept.role, kept.truncated, kept.node_id.clone()),
        (Role::Assistant, false, Some(node("slow")))
    );
    assert_eq!(stop.messages.persisted, p.history);
    assert_eq!(p.frontier(), ["slow"]);
    let rec = p.record.expect("recorded");
    assert_eq!(rec.status, RunStatus::Stopped);
    assert_eq!(rec.stop_reason.as_deref(), Some("user_interrupted"));
}

/// On the paused clock: the stubborn node is given its whole grace period (it still runs a
/// tick before the timeout), then forced (well before its own sleep would end).
#[tokio::test(start_paused = true)]
async fn graceful_stop_with_a_short_timeout_escalates_to_force() {
    const GRACE: Duration = Duration::from_millis(100);
    let k = kit(Script::new().interrupt(Interrupt::during("slow").graceful(GRACE)));
    let wf = single(&k, "slow", "stubborn", json!({}));
    let t = thread("graceful-escalates");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let mut events = run.events();
    event(&mut events, "Stopping", |e| {
        matches!(e, RunEvent::Stopping { .. })
    })
    .await;
    mark(&k.log, "slow:started").await;
    tokio::time::sleep(GRACE - Duration::from_millis(1)).await;
    assert!(
        run.outcome().is_none() && !k.log.has("slow:dropped"),
        "forced before the grace period was over"
    );
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    assert_eq!(stop.forced, nodes(&["slow"]));
    assert_eq!(stop.interrupted.len(), 1);
    assert!(stop.interrupted[0].forced);
    assert_eq!(k.stubborn.calls(), 1);
    mark(&k.log, "slow:dropped").await;
    assert!(!k.log.has("slow:finished"));
    assert_eq!(stop.frontier, nodes(&["slow"]));
    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.frontier(), ["slow"]);
    assert_eq!(p.record.expect("recorded").status, RunStatus::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_force_stop_escalates_a_graceful_one_and_both_callers_get_the_same_result() {
    let k = kit(Script::new());
    let wf = single(&k, "slow", "stubborn", json!({}));
    let t = thread("force-escalates");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let mut events = run.events();
    started(&run, &mut events, "slow").await;
    mark(&k.log, "slow:started").await;
    let id = run.run_id();

    // The graceful timeout (an hour) outlasts the stubborn node's sleep and the test's
    // patience: only the force can end the node before its sleep does.
    let rt = k.rt.clone();
    let graceful = tokio::spawn(async move {
        rt.stop(
            id,
            StopMode::Graceful {
                timeout: Duration::from_secs(3600),
            },
        )
        .await
    });
    event(&mut events, "Stopping", |e| {
        matches!(e, RunEvent::Stopping { .. })
    })
    .await;
    let rt = k.rt.clone();
    let force = tokio::spawn(async move { rt.stop(id, StopMode::Force).await });
    let force = within("force stop", force)
        .await
        .expect("task")
        .expect("the run is live");
    let graceful = within("graceful stop", graceful)
        .await
        .expect("task")
        .expect("the run is live");

    assert_eq!(graceful, force);
    let stop = stopped_reply(force);
    assert_eq!(stop.forced, nodes(&["slow"]));
    assert!(stop.interrupted[0].forced);
    mark(&k.log, "slow:dropped").await;
    assert!(!k.log.has("slow:finished"));
    assert_eq!(stop.reason, StopReason::UserInterrupted);
    assert_eq!(
        persisted(&k.rt, &t).await.record.expect("recorded").status,
        RunStatus::Stopped
    );
}

#[tokio::test]
async fn graceful_stop_lets_a_running_node_finish_and_starts_nothing_after_it() {
    let k = kit(Script::new());
    let wf = load(
        &k.rt,
        json!({"id": "finishes", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "work", "kind": "finish_on_stop"},
            {"id": "next", "kind": "count"}
        ], "edges": [{"from": "start", "to": "work"}, {"from": "work", "to": "next"}]}),
    );
    let t = thread("graceful-finishes");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    mark(&k.log, "work:started").await;
    let reply = within(
        "graceful stop",
        k.rt.stop(run.run_id(), StopMode::graceful()),
    )
    .await
    .expect("the run is live");
    let stop = stopped_reply(reply);
    let done = val(json!({"finished_after_stop": true}));

    assert_eq!(stop.finished, nodes(&["start", "work"]));
    assert_eq!(stop.outputs.get("work").map(|v| &**v), Some(&done));
    assert!(stop.interrupted.is_empty(), "{stop:#?}");
    assert!(stop.forced.is_empty());
    assert_eq!(stop.frontier, nodes(&["next"]));
    assert_eq!(k.calls.of("work"), 1);
    assert_eq!(k.calls.of("next"), 0, "no node starts after a stop");

    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.completed(), ["start", "work"]);
    assert_eq!(p.output("work"), Some(&done));
    assert_eq!(p.frontier(), ["next"]);
    assert!(p.history.is_empty());
    assert_eq!(p.record.expect("recorded").status, RunStatus::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_stops_get_equal_results() {
    let k = kit(Script::new());
    let wf = single(&k, "slow", "linger", json!({"ms": 300}));
    let t = thread("ten-stops");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    mark(&k.log, "slow:started").await;
    let barrier = Arc::new(tokio::sync::Barrier::new(10));
    let callers: Vec<_> = (0..10)
        .map(|_| {
            let (rt, barrier, id) = (k.rt.clone(), barrier.clone(), run.run_id());
            tokio::spawn(async move {
                barrier.wait().await;
                rt.stop(id, StopMode::graceful()).await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for caller in callers {
        replies.push(
            within("a stop caller", caller)
                .await
                .expect("task")
                .expect("the run is live"),
        );
    }
    let first = stopped_reply(replies[0].clone());
    for reply in &replies {
        assert_eq!(reply, &StopReply::Stopped(first.clone()));
    }
    assert_eq!(
        first.interrupted,
        [Interrupted {
            path: path("slow"),
            forced: false,
            partial: None,
            chunks: 0,
            error: None,
        }]
    );
    assert_eq!(finish(&run).await.stop_result(), Some(&first));
    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.checkpoint.as_ref().map(|c| c.0), first.checkpoint_id);
    // Progress snapshots may precede it (async durability); the stop's is the newest.
    assert_eq!(
        k.rt.checkpoint_store().list(&t).await.expect("list").last(),
        first.checkpoint_id.as_ref(),
        "the stop's checkpoint is the thread's newest"
    );
}

#[tokio::test]
async fn stopping_a_finished_run_or_an_unknown_one() {
    let k = kit(Script::new());
    let wf = chain(&k);
    let t = thread("stop-finished");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let before = persisted(&k.rt, &t).await;
    let checkpoints = k.rt.checkpoint_store().list(&t).await.expect("list");

    let reply = within("stop", k.rt.stop(run.run_id(), StopMode::Force))
        .await
        .expect("a recorded run");
    let StopReply::AlreadyFinished(f) = reply else {
        panic!("a finished run cannot stop: {reply:#?}");
    };
    assert_eq!((f.run_id, f.status), (run.run_id(), RunStatus::Succeeded));
    let rec = f.record.expect("the record is read");
    assert_eq!(rec.status, RunStatus::Succeeded);

    let reply = within("stop via handle", run.stop(StopMode::graceful()))
        .await
        .expect("a recorded run");
    let StopReply::AlreadyFinished(f) = reply else {
        panic!("a finished run cannot stop: {reply:#?}");
    };
    assert_eq!(f.status, RunStatus::Succeeded);
    assert_eq!(f.outcome, Some(outcome));
    assert_eq!(f.record.map(|r| r.status), Some(RunStatus::Succeeded));

    let unknown = RunId::new();
    assert_eq!(
        within("stop unknown", k.rt.stop(unknown, StopMode::Force)).await,
        Err(StopError::UnknownRun(unknown))
    );

    // Nothing ran again and nothing was written by the stops.
    assert_eq!((k.calls.of("a"), k.calls.of("b")), (1, 1));
    let after = persisted(&k.rt, &t).await;
    assert_eq!(after.history, before.history);
    assert_eq!(
        k.rt.checkpoint_store().list(&t).await.expect("list"),
        checkpoints
    );
    assert_eq!(
        record(&k.rt, run.run_id()).await.status,
        RunStatus::Succeeded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_racing_natural_completion_has_exactly_one_final_state() {
    let k = kit(Script::new());
    let wf = load(
        &k.rt,
        json!({"id": "quick", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "quick", "kind": "message", "params": {"template": "quick {{sys.query}}"}}
        ], "edges": [{"from": "start", "to": "quick"}]}),
    );
    let (mut stopped_count, mut finished_count) = (0, 0);
    for i in 0..100 {
        let t = thread(&format!("race-{i}"));
        let query = format!("q{i}");
        let run =
            k.rt.start(&wf, inputs([("query", query.clone().into())]), t.clone())
                .await
                .expect("start");
        let (rt, id) = (k.rt.clone(), run.run_id());
        let stopper = tokio::spawn(async move { rt.stop(id, StopMode::graceful()).await });
        let reply = within("racing stop", stopper)
            .await
            .expect("task")
            .expect("the run is known");
        let outcome = finish(&run).await;
        let rec = record(&k.rt, id).await;
        let p = persisted(&k.rt, &t).await;
        assert_unique_ids(&p.history);
        let quick_text = format!("quick {query}");
        let quick_msgs = p.texts().iter().filter(|s| **s == quick_text).count();
        assert_eq!(p.texts().iter().filter(|s| **s == query).count(), 1);
        match reply {
            StopReply::Stopped(stop) => {
                stopped_count += 1;
                assert_eq!(outcome, RunOutcome::Stopped(stop.clone()), "iteration {i}");
                assert_eq!(rec.status, RunStatus::Stopped, "iteration {i}");
                assert_eq!(rec.stop_reason.as_deref(), Some("user_interrupted"));
                assert_eq!(rec.checkpoint_id, stop.checkpoint_id);
                let quick_done = stop.finished.contains(&node("quick"));
                assert_eq!(
                    quick_msgs,
                    usize::from(quick_done),
                    "iteration {i}: {stop:#?}"
                );
                // A graceful stop lets a running `quick` finish: the run then ends stopped
                // with an empty frontier, nothing left to resume.
                assert_eq!(
                    stop.frontier.is_empty(),
                    quick_done,
                    "iteration {i}: {stop:#?}"
                );
                assert_eq!(p.frontier().is_empty(), quick_done, "iteration {i}");
                assert_eq!(stop.messages.persisted, p.history, "iteration {i}");
            }
            StopReply::AlreadyFinished(f) => {
                finished_count += 1;
                assert_eq!(f.status, RunStatus::Succeeded, "iteration {i}: {f:#?}");
                assert_eq!(outcome.status(), RunStatus::Succeeded, "iteration {i}");
                assert!(matches!(outcome, RunOutcome::Completed { .. }));
                assert_eq!(rec.status, RunStatus::Succeeded, "iteration {i}");
                assert_eq!(rec.stop_reason, None);
                assert_eq!(quick_msgs, 1, "iteration {i}: {:#?}", p.history);
                if let Some(o) = &f.outcome {
                    assert_eq!(o, &outcome, "iteration {i}");
                }
            }
            other => panic!("iteration {i}: unexpected reply {other:?}"),
        }
    }
    eprintln!(
        "stop raced completion 100 times: {stopped_count} stopped, {finished_count} finished"
    );
    assert!(k.rt.registry().is_empty());
}

#[tokio::test]
async fn stop_on_completion_keeps_the_output_and_starts_no_successor() {
    let k = kit(Script::new().interrupt(Interrupt::on_completion("a")));
    let wf = chain(&k);
    let t = thread("on-completion");
    let run =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    assert_eq!(stop.finished, nodes(&["start", "a"]));
    assert_eq!(
        stop.outputs.get("a").map(|v| &**v),
        Some(&val(json!({"node": "a"})))
    );
    assert_eq!(stop.frontier, nodes(&["b"]));
    assert!(stop.interrupted.is_empty());
    assert_eq!((k.calls.of("a"), k.calls.of("b")), (1, 0));
    assert_eq!(k.script.fired(), [At::OnCompletion("a".into())]);
    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.completed(), ["start", "a"]);
    assert_eq!(p.output("a"), Some(&val(json!({"node": "a"}))));
    assert_eq!(p.frontier(), ["b"]);
    assert_eq!(p.texts(), ["a done"]);
    assert_eq!(p.record.expect("recorded").status, RunStatus::Stopped);
}

#[tokio::test]
async fn history_store_failing_at_the_flush_keeps_the_messages_for_the_resume() {
    let history = Arc::new(MemoryHistoryStore::new());
    let k = kit_with(
        Script::new().interrupt(Interrupt::after_chunks("llm", 2)),
        |b| {
            b.lease_store(Arc::new(MemoryLeaseStore::new()))
                .history_store(history.clone())
                .config(short_store_deadline())
        },
    );
    let wf = chat(&k);
    let t = thread("flush-fails");
    history.fail_appends(true);
    let run =
        k.rt.start(&wf, inputs([("query", "first".into())]), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    let refused = &stop.messages.not_persisted;
    let refused_texts: Vec<(&str, bool)> = refused
        .iter()
        .map(|m| (m.content.as_str(), m.truncated))
        .collect();
    assert_eq!(refused_texts, [("first", false), ("one two", true)]);
    assert!(stop.messages.persisted.is_empty());
    let error = stop
        .messages
        .error
        .as_ref()
        .map(ToString::to_string)
        .expect("the store's error");
    assert!(error.contains("failing appends"), "{error}");
    assert!(
        stop.checkpoint_id.is_some(),
        "the checkpoint store still works"
    );

    let p = persisted(&k.rt, &t).await;
    assert!(p.history.is_empty(), "{:#?}", p.history);
    assert_eq!(
        &Vec::from_iter(p.snapshot().pending_messages.iter().cloned()),
        refused
    );
    assert_eq!(p.frontier(), ["llm"]);
    let rec = p.record.expect("recorded");
    assert_eq!(rec.status, RunStatus::Stopped);
    let note = rec
        .unpersisted
        .as_deref()
        .expect("the record says what was lost");
    assert!(note.contains("2 message(s) not persisted"), "{note}");
    assert!(note.contains("failing appends"), "{note}");

    history.fail_appends(false);
    let resumed = within(
        "resume",
        k.rt.resume(t.clone(), ResumeInput::Instruction("again".into())),
    )
    .await
    .expect("resumable");
    let outcome = finish(&resumed).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let p = persisted(&k.rt, &t).await;
    assert_unique_ids(&p.history);
    assert_eq!(
        p.texts(),
        ["first", "one two", "again", super::stopkit::WORDS]
    );
    let ids: Vec<_> = p.history.iter().map(|m| m.id).collect();
    assert_eq!(ids[..2], [refused[0].id, refused[1].id]);
    assert!(p.history[1].truncated);
    assert_eq!(p.history[2].run_id, Some(resumed.run_id()));
    let rec = record(&k.rt, resumed.run_id()).await;
    assert_eq!(rec.unpersisted, None);
    assert_eq!(rec.parent_run_id, Some(run.run_id()));
}

#[tokio::test]
async fn a_handler_panicking_on_stop_beside_a_stream_does_not_break_the_stop() {
    let k = kit(Script::new().interrupt(Interrupt::after_chunks("llm", 2)));
    let wf = load(
        &k.rt,
        json!({"id": "parallel", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "llm", "kind": "llm"},
            {"id": "boom", "kind": "panic_on_stop"}
        ], "edges": [{"from": "start", "to": "llm"}, {"from": "start", "to": "boom"}]}),
    );
    let t = thread("panic-on-stop");
    let run =
        k.rt.start(&wf, inputs([("query", "both".into())]), t.clone())
            .await
            .expect("start");
    let outcome = finish(&run).await;
    let stop = stopped(&outcome);

    assert_eq!(stop.reason, StopReason::UserInterrupted);
    let boom = stop
        .interrupted
        .iter()
        .find(|i| i.path == path("boom"))
        .unwrap_or_else(|| panic!("boom is interrupted: {stop:#?}"));
    let error = boom
        .error
        .as_ref()
        .map(ToString::to_string)
        .expect("the panic is reported");
    assert!(
        error.contains("panicked") && error.contains("boom panicked on stop"),
        "{error}"
    );
    let llm = stop
        .interrupted
        .iter()
        .find(|i| i.path == path("llm"))
        .unwrap_or_else(|| panic!("llm is interrupted: {stop:#?}"));
    assert_eq!(
        (llm.partial.as_deref(), llm.chunks, llm.forced),
        (Some("one two"), 2, false)
    );
    assert_eq!(stop.interrupted.len(), 2);
    assert_eq!(stop.partial_response.as_deref(), Some("one two"));
    let mut frontier = stop.frontier.clone();
    frontier.sort();
    assert_eq!(frontier, nodes(&["boom", "llm"]));
    assert_eq!(k.calls.of("boom"), 1);

    let p = persisted(&k.rt, &t).await;
    let truncated: Vec<&str> = p
        .history
        .iter()
        .filter(|m| m.truncated)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(truncated, ["one two"]);
    assert_eq!(p.texts(), ["both", "one two"]);
    let mut frontier = p.frontier();
    frontier.sort();
    assert_eq!(frontier, ["boom", "llm"]);
    let rec = p.record.expect("recorded");
    assert_eq!(rec.status, RunStatus::Stopped);
    assert_eq!(rec.checkpoint_id, stop.checkpoint_id);
}

/// The stop a probe requests at a chunk reaches the run as a message, while the node, which
/// sees it at once, may end first; on a multi-threaded runtime the node's end (a supervision
/// event, which ractor hands over before messages) often arrived first and the run failed with
/// "interrupted without a stop request". Every one of many such runs must stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_at_a_chunk_stops_the_run_however_the_threads_interleave() {
    for i in 0..200 {
        let k = kit(Script::new().interrupt(Interrupt::after_chunks("llm", 1)));
        let wf = chat(&k);
        let t = thread(&format!("chunk-race-{i}"));
        let run =
            k.rt.start(&wf, Default::default(), t.clone())
                .await
                .expect("start");
        let outcome = finish(&run).await;
        let Some(stop) = outcome.stop_result() else {
            panic!("iteration {i}: the run should have stopped: {outcome:#?}");
        };
        assert_eq!(
            stop.interrupted,
            [Interrupted {
                path: path("llm"),
                forced: false,
                partial: Some("one".into()),
                chunks: 1,
                error: None,
            }],
            "iteration {i}"
        );
        assert_eq!(stop.frontier, nodes(&["llm"]), "iteration {i}");
        let p = persisted(&k.rt, &t).await;
        assert_eq!(p.texts(), ["one"], "iteration {i}");
        assert!(p.history[0].truncated, "iteration {i}");
        assert_eq!(p.frontier(), ["llm"], "iteration {i}");
        let rec = p.record.expect("recorded");
        assert_eq!(
            (rec.status, rec.stop_reason.as_deref()),
            (RunStatus::Stopped, Some("user_interrupted")),
            "iteration {i}"
        );
    }
}

/// A force stop aborts; it does not first raise the stop flag. A node in a loop that would
/// answer the flag at once (here by finishing) is reported aborted every time, whatever runs
/// first on the runtime's threads; raising the flag first let it finish in some runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_stop_aborts_a_nested_node_that_would_answer_the_stop_flag() {
    for attempt in 0..20 {
        let k = kit(Script::new());
        let wf = load(
            &k.rt,
            json!({"id": "force-loop", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "drafts", "kind": "loop", "params": {"mode": "array", "items": [1, 2]},
                 "body": {"nodes": [{"id": "nap", "kind": "finish_on_stop"}],
                          "edges": []}}
            ], "edges": [{"from": "start", "to": "drafts"}]}),
        );
        let t = thread(&format!("force-loop-{attempt}"));
        let run = k.rt.start(&wf, Default::default(), t).await.expect("start");
        mark(&k.log, "nap:started").await;
        run.stop(StopMode::Force).await.expect("stop");
        let outcome = finish(&run).await;
        let stop = stopped(&outcome);
        assert_eq!(stop.forced, nodes(&["nap"]), "attempt {attempt}: {stop:#?}");
    }
}

/// A host kind that says it never blocks its thread: it finishes at once, or with `wait` set
/// waits for the stop.
struct Quick;

#[runvisor_actors::async_trait]
impl runvisor_actors::NodeHandler for Quick {
    fn never_blocks(&self) -> bool {
        true
    }

    async fn run(
        &self,
        input: Value,
        ctx: runvisor_actors::NodeContext,
    ) -> Result<runvisor_actors::NodeOutput, runvisor_actors::NodeError> {
        if input.get("wait") == Some(&Value::Bool(true)) {
            ctx.stopped().await;
            return Err(runvisor_actors::NodeError::Stopped);
        }
        Ok(runvisor_actors::NodeOutput::new(val(json!({"done": true}))))
    }
}

/// A handler that never blocks is first polled on its node's actor; one that then waits goes
/// on in a task of its own, so its actor still answers queries and a force stop still cuts it.
#[tokio::test]
async fn a_never_blocking_handler_that_waits_still_answers_and_is_aborted() {
    let rt = runvisor_actors::Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .handler("quick", Quick)
        .build();
    let wf = load(
        &rt,
        json!({"id": "quick", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "q", "kind": "quick"},
            {"id": "w", "kind": "quick", "params": {"wait": true}}
        ], "edges": [{"from": "start", "to": "q"}, {"from": "q", "to": "w"}]}),
    );
    let run = rt
        .start(&wf, inputs([]), thread("quick"))
        .await
        .expect("start");
    let mut events = run.events();
    within("w starts", async {
        while let Some(event) = events.next().await {
            if let RunEvent::NodeStarted { path, .. } = &event
                && path.to_string() == "w"
            {
                return;
            }
        }
        panic!("the run ended before w started");
    })
    .await;
    let tree = within("the tree", rt.tree(run.run_id()))
        .await
        .expect("the run answers");
    let w = tree
        .children
        .iter()
        .find(|c| c.node_id.as_ref().is_some_and(|n| n.as_str() == "w"))
        .expect("w is in the tree");
    assert_eq!(w.status, "running", "{tree:#?}");
    let reply = within("force stop", rt.stop(run.run_id(), StopMode::Force))
        .await
        .expect("the run is live");
    let stop = stopped_reply(reply);
    assert_eq!(stop.interrupted.len(), 1, "{stop:#?}");
    assert!(stop.interrupted[0].forced);
    assert_eq!(stop.interrupted[0].path.to_string(), "w");
    let outcome = finish(&run).await;
    assert_eq!(outcome.output("q"), Some(&val(json!({"done": true}))));
}

/// Never waits; records the `i` of every node it runs and says when ten have run.
#[derive(Debug, Clone, Default)]
struct Counted {
    ran: Arc<std::sync::Mutex<Vec<u64>>>,
    ten: Arc<tokio::sync::Notify>,
}

#[runvisor_actors::async_trait]
impl runvisor_actors::NodeHandler for Counted {
    fn never_blocks(&self) -> bool {
        true
    }

    async fn run(
        &self,
        input: Value,
        _ctx: runvisor_actors::NodeContext,
    ) -> Result<runvisor_actors::NodeOutput, runvisor_actors::NodeError> {
        let i = match input.get("i") {
            Some(Value::Int(i)) => *i as u64,
            other => panic!("no i: {other:?}"),
        };
        let mut ran = self.ran.lock().expect("not poisoned");
        ran.push(i);
        if ran.len() == 10 {
            self.ten.notify_one();
        }
        Ok(runvisor_actors::NodeOutput::new(val(json!({"i": i}))))
    }
}

/// A runtime with the `counted` kind, in-memory stores and `config`.
fn counted_runtime(
    counted: &Counted,
    config: runvisor_actors::RuntimeConfig,
) -> runvisor_actors::Runtime {
    runvisor_actors::Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .handler("counted", counted.clone())
        .config(config)
        .build()
}

/// Starts `wf` on thread `name`, stops it gracefully once ten of its `counted` nodes ran, checks
/// the stop landed before all `len` of them ran, resumes it, and checks that every one of them
/// ran exactly once, in order.
async fn stop_after_ten_then_resume(
    rt: &runvisor_actors::Runtime,
    wf: &runvisor_actors::Workflow,
    inputs: Map,
    name: &str,
    counted: &Counted,
    len: u64,
) {
    let t = thread(name);
    let run = rt.start(wf, inputs, t.clone()).await.expect("start");
    tokio::select! {
        _ = counted.ten.notified() => {}
        outcome = finish(&run) => panic!("the run ended before ten nodes ran: {outcome:#?}"),
    }
    let reply = within(
        "stop",
        rt.stop(
            run.run_id(),
            StopMode::Graceful {
                timeout: Duration::from_secs(5),
            },
        ),
    )
    .await
    .expect("the run is live");
    stopped_reply(reply);
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Stopped, "{outcome:#?}");
    let before = counted.ran.lock().expect("not poisoned").len() as u64;
    assert!(before < len, "the stop landed only after all {len} ran");

    let resumed = within("resume", rt.resume(t, ResumeInput::Continue))
        .await
        .expect("resumable");
    let outcome = finish(&resumed).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let ran = counted.ran.lock().expect("not poisoned").clone();
    assert_eq!(
        ran,
        (0..len).collect::<Vec<_>>(),
        "every one ran once, in order ({before} before the stop)"
    );
}

/// Nodes that never block run on their run's actor, a slice of them per message: a stop sent
/// in the middle of a long chain of them lands there, between two slices, and the resume runs
/// every node the stop left exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lands_in_the_middle_of_a_long_chain_of_never_blocking_nodes() {
    const LEN: u64 = 20_000;
    let counted = Counted::default();
    let rt = counted_runtime(&counted, runvisor_actors::RuntimeConfig::default());
    let mut nodes = vec![json!({"id": "start", "kind": "begin"})];
    let mut edges = Vec::new();
    let mut prev = "start".to_owned();
    for i in 0..LEN {
        let id = format!("n{i}");
        nodes.push(json!({"id": id, "kind": "counted", "params": {"i": i}}));
        edges.push(json!({"from": prev, "to": id}));
        prev = id;
    }
    let wf = load(&rt, json!({"id": "long", "nodes": nodes, "edges": edges}));
    stop_after_ten_then_resume(&rt, &wf, Map::new(), "long", &counted, LEN).await;
}

/// The same inside a loop: its body's nodes that never block run on the loop's actor, a
/// slice per message; a stop in the middle of many iterations lands there, and the resume
/// runs every iteration the stop left exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lands_in_the_middle_of_a_long_loop_of_never_blocking_nodes() {
    const LEN: u64 = 20_000;
    let counted = Counted::default();
    let rt = counted_runtime(&counted, runvisor_actors::RuntimeConfig::default());
    let wf = load(
        &rt,
        json!({"id": "long-loop", "nodes": [
            {"id": "start", "kind": "begin", "params": {"inputs": [
                {"name": "items", "type": "array", "required": true}
            ]}},
            {"id": "l", "kind": "loop", "params": {
                "mode": "array", "items": "{{start.items}}", "max_iterations": LEN
             }, "body": {"nodes": [
                {"id": "c", "kind": "counted", "params": {"i": "{{l.item}}"}}
            ]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let items = val(json!((0..LEN).collect::<Vec<_>>()));
    let inputs = inputs([("items", items)]);
    stop_after_ten_then_resume(&rt, &wf, inputs, "long-loop", &counted, LEN).await;
}

/// A parallel whose items' nodes never block finishes under every durability: items that
/// finish on the parallel's actor as they start are recorded there too (under `sync`, once the
/// items before them are stored), each item running once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parallel_of_never_blocking_items_finishes_under_every_durability() {
    const ITEMS: u64 = 2_000;
    for durability in [
        runvisor_actors::Durability::Exit,
        runvisor_actors::Durability::Async,
        runvisor_actors::Durability::Sync,
    ] {
        let counted = Counted::default();
        let rt = counted_runtime(
            &counted,
            runvisor_actors::RuntimeConfig {
                durability,
                ..runvisor_actors::RuntimeConfig::default()
            },
        );
        let wf = load(
            &rt,
            json!({"id": "wide", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "p", "kind": "parallel", "params": {
                    "items": (0..ITEMS).collect::<Vec<_>>(), "max_concurrency": 16,
                    "output": "{{c.i}}"
                }, "body": {"nodes": [
                    {"id": "c", "kind": "counted", "params": {"i": "{{p.item}}"}}
                ]}}
            ], "edges": [{"from": "start", "to": "p"}]}),
        );
        let run = rt
            .start(&wf, inputs([]), thread("wide"))
            .await
            .expect("start");
        let outcome = finish(&run).await;
        assert_eq!(
            outcome.status(),
            RunStatus::Succeeded,
            "{durability:?}: {outcome:#?}"
        );
        let mut ran = counted.ran.lock().expect("not poisoned").clone();
        ran.sort_unstable();
        assert_eq!(ran, (0..ITEMS).collect::<Vec<_>>(), "{durability:?}");
        let results = outcome.output("p").and_then(|p| p.get("results"));
        assert!(
            results == Some(&val(json!((0..ITEMS).collect::<Vec<_>>()))),
            "{durability:?}: the parallel's results are not its items in order"
        );
    }
}
