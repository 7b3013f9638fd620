//! Garbage in Redis (written by hand, by another tool, by an older version) is reported as
//! `StoreError::Corrupt` naming the key, never a panic, and a write over a key of the wrong
//! type writes nothing.

use runvisor::store::StoredCheckpoint;
use runvisor::{CheckpointId, Fence, Message, RunId};

use super::support::{RedisServer, assert_corrupt_at, cmd, raw, run_record, stores, thread};

#[tokio::test]
async fn junk_run_records_are_corrupt() {
    let server = RedisServer::start();
    let runs = stores(&server).await.runs;
    let mut con = raw(&server).await;
    let t = thread("junk");
    let run = RunId::new();
    let key = format!("runvisor:run:{{junk}}:{run}");
    let index = "runvisor:runs:{junk}";
    let _: () = cmd(
        &mut con,
        &["SET", &format!("runvisor:runthread:{run}"), "junk"],
    )
    .await;
    let valid = [
        "status",
        "running",
        "thread",
        "junk",
        "workflow_id",
        "wf",
        "started_at",
        "1",
    ];
    let cases: [(&str, &str); 6] = [
        ("status", "exploded"),
        ("started_at", "yesterday"),
        ("thread", "has space"),
        ("parent_run_id", "not-a-uuid"),
        ("finished_at", "-1"),
        ("checkpoint_id", "\u{ff}"),
    ];
    for (field, junk) in cases {
        let _: i64 = cmd(&mut con, &["DEL", &key]).await;
        let mut args = vec!["HSET", key.as_str()];
        args.extend(valid);
        args.extend([field, junk]);
        let _: i64 = cmd(&mut con, &args).await;
        assert_corrupt_at(runs.get(run).await, &key);
    }
    // A required field missing.
    let _: i64 = cmd(&mut con, &["HDEL", &key, "started_at"]).await;
    assert_corrupt_at(runs.get(run).await, &key);
    // Listed through the thread index, the bad record is named too.
    let _: i64 = cmd(&mut con, &["ZADD", index, "0", &run.to_string()]).await;
    assert_corrupt_at(runs.list_thread(&t).await, &key);
    // A member of the index that is not a run id.
    let _: i64 = cmd(&mut con, &["DEL", &key]).await;
    let _: i64 = cmd(&mut con, &["ZADD", index, "0", "garbage"]).await;
    assert_corrupt_at(runs.list_thread(&t).await, index);

    // The run key holds a string: reading and writing are refused, nothing is written.
    let _: () = cmd(&mut con, &["SET", &key, "not a hash"]).await;
    assert_corrupt_at(runs.get(run).await, &key);
    let _: i64 = cmd(&mut con, &["ZREM", index, "garbage"]).await;
    assert_corrupt_at(runs.list_thread(&t).await, &key);
    let record = run_record(run, &t);
    assert_corrupt_at(runs.put(&record, None).await, &key);
    let value: String = cmd(&mut con, &["GET", &key]).await;
    assert_eq!(value, "not a hash");
    // So does an index, or (fenced or not) a fencing counter, of another type.
    let _: i64 = cmd(&mut con, &["DEL", &key]).await;
    let _: () = cmd(&mut con, &["SET", index, "not a zset"]).await;
    assert_corrupt_at(runs.put(&record, None).await, index);
    let exists: i64 = cmd(&mut con, &["EXISTS", &key]).await;
    assert_eq!(exists, 0, "{key} was not written");
    let _: i64 = cmd(&mut con, &["DEL", index]).await;
    let fence = "runvisor:fence:{junk}";
    let _: i64 = cmd(&mut con, &["HSET", fence, "token", "1"]).await;
    assert_corrupt_at(runs.put(&record, Some(Fence(1))).await, fence);
    assert_corrupt_at(runs.put(&record, None).await, fence);
    for written in [key.as_str(), index] {
        let exists: i64 = cmd(&mut con, &["EXISTS", written]).await;
        assert_eq!(exists, 0, "{written} was not written");
    }
    let _: i64 = cmd(&mut con, &["DEL", fence]).await;
    runs.put(&record, None)
        .await
        .expect("with the junk gone, the record is written");
    let stored = runs.get(run).await.expect("read").expect("written");
    assert_eq!((stored.run_id, stored.status), (run, record.status));
    let _: i64 = cmd(&mut con, &["DEL", &key]).await;

    // A record where older versions kept it (no thread pointer) is read, and judged, there.
    let old = RunId::new();
    let legacy = format!("runvisor:run:{old}");
    let mut args = vec!["HSET", legacy.as_str()];
    args.extend(valid);
    let _: i64 = cmd(&mut con, &args).await;
    let found = runs.get(old).await.expect("legacy record").expect("found");
    assert_eq!(found.thread, t);
    let _: i64 = cmd(&mut con, &["HSET", &legacy, "status", "exploded"]).await;
    assert_corrupt_at(runs.get(old).await, &legacy);
    // The thread pointer holds what is not a thread id.
    let _: () = cmd(
        &mut con,
        &["SET", &format!("runvisor:runthread:{old}"), "a b"],
    )
    .await;
    assert_corrupt_at(runs.get(old).await, &format!("runvisor:runthread:{old}"));
}

