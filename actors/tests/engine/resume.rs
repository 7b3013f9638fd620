//! Resume: a resumed run never repeats completed nodes, restarts interrupted ones, takes a new
//! instruction as `{{sys.query}}` and sees every message persisted at the stop exactly once;
//! continuing a thread from an older checkpoint leaves the newer ones untouched; shutdown
//! stops every live run resumably; resume refuses what it cannot continue.

use std::time::Duration;

use runvisor_actors::testkit::{Interrupt, Script, persisted, stored_again_ahead};
use runvisor_actors::{
    CheckpointId, MessageId, ResumeError, ResumeFrom, ResumeInput, Role, RunEvent, RunHandle,
    RunStatus, Runtime, StopMode, StopReason, StopReply, ThreadId, Value, Workflow,
};
use serde_json::json;

use super::stopkit::*;
use super::support::{finish, inputs, load, text, thread, val, within};

#[tokio::test]
async fn resume_after_a_stop_continues_where_it_stopped() {
    let k = kit(Script::new().interrupt(Interrupt::after_chunks("llm", 2)));
    let wf = load(
        &k.rt,
        json!({"id": "resumable", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "intro", "kind": "count"},
            {"id": "llm", "kind": "llm"},
            {"id": "seen", "kind": "record"},
            {"id": "echo_q", "kind": "template", "params": {"template": "query: {{sys.query}}"}}
        ], "edges": [
            {"from": "start", "to": "intro"}, {"from": "intro", "to": "llm"},
            {"from": "llm", "to": "seen"}, {"from": "seen", "to": "echo_q"}
        ]}),
    );
    let t = thread("resume-continues");
    let first =
        k.rt.start(&wf, inputs([("query", "first question".into())]), t.clone())
            .await
            .expect("start");
    let outcome = finish(&first).await;
    let stop = stopped(&outcome);
    assert_eq!(stop.finished, nodes(&["start", "intro"]));
    assert_eq!(stop.frontier, nodes(&["llm"]));
    let at_stop = persisted(&k.rt, &t).await;
    assert_eq!(at_stop.texts(), ["first question", "intro done", "one two"]);
    let stop_ids: Vec<MessageId> = at_stop.history.iter().map(|m| m.id).collect();

    let resumed = within(
        "resume",
        k.rt.resume(
            t.clone(),
            ResumeInput::Instruction("second question".into()),
        ),
    )
    .await
    .expect("resumable");
    let mut events = resumed.events();
    let outcome = finish(&resumed).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");

    // Completed nodes never ran again; the interrupted one ran again from its start.
    assert_eq!(k.calls.of("intro"), 1);
    assert_eq!(k.streamer.calls(), 2);
    assert_eq!(k.calls.of("seen"), 1);
    let mut chunks = Vec::new();
    while let Some(e) = within("events", events.next()).await {
        match e {
            RunEvent::NodeStarted { path: p, .. } => {
                assert!(
                    p != path("start") && p != path("intro"),
                    "{p} ran again on resume"
                );
            }
            RunEvent::NodeChunk { text, .. } => chunks.push(text.to_string()),
            _ => {}
        }
    }
    assert_eq!(chunks.first().map(String::as_str), Some("one"));
    assert_eq!(chunks.concat(), WORDS);
    assert_eq!(text(&outcome, "llm"), WORDS);
    // The completed node's output comes from the snapshot.
    assert_eq!(
        outcome.output("intro"),
        Some(&val(json!({"node": "intro"})))
    );
    // The instruction became {{sys.query}}.
    assert_eq!(text(&outcome, "echo_q"), "query: second question");

    // History: everything from the stop once, then the instruction and the new answer.
    let p = persisted(&k.rt, &t).await;
    assert_unique_ids(&p.history);
    assert_eq!(
        p.texts(),
        [
            "first question",
            "intro done",
            "one two",
            "second question",
            WORDS
        ]
    );
    let instruction = &p.history[3];
    assert_eq!(
        (instruction.role, instruction.run_id),
        (Role::User, Some(resumed.run_id()))
    );
    assert_eq!(
        p.history.iter().take(3).map(|m| m.id).collect::<Vec<_>>(),
        stop_ids
    );
    assert_eq!(
        outcome
            .history()
            .persisted
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>(),
        ["second question", WORDS]
    );

    // What the resumed run's node saw: every message persisted at the stop, exactly once.
    let histories = k.calls.histories();
    assert_eq!(histories.len(), 1);
    let (who, seen) = &histories[0];
    assert_eq!(who, "seen");
    assert_unique_ids(seen);
    for id in &stop_ids {
        assert_eq!(
            seen.iter().filter(|m| m.id == *id).count(),
            1,
            "message {id:?} seen once: {seen:#?}"
        );
    }
    let seen_texts: Vec<&str> = seen.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(
        seen_texts,
        [
            "first question",
            "intro done",
            "one two",
            "second question",
            WORDS
        ]
    );

    let rec = record(&k.rt, resumed.run_id()).await;
    assert_eq!(rec.parent_run_id, Some(first.run_id()));
    assert_eq!(rec.status, RunStatus::Succeeded);
    assert_eq!(rec.checkpoint_id, p.checkpoint.as_ref().map(|c| c.0));
    let snap = p.snapshot();
    assert_eq!(snap.parent_run_id, Some(first.run_id()));
    assert_eq!(snap.query, Some(Value::from("second question")));
    assert_eq!(p.completed(), ["start", "intro", "llm", "seen", "echo_q"]);
    assert!(p.frontier().is_empty());
    // The stopped run's record is unchanged by the resume.
    assert_eq!(
        record(&k.rt, first.run_id()).await.status,
        RunStatus::Stopped
    );
}

