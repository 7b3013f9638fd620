//! The checkpoint-ops seed's endpoints on `runvisor serve` with a real `redis-server`:
//! `GET /api/v0/checkpoint/direct/stats[?user_id=]` and `POST
//! /api/v0/checkpoint/direct/cleanup` answer the seed's JSON, compared whole against the
//! seed's own examples (only the timestamp differs, and is checked for the seed's format), on
//! the `checkpoint:{user}:{timestamp}:{id}` layout and on runvisor's native layout holding
//! the same threads; a thread given wins over a user; the layout and keep count default to
//! the config's; bad ids, a service in memory and a missing token are refused in the
//! documented shapes.

use runvisor::store::{RunStatus, StoredCheckpoint};
use runvisor::{CheckpointId, RunId, RunLabels};
use serde_json::{Value, json};

use super::support::{RedisServer, cmd, raw, run_record, stores_keeping_all, thread};

use super::serve::server::{Answer, Server};

/// The seed's threads and their checkpoint counts.
const SEED: [(&str, usize); 4] = [
    ("wang1:20250729235038043", 36),
    ("wang1:20250731141657916", 16),
    ("wang1:20250801171843665", 64),
    ("wang2:20250731141659949", 16),
];

/// The seed's example timestamp, which every answer's is replaced with once checked.
const SEED_TIME: &str = "2025-01-31T10:30:00";

/// Writes the seed's threads as `checkpoint:<user>:<timestamp>:<id>` keys.
async fn compat_data(server: &RedisServer) {
    let mut con = raw(server).await;
    for (thread, n) in SEED {
        for i in 0..n {
            let key = format!("checkpoint:{thread}:{:04}-{}", i, CheckpointId::new());
            let _: () = cmd(&mut con, &["SET", &key, "{}"]).await;
        }
    }
}

/// Writes the seed's threads on the native layout: a stopped run of the thread's user, and its
/// checkpoints.
async fn native_data(server: &RedisServer) {
    let stores = stores_keeping_all(server).await;
    for (id, n) in SEED {
        let t = thread(id);
        let user = id.split(':').next().expect("a user");
        let run = RunId::new();
        let record = runvisor::store::RunRecord {
            status: RunStatus::Stopped,
            labels: RunLabels::default().with_user(user).expect("valid user"),
            ..run_record(run, &t)
        };
        stores.runs.put(&record, None).await.expect("record");
        for sequence in 1..=n {
            let checkpoint = StoredCheckpoint {
                id: CheckpointId::new(),
                run,
                sequence: sequence as u64,
                bytes: b"snapshot".to_vec(),
                link: None,
            };
            stores
                .checkpoints
                .put(&t, checkpoint, None)
                .await
                .expect("checkpoint");
        }
    }
}

/// The answer's body with its timestamp checked (`YYYY-MM-DDTHH:MM:SS`, the seed's format)
/// and replaced with the seed's.
fn seed_timed(answer: &Answer) -> Value {
    let mut body = answer.body.clone();
    let time = body["data"]["timestamp"].as_str().unwrap_or("").to_owned();
    let shape: Vec<bool> = time.chars().map(|c| c.is_ascii_digit()).collect();
    let digits: Vec<bool> = SEED_TIME.chars().map(|c| c.is_ascii_digit()).collect();
    assert_eq!(shape, digits, "the seed's timestamp format: {time:?}");
    assert!(
        time.starts_with("20") && time.as_bytes()[10] == b'T',
        "{time:?}"
    );
    body["data"]["timestamp"] = json!(SEED_TIME);
    body
}

