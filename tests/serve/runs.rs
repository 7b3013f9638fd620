//! Runs over HTTP: start and wait, start and stop (every caller gets the same stop result),
//! resume with a new instruction, cancel, force, an interaction answered, checkpoints, lists,
//! trees, validation.

use serde_json::json;

use super::server::Server;
use super::{form, sleepy};

/// Starts `sleepy` on `thread` for 60 s without waiting; returns the run id once it sleeps.
async fn sleeping(server: &Server, thread: &str) -> String {
    let started = server
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "60s"}, "thread": thread}),
        )
        .await;
    assert_eq!(started.status, 202, "{started:?}");
    assert_eq!(started.body["thread"], thread);
    let run = started.body["run_id"]
        .as_str()
        .expect("a run id")
        .to_owned();
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
async fn a_run_started_with_wait_answers_its_outcome() {
    let server = Server::start(&[], &[]);
    let done = server
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "1ms"}, "thread": "w-1",
                   "app": "app1", "chat": "chat1", "wait": true}),
        )
        .await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.body["status"], "succeeded");
    assert_eq!(done.body["thread"], "w-1");
    assert_eq!(done.body["workflow"], "sleepy");
    assert_eq!(done.body["outputs"]["b"]["text"], "done after 1ms");
    assert_eq!(done.body["stop"], json!(null));
    let run = done.body["run_id"].as_str().expect("run id");

    let got = server.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.body["status"], "succeeded");
    assert_eq!(got.body["app_id"], "app1");
    assert_eq!(
        got.body["outcome"]["outputs"]["b"]["text"],
        "done after 1ms"
    );

    let listed = server.get("/v1/runs?all=true&thread=w-1").await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let runs = listed.body["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "{listed:?}");
    assert_eq!(runs[0]["run_id"], run);
    assert_eq!(listed.body["next_offset"], json!(null));
    // Open runs only by default: this one ended.
    let open = server.get("/v1/runs?thread=w-1").await;
    assert_eq!(open.body["runs"], json!([]), "{open:?}");

    let checkpoints = server.get("/v1/threads/w-1/checkpoints").await;
    assert_eq!(checkpoints.status, 200, "{checkpoints:?}");
    let newest = &checkpoints.body["checkpoints"][0];
    assert_eq!(newest["run_id"], run);
    assert_eq!(newest["status"], "succeeded");
}

