//! Crash recovery with the real binary: `runvisor run` on a private Redis is killed with
//! SIGKILL in the middle of a workflow, and `runvisor resume` in another process finishes it.
//!
//! Executions are counted from both processes' progress output (`▶ node <id>` when a node
//! starts), and persisted effects from the thread's history (assistant messages per node).
//! Messages are persisted when a run ends and travel in its snapshots until then, so the
//! history holds every node's message exactly once in both modes; what differs is how much
//! work a crash costs:
//!
//! - `sync`: a node starts only after its predecessor's completion is stored, so every node
//!   started by the killed process had its predecessor in the last snapshot; at most the one
//!   node completed in the window between its completion and that snapshot runs twice.
//! - `async`: the nodes completed after the last stored snapshot run again (each at most
//!   twice), and the nodes in it never do.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runvisor::delta::materialize;
use runvisor::{Role, RunStatus, ThreadId};

use super::durability::{SLOW, assert_every_key_expires};
use super::support::{RedisServer, raw, stores, thread};

/// The workflow's nodes in chain order (after `start`); the stream nodes append a message.
const NODES: [&str; 6] = ["n1", "n2", "nap", "n3", "n4", "n5"];
const STREAMS: [&str; 5] = ["n1", "n2", "n3", "n4", "n5"];

fn text(node: &str) -> String {
    match node {
        // Long enough that the kill, right after `n2` is stored, lands before the run ends.
        "n3" => "n3 says one two three four five six seven".to_owned(),
        other => format!("{other} says hello"),
    }
}

fn workflow() -> String {
    let mut nodes = vec![serde_json::json!({"id": "start", "kind": "begin"})];
    let mut edges = Vec::new();
    let mut prev = "start";
    for node in NODES {
        nodes.push(if node == "nap" {
            serde_json::json!({"id": node, "kind": "sleep", "params": {"duration": "300ms"}})
        } else {
            let interval = if node == "n3" { "150ms" } else { "40ms" };
            serde_json::json!({"id": node, "kind": "stream_text",
                "params": {"text": text(node), "interval": interval}})
        });
        edges.push(serde_json::json!({"from": prev, "to": node}));
        prev = node;
    }
    serde_json::json!({"id": "crash", "nodes": nodes, "edges": edges}).to_string()
}

