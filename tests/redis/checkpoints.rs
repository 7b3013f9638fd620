//! The checkpoint store contract on Redis: exact id order for `list` and `latest`, exact
//! round trips of binary payloads, stale sequences refused without a trace, pruning of the
//! oldest. The in-memory store answers the same sequence of calls as the reference.

use runvisor::store::memory::MemoryCheckpointStore;
use runvisor::store::{CheckpointStore, StoredCheckpoint};
use runvisor::{CheckpointId, RunId, StoreError};

use super::support::{RedisServer, cmd, raw, stores, stores_keeping_all, thread, within};

fn checkpoint(id: CheckpointId, run: RunId, sequence: u64, bytes: &[u8]) -> StoredCheckpoint {
    StoredCheckpoint {
        id,
        run,
        sequence,
        bytes: bytes.to_vec(),
        link: None,
    }
}

/// `n` checkpoint ids in creation (= text) order.
fn ids(n: usize) -> Vec<CheckpointId> {
    let ids: Vec<CheckpointId> = (0..n).map(|_| CheckpointId::new()).collect();
    let mut sorted = ids.clone();
    sorted.sort_by_key(|id| id.to_string());
    assert_eq!(ids, sorted, "UUIDv7 ids are created in text order");
    ids
}

#[tokio::test]
async fn put_get_latest_and_list_in_exact_id_order() {
    let server = RedisServer::start();
    let redis = stores(&server).await.checkpoints;
    let memory = MemoryCheckpointStore::new();
    let t = thread("chat:42");
    let (a, b) = (RunId::new(), RunId::new());
    let ids = ids(6);
    // Written out of id order, by two runs.
    let writes = [
        checkpoint(ids[3], a, 1, b"a1"),
        checkpoint(ids[0], b, 1, b"b1"),
        checkpoint(ids[5], a, 2, b"a2"),
        checkpoint(ids[1], b, 2, b"b2"),
        checkpoint(ids[2], a, 3, b"a3"),
        checkpoint(ids[4], b, 7, b"b7"),
    ];
    assert_eq!(redis.latest(&t).await, Ok(None));
    assert_eq!(redis.list(&t).await, Ok(vec![]));
    for w in &writes {
        assert_eq!(memory.put(&t, w.clone(), None).await, Ok(()));
        assert_eq!(redis.put(&t, w.clone(), None).await, Ok(()));
        assert_eq!(redis.list(&t).await, memory.list(&t).await);
        assert_eq!(redis.latest(&t).await, memory.latest(&t).await);
    }
    assert_eq!(redis.list(&t).await, Ok(ids.clone()));
    assert_eq!(redis.latest(&t).await, Ok(Some(writes[2].clone())));
    for w in &writes {
        assert_eq!(redis.get(&t, w.id).await, Ok(Some(w.clone())));
    }
    assert_eq!(redis.get(&t, CheckpointId::new()).await, Ok(None));
    // Another thread sees none of it.
    let other = thread("chat:43");
    assert_eq!(redis.list(&other).await, Ok(vec![]));
    assert_eq!(redis.get(&other, ids[0]).await, Ok(None));
}

#[tokio::test]
async fn stale_sequences_are_refused_and_leave_no_trace() {
    let server = RedisServer::start();
    let redis = stores(&server).await.checkpoints;
    let memory = MemoryCheckpointStore::new();
    let t = thread("stale");
    let (a, b) = (RunId::new(), RunId::new());
    let ids = ids(8);
    let first = checkpoint(ids[0], a, 5, b"five");
    for store in [&*redis, &memory as &dyn CheckpointStore] {
        assert_eq!(store.put(&t, first.clone(), None).await, Ok(()));
        for (id, sequence) in [(ids[1], 5), (ids[2], 3), (ids[3], 0)] {
            assert_eq!(
                store
                    .put(&t, checkpoint(id, a, sequence, b"late"), None)
                    .await,
                Err(StoreError::StaleSequence {
                    run: a,
                    sequence,
                    stored: 5
                })
            );
            assert_eq!(store.get(&t, id).await, Ok(None));
        }
        assert_eq!(store.list(&t).await, Ok(vec![ids[0]]));
        assert_eq!(store.latest(&t).await, Ok(Some(first.clone())));
        // Sequences are per run.
        assert_eq!(
            store.put(&t, checkpoint(ids[4], b, 1, b"b"), None).await,
            Ok(())
        );
        assert_eq!(
            store.put(&t, checkpoint(ids[5], a, 6, b"six"), None).await,
            Ok(())
        );
    }
    // Compared exactly beyond 2^53, where a Lua number would round.
    let big = 1u64 << 53;
    assert_eq!(
        redis
            .put(&t, checkpoint(ids[6], b, big + 2, b""), None)
            .await,
        Ok(())
    );
    assert_eq!(
        redis
            .put(&t, checkpoint(ids[7], b, big + 1, b""), None)
            .await,
        Err(StoreError::StaleSequence {
            run: b,
            sequence: big + 1,
            stored: big + 2
        })
    );
    assert_eq!(
        redis
            .put(&t, checkpoint(CheckpointId::new(), b, u64::MAX, b""), None)
            .await,
        Ok(())
    );
    assert_eq!(
        redis
            .put(&t, checkpoint(CheckpointId::new(), b, u64::MAX, b""), None)
            .await,
        Err(StoreError::StaleSequence {
            run: b,
            sequence: u64::MAX,
            stored: u64::MAX
        })
    );
}