/// A resume of thread `t` from its checkpoint `checkpoint`, continuing the run it stopped.
async fn from_checkpoint(
    rt: &Runtime,
    t: &ThreadId,
    checkpoint: CheckpointId,
) -> Result<RunHandle, ResumeError> {
    rt.resume(
        ResumeFrom::Checkpoint {
            thread: t.clone(),
            checkpoint,
        },
        ResumeInput::Continue,
    )
    .await
}

/// A kit whose runs stop before `b` and before `c`, and workflow `id`: `start`, `a`, `b`, `c`
/// in a row.
fn a_b_c_stopping_before_b_and_c(id: &str) -> (Kit, Workflow) {
    let k = kit(Script::new()
        .interrupt(Interrupt::before("b"))
        .interrupt(Interrupt::before("c")));
    let wf = load(
        &k.rt,
        json!({"id": id, "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "count"},
            {"id": "b", "kind": "count"},
            {"id": "c", "kind": "count"}
        ], "edges": [
            {"from": "start", "to": "a"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"}
        ]}),
    );
    (k, wf)
}

/// `ResumeFrom::Checkpoint` continues the same thread from an older checkpoint (a fork is
/// `ResumeFrom::Fork`, in `fork.rs`).
#[tokio::test]
async fn continuing_a_thread_from_an_older_checkpoint_leaves_the_newer_ones_untouched() {
    let (k, wf) = a_b_c_stopping_before_b_and_c("forks");
    let t = thread("fork");
    let store = k.rt.checkpoint_store().clone();

    let run1 =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let out1 = finish(&run1).await;
    let cp1 = stopped(&out1).checkpoint_id.expect("cp1");
    assert_eq!(stopped(&out1).frontier, nodes(&["b"]));
    let cp1_bytes = store.get(&t, cp1).await.expect("get").expect("cp1 stored");

    let run2 = within("resume", k.rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumable");
    let out2 = finish(&run2).await;
    let stop2 = stopped(&out2);
    let cp2 = stop2.checkpoint_id.expect("cp2");
    assert_eq!(stop2.frontier, nodes(&["c"]));
    // `finished` is cumulative: the restored completions come first, as in the checkpoint.
    assert_eq!(stop2.finished, nodes(&["start", "a", "b"]));
    let cp2_bytes = store.get(&t, cp2).await.expect("get").expect("cp2 stored");
    assert_eq!(
        (k.calls.of("a"), k.calls.of("b"), k.calls.of("c")),
        (1, 1, 0)
    );

    let fork = within("fork", from_checkpoint(&k.rt, &t, cp1))
        .await
        .expect("forkable");
    let out3 = finish(&fork).await;
    assert_eq!(out3.status(), RunStatus::Succeeded, "{out3:#?}");
    // The fork continued from cp1's frontier: b ran again, then c; a did not.
    assert_eq!(
        (k.calls.of("a"), k.calls.of("b"), k.calls.of("c")),
        (1, 2, 1)
    );
    assert_eq!(out3.output("a"), Some(&val(json!({"node": "a"}))));
    assert_eq!(out3.output("c"), Some(&val(json!({"node": "c"}))));
    let rec = record(&k.rt, fork.run_id()).await;
    assert_eq!(rec.parent_run_id, Some(run1.run_id()));

    // Progress snapshots may sit between them (async durability); cp1 and cp2 stay, in
    // order, and the fork's final checkpoint is the newest.
    let listed = store.list(&t).await.expect("list");
    let at = |id| listed.iter().position(|c| *c == id).expect("still listed");
    assert!(at(cp1) < at(cp2), "{listed:?}");
    assert_eq!(
        listed.last(),
        record(&k.rt, fork.run_id()).await.checkpoint_id.as_ref()
    );
    assert_eq!(
        store.get(&t, cp1).await.expect("get"),
        Some(cp1_bytes),
        "cp1 unchanged"
    );
    assert_eq!(
        store.get(&t, cp2).await.expect("get"),
        Some(cp2_bytes),
        "cp2 unchanged"
    );
    let p = persisted(&k.rt, &t).await;
    assert_eq!(p.checkpoint.as_ref().map(|c| c.0), listed.last().copied());
    assert_eq!(p.snapshot().parent_run_id, Some(run1.run_id()));
    assert_eq!(p.completed(), ["start", "a", "b", "c"]);
    assert_unique_ids(&p.history);
    // The records of the stopped runs are unchanged.
    assert_eq!(record(&k.rt, run1.run_id()).await.checkpoint_id, Some(cp1));
    assert_eq!(record(&k.rt, run2.run_id()).await.checkpoint_id, Some(cp2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_stops_every_live_run_resumably() {
    let k = kit(Script::new());
    let streaming = load(
        &k.rt,
        json!({"id": "streaming", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "llm", "kind": "slow_llm"}
        ], "edges": [{"from": "start", "to": "llm"}]}),
    );
    let finishing = load(
        &k.rt,
        json!({"id": "finishing", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "work", "kind": "finish_on_stop"},
            {"id": "next", "kind": "count"}
        ], "edges": [{"from": "start", "to": "work"}, {"from": "work", "to": "next"}]}),
    );
    let (ta, tb) = (thread("shutdown-a"), thread("shutdown-b"));
    let a =
        k.rt.start(&streaming, Default::default(), ta.clone())
            .await
            .expect("start a");
    let mut a_events = a.events();
    let b =
        k.rt.start(&finishing, Default::default(), tb.clone())
            .await
            .expect("start b");
    event(&mut a_events, "first chunk of a", |e| {
        matches!(e, RunEvent::NodeChunk { .. })
    })
    .await;
    mark(&k.log, "work:started").await;

    let mut replies = within("shutdown", k.rt.shutdown()).await;
    replies.sort_by_key(|(id, _)| *id);
    let mut want = vec![a.run_id(), b.run_id()];
    want.sort();
    assert_eq!(replies.iter().map(|(id, _)| *id).collect::<Vec<_>>(), want);
    for (id, reply) in replies {
        let stop = stopped_reply(reply.expect("the run is live"));
        assert_eq!(stop.run_id, id);
        assert_eq!(stop.reason, StopReason::Shutdown);
        let rec = record(&k.rt, id).await;
        assert_eq!(rec.status, RunStatus::Stopped);
        assert_eq!(rec.stop_reason.as_deref(), Some("shutdown"));
        assert_eq!(rec.checkpoint_id, stop.checkpoint_id);
    }
    assert!(k.rt.registry().is_empty());
    let sa = persisted(&k.rt, &ta).await;
    assert_eq!(sa.frontier(), ["llm"]);
    assert_eq!(sa.snapshot().stop_reason, Some(StopReason::Shutdown));
    assert!(sa.history.iter().all(|m| m.truncated), "{:#?}", sa.history);
    let sb = persisted(&k.rt, &tb).await;
    assert_eq!(sb.completed(), ["start", "work"]);
    assert_eq!(sb.frontier(), ["next"]);

    let ra = within("resume a", k.rt.resume(ta.clone(), ResumeInput::Continue))
        .await
        .expect("a resumes");
    let rb = within("resume b", k.rt.resume(tb.clone(), ResumeInput::Continue))
        .await
        .expect("b resumes");
    let (oa, ob) = (finish(&ra).await, finish(&rb).await);
    assert_eq!(oa.status(), RunStatus::Succeeded, "{oa:#?}");
    assert_eq!(ob.status(), RunStatus::Succeeded, "{ob:#?}");
    assert_eq!(text(&oa, "llm"), WORDS);
    assert_eq!(k.slow_streamer.calls(), 2);
    assert_eq!((k.calls.of("work"), k.calls.of("next")), (1, 1));
    assert_eq!(
        record(&k.rt, ra.run_id()).await.parent_run_id,
        Some(a.run_id())
    );
    assert_eq!(
        record(&k.rt, rb.run_id()).await.parent_run_id,
        Some(b.run_id())
    );
    let pa = persisted(&k.rt, &ta).await;
    assert_unique_ids(&pa.history);
    assert_eq!(pa.texts().last().copied(), Some(WORDS));
}

