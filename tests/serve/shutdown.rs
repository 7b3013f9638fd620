//! SIGTERM: the service stops every run with reason `shutdown` (a checkpoint written, so the
//! run stays resumable), answers the request that waited for it, and exits 0.

use serde_json::json;

use super::server::Server;
use super::sleepy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_every_run_answers_waiting_requests_and_exits_zero() {
    let server = Server::start(&[], &[]);
    let url = server.url("/v1/runs");
    let waiting = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .json(&json!({"workflow": sleepy(), "inputs": {"query": "60s"},
                          "thread": "term-1", "wait": true}))
            .send()
            .await
            .expect("an answer before the server exits");
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.expect("a JSON body");
        (status, body)
    });
    server
        .until("the run to sleep", "/v1/runs?thread=term-1", |a| {
            a.body["runs"][0]["nodes"] == json!(["a"])
        })
        .await;

    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminate");
    assert_eq!(exit.code(), Some(0), "{log}");
    let (status, body) = waiting.await.expect("the waiting request");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "stopped", "{body}");
    assert_eq!(body["stop"]["reason"], "shutdown", "{body}");
    assert_eq!(body["stop"]["frontier"], json!(["a"]), "{body}");
    assert!(body["stop"]["checkpoint_id"].is_string(), "{body}");
}
