//! The run store contract on Redis: records round trip exactly (every status, every optional
//! field present or absent), `put` replaces, `list_thread` answers in run order, and fields
//! other tools add to a run hash survive.

use runvisor::store::memory::MemoryRunStore;
use runvisor::store::{RunRecord, RunStatus, RunStore};
use runvisor::{CheckpointId, RunId, ThreadId};

use super::support::{RedisServer, cmd, now_ms, raw, run_record, stores, thread};

fn bare(run: RunId, thread: &ThreadId) -> RunRecord {
    RunRecord {
        workflow_id: "support-agent".to_owned(),
        started_at_ms: 1_700_000_000_123,
        ..run_record(run, thread)
    }
}

fn full(run: RunId, thread: &ThreadId) -> RunRecord {
    RunRecord {
        status: RunStatus::Failed,
        parent_run_id: Some(RunId::new()),
        checkpoint_id: Some(CheckpointId::new()),
        finished_at_ms: Some(u64::MAX),
        failure_reason: Some("node `llm`: «timeout»\nline two \"quoted\"".to_owned()),
        stop_reason: Some(String::new()),
        unpersisted: Some("2 messages: redis: connection refused".to_owned()),
        workflow_id: String::new(),
        started_at_ms: 0,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
        ..bare(run, thread)
    }
}

#[tokio::test]
async fn records_round_trip_exactly_and_put_replaces() {
    let server = RedisServer::start();
    let runs = stores(&server).await.runs;
    let t = thread("chat:42");
    let run = RunId::new();
    assert_eq!(runs.get(run).await, Ok(None));

    let first = bare(run, &t);
    runs.put(&first, None).await.expect("put");
    assert_eq!(runs.get(run).await, Ok(Some(first.clone())));

    // Every optional field set (an empty string is a value, not an absence).
    let second = full(run, &t);
    runs.put(&second, None).await.expect("put");
    assert_eq!(runs.get(run).await, Ok(Some(second.clone())));

    // Back to absent: the fields are gone, not left over.
    runs.put(&first, None).await.expect("put");
    assert_eq!(runs.get(run).await, Ok(Some(first.clone())));

    for status in [
        RunStatus::Running,
        RunStatus::AwaitingInput,
        RunStatus::Stopped,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ] {
        let record = RunRecord {
            status,
            ..first.clone()
        };
        runs.put(&record, None).await.expect("put");
        assert_eq!(runs.get(run).await, Ok(Some(record)));
    }
}

#[tokio::test]
async fn list_thread_answers_in_run_order_like_the_memory_store() {
    let server = RedisServer::start();
    let redis = stores(&server).await.runs;
    let memory = MemoryRunStore::new();
    let (t, other) = (thread("list"), thread("other"));
    let ids: Vec<RunId> = (0..4).map(|_| RunId::new()).collect();
    let records = [
        full(ids[2], &t),
        bare(ids[0], &t),
        bare(ids[3], &other),
        full(ids[1], &t),
    ];
    for record in &records {
        redis.put(record, None).await.expect("put");
        memory.put(record, None).await.expect("put");
    }
    // Updating a record does not duplicate it in the index.
    redis.put(&records[1], None).await.expect("put again");
    let listed = redis.list_thread(&t).await.expect("list");
    assert_eq!(
        listed.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        [ids[0], ids[1], ids[2]]
    );
    assert_eq!(Ok(listed), memory.list_thread(&t).await);
    assert_eq!(
        redis.list_thread(&other).await,
        memory.list_thread(&other).await
    );
    assert_eq!(redis.list_thread(&thread("nobody")).await, Ok(vec![]));
}

