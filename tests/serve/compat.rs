//! The seeds' stop endpoints over HTTP, their answers compared field by field with the shapes
//! the seeds give: FastGPT's `POST /api/v2/chat/stop` (`{appId, chatId}` -> `{success}`) and
//! NexAU's `POST /stop` (`StopRequest` -> `StopResponse`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::server::Server;
use super::sleepy;

/// `start -> greet (stream_text, which appends an assistant message) -> a (sleep
/// {{sys.query}})`: a run that has persisted two messages (the query, the greeting) when it
/// sleeps.
fn greeting() -> Value {
    json!({"id": "greeting", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "greet", "kind": "stream_text", "params": {"text": "hello", "interval": "1ms"}},
        {"id": "a", "kind": "sleep", "params": {"duration": "{{sys.query}}"}}
    ], "edges": [{"from": "start", "to": "greet"}, {"from": "greet", "to": "a"}]})
}

/// Starts `sleepy` on `thread` for 60 s with `labels` (`app`, `chat`) and returns the run id
/// once it sleeps in node `a`.
async fn sleeping(server: &Server, thread: &str, labels: Value) -> String {
    sleeping_in(server, sleepy(), thread, labels).await
}

async fn sleeping_in(server: &Server, workflow: Value, thread: &str, labels: Value) -> String {
    let mut body = json!({"workflow": workflow, "inputs": {"query": "60s"}, "thread": thread});
    if let (Value::Object(body), Value::Object(labels)) = (&mut body, labels) {
        body.extend(labels);
    }
    let run = server.start_run(body).await;
    server
        .until(
            "the run to sleep in node a",
            &format!("/v1/runs/{run}"),
            |a| a.body["nodes"] == json!(["a"]),
        )
        .await;
    run
}

#[tokio::test]
async fn fastgpt_chat_stop_stops_the_run_of_that_app_and_chat() {
    let server = Server::start(&[], &[]);
    let run = sleeping(
        &server,
        "fg-1",
        json!({"app": "app_123456", "chat": "chat_789012"}),
    )
    .await;
    // Another chat of the same app goes on.
    let other = sleeping(
        &server,
        "fg-2",
        json!({"app": "app_123456", "chat": "chat_other"}),
    )
    .await;

    // FastGPT's client also sends outLinkAuthData; it is ignored, as zod strips it.
    let stopped = server
        .post(
            "/api/v2/chat/stop",
            json!({"appId": "app_123456", "chatId": "chat_789012", "outLinkAuthData": {}}),
        )
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    assert_eq!(stopped.body, json!({"success": true}));
    // The run ended within the wait: the answer came after the stop result.
    let record = server.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(record.body["status"], "stopped", "{record:?}");
    assert_eq!(record.body["stop_reason"], "user_interrupted", "{record:?}");
    let other = server.get(&format!("/v1/runs/{other}")).await;
    assert_eq!(other.body["status"], "running", "{other:?}");

    // No live run of that app and chat (any more): success all the same, and at once.
    let asked = Instant::now();
    let again = server
        .post(
            "/api/v2/chat/stop",
            json!({"appId": "app_123456", "chatId": "chat_789012"}),
        )
        .await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.body, json!({"success": true}));
    assert!(asked.elapsed() < Duration::from_secs(4), "no run, no wait");

    // The seed's schema: both ids required, chatId not empty.
    let missing = server
        .post("/api/v2/chat/stop", json!({"appId": "app_123456"}))
        .await;
    assert_eq!((missing.status, missing.code()), (400, "bad_request"));
    let empty = server
        .post(
            "/api/v2/chat/stop",
            json!({"appId": "app_123456", "chatId": ""}),
        )
        .await;
    assert_eq!((empty.status, empty.code()), (400, "bad_request"));
    // Ids are checked before they reach a store, as run labels are.
    let spaced = server
        .post(
            "/api/v2/chat/stop",
            json!({"appId": "app 1", "chatId": "chat_789012"}),
        )
        .await;
    assert_eq!((spaced.status, spaced.code()), (400, "invalid_id"));
}

