//! The key layout as other tools see it: exact key names under the prefix, the `{<thread>}`
//! hash tag on every per-thread key, and the TTL on every key written, refreshed by writes.
//! (The TTLs of ended runs' records, and retention, are in `retention`.)

use std::collections::BTreeSet;
use std::time::Duration;

use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::store::{RunRecord, StoredCheckpoint};
use runvisor::{CheckpointId, Message, RunId, RunLabels, ThreadId};

use super::support::{RedisServer, cmd, config, now_ms, raw, run_record, thread, within};

/// Writes one of everything for a thread; returns the keys that must exist.
async fn write_all(stores: &RedisStores, t: &ThreadId, sequence: u64) -> Vec<String> {
    let run = RunId::new();
    let id = CheckpointId::new();
    let cp = StoredCheckpoint {
        id,
        run,
        sequence,
        bytes: b"snapshot".to_vec(),
        link: None,
    };
    stores
        .checkpoints
        .put(t, cp, None)
        .await
        .expect("checkpoint put");
    stores
        .history
        .append(t, &[Message::user("hi")], None)
        .await
        .expect("history append");
    stores
        .runs
        .put(
            &RunRecord {
                started_at_ms: now_ms(),
                labels: RunLabels::app_chat("app", "chat")
                    .and_then(|l| l.with_user("u-1"))
                    .expect("valid labels"),
                ..run_record(run, t)
            },
            None,
        )
        .await
        .expect("run put");
    let p = stores.config().prefix.clone();
    vec![
        format!("{p}:cp:{{{t}}}:{id}"),
        format!("{p}:cpidx:{{{t}}}"),
        format!("{p}:cpseq:{{{t}}}:{run}"),
        format!("{p}:run:{{{t}}}:{run}"),
        format!("{p}:runs:{{{t}}}"),
        format!("{p}:hist:{{{t}}}"),
        format!("{p}:histids:{{{t}}}"),
        format!("{p}:runthread:{run}"),
        format!("{p}:recent"),
        format!("{p}:open"),
        format!("{p}:threads"),
        format!("{p}:threads:u-1"),
        format!("{p}:users"),
    ]
}

#[tokio::test]
async fn keys_follow_the_layout_and_carry_the_thread_hash_tag() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    let stores = within(
        "connect",
        RedisStores::connect(RedisConfig {
            prefix: "acme:rv".to_owned(),
            ..config(&server)
        }),
    )
    .await
    .expect("connect");
    let t = thread("chat:42");
    let expected = write_all(&stores, &t, 1).await;
    let keys: BTreeSet<String> = cmd::<Vec<String>>(&mut con, &["KEYS", "*"])
        .await
        .into_iter()
        .collect();
    assert_eq!(keys, expected.iter().cloned().collect::<BTreeSet<_>>());
    for key in &keys {
        assert!(key.starts_with("acme:rv:"), "{key} is under the prefix");
        if !key.starts_with("acme:rv:runthread:")
            && !key.starts_with("acme:rv:threads")
            && !["acme:rv:recent", "acme:rv:open", "acme:rv:users"].contains(&key.as_str())
        {
            assert!(key.contains("{chat:42}"), "{key} carries the hash tag");
        }
    }
    let types: Vec<String> = {
        let mut types = Vec::new();
        for key in &expected {
            types.push(cmd::<String>(&mut con, &["TYPE", key]).await);
        }
        types
    };
    assert_eq!(
        types,
        [
            "string", "zset", "string", "hash", "zset", "list", "set", "string", "zset", "zset",
            "set", "set", "set"
        ]
    );
    let scores: Vec<String> =
        cmd(&mut con, &["ZRANGE", &expected[1], "0", "-1", "WITHSCORES"]).await;
    assert_eq!(scores[1], "0", "index entries all have score 0");
}

#[tokio::test]
async fn every_key_written_gets_the_ttl_and_writes_refresh_it() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    let ttl = Duration::from_secs(3600);
    let stores = within(
        "connect",
        RedisStores::connect(RedisConfig {
            checkpoint_ttl: ttl,
            ..config(&server)
        }),
    )
    .await
    .expect("connect");
    let t = thread("ttl");
    let ttl_ms = ttl.as_millis() as i64;
    let keys = write_all(&stores, &t, 1).await;
    for key in &keys {
        let pttl: i64 = cmd(&mut con, &["PTTL", key]).await;
        assert!(
            pttl > ttl_ms - 60_000 && pttl <= ttl_ms,
            "{key} has the configured TTL, got {pttl}ms"
        );
    }
    // Shorten every TTL, then write again: each thread key written is refreshed.
    for key in &keys {
        let _: i64 = cmd(&mut con, &["PEXPIRE", key, "10000"]).await;
    }
    let again = write_all(&stores, &t, 2).await;
    // Per-thread keys (index, run index, history) are shared by both writes.
    for key in [&keys[1], &keys[4], &keys[5], &keys[6]] {
        let pttl: i64 = cmd(&mut con, &["PTTL", key]).await;
        assert!(
            pttl > 10_000,
            "{key} was refreshed by the write, got {pttl}ms"
        );
    }
    for key in &again {
        let pttl: i64 = cmd(&mut con, &["PTTL", key]).await;
        assert!(pttl > ttl_ms - 60_000, "{key} has the TTL, got {pttl}ms");
    }
    // The first run's record and sequence were not written again: their short TTL stands.
    for key in [&keys[2], &keys[3]] {
        let pttl: i64 = cmd(&mut con, &["PTTL", key]).await;
        assert!(pttl <= 10_000, "{key} untouched, got {pttl}ms");
    }
}