#[tokio::test]
async fn fields_written_by_other_tools_survive_a_put() {
    let server = RedisServer::start();
    let runs = stores(&server).await.runs;
    let mut con = raw(&server).await;
    let t = thread("foreign");
    let record = bare(RunId::new(), &t);
    runs.put(&record, None).await.expect("put");
    let key = format!("runvisor:run:{{foreign}}:{}", record.run_id);
    let _: i64 = cmd(&mut con, &["HSET", &key, "cancel_requested", "1"]).await;
    let finished = RunRecord {
        status: RunStatus::Cancelled,
        finished_at_ms: Some(5),
        ..record.clone()
    };
    runs.put(&finished, None).await.expect("put");
    assert_eq!(runs.get(record.run_id).await, Ok(Some(finished)));
    let flag: Option<String> = cmd(&mut con, &["HGET", &key, "cancel_requested"]).await;
    assert_eq!(flag.as_deref(), Some("1"));
    let fields: Vec<String> = cmd(&mut con, &["HKEYS", &key]).await;
    let mut fields = fields;
    fields.sort();
    assert_eq!(
        fields,
        [
            "app_id",
            "cancel_requested",
            "chat_id",
            "finished_at",
            "started_at",
            "status",
            "thread",
            "workflow_id"
        ]
    );
}

/// A record goes out in one pipeline with its pointer and index entries; a server that forgot
/// the record's script (a restart, `SCRIPT FLUSH`) answers that invocation `NOSCRIPT`, and the
/// store loads the script and sends it again: the record, its pointer and its index entries
/// are all in place.
#[tokio::test]
async fn a_record_is_written_after_the_server_forgot_its_script() {
    let server = RedisServer::start();
    let runs = stores(&server).await.runs;
    let mut con = raw(&server).await;
    let t = thread("forgotten");
    let run = RunId::new();
    // Started now: the recent index keeps the runs of the data TTL only.
    let running = RunRecord {
        started_at_ms: now_ms(),
        ..bare(run, &t)
    };
    runs.put(&running, None).await.expect("put");

    let () = cmd(&mut con, &["SCRIPT", "FLUSH"]).await;
    let ended = RunRecord {
        status: RunStatus::Succeeded,
        finished_at_ms: Some(running.started_at_ms + 1),
        ..running.clone()
    };
    runs.put(&ended, None)
        .await
        .expect("put after SCRIPT FLUSH");
    assert_eq!(runs.get(run).await, Ok(Some(ended.clone())));
    assert_eq!(runs.list_thread(&t).await, Ok(vec![ended.clone()]));
    assert_eq!(runs.list_open().await, Ok(Vec::new()));
    assert_eq!(runs.list_recent(10).await, Ok(vec![ended]));
}

/// The lease holder of `run` on worker `w1`.
fn holder(run: RunId) -> runvisor::LeaseHolder {
    runvisor::LeaseHolder {
        worker: runvisor::WorkerId::new("w1").expect("worker id"),
        run,
    }
}

/// A new run holding `t`'s lease, with its two flags raised: its stop flag in the thread's
/// slot and a FastGPT label flag elsewhere.
async fn flagged_holder(
    stores: &runvisor::redis::RedisStores,
    con: &mut ::redis::aio::MultiplexedConnection,
    t: &ThreadId,
) -> (RunId, runvisor::Lease, Vec<String>) {
    let run = RunId::new();
    let lease = stores
        .leases
        .acquire(t, &holder(run), std::time::Duration::from_secs(10))
        .await
        .expect("free")
        .lease;
    let flags = vec![
        format!("runvisor:stop:{{{t}}}:{run}"),
        "agent_runtime_stopping:app:chat".to_owned(),
    ];
    for flag in &flags {
        let _: () = cmd(con, &["SET", flag, "1", "EX", "60"]).await;
    }
    (run, lease, flags)
}

