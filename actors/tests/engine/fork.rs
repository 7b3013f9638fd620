//! Forks: a fork from checkpoint K is a new thread whose history is the source thread's history
//! as of K (the messages persisted up to K, then those K carried as pending, nothing after) and
//! whose checkpoints start with K; the source thread, its history and its checkpoints are
//! untouched. Also what refuses a fork (and then writes nothing), a fork of a thread a run is
//! live on, and a fork of a checkpoint written before snapshot schema 2.

use runvisor_actors::store::MemoryLeaseStore;
use std::sync::Arc;

use runvisor_actors::snapshot::{CODEC_POSTCARD, FORMAT_VERSION, MAGIC, Snapshot};
use runvisor_actors::store::StoredCheckpoint;
use runvisor_actors::store::memory::MemoryHistoryStore;
use runvisor_actors::testkit::{Interrupt, Script};
use runvisor_actors::{
    CheckpointId, Message, ResumeError, ResumeFrom, ResumeInput, RunHandle, RunId, RunStatus,
    Runtime, StopMode, ThreadId, Value, Workflow,
};
use serde_json::json;

use super::stopkit::*;
use super::support::{finish, inputs, load, short_store_deadline, thread, within};

/// `start -> a -> b -> seen -> c`: `a`, `b` and `c` each append `NODE done`; `seen` records the
/// history it sees.
fn chain(rt: &Runtime) -> Workflow {
    load(
        rt,
        json!({"id": "chain", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "count"},
            {"id": "b", "kind": "count"},
            {"id": "seen", "kind": "record"},
            {"id": "c", "kind": "count"}
        ], "edges": [
            {"from": "start", "to": "a"}, {"from": "a", "to": "b"},
            {"from": "b", "to": "seen"}, {"from": "seen", "to": "c"}
        ]}),
    )
}

fn query(text: &str) -> runvisor_actors::Map {
    inputs([("query", Value::from(text))])
}

async fn history(rt: &Runtime, t: &ThreadId) -> Vec<Message> {
    rt.history_store().load(t).await.expect("history loads")
}

fn texts(history: &[Message]) -> Vec<&str> {
    history.iter().map(|m| m.content.as_str()).collect()
}

/// Every checkpoint of a thread, oldest first, as stored.
async fn checkpoints(rt: &Runtime, t: &ThreadId) -> Vec<StoredCheckpoint> {
    let store = rt.checkpoint_store();
    let mut out = Vec::new();
    for id in store.list(t).await.expect("list") {
        out.push(store.get(t, id).await.expect("get").expect("listed"));
    }
    out
}

/// A stored checkpoint read back whole (a delta on top of its chain).
async fn decode(rt: &Runtime, t: &ThreadId, stored: &StoredCheckpoint) -> Snapshot {
    runvisor_actors::delta::materialize(rt.checkpoint_store().as_ref(), t, stored)
        .await
        .expect("the checkpoint reads back whole")
}

