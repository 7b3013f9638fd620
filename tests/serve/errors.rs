//! Every bad request gets a JSON error with its stable code, never a bare text answer: malformed
//! or non-JSON bodies, unknown fields, unknown runs and routes, bad ids, a busy thread, refused
//! inputs, bodies over the limit (declared or chunked), a missing or wrong token.

use std::io::{Read, Write};

use serde_json::json;

use super::server::Server;
use super::sleepy;

#[tokio::test]
async fn bad_requests_get_json_error_codes() {
    let server = Server::start(&[], &["--body-limit", "2048"]);
    let cases = [
        (
            Some("application/json"),
            "{\"workflow\": ",
            400,
            "bad_request",
        ),
        (Some("application/json"), "[1, 2]", 400, "bad_request"),
        (
            Some("application/json"),
            "{\"workflow\": {}, \"bogus\": 1}",
            400,
            "bad_request",
        ),
        (None, "{\"workflow\": {}}", 415, "unsupported_media_type"),
        (
            Some("text/plain"),
            "{\"workflow\": {}}",
            415,
            "unsupported_media_type",
        ),
        (
            Some("application/json"),
            "{\"workflow\": 5}",
            400,
            "bad_request",
        ),
    ];
    for (content_type, body, status, code) in cases {
        let answer = server.post_raw("/v1/runs", content_type, body).await;
        assert_eq!(
            (answer.status, answer.code()),
            (status, code),
            "{body}: {answer:?}"
        );
        assert!(answer.body["error"]["message"].is_string(), "{answer:?}");
    }
    let unknown = server
        .post_raw(
            "/v1/runs",
            Some("application/json"),
            "{\"workflow\": {}, \"bogus\": 1}",
        )
        .await;
    assert_eq!(unknown.body["error"]["field"], "bogus", "{unknown:?}");

    let nobody = "01a208f6-5cd7-71b9-a700-f6427f82d280";
    for answer in [
        server.get(&format!("/v1/runs/{nobody}")).await,
        server.get(&format!("/v1/runs/{nobody}/tree")).await,
        server
            .post(&format!("/v1/runs/{nobody}/stop"), json!({}))
            .await,
        server
            .post(&format!("/v1/runs/{nobody}/cancel"), json!({}))
            .await,
        server.get("/v1/no/such/route").await,
        server.post("/v1/threads/nobody/resume", json!({})).await,
    ] {
        assert_eq!(
            (answer.status, answer.code()),
            (404, "not_found"),
            "{answer:?}"
        );
    }
    for answer in [
        server.get("/v1/runs/not-a-uuid").await,
        server.post("/v1/runs/not-a-uuid/stop", json!({})).await,
        server.post("/v1/threads/bad%20id/resume", json!({})).await,
        server.get("/v1/threads/bad%0Aid/checkpoints").await,
        server
            .post(
                "/v1/runs",
                json!({"workflow": sleepy(), "thread": "bad id"}),
            )
            .await,
        server.get("/v1/runs?worker=bad%20id").await,
    ] {
        assert_eq!(
            (answer.status, answer.code()),
            (400, "invalid_id"),
            "{answer:?}"
        );
    }
    let wrong_method = server.post("/healthz", json!({})).await;
    assert_eq!(
        (wrong_method.status, wrong_method.code()),
        (405, "method_not_allowed")
    );
    let bad_query = server.get("/v1/runs?status=sleeping").await;
    assert_eq!(
        (bad_query.status, bad_query.code()),
        (400, "bad_request"),
        "{bad_query:?}"
    );
    let bad_stop = server
        .post(
            "/v1/runs/01a208f6-5cd7-71b9-a700-f6427f82d280/stop",
            json!({"mode": "later"}),
        )
        .await;
    assert_eq!(
        (bad_stop.status, bad_stop.code()),
        (400, "bad_request"),
        "{bad_stop:?}"
    );

    // Inputs the begin node refuses.
    let declared = json!({"id": "typed", "nodes": [{"id": "start", "kind": "begin", "params": {
        "inputs": [{"name": "tier", "type": "integer", "required": true}]}}]});
    let refused = server
        .post(
            "/v1/runs",
            json!({"workflow": declared, "inputs": {"tier": "high"}}),
        )
        .await;
    assert_eq!(
        (refused.status, refused.code()),
        (422, "invalid_input"),
        "{refused:?}"
    );
    assert_eq!(refused.body["error"]["input"], "tier");

    // Bodies over the limit: declared by their length, or sent in chunks.
    let big = format!("{{\"workflow\": \"{}\"}}", "x".repeat(4096));
    let declared = server
        .post_raw("/v1/runs", Some("application/json"), big.clone())
        .await;
    assert_eq!(
        (declared.status, declared.code()),
        (413, "payload_too_large"),
        "{declared:?}"
    );
    assert_eq!(declared.body["error"]["limit"], 2048);
    let (status, body) = chunked_post(&server, "/v1/runs", &big);
    assert_eq!(status, 413, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
}

/// POSTs `body` with `Transfer-Encoding: chunked` (no declared length) over a raw connection;
/// returns the status and the body.
fn chunked_post(server: &Server, path: &str, body: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(server.address).expect("connect");
    stream
        .set_read_timeout(Some(super::server::PATIENCE))
        .expect("timeout");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        server.address
    );
    for chunk in body.as_bytes().chunks(512) {
        request.push_str(&format!("{:x}\r\n", chunk.len()));
        request.push_str(std::str::from_utf8(chunk).expect("ascii"));
        request.push_str("\r\n");
    }
    request.push_str("0\r\n\r\n");
    // The server may answer and close before it has read everything: a failed write is fine.
    let _ = stream.write_all(request.as_bytes());
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("")
        .to_owned();
    // A chunked answer: its JSON is the line that starts with `{`.
    let json = body
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or(&body)
        .to_owned();
    (status, json)
}