#[tokio::test]
async fn resume_refuses_what_it_cannot_continue() {
    let k = kit(Script::new());

    // No checkpoint at all.
    let empty = thread("resume-nothing-there");
    assert_eq!(
        within("resume", k.rt.resume(empty.clone(), ResumeInput::Continue))
            .await
            .err(),
        Some(ResumeError::NoCheckpoint(empty.clone()))
    );

    // The newest checkpoint is of a completed run.
    let done = thread("resume-completed");
    let wf = load(
        &k.rt,
        json!({"id": "done", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "count"}
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    let run =
        k.rt.start(&wf, Default::default(), done.clone())
            .await
            .expect("start");
    assert_eq!(finish(&run).await.status(), RunStatus::Succeeded);
    let latest = persisted(&k.rt, &done)
        .await
        .checkpoint
        .expect("a final checkpoint")
        .0;
    assert_eq!(
        within("resume", k.rt.resume(done.clone(), ResumeInput::Continue))
            .await
            .err(),
        Some(ResumeError::NothingToResume {
            checkpoint: latest,
            run: run.run_id(),
            status: RunStatus::Succeeded,
        })
    );

    // A checkpoint id the thread does not have.
    let missing = CheckpointId::new();
    assert_eq!(
        within(
            "resume",
            k.rt.resume(
                ResumeFrom::Checkpoint {
                    thread: done.clone(),
                    checkpoint: missing,
                },
                ResumeInput::Continue,
            ),
        )
        .await
        .err(),
        Some(ResumeError::CheckpointNotFound {
            thread: done.clone(),
            checkpoint: missing,
        })
    );

    // A live run holds the thread.
    let busy = thread("resume-busy");
    let wf = load(
        &k.rt,
        json!({"id": "busy", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "slow", "kind": "linger", "params": {"ms": 0}}
        ], "edges": [{"from": "start", "to": "slow"}]}),
    );
    let live =
        k.rt.start(&wf, Default::default(), busy.clone())
            .await
            .expect("start");
    mark(&k.log, "slow:started").await;
    assert_eq!(
        within("resume", k.rt.resume(busy.clone(), ResumeInput::Continue))
            .await
            .err(),
        Some(ResumeError::ThreadBusy {
            thread: busy.clone(),
            run: live.run_id(),
            worker: Some(k.rt.worker().id.clone()),
        })
    );

    // None of the refusals started anything.
    assert_eq!(k.calls.of("a"), 1);
    assert_eq!(k.calls.of("slow"), 1);
    assert_eq!(k.rt.registry().len(), 1);
    assert_eq!(
        k.rt.run_store()
            .list_thread(&done)
            .await
            .expect("list")
            .len(),
        1
    );
    assert!(
        k.rt.run_store()
            .list_thread(&empty)
            .await
            .expect("list")
            .is_empty()
    );
    let reply = within("stop", live.stop(StopMode::graceful()))
        .await
        .expect("live");
    assert!(matches!(reply, StopReply::Stopped(_)), "{reply:#?}");
    assert!(k.rt.registry().is_empty());
}

