//! Stop from another process, with the real binaries: one `runvisor run` works on a workflow;
//! another process (`runvisor stop` / `runvisor cancel`, or a raw Redis client) sets the flag;
//! the run stops within a tick plus its node's grace, persists, deletes its flag, and the stop
//! command answers after the run has ended.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// A workflow whose middle node sleeps long enough to be stopped.
fn slow_workflow(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("slow.json");
    std::fs::write(
        &path,
        r#"{"id": "slow", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "think", "kind": "sleep", "params": {"duration": "60s"}},
            {"id": "say", "kind": "message", "params": {"template": "done"}}
        ], "edges": [{"from": "start", "to": "think"}, {"from": "think", "to": "say"}]}"#,
    )
    .expect("write workflow");
    path
}

fn spawn_run(server: &RedisServer, file: &std::path::Path, extra: &[&str]) -> Child {
    Command::new(BIN)
        .args(["--redis", &server.url(), "run"])
        .arg(file)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runvisor run")
}

/// Waits (bounded) until the thread has a run recorded in Redis, i.e. the run is live.
async fn wait_for_run(server: &RedisServer, thread: &str) {
    let mut con = raw(server).await;
    let key = format!("runvisor:runs:{{{thread}}}");
    within("the run to start", async {
        loop {
            let n: i64 = cmd(&mut con, &["ZCARD", &key]).await;
            if n > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The run's first node has started once its record exists; give the sleep a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn finish(child: Child) -> Output {
    let started = Instant::now();
    let mut child = child;
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if started.elapsed() > Duration::from_secs(30) => {
                let _ = child.kill();
                panic!("the run did not end after its stop");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn cli(server: &RedisServer, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["--redis", &server.url()])
        .args(args)
        .output()
        .expect("run the cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runvisor_stop_from_another_process_stops_the_run_and_answers_after_its_end() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = slow_workflow(dir.path());
    let run = spawn_run(
        &server,
        &file,
        &["--thread", "x1", "--app", "A", "--chat", "x1"],
    );
    wait_for_run(&server, "x1").await;

    let answer = cli(&server, &["stop", "--app", "A", "--chat", "x1"]);
    assert_eq!(answer["success"], true);
    assert_eq!(answer["ended"], true, "{answer}");
    assert_eq!(answer["key"], "agent_runtime_stopping:A:x1");

    let out = finish(run);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("stopped (user_interrupted) at think"),
        "{stdout}"
    );
    // The run deleted its flag and recorded its stop before the answer came.
    let mut con = raw(&server).await;
    let exists: i64 = cmd(&mut con, &["EXISTS", "agent_runtime_stopping:A:x1"]).await;
    assert_eq!(exists, 0);
    let runs: Vec<String> = cmd(&mut con, &["ZRANGE", "runvisor:runs:{x1}", "0", "-1"]).await;
    assert_eq!(runs.len(), 1);
    let status: Option<String> = cmd(
        &mut con,
        &[
            "HGET",
            &format!("runvisor:run:{{x1}}:{}", runs[0]),
            "status",
        ],
    )
    .await;
    assert_eq!(status.as_deref(), Some("stopped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_set_by_a_raw_client_stops_the_run_within_a_tick() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = slow_workflow(dir.path());
    let run = spawn_run(
        &server,
        &file,
        &["--thread", "x2", "--app", "A", "--chat", "x2"],
    );
    wait_for_run(&server, "x2").await;
    // As FastGPT sets it: SETEX 60 s, no publish; the watcher's tick finds it.
    let mut con = raw(&server).await;
    let _: String = cmd(
        &mut con,
        &["SETEX", "agent_runtime_stopping:A:x2", "60", "1"],
    )
    .await;
    let out = finish(run);
    assert_eq!(out.status.code(), Some(130));
    let exists: i64 = cmd(&mut con, &["EXISTS", "agent_runtime_stopping:A:x2"]).await;
    assert_eq!(exists, 0, "the run deletes its flag when it ends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runvisor_cancel_cancels_a_task_run_and_resume_continues_it() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("two.json");
    std::fs::write(
        &file,
        r#"{"id": "two", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "first", "kind": "message", "params": {"template": "first"}},
            {"id": "think", "kind": "sleep", "params": {"duration": "60s"}}
        ], "edges": [{"from": "start", "to": "first"}, {"from": "first", "to": "think"}]}"#,
    )
    .expect("write workflow");
    let run = spawn_run(&server, &file, &["--thread", "x3", "--task", "T9"]);
    wait_for_run(&server, "x3").await;
    let answer = cli(&server, &["cancel", "--task", "T9"]);
    assert_eq!(answer["ended"], true, "{answer}");
    assert_eq!(answer["key"], "T9-cancel");
    let out = finish(run);
    assert_eq!(out.status.code(), Some(130));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped (cancelled) at think"));

    // Another process continues the thread: `first` does not run again.
    let resumed = Command::new(BIN)
        .args([
            "--redis",
            &server.url(),
            "resume",
            "--thread",
            "x3",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn resume");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Stop the resumed run too (its sleep is a minute), from a third process.
    let mut con = raw(&server).await;
    let _: String = cmd(&mut con, &["SET", "T9-cancel", "1"]).await;
    let out = finish(resumed);
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(document["status"], "cancelled", "{document}");
    assert_eq!(
        document["stop"]["finished"],
        serde_json::json!(["start", "first"])
    );
    let history = stores(&server)
        .await
        .history
        .load(&thread("x3"))
        .await
        .expect("history");
    let firsts = history
        .iter()
        .filter(|m| m.content.contains("first"))
        .count();
    assert_eq!(firsts, 1, "{history:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_or_resume_of_a_thread_live_in_another_process_exits_4_with_one_line() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = slow_workflow(dir.path());
    let first = spawn_run(
        &server,
        &file,
        &["--thread", "shared", "--app", "A", "--chat", "shared"],
    );
    wait_for_run(&server, "shared").await;

    let file_arg = file.to_str().expect("utf-8 path");
    for args in [
        vec!["run", file_arg, "--thread", "shared"],
        vec!["resume", "--thread", "shared"],
    ] {
        let out = Command::new(BIN)
            .args(["--redis", &server.url()])
            .args(&args)
            .output()
            .expect("run the cli");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains("shared") && stderr.contains("worker"),
            "{args:?}: {stderr}"
        );
    }

    // The live run is untouched: it still stops normally.
    let answer = cli(&server, &["stop", "--app", "A", "--chat", "shared"]);
    assert_eq!(answer["ended"], true, "{answer}");
    let out = finish(first);
    assert_eq!(out.status.code(), Some(130));
}

#[tokio::test]
async fn runvisor_stop_with_no_live_run_exits_4_and_leaves_no_flag() {
    let server = RedisServer::start();
    for args in [
        vec!["stop", "--app", "A", "--chat", "nobody"],
        vec!["cancel", "--task", "T"],
    ] {
        let out = Command::new(BIN)
            .args(["--redis", &server.url()])
            .args(&args)
            .output()
            .expect("run the cli");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: no live run of "), "{stderr}");
    }
    let mut con = raw(&server).await;
    let keys: Vec<String> = cmd(&mut con, &["KEYS", "*"]).await;
    assert!(
        !keys
            .iter()
            .any(|k| k.starts_with("agent_runtime_stopping") || k.ends_with("-cancel")),
        "{keys:?}"
    );
}
