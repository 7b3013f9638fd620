//! A run that ends while Redis is down, with the real binary: it does not claim success (exit
//! 3, one `error:` line saying what was not stored), its end goes to a spill file, and
//! `runvisor recover`, once Redis is back, writes the five messages, the final checkpoint and
//! the run record into Redis exactly once; a second `recover` finds nothing to do, and a
//! spill file another process is replaying is left alone. A `sync` run meeting a permanent
//! error (a key of the wrong type) fails at once instead of waiting.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// A workflow with five messages, then a pause long enough to take Redis away.
fn five_messages_then_wait(dir: &Path) -> PathBuf {
    let path = dir.join("five.json");
    std::fs::write(
        &path,
        r#"{"id": "five", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "m1", "kind": "message", "params": {"template": "one"}},
            {"id": "m2", "kind": "message", "params": {"template": "two"}},
            {"id": "m3", "kind": "message", "params": {"template": "three"}},
            {"id": "m4", "kind": "message", "params": {"template": "four"}},
            {"id": "m5", "kind": "message", "params": {"template": "five"}},
            {"id": "wait", "kind": "sleep", "params": {"duration": "3s"}}
        ], "edges": [
            {"from": "start", "to": "m1"}, {"from": "m1", "to": "m2"}, {"from": "m2", "to": "m3"},
            {"from": "m3", "to": "m4"}, {"from": "m4", "to": "m5"}, {"from": "m5", "to": "wait"}
        ]}"#,
    )
    .expect("write workflow");
    path
}

/// Short deadlines, so an outage is given up on within seconds.
fn config_file(dir: &Path) -> PathBuf {
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        r#"{"runtime": {"store_deadline": "1s"},
            "redis": {"connect_timeout": "300ms", "response_timeout": "300ms", "call_timeout": "1s"}}"#,
    )
    .expect("write config");
    path
}

/// The binary against a server, with the test's config and spill directory.
fn runvisor(server: &RedisServer, dir: &Path, spill: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg("--config")
        .arg(config_file(dir))
        .args(["--redis", &server.url()])
        .arg("--spill-dir")
        .arg(spill);
    command
}

fn wait_for(mut child: Child) -> Output {
    let started = Instant::now();
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if started.elapsed() > Duration::from_secs(60) => {
                let _ = child.kill();
                panic!("the run did not end");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The `error:` lines of a process's stderr (logs may come before them).
fn error_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .map(str::to_owned)
        .collect()
}

fn spill_files(spill: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(spill) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "spill"))
        .collect();
    files.sort();
    files
}