#[tokio::test]
async fn junk_history_is_corrupt() {
    let server = RedisServer::start();
    let history = stores(&server).await.history;
    let mut con = raw(&server).await;
    let t = thread("junk");
    let list = "runvisor:hist:{junk}";
    let ids = "runvisor:histids:{junk}";
    let good = Message::user("fine");
    history
        .append(&t, std::slice::from_ref(&good), None)
        .await
        .expect("append");
    let _: i64 = cmd(&mut con, &["RPUSH", list, "{\"id\": 42"]).await;
    assert_corrupt_at(history.load(&t).await, list);
    let _: i64 = cmd(&mut con, &["DEL", list]).await;
    let _: i64 = cmd(
        &mut con,
        &["RPUSH", list, "{\"valid\": \"json\", \"but\": 1}"],
    )
    .await;
    assert_corrupt_at(history.load(&t).await, list);
    // An entry in the compact format whose message is cut short, has bytes after it, or has a
    // format byte no release writes.
    let _: i64 = cmd(&mut con, &["DEL", list, ids]).await;
    history
        .append(&t, std::slice::from_ref(&good), None)
        .await
        .expect("append");
    let mut entries: Vec<Vec<u8>> = cmd(&mut con, &["LRANGE", list, "0", "0"]).await;
    let whole = entries.pop().expect("an entry");
    let cut = whole[..whole.len() - 3].to_vec();
    let mut longer = whole.clone();
    longer.push(0);
    let mut unknown = whole.clone();
    unknown[0] = 7;
    for junk in [cut, longer, unknown, Vec::new()] {
        let _: i64 = cmd(&mut con, &["DEL", list]).await;
        let mut rpush = ::redis::cmd("RPUSH");
        rpush.arg(list).arg(junk);
        let _: i64 = rpush.query_async(&mut con).await.expect("RPUSH");
        assert_corrupt_at(history.load(&t).await, list);
    }

    // The id set is not a set: the append is refused and writes nothing.
    let _: i64 = cmd(&mut con, &["DEL", list, ids]).await;
    let _: () = cmd(&mut con, &["SET", ids, "x"]).await;
    assert_corrupt_at(history.append(&t, &[Message::user("new")], None).await, ids);
    let len: i64 = cmd(&mut con, &["EXISTS", list]).await;
    assert_eq!(len, 0, "nothing was appended");
    // The list is not a list.
    let _: i64 = cmd(&mut con, &["DEL", ids]).await;
    let _: i64 = cmd(&mut con, &["HSET", list, "a", "b"]).await;
    assert_corrupt_at(history.load(&t).await, list);
    assert_corrupt_at(
        history.append(&t, &[Message::user("new")], None).await,
        list,
    );
    let ids_exist: i64 = cmd(&mut con, &["EXISTS", ids]).await;
    assert_eq!(ids_exist, 0, "no id was recorded");
}