#[tokio::test]
async fn a_stopped_run_answers_its_stop_result_and_its_thread_resumes() {
    let server = Server::start(&[], &[]);
    let run = sleeping(&server, "s-1").await;

    let tree = server.get(&format!("/v1/runs/{run}/tree")).await;
    assert_eq!(tree.status, 200, "{tree:?}");
    assert_eq!(tree.body["kind"], "run_supervisor");
    assert_eq!(tree.body["children"][0]["node_id"], "a");

    let stopped = server
        .post(
            &format!("/v1/runs/{run}/stop"),
            json!({"mode": "graceful", "timeout": "5s"}),
        )
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    assert_eq!(stopped.body["run_id"], run);
    assert_eq!(stopped.body["status"], "stopped");
    let stop = &stopped.body["stop"];
    assert_eq!(stop["reason"], "user_interrupted");
    assert_eq!(stop["stopped_at"], json!(["a"]));
    assert_eq!(stop["finished"], json!(["start"]));
    assert_eq!(stop["frontier"], json!(["a"]));
    assert!(stop["checkpoint_id"].is_string(), "{stopped:?}");
    // Every caller of the stop gets the same result.
    let again = server
        .post(&format!("/v1/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.body["stop"], *stop);

    let listed = server.get("/v1/runs?status=stopped&thread=s-1").await;
    assert_eq!(listed.body["runs"][0]["run_id"], run, "{listed:?}");
    assert_eq!(listed.body["runs"][0]["stop_reason"], "user_interrupted");
    let tree = server.get(&format!("/v1/runs/{run}/tree")).await;
    assert_eq!((tree.status, tree.code()), (409, "no_live_run"), "{tree:?}");

    // The resume sleeps as long as the new instruction says; `start` is not run again.
    let resumed = server
        .post(
            "/v1/threads/s-1/resume",
            json!({"say": "1ms", "wait": true}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    assert_eq!(resumed.body["status"], "succeeded");
    assert_eq!(resumed.body["thread"], "s-1");
    assert_eq!(resumed.body["outputs"]["b"]["text"], "done after 1ms");
    assert_ne!(resumed.body["run_id"], run);
    let resumed_run = resumed.body["run_id"].as_str().expect("run id");
    let record = server.get(&format!("/v1/runs/{resumed_run}")).await;
    assert_eq!(record.body["status"], "succeeded", "{record:?}");

    let checkpoints = server.get("/v1/threads/s-1/checkpoints").await;
    let listed: Vec<_> = checkpoints.body["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| (c["run_id"].clone(), c["status"].clone()))
        .collect();
    assert!(
        listed.contains(&(json!(run), json!("stopped"))),
        "{checkpoints:?}"
    );
    assert!(
        listed.contains(&(json!(resumed_run), json!("succeeded"))),
        "{checkpoints:?}"
    );

    let late = server
        .post(&format!("/v1/runs/{resumed_run}/stop"), json!({}))
        .await;
    assert_eq!((late.status, late.code()), (409, "no_live_run"), "{late:?}");
    assert_eq!(late.body["error"]["status"], "succeeded");
}

#[tokio::test]
async fn cancel_and_force_stop() {
    let server = Server::start(&[], &[]);
    let run = sleeping(&server, "c-1").await;
    let cancelled = server
        .post(&format!("/v1/runs/{run}/cancel"), json!({}))
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    assert_eq!(cancelled.body["status"], "cancelled");
    assert_eq!(cancelled.body["stop"]["reason"], "cancelled");

    let run = sleeping(&server, "f-1").await;
    let forced = server
        .post(&format!("/v1/runs/{run}/stop"), json!({"mode": "force"}))
        .await;
    assert_eq!(forced.status, 200, "{forced:?}");
    assert_eq!(forced.body["status"], "stopped");
    assert_eq!(forced.body["stop"]["stopped_at"], json!(["a"]));
}

#[tokio::test]
async fn an_interaction_is_answered_through_resume() {
    let server = Server::start(&[], &[]);
    let paused = server
        .post(
            "/v1/runs",
            json!({"workflow": form(), "thread": "i-1", "wait": true}),
        )
        .await;
    assert_eq!(paused.status, 200, "{paused:?}");
    assert_eq!(paused.body["status"], "awaiting_input");
    assert_eq!(paused.body["interactions"][0]["path"], "ask");

    let refused = server
        .post(
            "/v1/threads/i-1/resume",
            json!({"answer": {}, "wait": true}),
        )
        .await;
    assert_eq!(
        (refused.status, refused.code()),
        (422, "invalid_answer"),
        "{refused:?}"
    );

    let answered = server
        .post(
            "/v1/threads/i-1/resume",
            json!({"answer": {"email": "a@b.c"}, "wait": true}),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    assert_eq!(answered.body["status"], "succeeded");
    assert_eq!(answered.body["outputs"]["reply"]["text"], "thanks, a@b.c");
}

#[tokio::test]
async fn validation_lists_every_problem() {
    let server = Server::start(&[], &[]);
    let valid = server
        .post("/v1/workflows/validate", json!({"workflow": sleepy()}))
        .await;
    assert_eq!(valid.status, 200, "{valid:?}");
    assert_eq!(valid.body["valid"], true);
    assert_eq!(valid.body["nodes"], 3);

    let broken = json!({"id": "broken", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "a", "kind": "no_such_kind"},
        {"id": "b", "kind": "sleep", "params": {}}
    ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "missing"}]});
    let invalid = server
        .post("/v1/workflows/validate", json!({"workflow": broken}))
        .await;
    assert_eq!(
        (invalid.status, invalid.code()),
        (422, "invalid_workflow"),
        "{invalid:?}"
    );
    let errors = invalid.body["error"]["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 3, "{invalid:?}");
    let text = invalid.body.to_string();
    for needle in ["no_such_kind", "duration", "missing"] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // The same refusal when a run is started with it; the text of a workflow works too.
    let start = server
        .post("/v1/runs", json!({"workflow": broken.to_string()}))
        .await;
    assert_eq!(
        (start.status, start.code()),
        (422, "invalid_workflow"),
        "{start:?}"
    );
    assert_eq!(
        start.body["error"]["errors"],
        invalid.body["error"]["errors"]
    );
}

/// The events of a server-sent event stream: (name, data).
fn sse_events(text: &str) -> Vec<(String, serde_json::Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).ok();
                }
            }
            Some((name?, data?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_run_sends_its_events_and_ends_with_its_stop_result() {
    let server = Server::start(&[], &[]);
    let url = server.url("/v1/runs");
    let streaming = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .json(&json!({"workflow": sleepy(), "inputs": {"query": "60s"},
                          "thread": "sse-1", "stream": true}))
            .send()
            .await
            .expect("an answer");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        (content_type, response.text().await.expect("the stream"))
    });
    let listed = server
        .until("the run to sleep", "/v1/runs?thread=sse-1", |a| {
            a.body["runs"][0]["nodes"] == json!(["a"])
        })
        .await;
    let run = listed.body["runs"][0]["run_id"]
        .as_str()
        .expect("run id")
        .to_owned();
    let stopped = server
        .post(&format!("/v1/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");

    let (content_type, text) = streaming.await.expect("the stream ends");
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let events = sse_events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap_or(usize::MAX);
    assert_eq!(names.first(), Some(&"run_started"), "{text}");
    assert!(at("node_started") < at("stopping"), "{text}");
    assert!(at("stopping") < at("node_interrupted"), "{text}");
    let (last, outcome) = events.last().expect("events");
    assert_eq!(last, "stopped", "{text}");
    assert_eq!(outcome["run_id"], run.as_str());
    assert_eq!(outcome["stop"], stopped.body["stop"]);
    assert!(
        events.contains(&(
            "node_interrupted".to_owned(),
            json!({"path": "a", "forced": false})
        )),
        "{text}"
    );

    let both = server
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "wait": true, "stream": true}),
        )
        .await;
    assert_eq!((both.status, both.code()), (400, "bad_request"), "{both:?}");
}