/// Runs the binary with its output going to files in `dir` (named after `name`).
fn spawn(dir: &Path, name: &str, args: &[&str]) -> Child {
    let file = |ext: &str| std::fs::File::create(dir.join(format!("{name}.{ext}"))).expect("log");
    Command::new(env!("CARGO_BIN_EXE_runvisor"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUNVISOR_REDIS_URL")
        .stdin(Stdio::null())
        .stdout(file("out"))
        .stderr(file("err"))
        .spawn()
        .expect("the runvisor binary starts")
}

fn output(dir: &Path, name: &str) -> String {
    let read =
        |ext: &str| std::fs::read_to_string(dir.join(format!("{name}.{ext}"))).unwrap_or_default();
    format!("--- stdout\n{}--- stderr\n{}", read("out"), read("err"))
}

/// The nodes a process started, from its progress lines (`▶ node <id> (<kind>)`).
fn started(dir: &Path, name: &str) -> BTreeMap<String, usize> {
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("▶ node ")
            && let Some(id) = rest.split_whitespace().next()
        {
            *counts.entry(id.to_owned()).or_default() += 1;
        }
    }
    counts
}

/// Waits for a process to exit, killing it and failing the test after `limit`.
/// A config with one-second leases.
const LEASES: &str = r#"{"runtime": {"lease": {"ttl": "1s", "renew": "250ms"}}}"#;

async fn exit_code(child: &mut Child, limit: Duration, dir: &Path, name: &str) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{name}` did not exit within {limit:?}\n{}",
                output(dir, name)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn kill_mid_run_then_resume(durability: &str, t: ThreadId) {
    let server = RedisServer::start();
    let url = server.url();
    let stores = stores(&server).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("crash.json");
    std::fs::write(&file, workflow()).expect("write the workflow");
    let file = file.to_str().expect("utf-8 path");
    // Short leases: the killed worker's thread is orphaned a second after its last heartbeat.
    let config = dir.path().join("config.json");
    std::fs::write(&config, LEASES).expect("write the config");
    let config = config.to_str().expect("utf-8 path");
    let thread_arg = t.to_string();

    // Process one: runs until `n2`'s completion is in a stored snapshot, then SIGKILL.
    let mut first = spawn(
        dir.path(),
        "run",
        &[
            "--config",
            config,
            "--redis",
            &url,
            "run",
            file,
            "--thread",
            &thread_arg,
            "--durability",
            durability,
            "--input",
            "query=crash me",
        ],
    );
    let deadline = Instant::now() + SLOW;
    loop {
        if let Some(status) = first.try_wait().expect("try_wait") {
            panic!(
                "the run ended ({status}) before it could be killed\n{}",
                output(dir.path(), "run")
            );
        }
        let latest = stores.checkpoints.latest(&t).await.ok().flatten();
        let n2_stored = match latest {
            Some(latest) => materialize(&*stores.checkpoints, &t, &latest)
                .await
                .expect("stored snapshots decode")
                .graph
                .completed
                .iter()
                .any(|c| c.node.as_str() == "n2"),
            None => false,
        };
        if n2_stored {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "`n2` not in a stored snapshot within {SLOW:?}\n{}",
            output(dir.path(), "run")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().expect("SIGKILL");
    let status = first.wait().expect("reaped");
    assert_eq!(status.code(), None, "killed by a signal, not exited");

    // What the crash left: the run's record still says running (its end never came), and
    // the last snapshot holds the completed nodes and, not yet persisted, their messages.
    let records = stores.runs.list_thread(&t).await.expect("runs");
    assert_eq!(records.len(), 1, "{records:#?}");
    let crashed = records[0].run_id;
    assert_eq!(records[0].status, RunStatus::Running);
    let latest = stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("a checkpoint");
    let snapshot = materialize(&*stores.checkpoints, &t, &latest)
        .await
        .expect("the last snapshot decodes");
    assert_eq!(snapshot.run_id, crashed);
    assert_eq!(snapshot.status, RunStatus::Running);
    let stored: Vec<&str> = snapshot
        .graph
        .completed
        .iter()
        .map(|c| c.node.as_str())
        .collect();
    let chain: Vec<&str> = std::iter::once("start").chain(NODES).collect();
    assert_eq!(
        stored,
        chain[..stored.len()],
        "completions are a prefix of the chain"
    );
    assert!(
        stored.len() >= 3 && stored.len() < chain.len(),
        "{stored:?}"
    );
    let frontier: Vec<&str> = snapshot.graph.frontier.iter().map(|n| n.as_str()).collect();
    assert_eq!(frontier, [chain[stored.len()]]);
    let pending: Vec<(Role, Option<&str>, &str)> = snapshot
        .pending_messages
        .iter()
        .map(|m| {
            (
                m.role,
                m.node_id.as_ref().map(|n| n.as_str()),
                m.content.as_str(),
            )
        })
        .collect();
    let mut expected_pending = vec![(Role::User, None, "crash me".to_owned())];
    for node in stored.iter().filter(|n| STREAMS.contains(n)) {
        expected_pending.push((Role::Assistant, Some(*node), text(node)));
    }
    assert_eq!(
        pending,
        expected_pending
            .iter()
            .map(|(r, n, c)| (*r, *n, c.as_str()))
            .collect::<Vec<_>>()
    );
    assert!(
        stores.history.load(&t).await.expect("history").is_empty(),
        "messages are persisted at the run's end, which never came"
    );

    let before = started(dir.path(), "run");
    if durability == "sync" {
        // Nothing started before its predecessor's completion was stored.
        for (i, node) in chain.iter().enumerate().skip(1) {
            if before.contains_key(*node) {
                assert!(
                    stored.contains(&chain[i - 1]),
                    "`{node}` started before `{}` was stored ({stored:?})\n{}",
                    chain[i - 1],
                    output(dir.path(), "run")
                );
            }
        }
    }

    // Process two: takes the thread over once the killed worker's heartbeat has expired (until
    // then the thread is busy: exit code 4), and finishes the run.
    let deadline = Instant::now() + SLOW;
    loop {
        let mut second = spawn(
            dir.path(),
            "resume",
            &[
                "--config",
                config,
                "--redis",
                &url,
                "resume",
                "--thread",
                &thread_arg,
            ],
        );
        let code = exit_code(&mut second, SLOW, dir.path(), "resume").await;
        if code == Some(4) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(code, Some(0), "{}", output(dir.path(), "resume"));
        break;
    }
    let after = started(dir.path(), "resume");

    // The resumed process ran exactly the nodes the snapshot had not completed.
    let rerun: Vec<&str> = chain
        .iter()
        .copied()
        .filter(|n| after.contains_key(*n))
        .collect();
    assert_eq!(
        rerun,
        chain[stored.len()..],
        "{}",
        output(dir.path(), "resume")
    );
    assert!(after.values().all(|c| *c == 1), "{after:?}");
    // Executions per node over both processes: once for the stored ones, at most twice for
    // the others (the killed process's output may miss its last lines: a lower bound).
    let mut twice = Vec::new();
    for node in &chain[1..] {
        let runs = before.get(*node).copied().unwrap_or(0) + after.get(*node).copied().unwrap_or(0);
        if stored.contains(node) {
            assert_eq!(runs, 1, "`{node}` ran {runs} times");
        } else {
            assert!((1..=2).contains(&runs), "`{node}` ran {runs} times");
            if runs == 2 {
                twice.push(*node);
            }
        }
    }
    eprintln!("{durability}: the last snapshot held {stored:?}; ran twice: {twice:?}");
    if durability == "sync" {
        // Only the node the crash caught (at most one, the first of the frontier) ran twice.
        assert!(
            twice.is_empty() || twice == [chain[stored.len()]],
            "{twice:?} ran twice with sync durability"
        );
    }

    // Persisted effects: the query and every node's message exactly once, in order.
    let history = stores.history.load(&t).await.expect("history");
    let ids: HashSet<_> = history.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), history.len(), "no message stored twice");
    let got: Vec<(Role, Option<String>, &str)> = history
        .iter()
        .map(|m| {
            (
                m.role,
                m.node_id.as_ref().map(|n| n.to_string()),
                m.content.as_str(),
            )
        })
        .collect();
    let mut want = vec![(Role::User, None, "crash me".to_owned())];
    for node in STREAMS {
        want.push((Role::Assistant, Some(node.to_owned()), text(node)));
    }
    assert_eq!(
        got,
        want.iter()
            .map(|(r, n, c)| (*r, n.clone(), c.as_str()))
            .collect::<Vec<_>>()
    );

    // Records and checkpoints: the resumed run succeeded and says whose work it continued.
    let records = stores.runs.list_thread(&t).await.expect("runs");
    assert_eq!(records.len(), 2, "{records:#?}");
    assert_eq!(records[0].run_id, crashed);
    assert_eq!(records[1].status, RunStatus::Succeeded, "{records:#?}");
    assert_eq!(records[1].parent_run_id, Some(crashed));
    let last = stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("the final checkpoint");
    assert_eq!(records[1].checkpoint_id, Some(last.id));
    // A delta when the bound has not come round: read back through its chain.
    let last = materialize(&*stores.checkpoints, &t, &last)
        .await
        .expect("the final checkpoint reads back whole");
    assert_eq!(last.status, RunStatus::Succeeded);
    assert_eq!(last.run_id, records[1].run_id);
    assert_eq!(
        last.graph
            .completed
            .iter()
            .map(|c| c.node.as_str())
            .collect::<Vec<_>>(),
        chain
    );
    // The final checkpoint carries the run's messages as pending (written before the
    // history); the history has taken every one of them.
    assert!(
        last.pending_messages.iter().all(|m| ids.contains(&m.id)),
        "a pending message is not in the history"
    );
    let mut con = raw(&server).await;
    assert!(assert_every_key_expires(&mut con, "runvisor").await >= 7);
}

#[tokio::test]
async fn a_killed_sync_run_resumes_in_another_process_and_every_node_counts_once() {
    kill_mid_run_then_resume("sync", thread("crash-sync")).await;
}

#[tokio::test]
async fn a_killed_async_run_resumes_in_another_process_and_only_unstored_nodes_run_again() {
    kill_mid_run_then_resume("async", thread("crash-async")).await;
}
