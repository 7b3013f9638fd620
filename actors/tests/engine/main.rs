//! Engine integration tests: whole runs through the supervised actor tree, in memory.

mod support;

mod smoke {
    use super::support::*;

    #[tokio::test]
    async fn hello() {
        let rt = runtime();
        let wf = rt
            .load_json(
                r#"{"id": "hello", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "greet", "kind": "message", "params": {"template": "Hello, {{sys.query}}!"}}
            ], "edges": [{"from": "start", "to": "greet"}]}"#,
            )
            .expect("valid");
        let run = rt
            .start(&wf, inputs([("query", "world".into())]), thread("t"))
            .await
            .expect("start");
        let outcome = run.wait().await;
        assert_eq!(text(&outcome, "greet"), "Hello, world!");
    }
}