/// A thread's newest checkpoint was written by a process whose clock runs an hour ahead (here:
/// the stopped run's checkpoint stored again under such an id). The runs that continue it, and
/// one that continues the thread from an older checkpoint, write checkpoints that sort after
/// it: the thread's newest stays the newest written, which the next resume continues.
#[tokio::test]
async fn runs_continuing_a_checkpoint_of_a_clock_ahead_write_checkpoints_that_sort_after_it() {
    let (k, wf) = a_b_c_stopping_before_b_and_c("skewed");
    let t = thread("clock-ahead");
    let store = k.rt.checkpoint_store().clone();
    let run1 =
        k.rt.start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
    let out1 = finish(&run1).await;
    let cp1 = stopped(&out1).checkpoint_id.expect("cp1");
    let ahead = stored_again_ahead(&*store, &t, cp1, Duration::from_secs(3600))
        .await
        .expect("stored again");
    assert_eq!(
        store.latest(&t).await.expect("latest").map(|c| c.id),
        Some(ahead)
    );

    let run2 = within("resume", k.rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumable");
    let out2 = finish(&run2).await;
    let cp2 = stopped(&out2).checkpoint_id.expect("cp2");
    assert_eq!(stopped(&out2).frontier, nodes(&["c"]));
    assert!(cp2 > ahead, "{cp2} sorts before {ahead}");
    assert_eq!(
        store.latest(&t).await.expect("latest").map(|c| c.id),
        Some(cp2)
    );
    // Every checkpoint the run wrote sorts after the one it continued.
    let listed = store.list(&t).await.expect("list");
    for id in &listed {
        let checkpoint = store.get(&t, *id).await.expect("get").expect("listed");
        if checkpoint.run == run2.run_id() {
            assert!(*id > ahead, "{id} of the resumed run sorts before {ahead}");
        }
    }

    // Continuing the thread from the older checkpoint: after the thread's newest too.
    let run3 = within("resume from cp1", from_checkpoint(&k.rt, &t, cp1))
        .await
        .expect("resumable");
    let out3 = finish(&run3).await;
    assert_eq!(out3.status(), RunStatus::Succeeded, "{out3:#?}");
    let cp3 = record(&k.rt, run3.run_id())
        .await
        .checkpoint_id
        .expect("final checkpoint");
    assert!(cp3 > cp2, "{cp3} sorts before {cp2}");
    assert_eq!(
        store.latest(&t).await.expect("latest").map(|c| c.id),
        Some(cp3)
    );
}