/// A run's end in one write: its record, then its flags deleted and announced, then its lease
/// given up; and nothing of it when the record is refused.
#[tokio::test]
async fn a_run_end_clears_its_flags_announces_it_and_gives_its_lease_up_after_its_record() {
    use futures::StreamExt;
    use runvisor::StoreError;
    use runvisor::store::{EndWritten, Notice};

    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("chat:{end}");
    let (run, lease, flags) = flagged_holder(&stores, &mut con, &t).await;
    let mut notices = stores.signals.subscribe().await.expect("subscribe");
    let ended = RunRecord {
        status: RunStatus::Succeeded,
        finished_at_ms: Some(now_ms()),
        ..run_record(run, &t)
    };

    // A record of another type at the run's key: refused naming it, nothing of the end done.
    let key = format!("runvisor:run:{{{t}}}:{run}");
    let _: () = cmd(&mut con, &["SET", &key, "junk"]).await;
    match stores.runs.put_end(&ended, &lease, &flags).await {
        Err(StoreError::Corrupt { key: named, .. }) => assert_eq!(named, key),
        other => panic!("a junk record must be refused as corrupt: {other:?}"),
    }
    let left: i64 = cmd(&mut con, &["EXISTS", &flags[0], &flags[1]]).await;
    assert_eq!(left, 2, "no flag is cleared before the record is written");
    assert_eq!(
        stores.leases.lease(&t).await.expect("read lease"),
        Some(lease.clone()),
        "the lease is kept"
    );
    let _: i64 = cmd(&mut con, &["DEL", &key]).await;

    // The record, then the flags, the notices and the lease.
    let written = stores
        .runs
        .put_end(&ended, &lease, &flags)
        .await
        .expect("end");
    assert_eq!(written, EndWritten::Released { announced: true });
    assert_eq!(
        stores.runs.get(run).await.expect("get"),
        Some(ended.clone())
    );
    let left: i64 = cmd(&mut con, &["EXISTS", &flags[0], &flags[1]]).await;
    assert_eq!(left, 0, "the run's flags are gone");
    assert_eq!(stores.leases.lease(&t).await.expect("read lease"), None);
    for flag in &flags {
        let notice = tokio::time::timeout(std::time::Duration::from_secs(5), notices.next())
            .await
            .expect("a notice within 5 s")
            .expect("the notice stream goes on");
        assert_eq!(
            notice,
            Notice {
                key: flag.clone(),
                raised: false
            }
        );
    }

    // Written again (a retry whose first answer was lost): the same record, nothing else.
    let next = RunId::new();
    let taken = stores
        .leases
        .acquire(&t, &holder(next), std::time::Duration::from_secs(10))
        .await
        .expect("free again")
        .lease;
    let _: () = cmd(&mut con, &["SET", &flags[1], "1", "EX", "60"]).await;
    // The thread is another run's now: the old token is refused, and that run's lease and
    // the flag set for it stay.
    match stores.runs.put_end(&ended, &lease, &flags).await {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("a stale token must be refused: {other:?}"),
    }
    assert_eq!(
        stores.leases.lease(&t).await.expect("read lease"),
        Some(taken)
    );
    let left: i64 = cmd(&mut con, &["EXISTS", &flags[1]]).await;
    assert_eq!(left, 1, "the new run's flag stays");
}