/// The seed's "全部统计信息" example, verbatim.
fn seed_system_stats() -> Value {
    json!({
      "code": 200,
      "success": true,
      "message": "获取系统checkpoint统计成功",
      "data": {
        "operation_type": "system_stats",
        "total_users": 2,
        "total_threads": 4,
        "total_checkpoints": 132,
        "users": [
          {
            "user_id": "wang1",
            "thread_count": 3,
            "total_checkpoints": 116,
            "threads": [
              {"thread_id": "wang1:20250729235038043", "checkpoint_count": 36},
              {"thread_id": "wang1:20250731141657916", "checkpoint_count": 16},
              {"thread_id": "wang1:20250801171843665", "checkpoint_count": 64}
            ]
          },
          {
            "user_id": "wang2",
            "thread_count": 1,
            "total_checkpoints": 16,
            "threads": [
              {"thread_id": "wang2:20250731141659949", "checkpoint_count": 16}
            ]
          }
        ],
        "timestamp": "2025-01-31T10:30:00"
      }
    })
}

/// The seed's "指定用户统计信息" example, verbatim.
fn seed_user_stats() -> Value {
    json!({
      "code": 200,
      "success": true,
      "message": "获取用户wang1统计成功",
      "data": {
        "operation_type": "user_stats",
        "user_id": "wang1",
        "thread_count": 3,
        "total_checkpoints": 116,
        "threads": [
          {"thread_id": "wang1:20250801171843665", "checkpoint_count": 64},
          {"thread_id": "wang1:20250729235038043", "checkpoint_count": 36},
          {"thread_id": "wang1:20250731141657916", "checkpoint_count": 16}
        ],
        "timestamp": "2025-01-31T10:30:00"
      }
    })
}