#[tokio::test]
async fn junk_checkpoints_are_corrupt() {
    let server = RedisServer::start();
    let checkpoints = stores(&server).await.checkpoints;
    let mut con = raw(&server).await;
    let t = thread("junk");
    let run = RunId::new();
    let id = CheckpointId::new();
    let payload = format!("runvisor:cp:{{junk}}:{id}");
    let index = "runvisor:cpidx:{junk}";
    let sequence = format!("runvisor:cpseq:{{junk}}:{run}");
    let cp = |sequence: u64| StoredCheckpoint {
        id,
        run,
        sequence,
        bytes: b"bytes".to_vec(),
        link: None,
    };
    checkpoints.put(&t, cp(1), None).await.expect("put");

    // A value whose header is missing, of another format, or names no run, sequence, kind,
    // base or parent; each is an error naming the key, from every read.
    let value: Vec<u8> = cmd(&mut con, &["GET", &payload]).await;
    let header = String::from_utf8(value[..61].to_vec()).expect("a text header");
    let delta = format!("{}d{}{id}{id}", &header[..4], &header[5..]);
    let junk = [
        "x".to_owned(),
        format!("rvc9{}", &header[4..]),
        header.replacen(&run.to_string(), "nobody-nobody-nobody-nobody-nobody-n", 1),
        format!("{}many-many-many-many-many", &header[..41]),
        format!("{}x{}", &header[..4], &header[5..]),
        delta[..100].to_owned(),
        delta.replacen(&id.to_string(), "a-parent-that-is-not-an-id-at-all-xx", 2),
    ];
    for value in &junk {
        let _: () = cmd(&mut con, &["SET", &payload, value]).await;
        assert_corrupt_at(checkpoints.get(&t, id).await, &payload);
        assert_corrupt_at(checkpoints.latest(&t).await, &payload);
        assert_corrupt_at(checkpoints.chain(&t, id, 10).await, &payload);
    }
    // As earlier releases wrote it: a hash, whose fields are checked the same way.
    let _: i64 = cmd(&mut con, &["DEL", &payload]).await;
    let _: i64 = cmd(&mut con, &["HSET", &payload, "sequence", "many"]).await;
    assert_corrupt_at(checkpoints.get(&t, id).await, &payload);
    assert_corrupt_at(checkpoints.latest(&t).await, &payload);
    let _: i64 = cmd(
        &mut con,
        &["HSET", &payload, "sequence", "1", "run", "nobody"],
    )
    .await;
    assert_corrupt_at(checkpoints.get(&t, id).await, &payload);
    let _: i64 = cmd(&mut con, &["HDEL", &payload, "bytes", "run"]).await;
    assert_corrupt_at(checkpoints.get(&t, id).await, &payload);
    // A key of another type.
    let _: i64 = cmd(&mut con, &["DEL", &payload]).await;
    let _: i64 = cmd(&mut con, &["RPUSH", &payload, "x"]).await;
    assert_corrupt_at(checkpoints.get(&t, id).await, &payload);
    assert_corrupt_at(checkpoints.chain(&t, id, 10).await, &payload);
    let _: i64 = cmd(&mut con, &["DEL", &payload]).await;
    let _: () = cmd(&mut con, &["SET", &payload, &header]).await;

    let _: i64 = cmd(&mut con, &["ZADD", index, "0", "not-an-id"]).await;
    assert_corrupt_at(checkpoints.list(&t).await, index);
    assert_corrupt_at(checkpoints.latest(&t).await, index);
    // Pruning cleans a malformed entry up like any other.
    assert_eq!(checkpoints.prune(&t, 0).await, Ok(2));
    assert_eq!(checkpoints.list(&t).await, Ok(vec![]));

    // A stored sequence that is not a number refuses the write.
    let _: () = cmd(&mut con, &["SET", &sequence, "seven"]).await;
    assert_corrupt_at(checkpoints.put(&t, cp(2), None).await, &sequence);
    // An index of the wrong type refuses the write, and nothing is written.
    let _: i64 = cmd(&mut con, &["DEL", &sequence]).await;
    let _: () = cmd(&mut con, &["SET", index, "x"]).await;
    assert_corrupt_at(checkpoints.put(&t, cp(3), None).await, index);
    assert_corrupt_at(checkpoints.list(&t).await, index);
    for key in [&payload, &sequence] {
        let exists: i64 = cmd(&mut con, &["EXISTS", key]).await;
        assert_eq!(exists, 0, "{key} was not written");
    }

    // So does a sequence key, or (for a fenced write) a fencing counter, of the wrong type.
    let _: i64 = cmd(&mut con, &["DEL", index]).await;
    let _: i64 = cmd(&mut con, &["RPUSH", &sequence, "x"]).await;
    assert_corrupt_at(checkpoints.put(&t, cp(4), None).await, &sequence);
    let _: i64 = cmd(&mut con, &["DEL", &sequence]).await;
    let fence = "runvisor:fence:{junk}";
    let _: i64 = cmd(&mut con, &["HSET", fence, "token", "1"]).await;
    assert_corrupt_at(checkpoints.put(&t, cp(5), Some(Fence(1))).await, fence);
    for key in [&payload, &sequence, index] {
        let exists: i64 = cmd(&mut con, &["EXISTS", key]).await;
        assert_eq!(exists, 0, "{key} was not written");
    }
}

/// A start reads the thread's history while it records the run: a history that cannot be read
/// fails the start with an error naming the key, the run's record says it failed and why, and
/// the thread is free again (a start after the junk is gone runs).
#[tokio::test]
async fn a_start_over_junk_history_fails_naming_the_key_and_records_why() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let runtime = stores
        .install(runvisor::register_standard_kinds(
            runvisor::Runtime::builder(),
        ))
        .try_build()
        .expect("runtime");
    let workflow = runtime
        .load_json(r#"{"id": "hello", "nodes": [{"id": "start", "kind": "begin"}], "edges": []}"#)
        .expect("valid");
    let mut con = raw(&server).await;
    let t = thread("junk");
    let list = "runvisor:hist:{junk}";
    let _: i64 = cmd(&mut con, &["HSET", list, "a", "b"]).await;

    let error = match runtime
        .start(&workflow, runvisor::Map::new(), t.clone())
        .await
    {
        Err(error) => error,
        Ok(run) => panic!("started over a junk history: {:?}", run.wait().await),
    };
    assert!(
        matches!(&error, runvisor::StartError::History { thread, .. } if *thread == t),
        "{error:?}"
    );
    assert!(error.to_string().contains(list), "{error}");
    let records = stores.runs.list_thread(&t).await.expect("list");
    let [record] = &records[..] else {
        panic!("one record expected: {records:?}")
    };
    assert_eq!(record.status, runvisor::RunStatus::Failed);
    let reason = record.failure_reason.as_deref().unwrap_or_default();
    assert!(reason.contains(list), "{reason}");
    assert!(record.finished_at_ms.is_some());

    let _: i64 = cmd(&mut con, &["DEL", list]).await;
    let run = runtime
        .start(&workflow, runvisor::Map::new(), t.clone())
        .await
        .expect("the thread is free again");
    assert_eq!(run.wait().await.status(), runvisor::RunStatus::Succeeded);
}
