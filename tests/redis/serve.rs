//! Two `runvisor serve` processes on one Redis: one lists and shows the runs of the other,
//! stops one of them (asked of the worker that runs it, which answers its stop result) and
//! resumes its thread; SIGTERM of a serve process stops its runs with reason `shutdown` and
//! another resumes them.

use serde_json::{Value, json};

use super::support::RedisServer;

#[path = "../serve/server.rs"]
pub(crate) mod server;

use server::Server;

/// `start -> a (sleep {{sys.query}}) -> b`, as in the serve tests.
fn sleepy() -> Value {
    json!({"id": "sleepy", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "a", "kind": "sleep", "params": {"duration": "{{sys.query}}"}},
        {"id": "b", "kind": "stream_text",
         "params": {"text": "done after {{sys.query}}", "interval": "1ms"}}
    ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]})
}

fn serve(redis: &RedisServer) -> Server {
    Server::start(&["--redis", &redis.url()], &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_process_lists_stops_and_resumes_runs_of_another() {
    let redis = RedisServer::start();
    let a = serve(&redis);
    let b = serve(&redis);
    let ready = b.get("/readyz").await;
    assert_eq!(
        (ready.status, ready.body["stores"].clone()),
        (200, json!("redis"))
    );

    let started = a
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "60s"}, "thread": "x-1"}),
        )
        .await;
    assert_eq!(started.status, 202, "{started:?}");
    let run = started.body["run_id"].as_str().expect("run id").to_owned();

    // B lists A's run with the node it runs now, asked of A.
    let listed = b
        .until("B to list A's sleeping run", "/v1/runs?thread=x-1", |l| {
            l.body["runs"][0]["nodes"] == json!(["a"])
        })
        .await;
    let row = &listed.body["runs"][0];
    assert_eq!(row["run_id"], run.as_str());
    assert_eq!(row["status"], "running");
    assert_eq!(row["worker_alive"], true);
    let worker_a = row["worker"].clone();
    let tree = b.get(&format!("/v1/runs/{run}/tree")).await;
    assert_eq!(tree.status, 200, "{tree:?}");
    assert_eq!(tree.body["children"][0]["node_id"], "a");

    // B stops it: A stops it and answers the stop result.
    let stopped = b
        .post(
            &format!("/v1/runs/{run}/stop"),
            json!({"mode": "graceful", "timeout": "5s"}),
        )
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}\nA:\n{}", a.log());
    assert_eq!(stopped.body["status"], "stopped");
    assert_eq!(stopped.body["thread"], "x-1");
    assert_eq!(stopped.body["stop"]["reason"], "user_interrupted");
    assert_eq!(stopped.body["stop"]["stopped_at"], json!(["a"]));
    assert!(
        stopped.body["stop"]["checkpoint_id"].is_string(),
        "{stopped:?}"
    );
    let record = b.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(record.body["status"], "stopped", "{record:?}");
    assert_eq!(record.body["worker"], worker_a);

    // B resumes the thread A ran, from the stop's checkpoint.
    let resumed = b
        .post(
            "/v1/threads/x-1/resume",
            json!({"say": "1ms", "wait": true}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    assert_eq!(resumed.body["status"], "succeeded");
    assert_eq!(resumed.body["outputs"]["b"]["text"], "done after 1ms");
    assert_ne!(resumed.body["run_id"], run.as_str());
    // A, which ran it, still answers its stop result; B says it does not run.
    let again = a.post(&format!("/v1/runs/{run}/stop"), json!({})).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.body["stop"], stopped.body["stop"]);
    let late = b.post(&format!("/v1/runs/{run}/stop"), json!({})).await;
    assert_eq!((late.status, late.code()), (409, "no_live_run"), "{late:?}");
    assert_eq!(late.body["error"]["status"], "stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_runs_resumably_and_another_serve_resumes_them() {
    let redis = RedisServer::start();
    let a = serve(&redis);
    let b = serve(&redis);
    let started = a
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "60s"}, "thread": "term-1"}),
        )
        .await;
    assert_eq!(started.status, 202, "{started:?}");
    let run = started.body["run_id"].as_str().expect("run id").to_owned();
    a.until("the run to sleep", &format!("/v1/runs/{run}"), |r| {
        r.body["nodes"] == json!(["a"])
    })
    .await;

    let (exit, log) = tokio::task::spawn_blocking(move || a.terminate())
        .await
        .expect("terminate");
    assert_eq!(exit.code(), Some(0), "{log}");
    let record = b.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(record.body["status"], "stopped", "{record:?}");
    assert_eq!(record.body["stop_reason"], "shutdown", "{record:?}");

    let resumed = b
        .post(
            "/v1/threads/term-1/resume",
            json!({"say": "1ms", "wait": true}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    assert_eq!(resumed.body["status"], "succeeded");
    assert_eq!(resumed.body["outputs"]["start"], json!({"query": "60s"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_stop_endpoints_of_one_serve_process_stop_runs_of_another() {
    let redis = RedisServer::start();
    let a = serve(&redis);
    let b = serve(&redis);
    let start = |thread: &str, labels: Value| {
        let mut body = json!({"workflow": sleepy(), "inputs": {"query": "60s"}, "thread": thread});
        if let (Value::Object(body), Value::Object(labels)) = (&mut body, labels) {
            body.extend(labels);
        }
        body
    };
    let fastgpt = a
        .post(
            "/v1/runs",
            start("fg-x", json!({"app": "app1", "chat": "c1"})),
        )
        .await;
    let fastgpt = fastgpt.body["run_id"].as_str().expect("run id").to_owned();
    let nexau = a.post("/v1/runs", start("sess-x", json!({}))).await;
    let nexau = nexau.body["run_id"].as_str().expect("run id").to_owned();
    for run in [&fastgpt, &nexau] {
        b.until("B to see A's run sleep", &format!("/v1/runs/{run}"), |r| {
            r.body["nodes"] == json!(["a"])
        })
        .await;
    }
    // B's scrape counts A's runs among the open runs; A holds their leases, B none.
    let (_, _, scraped) = b.get_text("/metrics").await;
    assert!(
        scraped.contains("runvisor_runs{status=\"running\"} 2"),
        "{scraped}"
    );
    assert!(scraped.contains("runvisor_leases_held 0"), "{scraped}");

    let stopped = b
        .post(
            "/api/v2/chat/stop",
            json!({"appId": "app1", "chatId": "c1"}),
        )
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}\nA:\n{}", a.log());
    assert_eq!(stopped.body, json!({"success": true}));
    let record = b.get(&format!("/v1/runs/{fastgpt}")).await;
    assert_eq!(record.body["status"], "stopped", "{record:?}");

    let stopped = b
        .post("/stop", json!({"session_id": "sess-x", "timeout": 5}))
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}\nA:\n{}", a.log());
    assert_eq!(
        stopped.body,
        json!({"status": "success", "stop_reason": "USER_INTERRUPTED",
               "message_count": 1, "error": null})
    );
    let record = b.get(&format!("/v1/runs/{nexau}")).await;
    assert_eq!(record.body["status"], "stopped", "{record:?}");
    let (_, _, scraped) = b.get_text("/metrics").await;
    assert!(
        scraped.contains("runvisor_stop_latency_seconds_count{endpoint=\"nexau\"} 1"),
        "{scraped}"
    );
}
