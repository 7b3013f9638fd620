//! `GET /metrics`: the token is required; the metric names are there; counters move after a
//! run and a stop.

use serde_json::json;

use super::server::Server;
use super::sleepy;

/// The value of the sample `name` (with its labels, as rendered) in a scrape; 0 when absent.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (key == name).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_need_the_token_and_move_after_runs() {
    let server = Server::start(&[], &["--token", "s3cret"]);
    let (status, _, _) = server.get_text("/metrics").await;
    assert_eq!(status, 401);
    let server = server.with_token("s3cret");

    let (status, content_type, before) = server.get_text("/metrics").await;
    assert_eq!(status, 200, "{before}");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    for name in [
        "# TYPE runvisor_runs gauge",
        "# TYPE runvisor_leases_held gauge",
        "# TYPE runvisor_runs_started counter",
        "# TYPE runvisor_runs_ended counter",
        "# TYPE runvisor_stop_latency_seconds histogram",
        "# TYPE runvisor_stop_ack_seconds histogram",
        "# TYPE runvisor_store_errors counter",
        "# TYPE runvisor_checkpoint_bytes histogram",
        "# TYPE runvisor_checkpoint_write_seconds histogram",
        "# TYPE runvisor_watcher_tick_seconds histogram",
        "# TYPE runvisor_spans_dropped counter",
        "# TYPE runvisor_node_duration_seconds histogram",
    ] {
        assert!(before.contains(name), "{name} missing in:\n{before}");
    }
    assert_eq!(
        sample(&before, "runvisor_runs{status=\"running\"}"),
        0.0,
        "{before}"
    );
    assert!(
        before.contains("runvisor_stop_latency_seconds_count{endpoint=\"fastgpt\"} 0"),
        "{before}"
    );
    assert!(
        before.contains("runvisor_store_errors_total{source=\"checkpoint\",kind=\"transient\"} 0"),
        "{before}"
    );

    let done = server
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "1ms"}, "wait": true}),
        )
        .await;
    assert_eq!(done.body["status"], "succeeded", "{done:?}");
    // A run that sleeps, then is stopped.
    let started = server
        .post(
            "/v1/runs",
            json!({"workflow": sleepy(), "inputs": {"query": "60s"}}),
        )
        .await;
    let run = started.body["run_id"]
        .as_str()
        .expect("a run id")
        .to_owned();
    server
        .until("the run to sleep", &format!("/v1/runs/{run}"), |a| {
            a.body["nodes"] == json!(["a"])
        })
        .await;
    let (_, _, live) = server.get_text("/metrics").await;
    assert_eq!(
        sample(&live, "runvisor_runs{status=\"running\"}"),
        1.0,
        "{live}"
    );
    assert_eq!(sample(&live, "runvisor_leases_held"), 1.0, "{live}");
    let stopped = server
        .post(&format!("/v1/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");

    // The observer counts the run's end once its events end: poll until it did.
    let after = loop {
        let (_, _, text) = server.get_text("/metrics").await;
        if sample(&text, "runvisor_runs_ended_total{status=\"stopped\"}") >= 1.0 {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        sample(&after, "runvisor_runs_started_total"),
        2.0,
        "{after}"
    );
    // Each run wrote its final checkpoint (and progress ones on the way): sizes and times.
    assert!(
        sample(&after, "runvisor_checkpoint_bytes_count{mode=\"final\"}") >= 2.0,
        "{after}"
    );
    assert!(
        sample(&after, "runvisor_checkpoint_bytes_sum{mode=\"final\"}") > 0.0,
        "{after}"
    );
    assert!(
        sample(
            &after,
            "runvisor_checkpoint_write_seconds_count{mode=\"final\"}"
        ) >= 2.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "runvisor_spans_dropped_total"),
        0.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "runvisor_runs_ended_total{status=\"succeeded\"}"),
        1.0,
        "{after}"
    );
    // Both runs started `begin` and `sleep`; only the first reached `stream_text`.
    assert_eq!(
        sample(&after, "runvisor_node_executions_total{kind=\"begin\"}"),
        2.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "runvisor_node_executions_total{kind=\"sleep\"}"),
        2.0,
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            "runvisor_node_executions_total{kind=\"stream_text\"}"
        ),
        1.0,
        "{after}"
    );
    // How long they ran, by kind and outcome: the sleep of the stopped run was stopped.
    for (series, count) in [
        ("{kind=\"begin\",outcome=\"completed\"}", 2.0),
        ("{kind=\"sleep\",outcome=\"completed\"}", 1.0),
        ("{kind=\"sleep\",outcome=\"stopped\"}", 1.0),
        ("{kind=\"stream_text\",outcome=\"completed\"}", 1.0),
    ] {
        let name = format!("runvisor_node_duration_seconds_count{series}");
        assert_eq!(sample(&after, &name), count, "{name} in:\n{after}");
    }
    assert!(
        sample(
            &after,
            "runvisor_node_duration_seconds_sum{kind=\"sleep\",outcome=\"stopped\"}"
        ) > 0.0,
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            "runvisor_stop_latency_seconds_count{endpoint=\"v1_stop\"}"
        ),
        1.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "runvisor_runs{status=\"running\"}"),
        0.0,
        "{after}"
    );
    assert_eq!(sample(&after, "runvisor_leases_held"), 0.0, "{after}");
    // The run's supervisor acknowledged the stop (its `stopping` event) once.
    assert_eq!(
        sample(&after, "runvisor_stop_ack_seconds_count"),
        1.0,
        "{after}"
    );
}