/// Every field of `actual` against `expected`, naming the first that differs.
fn same(actual: &Value, expected: &Value, at: &str) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            let keys =
                |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<String>>();
            let (mut ak, mut ek) = (keys(a), keys(e));
            ak.sort();
            ek.sort();
            assert_eq!(ak, ek, "the fields of {at}");
            for (k, v) in e {
                same(&a[k], v, &format!("{at}.{k}"));
            }
        }
        (Value::Array(a), Value::Array(e)) => {
            assert_eq!(a.len(), e.len(), "the length of {at}");
            for (i, (a, e)) in a.iter().zip(e).enumerate() {
                same(a, e, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(actual, expected, "{at}"),
    }
}

/// The stats and cleanups of the seed's examples, on one layout.
async fn seed_examples(s: &Server, layout: &str) {
    let q = format!("layout={layout}");
    let all = s.get(&format!("/api/v0/checkpoint/direct/stats?{q}")).await;
    assert_eq!(all.status, 200, "{all:?}");
    same(&seed_timed(&all), &seed_system_stats(), layout);
    let one = s
        .get(&format!(
            "/api/v0/checkpoint/direct/stats?user_id=wang1&{q}"
        ))
        .await;
    assert_eq!(one.status, 200, "{one:?}");
    same(&seed_timed(&one), &seed_user_stats(), layout);

    // A thread given wins over a user; keep_count as given.
    let path = format!("/api/v0/checkpoint/direct/cleanup?{q}");
    let thread = s
        .post(
            &path,
            json!({"thread_id": "wang1:20250729235038043", "user_id": "wang2", "keep_count": 10}),
        )
        .await;
    assert_eq!(thread.status, 200, "{thread:?}");
    let expected = json!({
      "code": 200,
      "success": true,
      "message": "Checkpoint清理完成",
      "data": {
        "operation_type": "cleanup_thread",
        "target": "wang1:20250729235038043",
        "keep_count": 10,
        "total_processed": 1,
        "total_deleted": 26,
        "details": {
          "wang1:20250729235038043": {
            "original_count": 36, "deleted_count": 26, "remaining_count": 10, "status": "success"
          }
        },
        "timestamp": SEED_TIME
      }
    });
    same(&seed_timed(&thread), &expected, layout);

    // A user's threads; keep_count defaults to 10 (the seed's CHECKPOINT_KEEP_COUNT).
    let user = s.post(&path, json!({"user_id": "wang1"})).await;
    assert_eq!(user.status, 200, "{user:?}");
    let expected = json!({
      "code": 200,
      "success": true,
      "message": "Checkpoint清理完成",
      "data": {
        "operation_type": "cleanup_user",
        "target": "wang1",
        "keep_count": 10,
        "total_processed": 3,
        "total_deleted": 60,
        "details": {
          "wang1:20250729235038043": {
            "original_count": 10, "deleted_count": 0, "remaining_count": 10, "status": "success"
          },
          "wang1:20250731141657916": {
            "original_count": 16, "deleted_count": 6, "remaining_count": 10, "status": "success"
          },
          "wang1:20250801171843665": {
            "original_count": 64, "deleted_count": 54, "remaining_count": 10, "status": "success"
          }
        },
        "timestamp": SEED_TIME
      }
    });
    same(&seed_timed(&user), &expected, layout);

    // Everything (empty ids are absent, as the seed reads them).
    let all = s
        .post(
            &path,
            json!({"keep_count": 5, "user_id": "", "thread_id": null}),
        )
        .await;
    assert_eq!(all.status, 200, "{all:?}");
    let data = &seed_timed(&all)["data"];
    assert_eq!(data["operation_type"], "cleanup_all", "{layout}");
    assert_eq!(data["target"], "all");
    assert_eq!(
        (
            data["total_processed"].clone(),
            data["total_deleted"].clone()
        ),
        (json!(4), json!(5 * 3 + 11)),
        "{layout}: {data}"
    );
    let left = s.get(&format!("/api/v0/checkpoint/direct/stats?{q}")).await;
    assert_eq!(
        left.body["data"]["total_checkpoints"], 20,
        "{layout}: {left:?}"
    );
    // The largest keep count keeps everything.
    let most = s.post(&path, json!({"keep_count": u64::MAX})).await;
    assert_eq!(most.status, 200, "{layout}: {most:?}");
    assert_eq!(most.body["data"]["total_deleted"], 0, "{layout}: {most:?}");
    assert_eq!(
        most.body["data"]["keep_count"],
        u64::MAX,
        "{layout}: {most:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_cleanup_answer_the_seeds_json_on_both_layouts() {
    let redis = RedisServer::start();
    compat_data(&redis).await;
    native_data(&redis).await;
    let s = Server::start(&["--redis", &redis.url()], &[]);
    seed_examples(&s, "compat").await;
    seed_examples(&s, "native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layout_and_keep_count_default_to_the_config_and_a_cleanup_body_may_name_them() {
    let redis = RedisServer::start();
    compat_data(&redis).await;
    let s = Server::start(&["--redis", &redis.url()], &[]);
    let native = s.get("/api/v0/checkpoint/direct/stats").await;
    assert_eq!(native.status, 200, "{native:?}");
    assert_eq!(native.body["data"]["total_checkpoints"], 0, "{native:?}");
    let cleaned = s
        .post(
            "/api/v0/checkpoint/direct/cleanup",
            json!({"user_id": "wang2", "keep_count": 1, "layout": "compat"}),
        )
        .await;
    assert_eq!(cleaned.body["data"]["total_deleted"], 15, "{cleaned:?}");

    // The config may make compat the default layout, and change the default keep count.
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("runvisor.json");
    let config = json!({"serve": {"checkpoint_layout": "compat", "checkpoint_keep_count": 3}});
    std::fs::write(&path, config.to_string()).expect("write the config");
    let path = path.to_str().expect("a UTF-8 path");
    let s = Server::start(&["--config", path, "--redis", &redis.url()], &[]);
    let stats = s.get("/api/v0/checkpoint/direct/stats").await;
    assert_eq!(
        stats.body["data"]["total_checkpoints"],
        132 - 15,
        "{stats:?}"
    );
    let cleaned = s
        .post(
            "/api/v0/checkpoint/direct/cleanup",
            json!({"thread_id": "wang1:20250731141657916"}),
        )
        .await;
    assert_eq!(cleaned.body["data"]["keep_count"], 3, "{cleaned:?}");
    assert_eq!(cleaned.body["data"]["total_deleted"], 13, "{cleaned:?}");
    let native = s.get("/api/v0/checkpoint/direct/stats?layout=native").await;
    assert_eq!(native.body["data"]["total_checkpoints"], 0, "{native:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ids_memory_and_missing_tokens_are_refused_in_the_documented_shapes() {
    let redis = RedisServer::start();
    let s = Server::start(&["--redis", &redis.url()], &["--token", "t0k"]);
    let refused = s.get("/api/v0/checkpoint/direct/stats").await;
    assert_eq!((refused.status, refused.code()), (401, "unauthorized"));
    let refused = s.post("/api/v0/checkpoint/direct/cleanup", json!({})).await;
    assert_eq!((refused.status, refused.code()), (401, "unauthorized"));
    let s = s.with_token("t0k");

    // Ids the layout cannot hold: the seed's error shape, before Redis is asked.
    let bad = s
        .post(
            "/api/v0/checkpoint/direct/cleanup?layout=compat",
            json!({"thread_id": "no-timestamp"}),
        )
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    let mut body = seed_timed(&bad);
    assert!(
        body["data"]["response"]
            .as_str()
            .is_some_and(|r| r.contains("no-timestamp")),
        "{bad:?}"
    );
    body["data"]["response"] = json!("具体错误信息");
    same(
        &body,
        &json!({
          "code": 400,
          "success": false,
          "message": "请求处理失败",
          "data": {
            "response": "具体错误信息",
            "error_type": "INVALID_THREAD_ID",
            "timestamp": SEED_TIME
          }
        }),
        "bad thread",
    );
    let bad = s
        .get("/api/v0/checkpoint/direct/stats?user_id=a:b&layout=compat")
        .await;
    assert_eq!(
        (bad.status, bad.body["data"]["error_type"].clone()),
        (400, json!("INVALID_USER_ID")),
        "{bad:?}"
    );
    let bad = s
        .post(
            "/api/v0/checkpoint/direct/cleanup",
            json!({"thread_id": "a b"}),
        )
        .await;
    assert_eq!(
        (bad.status, bad.body["data"]["error_type"].clone()),
        (400, json!("INVALID_THREAD_ID")),
        "{bad:?}"
    );
    // Malformed requests: the service's own 400.
    for body in [
        json!({"keep_count": 0}),
        json!({"keep_count": "ten"}),
        json!({"layout": "x"}),
    ] {
        let bad = s.post("/api/v0/checkpoint/direct/cleanup", body).await;
        assert_eq!((bad.status, bad.code()), (400, "bad_request"), "{bad:?}");
    }
    let bad = s.get("/api/v0/checkpoint/direct/stats?layout=x").await;
    assert_eq!((bad.status, bad.code()), (400, "bad_request"), "{bad:?}");

    // Redis gone: REDIS_CONNECTION_ERROR.
    drop(redis);
    let gone = s.get("/api/v0/checkpoint/direct/stats").await;
    assert_eq!(
        (
            gone.status,
            gone.body["success"].clone(),
            gone.body["data"]["error_type"].clone()
        ),
        (500, json!(false), json!("REDIS_CONNECTION_ERROR")),
        "{gone:?}"
    );

    // In memory: 501 NOT_ON_REDIS.
    let memory = Server::start(&[], &[]);
    for answer in [
        memory.get("/api/v0/checkpoint/direct/stats").await,
        memory
            .post("/api/v0/checkpoint/direct/cleanup", json!({}))
            .await,
    ] {
        assert_eq!(answer.status, 501, "{answer:?}");
        assert_eq!(answer.body["code"], 501);
        assert_eq!(answer.body["success"], false);
        assert_eq!(
            answer.body["data"]["error_type"], "NOT_ON_REDIS",
            "{answer:?}"
        );
    }
}
