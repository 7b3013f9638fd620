//! Operators' commands across processes, with the real binary: `runvisor ps` lists a run of
//! another process with the nodes it runs now; a run whose process was killed shows as
//! `orphaned` within a lease TTL; `runvisor worker --adopt-orphans` takes it over and finishes
//! it without rerunning its finished nodes; `runvisor tree` shows the actor tree of a run of
//! another process, and says why there is none otherwise, each with its exit code.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// One-second leases, so an orphan shows (and is adopted) quickly.
const CONFIG: &str = r#"{"runtime": {"lease": {"ttl": "1s", "renew": "200ms"},
    "adopt_every": "200ms", "durability": "sync"}}"#;

/// `start -> first (message) -> l (loop over two items) { p (parallel, 2 items) { w (sleep) } }`.
const WORKFLOW: &str = r#"{"id": "ops", "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "first", "kind": "message", "params": {"template": "first done"}},
    {"id": "l", "kind": "loop", "params": {"mode": "array", "items": [1, 2]},
     "body": {"nodes": [
        {"id": "p", "kind": "parallel", "params": {"items": ["a", "b"], "max_concurrency": 2},
         "body": {"nodes": [{"id": "w", "kind": "sleep", "params": {"duration": "60s"}}]}}
     ]}}
], "edges": [{"from": "start", "to": "first"}, {"from": "first", "to": "l"}]}"#;

struct Setup {
    server: RedisServer,
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("ops.json"), WORKFLOW).expect("workflow");
        std::fs::write(dir.path().join("config.json"), CONFIG).expect("config");
        Self {
            server: RedisServer::start(),
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir
            .path()
            .join(name)
            .to_str()
            .expect("utf-8 path")
            .to_owned()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "--config",
            &self.path("config.json"),
            "--redis",
            &self.server.url(),
        ])
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUNVISOR_REDIS_URL");
        cmd
    }

    fn spawn(&self, name: &str, args: &[&str]) -> Child {
        let file = |ext: &str| {
            std::fs::File::create(self.dir.path().join(format!("{name}.{ext}"))).expect("log")
        };
        self.command(args)
            .stdin(Stdio::null())
            .stdout(file("out"))
            .stderr(file("err"))
            .spawn()
            .expect("spawn runvisor")
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run runvisor")
    }

    fn log(&self, name: &str) -> String {
        let read = |ext: &str| {
            std::fs::read_to_string(self.dir.path().join(format!("{name}.{ext}")))
                .unwrap_or_default()
        };
        format!("--- stdout\n{}--- stderr\n{}", read("out"), read("err"))
    }

    fn ps(&self, extra: &[&str]) -> Vec<serde_json::Value> {
        let mut args = vec!["ps", "--json"];
        args.extend(extra);
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("ps --json prints a JSON array")
    }
}

/// How long a listing may take to show what a spawned process does: the debug binaries start
/// slowly when the suite's other tests load the machine.
const SPAWNED: Duration = Duration::from_secs(20);