async fn fork(rt: &Runtime, source: &ThreadId, checkpoint: CheckpointId, into: &str) -> RunHandle {
    within(
        "fork",
        rt.resume(
            ResumeFrom::Fork {
                thread: source.clone(),
                checkpoint,
                into: Some(thread(into)),
            },
            ResumeInput::Continue,
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("the fork should start: {e}"))
}

async fn refused_fork(rt: &Runtime, from: ResumeFrom) -> ResumeError {
    match within("a refused fork", rt.resume(from, ResumeInput::Continue)).await {
        Ok(run) => panic!(
            "the fork should be refused; it ran: {:#?}",
            finish(&run).await
        ),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_fork_has_the_history_as_of_its_checkpoint_and_leaves_the_source_untouched() {
    let k = kit(Script::new()
        .interrupt(Interrupt::before("b"))
        .interrupt(Interrupt::before("c")));
    let wf = chain(&k.rt);
    let source = thread("fork-source");

    // Run 1 stops before b (cp1), run 2 before c (cp2), run 3 finishes the source thread.
    let run1 =
        k.rt.start(&wf, query("q1"), source.clone())
            .await
            .expect("start");
    let cp1 = stopped(&finish(&run1).await).checkpoint_id.expect("cp1");
    let run2 = within("resume", k.rt.resume(source.clone(), ResumeInput::Continue))
        .await
        .expect("resumes");
    stopped(&finish(&run2).await);
    let run3 = within("resume", k.rt.resume(source.clone(), ResumeInput::Continue))
        .await
        .expect("resumes");
    assert_eq!(finish(&run3).await.status(), RunStatus::Succeeded);
    let source_history = history(&k.rt, &source).await;
    assert_eq!(texts(&source_history), ["q1", "a done", "b done", "c done"]);
    let source_checkpoints = checkpoints(&k.rt, &source).await;
    let source_runs = k.rt.run_store().list_thread(&source).await.expect("runs");
    let at_cp1 = decode(
        &k.rt,
        &source,
        source_checkpoints
            .iter()
            .find(|c| c.id == cp1)
            .expect("cp1 is kept"),
    )
    .await;
    // As of cp1: the history before run 1 (nothing) and run 1's messages, which its stop
    // checkpoint carries as pending (it is written before the history).
    assert_eq!(at_cp1.history_len, Some(0));
    assert_eq!(
        texts(&Vec::from_iter(at_cp1.pending_messages.iter().cloned())),
        ["q1", "a done"],
        "q1 and `a done` are in cp1"
    );
    assert_eq!(
        (k.calls.of("a"), k.calls.of("b"), k.calls.of("c")),
        (1, 1, 1)
    );

    let forked = fork(&k.rt, &source, cp1, "fork-new").await;
    let into = thread("fork-new");
    assert_eq!(forked.thread(), &into);
    let outcome = finish(&forked).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");

    // The fork continued from cp1's frontier: b and c ran again, a did not.
    assert_eq!(
        (k.calls.of("a"), k.calls.of("b"), k.calls.of("c")),
        (1, 2, 2)
    );
    // Its nodes saw the history as of cp1, then their own messages; nothing of runs 2 and 3.
    let seen = k.calls.histories();
    let (_, fork_seen) = seen.last().expect("seen ran in the fork");
    assert_eq!(texts(fork_seen), ["q1", "a done", "b done"]);
    assert_eq!(fork_seen[..2], source_history[..2]);
    assert_ne!(
        fork_seen[2].id, source_history[2].id,
        "the fork's own `b done`"
    );

    // The new thread's history: the source's first two messages (the same messages), then the
    // fork's own.
    let fork_history = history(&k.rt, &into).await;
    assert_eq!(texts(&fork_history), ["q1", "a done", "b done", "c done"]);
    assert_eq!(fork_history[..2], source_history[..2]);
    for m in &fork_history[2..] {
        assert_eq!(m.run_id, Some(forked.run_id()), "{m:?}");
    }
    assert_unique_ids(&fork_history);

    // The new thread's checkpoints start with cp1, re-encoded for it.
    let fork_checkpoints = checkpoints(&k.rt, &into).await;
    assert_eq!(fork_checkpoints[0].id, cp1);
    let copy = decode(&k.rt, &into, &fork_checkpoints[0]).await;
    assert_eq!(copy.thread, into);
    assert_eq!(copy.run_id, run1.run_id());
    assert_eq!(copy.graph, at_cp1.graph);
    assert_eq!(copy.history_len, Some(0));
    assert_eq!(
        Snapshot {
            thread: source.clone(),
            ..copy.clone()
        },
        at_cp1
    );
    let last = decode(
        &k.rt,
        &into,
        fork_checkpoints
            .last()
            .expect("the fork's final checkpoint"),
    )
    .await;
    assert_eq!(
        (last.run_id, last.status),
        (forked.run_id(), RunStatus::Succeeded)
    );
    // The history before the fork's run (the two copied) and its own two, as pending.
    assert_eq!(last.history_len, Some(2));
    assert_eq!(last.pending_messages.len(), 2);
    for c in &fork_checkpoints[1..] {
        assert_eq!(decode(&k.rt, &into, c).await.run_id, forked.run_id());
    }
    // The definition is there for the new thread; the fork's record names its parent.
    assert!(
        k.rt.checkpoint_store()
            .get_workflow(&into, &copy.workflow_hash)
            .await
            .expect("workflow store answers")
            .is_some()
    );
    let rec = record(&k.rt, forked.run_id()).await;
    assert_eq!(
        (rec.thread, rec.parent_run_id),
        (into.clone(), Some(run1.run_id()))
    );

    // The source thread is exactly as it was.
    assert_eq!(history(&k.rt, &source).await, source_history);
    assert_eq!(checkpoints(&k.rt, &source).await, source_checkpoints);
    assert_eq!(
        k.rt.run_store().list_thread(&source).await.expect("runs"),
        source_runs
    );

    // The copy is a checkpoint like any other: a fork of the fork from it has the same
    // history as of cp1.
    let again = fork(&k.rt, &into, cp1, "fork-of-fork").await;
    assert_eq!(finish(&again).await.status(), RunStatus::Succeeded);
    let second = history(&k.rt, &thread("fork-of-fork")).await;
    assert_eq!(texts(&second), ["q1", "a done", "b done", "c done"]);
    assert_eq!(second[..2], source_history[..2]);
    assert_eq!(history(&k.rt, &into).await, fork_history);
}

#[tokio::test]
async fn a_fork_gets_the_messages_its_checkpoint_carried_as_pending() {
    let store = Arc::new(MemoryHistoryStore::new());
    let k = kit_with(Script::new().interrupt(Interrupt::before("b")), |b| {
        b.lease_store(Arc::new(MemoryLeaseStore::new()))
            .history_store(store.clone())
            .config(short_store_deadline())
    });
    let wf = chain(&k.rt);
    let intro = load(
        &k.rt,
        json!({"id": "intro", "nodes": [
            {"id": "start", "kind": "begin"}, {"id": "z", "kind": "count"}
        ], "edges": [{"from": "start", "to": "z"}]}),
    );
    let source = thread("fork-pending");
    let run0 =
        k.rt.start(&intro, query("hello"), source.clone())
            .await
            .expect("start");
    assert_eq!(finish(&run0).await.status(), RunStatus::Succeeded);

    // Run 1 stops before b while the history store refuses appends: its checkpoint carries
    // `q1` and `a done` as pending, after the two messages persisted before it.
    store.fail_appends(true);
    let run1 =
        k.rt.start(&wf, query("q1"), source.clone())
            .await
            .expect("start");
    let stop = finish(&run1).await;
    let cp1 = stopped(&stop).checkpoint_id.expect("cp1");
    assert_eq!(
        texts(&stopped(&stop).messages.not_persisted),
        ["q1", "a done"]
    );
    store.fail_appends(false);
    let cp1_snapshot = decode(
        &k.rt,
        &source,
        &k.rt
            .checkpoint_store()
            .get(&source, cp1)
            .await
            .expect("get")
            .expect("cp1"),
    )
    .await;
    assert_eq!(cp1_snapshot.history_len, Some(2));
    assert_eq!(
        texts(&Vec::from_iter(
            cp1_snapshot.pending_messages.iter().cloned()
        )),
        ["q1", "a done"]
    );

    // The source goes on (its resume persists the pending messages, then runs the rest).
    let run2 = within("resume", k.rt.resume(source.clone(), ResumeInput::Continue))
        .await
        .expect("resumes");
    assert_eq!(finish(&run2).await.status(), RunStatus::Succeeded);
    let source_history = history(&k.rt, &source).await;
    assert_eq!(
        texts(&source_history),
        ["hello", "z done", "q1", "a done", "b done", "c done"]
    );

    let forked = fork(&k.rt, &source, cp1, "fork-pending-new").await;
    assert_eq!(finish(&forked).await.status(), RunStatus::Succeeded);
    let fork_history = history(&k.rt, &thread("fork-pending-new")).await;
    assert_eq!(
        texts(&fork_history),
        ["hello", "z done", "q1", "a done", "b done", "c done"]
    );
    // The persisted ones and the pending ones are the same messages; what follows is the fork's.
    assert_eq!(fork_history[..4], source_history[..4]);
    assert_eq!(
        fork_history[2..4],
        Vec::from_iter(cp1_snapshot.pending_messages.iter().cloned())[..]
    );
    for m in &fork_history[4..] {
        assert_eq!(m.run_id, Some(forked.run_id()), "{m:?}");
    }
    assert_eq!(history(&k.rt, &source).await, source_history);
}

#[tokio::test]
async fn a_refused_fork_writes_nothing() {
    let k = kit(Script::new().interrupt(Interrupt::before("b")));
    let wf = chain(&k.rt);
    let source = thread("fork-refusals");
    // An earlier message: cp1 records that the history held one message before run 1.
    k.rt.history_store()
        .append(&source, &[Message::user("earlier")], None)
        .await
        .expect("append");
    let run1 =
        k.rt.start(&wf, query("q1"), source.clone())
            .await
            .expect("start");
    let cp1 = stopped(&finish(&run1).await).checkpoint_id.expect("cp1");
    let source_history = history(&k.rt, &source).await;
    let source_checkpoints = checkpoints(&k.rt, &source).await;
    let fork_into = |into: &ThreadId, checkpoint| ResumeFrom::Fork {
        thread: source.clone(),
        checkpoint,
        into: Some(into.clone()),
    };

    // Into the source itself, or any thread with checkpoints or history.
    assert_eq!(
        refused_fork(&k.rt, fork_into(&source, cp1)).await,
        ResumeError::ForkTargetExists {
            thread: source.clone(),
            checkpoints: source_checkpoints.len(),
            messages: 3,
        }
    );
    let chatty = thread("fork-refusals-chatty");
    k.rt.history_store()
        .append(&chatty, &[Message::user("already here")], None)
        .await
        .expect("append");
    assert_eq!(
        refused_fork(&k.rt, fork_into(&chatty, cp1)).await,
        ResumeError::ForkTargetExists {
            thread: chatty.clone(),
            checkpoints: 0,
            messages: 1,
        }
    );
    assert_eq!(texts(&history(&k.rt, &chatty).await), ["already here"]);
    assert!(checkpoints(&k.rt, &chatty).await.is_empty());

    // A checkpoint the source does not have is named with the source thread.
    let fresh = thread("fork-refusals-fresh");
    let missing = CheckpointId::new();
    assert_eq!(
        refused_fork(&k.rt, fork_into(&fresh, missing)).await,
        ResumeError::CheckpointNotFound {
            thread: source.clone(),
            checkpoint: missing,
        }
    );

    // A thread a run is live on is busy, even before it has written anything.
    let busy = thread("fork-refusals-busy");
    let lingering = load(
        &k.rt,
        json!({"id": "lingering", "nodes": [
            {"id": "start", "kind": "begin"}, {"id": "slow", "kind": "linger", "params": {"ms": 0}}
        ], "edges": [{"from": "start", "to": "slow"}]}),
    );
    let live =
        k.rt.start(&lingering, query("x"), busy.clone())
            .await
            .expect("start");
    mark(&k.log, "slow:started").await;
    assert_eq!(
        refused_fork(&k.rt, fork_into(&busy, cp1)).await,
        ResumeError::ThreadBusy {
            thread: busy.clone(),
            run: live.run_id(),
            worker: Some(k.rt.worker().id.clone()),
        }
    );
    let _ = k.rt.stop(live.run_id(), StopMode::Force).await;
    finish(&live).await;

    // The source's history lost its messages (another store, say): the history as of cp1
    // cannot be rebuilt, and the fork says so.
    let store = k.rt.checkpoint_store().clone();
    let forgetful = kit_with(Script::new(), |b| {
        b.lease_store(Arc::new(MemoryLeaseStore::new()))
            .checkpoint_store(store.clone())
    });
    assert_eq!(
        refused_fork(&forgetful.rt, fork_into(&fresh, cp1)).await,
        ResumeError::HistoryMissing {
            thread: source.clone(),
            checkpoint: cp1,
            recorded: 1,
            stored: 0,
        }
    );

    // None of it wrote anything, to the new thread or the source.
    assert!(history(&k.rt, &fresh).await.is_empty());
    assert!(checkpoints(&k.rt, &fresh).await.is_empty());
    assert_eq!(history(&k.rt, &source).await, source_history);
    assert_eq!(checkpoints(&k.rt, &source).await, source_checkpoints);
    assert!(k.rt.registry().is_empty(), "no refused fork left a run");

    // And the fork still works.
    let forked = fork(&k.rt, &source, cp1, "fork-refusals-fresh").await;
    assert_eq!(finish(&forked).await.status(), RunStatus::Succeeded);
}

#[tokio::test]
async fn a_thread_a_run_is_live_on_can_be_forked_into_a_generated_thread() {
    let k = kit(Script::new().interrupt(Interrupt::before("slow")));
    let wf = load(
        &k.rt,
        json!({"id": "live", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "count"},
            {"id": "slow", "kind": "linger", "params": {"ms": 0}}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "slow"}]}),
    );
    let source = thread("fork-live");
    let run1 =
        k.rt.start(&wf, query("q1"), source.clone())
            .await
            .expect("start");
    let cp1 = stopped(&finish(&run1).await).checkpoint_id.expect("cp1");
    let run2 = within("resume", k.rt.resume(source.clone(), ResumeInput::Continue))
        .await
        .expect("resumes");
    mark(&k.log, "slow:started").await;

    let forked = within(
        "fork of a live thread",
        k.rt.resume(
            ResumeFrom::Fork {
                thread: source.clone(),
                checkpoint: cp1,
                into: None,
            },
            ResumeInput::Continue,
        ),
    )
    .await
    .expect("a live thread can be forked");
    let into = forked.thread().clone();
    assert_ne!(into, source);
    let mut events = forked.events();
    started(&forked, &mut events, "slow").await;
    let fork_stop = stopped_reply(
        k.rt.stop(forked.run_id(), StopMode::Force)
            .await
            .expect("stops"),
    );
    let source_stop = stopped_reply(
        k.rt.stop(run2.run_id(), StopMode::Force)
            .await
            .expect("stops"),
    );
    finish(&forked).await;
    finish(&run2).await;

    // Each run stopped where it was and wrote its checkpoint into its own thread.
    let fork_checkpoints = checkpoints(&k.rt, &into).await;
    assert_eq!(fork_checkpoints[0].id, cp1);
    assert!(
        fork_checkpoints
            .iter()
            .any(|c| Some(c.id) == fork_stop.checkpoint_id)
    );
    for c in checkpoints(&k.rt, &source).await {
        let snapshot = decode(&k.rt, &source, &c).await;
        assert_eq!(snapshot.thread, source);
        assert!(
            [run1.run_id(), run2.run_id()].contains(&snapshot.run_id),
            "{snapshot:#?}"
        );
    }
    let source_checkpoints = checkpoints(&k.rt, &source).await;
    assert!(
        source_checkpoints
            .iter()
            .any(|c| Some(c.id) == source_stop.checkpoint_id)
    );
    assert_eq!(texts(&history(&k.rt, &into).await), ["q1", "a done"]);
    assert_eq!(history(&k.rt, &into).await, history(&k.rt, &source).await);
    assert_eq!(k.calls.of("a"), 1);
    assert_eq!(k.calls.of("slow"), 2);
}