/// Starts a run of the five-message workflow on `thread`, waits until it has stored some
/// progress (its messages are done, it sleeps), then kills Redis and waits for the run's end.
async fn run_across_an_outage(
    server: &mut RedisServer,
    dir: &Path,
    spill: &Path,
    thread: &str,
) -> Output {
    let file = five_messages_then_wait(dir);
    let child = runvisor(server, dir, spill)
        .arg("run")
        .arg(&file)
        .args(["--thread", thread])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runvisor run");
    let mut con = raw(server).await;
    let index = format!("runvisor:cpidx:{{{thread}}}");
    within("the run's first stored progress", async {
        loop {
            let n: i64 = cmd(&mut con, &["ZCARD", &index]).await;
            if n > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    server.kill9();
    let out = tokio::task::spawn_blocking(move || wait_for(child))
        .await
        .expect("join");
    server.restart();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ending_while_redis_is_down_exits_3_and_recover_stores_it_exactly_once() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let spill = dir.path().join("spill");
    let out = run_across_an_outage(&mut server, dir.path(), &spill, "down").await;

    // Not a success: exit 3, one error line naming what was not stored and where it went.
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let line = &errors[0];
    for needle in [
        "succeeded, but its end was not stored",
        "5 message(s)",
        "the final checkpoint",
        "the run record",
        "runvisor recover",
    ] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    let progress = String::from_utf8_lossy(&out.stdout);
    assert!(
        progress.contains("■ run succeeded, but its end was not stored\n"),
        "{progress}"
    );
    let files = spill_files(&spill);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(line.contains(&files[0].display().to_string()), "{line}");

    // Redis is back (empty: the old server kept nothing). Recover writes it all, once.
    let recover = runvisor(&server, dir.path(), &spill)
        .arg("recover")
        .output()
        .expect("recover");
    let stdout = String::from_utf8_lossy(&recover.stdout);
    assert_eq!(
        recover.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&recover.stderr)
    );
    assert!(
        stdout.starts_with("replayed run ")
            && stdout.contains("of thread down: 5 message(s), checkpoint ")
            && stdout.contains("run record"),
        "{stdout}"
    );
    assert!(spill_files(&spill).is_empty(), "the spill file is removed");

    let mut con = raw(&server).await;
    let history_store = stores(&server).await.history;
    let stored = |con: &mut ::redis::aio::MultiplexedConnection| {
        let mut con = con.clone();
        let history_store = history_store.clone();
        async move {
            let history: Vec<String> = history_store
                .load(&thread("down"))
                .await
                .expect("history")
                .into_iter()
                .map(|m| m.content)
                .collect();
            let checkpoints: Vec<String> =
                cmd(&mut con, &["ZRANGE", "runvisor:cpidx:{down}", "0", "-1"]).await;
            let runs: Vec<String> =
                cmd(&mut con, &["ZRANGE", "runvisor:runs:{down}", "0", "-1"]).await;
            (history, checkpoints, runs)
        }
    };
    let (history, checkpoints, runs) = stored(&mut con).await;
    assert_eq!(history, ["one", "two", "three", "four", "five"]);
    assert_eq!(checkpoints.len(), 1, "the final checkpoint, once");
    assert_eq!(runs.len(), 1);
    let record_key = format!("runvisor:run:{{down}}:{}", runs[0]);
    let record: Vec<Option<String>> = cmd(
        &mut con,
        &[
            "HMGET",
            &record_key,
            "status",
            "checkpoint_id",
            "unpersisted",
        ],
    )
    .await;
    assert_eq!(record[0].as_deref(), Some("succeeded"));
    assert_eq!(record[1].as_ref(), Some(&checkpoints[0]));
    assert_eq!(record[2], None, "nothing is missing any more");
    assert!(stdout.contains(&checkpoints[0]), "{stdout}");

    // A second recover has nothing to do, and Redis is as it was.
    let again = runvisor(&server, dir.path(), &spill)
        .arg("recover")
        .output()
        .expect("recover again");
    assert_eq!(again.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(stdout.starts_with("nothing to recover in "), "{stdout}");
    assert_eq!(stored(&mut con).await, (history, checkpoints, runs));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_file_being_replayed_elsewhere_is_left_alone() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let spill = dir.path().join("spill");
    let out = run_across_an_outage(&mut server, dir.path(), &spill, "locked").await;
    assert_eq!(out.status.code(), Some(3));
    let files = spill_files(&spill);
    assert_eq!(files.len(), 1, "{files:?}");

    // Another recover holds the file's lock: this one leaves it (exit 4) and writes nothing.
    let held = File::open(&files[0]).expect("open the spill file");
    held.lock().expect("lock it");
    let busy = runvisor(&server, dir.path(), &spill)
        .arg("recover")
        .output()
        .expect("recover");
    assert_eq!(busy.status.code(), Some(4));
    let errors = error_lines(&busy);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("another process is replaying it"),
        "{errors:?}"
    );
    assert_eq!(spill_files(&spill), files);
    let mut con = raw(&server).await;
    let n: i64 = cmd(&mut con, &["EXISTS", "runvisor:hist:{locked}"]).await;
    assert_eq!(n, 0, "nothing written");

    // A worker starting once the lock is gone replays it.
    drop(held);
    let worker = runvisor(&server, dir.path(), &spill)
        .arg("recover")
        .output()
        .expect("recover");
    assert_eq!(worker.status.code(), Some(0));
    assert!(spill_files(&spill).is_empty());
    let n: i64 = cmd(&mut con, &["LLEN", "runvisor:hist:{locked}"]).await;
    assert_eq!(n, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_run_meeting_a_permanent_error_fails_at_once_and_spills() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let spill = dir.path().join("spill");
    // The thread's checkpoint index is a string: every checkpoint write is refused for good.
    let mut con = raw(&server).await;
    let _: String = cmd(&mut con, &["SET", "runvisor:cpidx:{wrong}", "not a zset"]).await;
    let file = five_messages_then_wait(dir.path());
    let out = runvisor(&server, dir.path(), &spill)
        .arg("run")
        .arg(&file)
        .args(["--thread", "wrong", "--durability", "sync"])
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("failed (the run's progress could not be stored")
            && errors[0].contains("runvisor:cpidx:{wrong}")
            && errors[0].contains("the final checkpoint"),
        "{errors:?}"
    );
    // It failed at its first node: the messages after it never ran.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("node m2"), "{stdout}");
    assert_eq!(spill_files(&spill).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_replays_spill_files_when_it_starts() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let spill = dir.path().join("spill");
    let out = run_across_an_outage(&mut server, dir.path(), &spill, "atstart").await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(spill_files(&spill).len(), 1);

    let mut worker = runvisor(&server, dir.path(), &spill)
        .args(["worker", "--adopt-orphans"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a worker");
    let mut con = raw(&server).await;
    within("the worker to replay the spill file", async {
        loop {
            let n: i64 = cmd(&mut con, &["LLEN", "runvisor:hist:{atstart}"]).await;
            if n == 5 && spill_files(&spill).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let _ = worker.kill();
    let _ = worker.wait();
    let checkpoints: i64 = cmd(&mut con, &["ZCARD", "runvisor:cpidx:{atstart}"]).await;
    assert_eq!(checkpoints, 1);
}