#[tokio::test]
async fn payloads_are_binary_safe() {
    let server = RedisServer::start();
    let redis = stores(&server).await.checkpoints;
    let t = thread("binary");
    let run = RunId::new();
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let large: Vec<u8> = (0..1_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let payloads: [&[u8]; 5] = [
        &every_byte,
        b"",
        b"\0\0\0",
        &[0xff, 0xfe, 0x80, 0xc3, 0x28, b'\r', b'\n'],
        &large,
    ];
    for (i, bytes) in payloads.iter().enumerate() {
        let cp = checkpoint(CheckpointId::new(), run, i as u64 + 1, bytes);
        assert_eq!(redis.put(&t, cp.clone(), None).await, Ok(()));
        assert_eq!(redis.get(&t, cp.id).await, Ok(Some(cp.clone())));
        assert_eq!(redis.latest(&t).await, Ok(Some(cp)));
    }
}

#[tokio::test]
async fn prune_removes_the_oldest_payloads_and_index_entries() {
    let server = RedisServer::start();
    // Writes keep everything: `prune` alone removes.
    let redis = stores_keeping_all(&server).await.checkpoints;
    let mut con = raw(&server).await;
    let t = thread("prune");
    let run = RunId::new();
    // More than one prune batch.
    let ids = ids(300);
    for (i, id) in ids.iter().enumerate() {
        let cp = checkpoint(*id, run, i as u64 + 1, &[i as u8]);
        redis.put(&t, cp, None).await.expect("put");
    }
    assert_eq!(within("prune", redis.prune(&t, 10)).await, Ok(290));
    assert_eq!(redis.list(&t).await, Ok(ids[290..].to_vec()));
    let gone = format!("runvisor:cp:{{prune}}:{}", ids[289]);
    let kept = format!("runvisor:cp:{{prune}}:{}", ids[290]);
    assert_eq!(cmd::<i64>(&mut con, &["EXISTS", &gone]).await, 0);
    assert_eq!(cmd::<i64>(&mut con, &["EXISTS", &kept]).await, 1);
    let all: Vec<String> = cmd(&mut con, &["KEYS", "runvisor:cp:{prune}:*"]).await;
    assert_eq!(all.len(), 10, "only the kept payloads remain");
    assert_eq!(redis.prune(&t, 10).await, Ok(0));
    assert_eq!(redis.prune(&t, usize::MAX).await, Ok(0));
    assert_eq!(redis.prune(&t, 1).await, Ok(9));
    assert_eq!(
        redis.latest(&t).await.map(|c| c.map(|c| c.id)),
        Ok(Some(ids[299]))
    );
    assert_eq!(redis.prune(&t, 0).await, Ok(1));
    assert_eq!(redis.list(&t).await, Ok(vec![]));
    assert_eq!(redis.latest(&t).await, Ok(None));
    assert_eq!(redis.prune(&thread("never-written"), 0).await, Ok(0));

    // The same calls on the reference store give the same answers.
    let memory = MemoryCheckpointStore::keeping(None);
    let run = RunId::new();
    for (i, id) in ids.iter().take(5).enumerate() {
        let cp = checkpoint(*id, run, i as u64 + 1, b"x");
        memory.put(&t, cp.clone(), None).await.expect("put");
        redis.put(&t, cp, None).await.expect("put");
    }
    for keep in [3, 3, 1, 0] {
        assert_eq!(redis.prune(&t, keep).await, memory.prune(&t, keep).await);
        assert_eq!(redis.list(&t).await, memory.list(&t).await);
    }
}

#[tokio::test]
async fn index_entries_whose_payload_expired_read_as_absent_and_are_dropped_when_seen() {
    let server = RedisServer::start();
    let redis = stores(&server).await.checkpoints;
    let mut con = raw(&server).await;
    let t = thread("expired");
    let index = "runvisor:cpidx:{expired}";
    let run = RunId::new();
    let ids = ids(5);
    for (i, id) in ids.iter().enumerate() {
        let cp = checkpoint(*id, run, i as u64 + 1, b"x");
        redis.put(&t, cp, None).await.expect("put");
    }
    // As if payloads had expired while the index lived on.
    for id in [ids[0], ids[2], ids[4]] {
        let payload = format!("runvisor:cp:{{expired}}:{id}");
        assert_eq!(cmd::<i64>(&mut con, &["DEL", &payload]).await, 1);
    }
    let range = ["ZRANGE", index, "0", "-1"];
    // `get` of an expired checkpoint drops its entry.
    assert_eq!(redis.get(&t, ids[2]).await, Ok(None));
    assert!(
        !cmd::<Vec<String>>(&mut con, &range)
            .await
            .contains(&ids[2].to_string())
    );
    // `latest` skips and drops the newer entries whose payload is gone.
    assert_eq!(
        redis.latest(&t).await.map(|c| c.map(|c| c.id)),
        Ok(Some(ids[3])),
        "latest skips the entry whose payload is gone"
    );
    assert!(
        !cmd::<Vec<String>>(&mut con, &range)
            .await
            .contains(&ids[4].to_string())
    );
    // `list` answers and keeps only entries with a payload.
    assert_eq!(redis.list(&t).await, Ok(vec![ids[1], ids[3]]));
    assert_eq!(
        cmd::<Vec<String>>(&mut con, &range).await,
        vec![ids[1].to_string(), ids[3].to_string()]
    );
}
