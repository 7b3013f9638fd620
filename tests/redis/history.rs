//! The history store contract on Redis: appends are idempotent by message id and keep their
//! order (within a batch too), messages round trip exactly, and the in-memory store answers
//! the same calls the same way.

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