/// A run's whole end in one step: its final checkpoint, then its messages, then its record,
/// then its flags (deleted and announced) and its lease; a step that fails stops it there,
/// with the steps before it stored and none after.
#[tokio::test]
async fn a_whole_end_writes_checkpoint_messages_record_flags_and_lease_in_order() {
    use futures::StreamExt;
    use runvisor::store::{
        DeltaLink, EndFailed, EndStep, EndWritten, Notice, StoredCheckpoint, WholeEnd,
    };
    use runvisor::{Message, StoreError};

    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("chat:{whole}");
    let (run, lease, flags) = flagged_holder(&stores, &mut con, &t).await;
    let mut notices = stores.signals.subscribe().await.expect("subscribe");
    let checkpoint = |sequence, link| StoredCheckpoint {
        id: CheckpointId::new(),
        run,
        sequence,
        bytes: format!("snapshot {sequence}").into_bytes(),
        link,
    };
    let messages = [Message::user("hello"), Message::assistant("hi there")];
    let record = |checkpoint: &StoredCheckpoint| RunRecord {
        status: RunStatus::Succeeded,
        finished_at_ms: Some(now_ms()),
        checkpoint_id: Some(checkpoint.id),
        ..run_record(run, &t)
    };
    macro_rules! whole {
        ($checkpoint:expr, $record:expr) => {
            WholeEnd {
                checkpoint: $checkpoint,
                messages: &messages,
                record: $record,
                lease: &lease,
                flags: &flags,
            }
        };
    }
    macro_rules! untouched {
        ($what:expr) => {{
            let what = $what;
            assert_eq!(
                stores.runs.get(run).await.expect("get"),
                None,
                "{what}: no record"
            );
            let left: i64 = cmd(&mut con, &["EXISTS", &flags[0], &flags[1]]).await;
            assert_eq!(left, 2, "{what}: the flags stay");
            assert_eq!(
                stores.leases.lease(&t).await.expect("read lease"),
                Some(lease.clone()),
                "{what}: the lease is kept"
            );
        }};
    }

    // A delta whose base is not stored: refused at the first step, nothing written.
    let missing = CheckpointId::new();
    let orphan = checkpoint(
        1,
        Some(DeltaLink {
            base: missing,
            parent: missing,
        }),
    );
    let orphan_record = record(&orphan);
    match stores
        .ends
        .put_whole_end(&whole!(&orphan, &orphan_record))
        .await
    {
        Err(EndFailed {
            step: EndStep::Checkpoint,
            error: StoreError::MissingParent { checkpoint },
        }) => assert_eq!(checkpoint, missing),
        other => panic!("a delta without its base must be refused: {other:?}"),
    }
    assert_eq!(stores.checkpoints.list(&t).await.expect("list"), vec![]);
    assert!(stores.history.load(&t).await.expect("history").is_empty());
    untouched!("missing base");

    // A history of another type: the checkpoint is stored, nothing after it.
    let history_key = format!("runvisor:hist:{{{t}}}");
    let _: () = cmd(&mut con, &["SET", &history_key, "junk"]).await;
    let first = checkpoint(1, None);
    let first_record = record(&first);
    match stores
        .ends
        .put_whole_end(&whole!(&first, &first_record))
        .await
    {
        Err(EndFailed {
            step: EndStep::History,
            error: StoreError::Corrupt { key, .. },
        }) => assert_eq!(key, history_key),
        other => panic!("a junk history must stop the end at its step: {other:?}"),
    }
    assert_eq!(
        stores.checkpoints.list(&t).await.expect("list"),
        vec![first.id]
    );
    untouched!("junk history");
    let _: i64 = cmd(&mut con, &["DEL", &history_key]).await;

    // Every step, in one write.
    let last = checkpoint(2, None);
    let ended = record(&last);
    let written = stores
        .ends
        .put_whole_end(&whole!(&last, &ended))
        .await
        .expect("whole end");
    assert_eq!(written, EndWritten::Released { announced: true });
    assert_eq!(
        stores.checkpoints.get(&t, last.id).await.expect("get"),
        Some(last.clone())
    );
    assert_eq!(
        stores.history.load(&t).await.expect("history"),
        messages.to_vec()
    );
    assert_eq!(
        stores.runs.get(run).await.expect("get"),
        Some(ended.clone())
    );
    assert_eq!(
        stores.runs.list_thread(&t).await.expect("list"),
        vec![ended.clone()],
        "the record is in its thread's index"
    );
    let left: i64 = cmd(&mut con, &["EXISTS", &flags[0], &flags[1]]).await;
    assert_eq!(left, 0, "the run's flags are gone");
    assert_eq!(stores.leases.lease(&t).await.expect("read lease"), None);
    for flag in &flags {
        let notice = tokio::time::timeout(std::time::Duration::from_secs(5), notices.next())
            .await
            .expect("a notice within 5 s")
            .expect("the notice stream goes on");
        assert_eq!(
            notice,
            Notice {
                key: flag.clone(),
                raised: false
            }
        );
    }

    // Another run holds the thread: the old token writes nothing, that run's lease and flag
    // stay.
    let taken = stores
        .leases
        .acquire(
            &t,
            &holder(RunId::new()),
            std::time::Duration::from_secs(10),
        )
        .await
        .expect("free again")
        .lease;
    let _: () = cmd(&mut con, &["SET", &flags[1], "1", "EX", "60"]).await;
    let late = checkpoint(3, None);
    let late_record = record(&late);
    match stores
        .ends
        .put_whole_end(&whole!(&late, &late_record))
        .await
    {
        Err(EndFailed {
            step: EndStep::Checkpoint,
            error: StoreError::Fenced { .. },
        }) => {}
        other => panic!("a stale token must be refused: {other:?}"),
    }
    assert_eq!(
        stores.checkpoints.get(&t, late.id).await.expect("get"),
        None
    );
    assert_eq!(stores.runs.get(run).await.expect("get"), Some(ended));
    assert_eq!(
        stores.leases.lease(&t).await.expect("read lease"),
        Some(taken)
    );
    let left: i64 = cmd(&mut con, &["EXISTS", &flags[1]]).await;
    assert_eq!(left, 1, "the new run's flag stays");
}

