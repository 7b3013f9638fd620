//! The history store contract on Redis: appends are idempotent by message id and keep their
//! order (within a batch too), messages round trip exactly, and the in-memory store answers
//! the same calls the same way. A history written by an earlier release (JSON entries, text
//! ids) is still read and still deduplicates; entries are compact.

use runvisor::store::HistoryStore;
use runvisor::store::memory::MemoryHistoryStore;
use runvisor::{Message, NodeId, Role, RunId};

use super::support::{RedisServer, cmd, raw, stores, thread};

#[tokio::test]
async fn appends_are_idempotent_and_in_order() {
    let server = RedisServer::start();
    let redis = stores(&server).await.history;
    let memory = MemoryHistoryStore::new();
    let t = thread("chat:42");
    let [a, b, c, d] = ["a", "b", "c", "d"].map(Message::user);
    let batches: [Vec<Message>; 6] = [
        vec![a.clone(), b.clone()],
        vec![b.clone(), c.clone()],
        vec![a.clone()],
        vec![],
        vec![d.clone(), d.clone(), c.clone()],
        vec![a.clone(), b.clone(), c.clone(), d.clone()],
    ];
    assert_eq!(redis.load(&t).await, Ok(vec![]));
    for batch in &batches {
        redis.append(&t, batch, None).await.expect("append");
        memory.append(&t, batch, None).await.expect("append");
        assert_eq!(redis.load(&t).await, memory.load(&t).await);
    }
    assert_eq!(redis.load(&t).await, Ok(vec![a, b, c, d]));
    let mut con = raw(&server).await;
    let ids: i64 = cmd(&mut con, &["SCARD", "runvisor:histids:{chat:42}"]).await;
    assert_eq!(ids, 4);
    assert_eq!(redis.load(&thread("chat:43")).await, Ok(vec![]));
}

#[tokio::test]
async fn messages_round_trip_exactly() {
    let server = RedisServer::start();
    let redis = stores(&server).await.history;
    let t = thread("exact");
    let mut full = Message::new(
        Role::Tool,
        "line one\nline two \"quoted\" \\ back\u{0}slash «unicode» 🦀",
    );
    full.run_id = Some(RunId::new());
    full.node_id = Some(NodeId::new("tool_1").expect("valid"));
    full.truncated = true;
    full.created_at_ms = u64::MAX;
    let plain = Message::new(Role::System, "");
    redis
        .append(&t, &[full.clone(), plain.clone()], None)
        .await
        .expect("append");
    assert_eq!(redis.load(&t).await, Ok(vec![full, plain]));
}

/// What an earlier release wrote: JSON entries and text ids. They load, and appending a
/// message whose id was recorded as text does not add it again.
#[tokio::test]
async fn a_history_written_as_json_with_text_ids_is_read_and_kept_idempotent() {
    let server = RedisServer::start();
    let redis = stores(&server).await.history;
    let mut con = raw(&server).await;
    let t = thread("legacy");
    let mut old = Message::assistant("written by an earlier release");
    old.run_id = Some(RunId::new());
    old.node_id = Some(NodeId::new("answer").expect("valid"));
    let json = serde_json::to_string(&old).expect("json");
    let _: i64 = cmd(&mut con, &["RPUSH", "runvisor:hist:{legacy}", &json]).await;
    let text_id = old.id.to_string();
    let _: i64 = cmd(&mut con, &["SADD", "runvisor:histids:{legacy}", &text_id]).await;
    assert_eq!(redis.load(&t).await, Ok(vec![old.clone()]));

    let new = Message::user("written now");
    redis
        .append(&t, &[old.clone(), new.clone()], None)
        .await
        .expect("append");
    redis
        .append(&t, std::slice::from_ref(&new), None)
        .await
        .expect("append again");
    assert_eq!(redis.load(&t).await, Ok(vec![old, new]));
    let len: i64 = cmd(&mut con, &["LLEN", "runvisor:hist:{legacy}"]).await;
    assert_eq!(len, 2);
}

/// An entry holds the text and about 45 bytes more (ids as their 16 bytes); the id set holds
/// 16 bytes per id.
#[tokio::test]
async fn entries_and_ids_are_compact() {
    let server = RedisServer::start();
    let redis = stores(&server).await.history;
    let mut con = raw(&server).await;
    let t = thread("compact");
    let text = "The answer, about sixty bytes long, as an agent would write it.";
    let mut message = Message::assistant(text);
    message.run_id = Some(RunId::new());
    message.node_id = Some(NodeId::new("t").expect("valid"));
    redis
        .append(&t, std::slice::from_ref(&message), None)
        .await
        .expect("append");
    let entry: Vec<Vec<u8>> =
        cmd(&mut con, &["LRANGE", "runvisor:hist:{compact}", "0", "-1"]).await;
    let json = serde_json::to_string(&message).expect("json");
    assert_eq!(entry.len(), 1);
    let overhead = entry[0].len() - text.len();
    assert!(
        overhead <= 50,
        "{overhead} bytes besides the text (JSON: {})",
        json.len() - text.len()
    );
    let ids: Vec<Vec<u8>> = cmd(&mut con, &["SMEMBERS", "runvisor:histids:{compact}"]).await;
    assert_eq!(ids, [message.id.as_uuid().as_bytes().to_vec()]);
}