#[tokio::test]
async fn nexau_stop_answers_a_stop_response() {
    let server = Server::start(&[], &[]);
    let run = sleeping_in(&server, greeting(), "sess-1", json!({"user": "u-1"})).await;

    let stopped = server
        .post(
            "/stop",
            json!({"user_id": "u-1", "session_id": "sess-1", "force": false, "timeout": 5.0}),
        )
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    // message_count: the messages the run persisted, as its outcome lists them.
    let record = server.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(record.body["status"], "stopped", "{record:?}");
    let persisted = record.body["outcome"]["messages"]
        .as_array()
        .expect("the outcome's messages")
        .len();
    // The user's query and greet's assistant message.
    assert_eq!(persisted, 2, "{record:?}");
    assert_eq!(
        stopped.body,
        json!({
            "status": "success",
            "stop_reason": "USER_INTERRUPTED",
            "message_count": 2,
            "error": null,
        })
    );

    // No running agent on that session any more: NexAU's error answer, 200.
    let again = server
        .post("/stop", json!({"user_id": "u-1", "session_id": "sess-1"}))
        .await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(
        again.body,
        json!({
            "status": "error",
            "stop_reason": null,
            "message_count": 0,
            "error": "No running agent found for user_id=u-1, session_id=sess-1, agent_id=any",
        })
    );

    // A run with a user label is that user's only.
    sleeping(&server, "sess-u", json!({"user": "alice"})).await;
    let not_hers = server
        .post("/stop", json!({"user_id": "bob", "session_id": "sess-u"}))
        .await;
    assert_eq!(
        not_hers.body,
        json!({
            "status": "error",
            "stop_reason": null,
            "message_count": 0,
            "error": "No running agent found for user_id=bob, session_id=sess-u, agent_id=any",
        })
    );
    let hers = server
        .post("/stop", json!({"user_id": "alice", "session_id": "sess-u"}))
        .await;
    assert_eq!(hers.body["status"], "success", "{hers:?}");

    // The defaults: user_id "default-user", who owns the runs started without a user (no
    // other user stops them); agent_id names the workflow (or the run).
    sleeping(&server, "sess-2", json!({})).await;
    let not_default = server
        .post("/stop", json!({"user_id": "bob", "session_id": "sess-2"}))
        .await;
    assert_eq!(not_default.body["status"], "error", "{not_default:?}");
    let wrong_agent = server
        .post(
            "/stop",
            json!({"session_id": "sess-2", "agent_id": "other"}),
        )
        .await;
    assert_eq!(
        wrong_agent.body,
        json!({
            "status": "error",
            "stop_reason": null,
            "message_count": 0,
            "error": "No running agent found for user_id=default-user, session_id=sess-2, \
                      agent_id=other",
        })
    );
    let forced = server
        .post(
            "/stop",
            json!({"session_id": "sess-2", "agent_id": "sleepy", "force": true}),
        )
        .await;
    assert_eq!(forced.status, 200, "{forced:?}");
    assert_eq!(forced.body["status"], "success", "{forced:?}");
    assert_eq!(forced.body["stop_reason"], "USER_INTERRUPTED");
    assert_eq!(forced.body["error"], Value::Null);
    let mut fields: Vec<_> = forced
        .body
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect();
    fields.sort();
    assert_eq!(fields, ["error", "message_count", "status", "stop_reason"]);

    // A timeout that is no duration: the same shape, 400.
    let bad = server
        .post("/stop", json!({"session_id": "sess-3", "timeout": -1.0}))
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(bad.body["status"], "error");
    assert_eq!(bad.body["message_count"], 0);
    assert!(bad.body["error"].is_string(), "{bad:?}");
    // session_id is required, as in NexAU's model.
    let missing = server.post("/stop", json!({"user_id": "u-1"})).await;
    assert_eq!((missing.status, missing.code()), (400, "bad_request"));
}