/// Rewrites a snapshot as schema version 1 wrote it: without `history_len`, and labels
/// without a user.
fn as_schema_1(snapshot: &Snapshot) -> Vec<u8> {
    const HEADER_LEN: usize = 4 + 2 + 2 + 1 + 4 + 4;
    assert_eq!(
        snapshot.labels.user_id(),
        None,
        "schema 1 had no user label"
    );
    let v3 = Snapshot {
        history_len: None,
        ..snapshot.clone()
    }
    .encode()
    .expect("encodes");
    // The labels' `None` user and `None` history length are the payload's last two bytes.
    let payload = &v3[HEADER_LEN..v3.len() - 2];
    let crc = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.push(CODEC_POSTCARD);
    out.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&crc.checksum(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[tokio::test]
async fn a_fork_of_a_schema_1_checkpoint_gets_the_whole_history_as_stored() {
    let k = kit(Script::new().interrupt(Interrupt::before("b")));
    let wf = chain(&k.rt);
    let source = thread("fork-v1");
    let run1 =
        k.rt.start(&wf, query("q1"), source.clone())
            .await
            .expect("start");
    let cp1 = stopped(&finish(&run1).await).checkpoint_id.expect("cp1");
    let run2 = within("resume", k.rt.resume(source.clone(), ResumeInput::Continue))
        .await
        .expect("resumes");
    assert_eq!(finish(&run2).await.status(), RunStatus::Succeeded);

    // cp1 as an older build would have written it, stored as another checkpoint.
    let store = k.rt.checkpoint_store();
    let cp1_snapshot = decode(
        &k.rt,
        &source,
        &store.get(&source, cp1).await.expect("get").expect("cp1"),
    )
    .await;
    let old = CheckpointId::new();
    let bytes = as_schema_1(&cp1_snapshot);
    assert_eq!(Snapshot::decode(&bytes).map(|s| s.history_len), Ok(None));
    store
        .put(
            &source,
            StoredCheckpoint {
                id: old,
                run: RunId::new(),
                sequence: 1,
                bytes,
                link: None,
            },
            None,
        )
        .await
        .expect("put");

    // It does not say where the history stood: the fork gets all of it, as stored now.
    let forked = fork(&k.rt, &source, old, "fork-v1-new").await;
    assert_eq!(finish(&forked).await.status(), RunStatus::Succeeded);
    let into = thread("fork-v1-new");
    let fork_history = history(&k.rt, &into).await;
    assert_eq!(
        texts(&fork_history),
        ["q1", "a done", "b done", "c done", "b done", "c done"]
    );
    assert_eq!(fork_history[..4], history(&k.rt, &source).await[..]);
    // Its copy records what the new thread was given.
    let copy = decode(&k.rt, &into, &checkpoints(&k.rt, &into).await[0]).await;
    assert_eq!((copy.thread, copy.history_len), (into.clone(), Some(4)));

    // And it still restores on its own thread.
    let resumed = within(
        "resume",
        k.rt.resume(
            ResumeFrom::Checkpoint {
                thread: source.clone(),
                checkpoint: old,
            },
            ResumeInput::Continue,
        ),
    )
    .await
    .expect("a schema-1 checkpoint resumes");
    assert_eq!(finish(&resumed).await.status(), RunStatus::Succeeded);
    assert_eq!((k.calls.of("a"), k.calls.of("b")), (1, 3));
}