/// A new run's start on `t` through the start store, reading the newest two messages.
async fn begin_with_window(
    stores: &runvisor::redis::RedisStores,
    t: &ThreadId,
) -> runvisor::store::Begun {
    let run = RunId::new();
    stores
        .starts
        .begin(
            &run_record(run, t),
            &holder(run),
            std::time::Duration::from_secs(10),
            Some(2),
        )
        .await
        .expect("begin")
}

/// A runtime's history window on Redis: the start's script and the history store read the
/// thread's newest messages alone, with the history's length; a window of 0 reads none, one
/// past the length reads all, and a list of another type is named.
#[tokio::test]
async fn a_history_window_reads_the_newest_messages_and_the_length_on_redis() {
    use runvisor::store::{Begun, HistoryTail};
    use runvisor::{Message, StoreError};

    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("chat:{window}");
    let messages: Vec<Message> = (0..5).map(|i| Message::user(format!("m{i}"))).collect();
    stores
        .history
        .append(&t, &messages, None)
        .await
        .expect("append");

    for (window, from) in [
        (Some(2), 3),
        (Some(0), 5),
        (Some(5), 0),
        (Some(9), 0),
        (None, 0),
    ] {
        let tail = stores.history.load_tail(&t, window).await.expect("tail");
        assert_eq!(
            tail,
            HistoryTail::new(messages[from..].to_vec(), 5),
            "window {window:?}"
        );
    }
    assert_eq!(
        stores
            .history
            .load_tail(&thread("chat:{window-none}"), Some(3))
            .await,
        Ok(HistoryTail::default())
    );

    match begin_with_window(&stores, &t).await {
        Begun::Started {
            history: Ok(history),
            ..
        } => assert_eq!(history, HistoryTail::new(messages[3..].to_vec(), 5)),
        other => panic!("the thread must be started with its tail: {other:?}"),
    }

    let odd = thread("chat:{window-odd}");
    let list = format!("runvisor:hist:{{{odd}}}");
    let _: () = cmd(&mut con, &["SET", &list, "junk"]).await;
    match stores.history.load_tail(&odd, Some(2)).await {
        Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, list),
        other => panic!("a junk history must be named: {other:?}"),
    }
    match begin_with_window(&stores, &odd).await {
        Begun::Started {
            history: Err(StoreError::Corrupt { key, .. }),
            ..
        } => assert_eq!(key, list),
        other => panic!("a junk history must be named: {other:?}"),
    }
}