/// Reads `response` (a server-sent event stream) into `text` until its events satisfy `check`.
async fn read_until(
    response: &mut reqwest::Response,
    text: &mut String,
    what: &str,
    check: impl Fn(&[(String, serde_json::Value)]) -> bool,
) {
    let read = async {
        while !check(&sse_events(text)) {
            match response.chunk().await.expect("the stream") {
                Some(chunk) => text.push_str(&String::from_utf8_lossy(&chunk)),
                None => panic!("the stream ended before {what}: {text}"),
            }
        }
    };
    if tokio::time::timeout(super::server::PATIENCE, read)
        .await
        .is_err()
    {
        panic!("waited too long for {what}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_stream_lists_the_runs_tells_their_changes_and_ends_at_shutdown() {
    let server = Server::start(&[], &[]);
    let mut response = reqwest::Client::new()
        .get(server.url("/v1/events"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap_or("");
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut text = String::new();
    read_until(&mut response, &mut text, "the first list", |e| {
        !e.is_empty()
    })
    .await;
    assert_eq!(
        sse_events(&text)[0],
        ("runs".to_owned(), json!({"runs": []})),
        "{text}"
    );

    let run = sleeping(&server, "ev-1").await;
    let change = |change: &str, status: &str| {
        (
            "run".to_owned(),
            json!({"run_id": run, "thread": "ev-1", "change": change, "status": status}),
        )
    };
    let started = change("started", "running");
    read_until(&mut response, &mut text, "the start and a list", |events| {
        let at = events.iter().position(|e| *e == started);
        at.is_some_and(|at| {
            events[at..]
                .iter()
                .any(|(name, data)| name == "runs" && data["runs"][0]["run_id"] == run.as_str())
        })
    })
    .await;

    let stopped = server
        .post(&format!("/v1/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    let stopping = change("stopping", "running");
    let ended = change("ended", "stopped");
    read_until(&mut response, &mut text, "the stop and a list", |events| {
        let at = events.iter().position(|e| *e == ended);
        events.contains(&stopping)
            && at.is_some_and(|at| {
                events[at..]
                    .iter()
                    .any(|(name, data)| name == "runs" && data["runs"][0]["status"] == "stopped")
            })
    })
    .await;

    // Shutdown ends the stream: the server exits at once, 0.
    let exit = tokio::task::spawn_blocking(move || server.terminate());
    let rest = tokio::time::timeout(super::server::PATIENCE, async {
        while let Ok(Some(_)) = response.chunk().await {}
    })
    .await;
    assert!(rest.is_ok(), "the stream did not end at shutdown");
    let (status, log) = exit.await.expect("the server exits");
    assert!(status.success(), "{status:?}: {log}");
}
