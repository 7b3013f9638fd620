//! `GET /openapi.json`: the OpenAPI document names every `/v1` endpoint with its method, the
//! request bodies' fields, the error shape and the bearer token.

use serde_json::json;

use super::server::Server;

#[tokio::test]
async fn the_openapi_document_describes_every_v1_endpoint() {
    let server = Server::start(&[], &["--token", "s3cret"]);
    let refused = server.get("/openapi.json").await;
    assert_eq!((refused.status, refused.code()), (401, "unauthorized"));
    let server = server.with_token("s3cret");
    let document = server.get("/openapi.json").await;
    assert_eq!(document.status, 200, "{document:?}");
    let doc = &document.body;
    assert_eq!(doc["openapi"], "3.1.0", "{doc}");
    for (path, method) in [
        ("/v1/runs", "post"),
        ("/v1/runs", "get"),
        ("/v1/runs/{run_id}", "get"),
        ("/v1/events", "get"),
        ("/v1/runs/{run_id}/tree", "get"),
        ("/v1/runs/{run_id}/stop", "post"),
        ("/v1/runs/{run_id}/cancel", "post"),
        ("/v1/threads/{thread}/resume", "post"),
        ("/v1/threads/{thread}/checkpoints", "get"),
        ("/v1/workflows/validate", "post"),
    ] {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing: {doc}"
        );
    }
    let schemas = &doc["components"]["schemas"];
    let start = &schemas["StartRequest"];
    for field in [
        "workflow", "inputs", "thread", "app", "chat", "task", "wait", "stream",
    ] {
        assert!(start["properties"][field].is_object(), "{field}: {start}");
    }
    assert_eq!(start["required"], json!(["workflow"]), "{start}");
    assert_eq!(
        schemas["Mode"]["enum"],
        json!(["graceful", "force"]),
        "{schemas}"
    );
    assert!(schemas["StopBody"]["properties"]["timeout"].is_object());
    assert!(schemas["ResumeRequest"]["properties"]["answer"].is_object());
    assert!(schemas["ErrorDocument"]["properties"]["error"].is_object());
    assert!(schemas["RunChange"]["properties"]["change"].is_object());
    let list = &doc["paths"]["/v1/runs"]["get"]["parameters"];
    let names: Vec<_> = list
        .as_array()
        .expect("parameters")
        .iter()
        .map(|p| p["name"].as_str().unwrap_or(""))
        .collect();
    for name in [
        "status", "thread", "app", "chat", "task", "worker", "all", "limit", "offset",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer",
        "{doc}"
    );
}