#[tokio::test]
async fn a_busy_thread_names_its_run_and_worker() {
    let server = Server::start(&[], &[]);
    let first = server
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "60s"}, "thread": "busy-1"}),
        )
        .await;
    assert_eq!(first.status, 202, "{first:?}");
    let run = first.body["run_id"].clone();
    let second = server
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "1ms"}, "thread": "busy-1"}),
        )
        .await;
    assert_eq!(
        (second.status, second.code()),
        (409, "thread_busy"),
        "{second:?}"
    );
    assert_eq!(second.body["error"]["run_id"], run);
    assert_eq!(second.body["error"]["thread"], "busy-1");
    assert!(second.body["error"]["worker"].is_string(), "{second:?}");
    let resume = server.post("/v1/threads/busy-1/resume", json!({})).await;
    assert_eq!(
        (resume.status, resume.code()),
        (409, "thread_busy"),
        "{resume:?}"
    );
}

#[tokio::test]
async fn with_a_token_every_endpoint_but_health_and_the_page_needs_it() {
    let server = Server::start(&[], &["--token", "s3cret"]);
    let health = server.get("/healthz").await;
    assert_eq!(health.status, 200, "{health:?}");
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status, 200, "{ready:?}");
    // The page holds no data: it is served to anyone, and asks for the token.
    for (path, content_type) in [
        ("/", "text/html"),
        ("/page.js", "text/javascript"),
        ("/page.css", "text/css"),
    ] {
        let (status, ct, body) = server.get_text(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(ct.starts_with(content_type), "{path}: {ct}");
    }
    for answer in [
        server.get("/v1/runs").await,
        server.get("/v1/events").await,
        server
            .post("/v1/workflows/validate", json!({"workflow": sleepy()}))
            .await,
        server.get("/v1/nowhere").await,
    ] {
        assert_eq!(
            (answer.status, answer.code()),
            (401, "unauthorized"),
            "{answer:?}"
        );
    }
    let server = server.with_token("wrong");
    let wrong = server.get("/v1/runs").await;
    assert_eq!(
        (wrong.status, wrong.code()),
        (401, "unauthorized"),
        "{wrong:?}"
    );
    let server = server.with_token("s3cret");
    let right = server.get("/v1/runs").await;
    assert_eq!(right.status, 200, "{right:?}");
    let valid = server
        .post("/v1/workflows/validate", json!({"workflow": sleepy()}))
        .await;
    assert_eq!(valid.status, 200, "{valid:?}");
}