/// A new run's start in one step: the thread's lease taken, the run's first record written
/// with the new token, the thread's history read; a held lease or a refused record leaves
/// nothing held or written.
#[tokio::test]
async fn a_start_takes_the_lease_writes_the_record_and_reads_the_history_in_one_step() {
    use runvisor::store::{Begun, HistoryTail};
    use runvisor::{Message, StoreError};
    use std::time::Duration;

    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let ttl = Duration::from_secs(10);

    // A free thread with a history: lease, record and history in one step.
    let t = thread("chat:{start}");
    let earlier = [Message::user("before"), Message::assistant("reply")];
    stores
        .history
        .append(&t, &earlier, None)
        .await
        .expect("append");
    let run = RunId::new();
    let first = run_record(run, &t);
    let (lease, took_over, history) = match stores
        .starts
        .begin(&first, &holder(run), ttl, None)
        .await
        .expect("begin")
    {
        Begun::Started {
            acquired,
            history,
            newest_checkpoint,
        } => {
            // No checkpoint on the thread yet.
            assert_eq!(newest_checkpoint, None);
            (acquired.lease, acquired.took_over, history)
        }
        other => panic!("a free thread must be started: {other:?}"),
    };
    assert_eq!(took_over, None);
    assert_eq!(
        history.expect("history"),
        HistoryTail::new(earlier.to_vec(), 2)
    );
    assert_eq!(
        stores.leases.lease(&t).await.expect("lease"),
        Some(lease.clone())
    );
    let recorded = RunRecord {
        fence: Some(lease.fence.0),
        ..first.clone()
    };
    assert_eq!(
        stores.runs.get(run).await.expect("get"),
        Some(recorded.clone())
    );
    assert_eq!(stores.runs.list_open().await.expect("open"), vec![recorded]);

    // Held: nothing written, the lease is the first run's.
    let second = RunId::new();
    match stores
        .starts
        .begin(&run_record(second, &t), &holder(second), ttl, None)
        .await
        .expect("begin")
    {
        Begun::NotStarted => {}
        other => panic!("a held thread must not be started: {other:?}"),
    }
    assert_eq!(stores.runs.get(second).await.expect("get"), None);
    assert_eq!(stores.leases.lease(&t).await.expect("lease"), Some(lease));

    // A record key of another type: not started, and the lease taken for it given back.
    let junk = thread("chat:{start-junk}");
    let third = RunId::new();
    let key = format!("runvisor:run:{{{junk}}}:{third}");
    let _: () = cmd(&mut con, &["SET", &key, "junk"]).await;
    match stores
        .starts
        .begin(&run_record(third, &junk), &holder(third), ttl, None)
        .await
        .expect("begin")
    {
        Begun::NotStarted => {}
        other => panic!("a refused record must not start the run: {other:?}"),
    }
    assert_eq!(stores.leases.lease(&junk).await.expect("lease"), None);
    let kept: String = cmd(&mut con, &["GET", &key]).await;
    assert_eq!(kept, "junk");

    // A history of another type: started, and the history's error named.
    let odd = thread("chat:{start-odd}");
    let list = format!("runvisor:hist:{{{odd}}}");
    let _: () = cmd(&mut con, &["SET", &list, "junk"]).await;
    let fourth = RunId::new();
    match stores
        .starts
        .begin(&run_record(fourth, &odd), &holder(fourth), ttl, None)
        .await
        .expect("begin")
    {
        Begun::Started {
            history: Err(StoreError::Corrupt { key, .. }),
            ..
        } => assert_eq!(key, list),
        other => panic!("a junk history must be named: {other:?}"),
    }

    // A checkpoint index of another type orders nothing: started, with no newest checkpoint
    // (the checkpoint writes meet the index and name it).
    let odd_index = thread("chat:{start-odd-index}");
    let index = format!("runvisor:cpidx:{{{odd_index}}}");
    let _: () = cmd(&mut con, &["SET", &index, "junk"]).await;
    let sixth = RunId::new();
    match stores
        .starts
        .begin(&run_record(sixth, &odd_index), &holder(sixth), ttl, None)
        .await
        .expect("begin")
    {
        Begun::Started {
            history: Ok(history),
            newest_checkpoint: None,
            ..
        } => assert_eq!(history, HistoryTail::default()),
        other => panic!("a junk index must not stop the start: {other:?}"),
    }

    // An expired lease is taken over in the same step, naming whose it was.
    let old = thread("chat:{start-expired}");
    let gone = RunId::new();
    stores
        .leases
        .acquire(&old, &holder(gone), Duration::from_millis(1))
        .await
        .expect("free");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let fifth = RunId::new();
    match stores
        .starts
        .begin(&run_record(fifth, &old), &holder(fifth), ttl, None)
        .await
        .expect("begin")
    {
        Begun::Started { acquired, .. } => {
            assert_eq!(acquired.took_over, Some(holder(gone)));
            assert_eq!(
                stores
                    .runs
                    .get(fifth)
                    .await
                    .expect("get")
                    .and_then(|r| r.fence),
                Some(acquired.lease.fence.0)
            );
        }
        other => panic!("an expired lease must be taken: {other:?}"),
    }
}