/// Waits (bounded by [`SPAWNED`]) until `check` holds for what `ps` lists; on a timeout the
/// failure shows the last listing and the logs of the processes the test spawned.
async fn until_ps(
    setup: &Setup,
    what: &str,
    extra: &[&str],
    check: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + SPAWNED;
    loop {
        let rows = setup.ps(extra);
        if check(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "waited {SPAWNED:?} for {what}; ps lists {rows:#?}\nrun:\n{}\nworker:\n{}",
            setup.log("run"),
            setup.log("worker")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_and_tree_see_runs_of_other_processes_and_a_worker_adopts_an_orphan() {
    let setup = Setup::new();
    let file = setup.path("ops.json");
    let mut first = setup.spawn(
        "run",
        &[
            "run", &file, "--thread", "ops-1", "--app", "A", "--chat", "c1",
        ],
    );

    // Another process lists the run with the nodes it runs now.
    let rows = until_ps(&setup, "ps to show the running items", &[], |rows| {
        rows.first()
            .and_then(|r| r["nodes"].as_array())
            .is_some_and(|n| n.len() == 4)
    })
    .await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let row = &rows[0];
    assert_eq!(row["status"], "running");
    assert_eq!(row["thread"], "ops-1");
    assert_eq!(
        (row["app_id"].as_str(), row["chat_id"].as_str()),
        (Some("A"), Some("c1"))
    );
    assert_eq!(row["worker_alive"], true);
    let nodes: Vec<&str> = row["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert_eq!(nodes, ["l", "l/#0/p", "l/#0/p/@0/w", "l/#0/p/@1/w"]);
    let run = row["run_id"].as_str().expect("run id").to_owned();

    // Its actor tree, from the process that runs it.
    let out = setup.run(&["tree", &run]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[0].starts_with("run_supervisor running"), "{text}");
    assert!(lines[1].contains("loop l running (iteration 0)"), "{text}");
    assert!(
        lines[2].contains("parallel l/#0/p running (items in flight: 0, 1)"),
        "{text}"
    );
    assert!(lines[3].contains("node l/#0/p/@0/w running"), "{text}");
    assert!(lines[4].contains("node l/#0/p/@1/w running"), "{text}");
    // The human table names the same run.
    let out = setup.run(&["ps"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("RUN"), "{table}");
    assert!(
        table.contains(&run) && table.contains("app=A chat=c1"),
        "{table}"
    );

    // The process dies: within a lease TTL the run is orphaned, and a tree says so.
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    until_ps(&setup, "the run to be orphaned", &[], |rows| {
        rows.first().is_some_and(|r| r["status"] == "orphaned")
    })
    .await;
    let out = setup.run(&["tree", &run]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: ") && stderr.contains("orphaned"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // A worker adopting orphans takes it over: its items run again (they were running when
    // the process died), `first` does not (it had finished).
    let mut worker = setup.spawn("worker", &["worker", "--adopt-orphans"]);
    let rows = until_ps(&setup, "the orphan to be adopted", &["--all"], |rows| {
        rows.len() == 2 && rows[0]["status"] == "running" && rows[1]["status"] == "stopped"
    })
    .await;
    assert_eq!(rows[1]["run_id"].as_str(), Some(run.as_str()));
    assert_eq!(rows[1]["stop_reason"], "lease_lost");
    let adopted = rows[0]["run_id"].as_str().expect("id").to_owned();
    assert_ne!(adopted, run);
    until_ps(&setup, "the adopted run's items to run", &[], |rows| {
        rows.first()
            .and_then(|r| r["nodes"].as_array())
            .is_some_and(|n| n.len() == 4)
    })
    .await;

    // Stopping the worker stops its runs gracefully; they stay resumable, not orphaned.
    let pid = i32::try_from(worker.id()).expect("pid");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = worker.try_wait().expect("wait") {
            assert!(status.success(), "{}", setup.log("worker"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "worker did not stop\n{}",
            setup.log("worker")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rows = setup.ps(&["--all"]);
    assert_eq!(rows[0]["status"], "stopped", "{rows:#?}");
    assert_eq!(rows[0]["stop_reason"], "shutdown");
    // `first` finished before the crash and never ran again: its message is there once.
    let history = stores(&setup.server)
        .await
        .history
        .load(&thread("ops-1"))
        .await
        .expect("history");
    let firsts = history.iter().filter(|m| m.content == "first done").count();
    assert_eq!(firsts, 1, "{history:#?}");

    // No tree for a run that ended (exit 4), or for a run that does not exist (exit 2).
    let out = setup.run(&["tree", &adopted]);
    assert_eq!(out.status.code(), Some(4));
    let out = setup.run(&["tree", "01a20000-0000-7000-8000-000000000000"]);
    assert_eq!(out.status.code(), Some(2));
    let out = setup.run(&["tree", "not-a-run"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// A run paused for input is listed as open until a resume from another process answers it:
/// then its record says `answered` (no longer open), the answering run is the one listed, and
/// once the thread's last question is answered nothing is open.
#[test]
fn a_paused_run_answered_from_another_process_is_no_longer_listed_as_open() {
    let setup = Setup::new();
    let interactive = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/workflows/interactive.json"
    );
    let statuses = |extra: &[&str]| -> Vec<(String, String)> {
        setup
            .ps(extra)
            .iter()
            .map(|row| {
                let text = |field: &str| row[field].as_str().unwrap_or_default().to_owned();
                (text("run_id"), text("status"))
            })
            .collect()
    };
    let ok = |out: Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    ok(setup.run(&["run", interactive, "--thread", "ask-1"]));
    let open = statuses(&[]);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].1, "awaiting_input");
    let asked = open[0].0.clone();

    // A wrong answer changes nothing.
    let out = setup.run(&[
        "resume",
        "--thread",
        "ask-1",
        "--answer",
        r#"{"name": "Ann"}"#,
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        statuses(&[]),
        [(asked.clone(), "awaiting_input".to_owned())]
    );

    ok(setup.run(&[
        "resume",
        "--thread",
        "ask-1",
        "--answer",
        r#"{"email": "ann@example.com", "name": "Ann"}"#,
    ]));
    let open = statuses(&[]);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].1, "awaiting_input");
    let chose = open[0].0.clone();
    assert_ne!(chose, asked);
    assert_eq!(
        statuses(&["--status", "answered"]),
        [(asked.clone(), "answered".to_owned())]
    );
    // The run that answered names the one it continues.
    let rows = setup.ps(&[]);
    assert_eq!(
        rows[0]["parent_run_id"].as_str(),
        Some(asked.as_str()),
        "{rows:#?}"
    );

    ok(setup.run(&["resume", "--thread", "ask-1", "--answer", "pro"]));
    assert_eq!(statuses(&[]), []);
    let all = statuses(&["--all", "--thread", "ask-1"]);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(all[0].1, "succeeded");
    assert_eq!(
        all[1..],
        [
            (chose, "answered".to_owned()),
            (asked, "answered".to_owned())
        ]
    );
}