/// A resume's first record and the `answered` of the paused run it answers go in one script:
/// both written under the resumed run's token (the paused run leaves the open runs), neither
/// under a token the thread has moved past, and an `answered` refused on its own (a key of
/// another type) leaves the first written and says why.
#[tokio::test]
async fn a_resumes_record_and_the_paused_runs_answered_are_one_write() {
    use std::time::Duration;

    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let runs = &stores.runs;
    let t = thread("chat:{answering}");
    let paused_run = RunId::new();
    let first = stores
        .leases
        .acquire(&t, &holder(paused_run), Duration::from_secs(30))
        .await
        .expect("free");
    let paused = RunRecord {
        status: RunStatus::AwaitingInput,
        started_at_ms: now_ms(),
        ..run_record(paused_run, &t)
    };
    runs.put(&paused, Some(first.lease.fence))
        .await
        .expect("paused");
    stores
        .leases
        .release(&t, &first.lease)
        .await
        .expect("released");

    let resumed_run = RunId::new();
    let second = stores
        .leases
        .acquire(&t, &holder(resumed_run), Duration::from_secs(30))
        .await
        .expect("free again");
    let resumed = RunRecord {
        parent_run_id: Some(paused_run),
        started_at_ms: now_ms(),
        fence: Some(second.lease.fence.0),
        ..run_record(resumed_run, &t)
    };
    let answered = RunRecord {
        status: RunStatus::Answered,
        ..paused.clone()
    };
    // Under a token the thread has moved past: neither is written.
    assert!(matches!(
        runs.put_answering(&resumed, &answered, Some(first.lease.fence))
            .await,
        Err(runvisor::StoreError::Fenced { .. })
    ));
    assert_eq!(runs.get(resumed_run).await, Ok(None));
    assert_eq!(runs.get(paused_run).await, Ok(Some(paused.clone())));
    // Under the resumed run's: both, and only the resumed run is open.
    assert_eq!(
        runs.put_answering(&resumed, &answered, Some(second.lease.fence))
            .await,
        Ok(Ok(()))
    );
    assert_eq!(runs.get(resumed_run).await, Ok(Some(resumed.clone())));
    assert_eq!(runs.get(paused_run).await, Ok(Some(answered.clone())));
    assert_eq!(runs.list_open().await, Ok(vec![resumed.clone()]));

    // The paused run's record key holds another type: the first is written, the `answered`
    // refused and named.
    let other_paused = RunId::new();
    let key = format!("runvisor:run:{{{t}}}:{other_paused}");
    let _: () = cmd(&mut con, &["SET", &key, "junk"]).await;
    let again = RunRecord {
        parent_run_id: Some(other_paused),
        ..resumed.clone()
    };
    let refused = RunRecord {
        status: RunStatus::Answered,
        ..run_record(other_paused, &t)
    };
    match runs
        .put_answering(&again, &refused, Some(second.lease.fence))
        .await
    {
        Ok(Err(runvisor::StoreError::Corrupt { key: named, .. })) => assert_eq!(named, key),
        other => panic!("the refused `answered` must be named: {other:?}"),
    }
    assert_eq!(runs.get(resumed_run).await, Ok(Some(again)));
}
