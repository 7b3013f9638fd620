//! The Python client (`examples/clients/python/`) against the real `runvisor serve`: its demo
//! serves a workflow's `http` nodes from Python, streams the run's events, stops it
//! mid-stream (gracefully, then by force), checks the stop result, resumes the thread and
//! checks the outputs. It exits non-zero on any mismatch.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::Server;

const DEMO: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/clients/python/demo.py"
);

/// How long one demo may take before the test fails: a bound against hanging.
const DEMO_PATIENCE: Duration = Duration::from_secs(120);

/// The demo's process, killed if the test ends before it does.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs the demo in `mode` against the server; returns its exit success, stdout and stderr.
fn demo(server: &Server, mode: &str) -> (bool, String, String) {
    let child = Command::new("python3")
        .arg(DEMO)
        .args(["--url", &server.url(""), "--mode", mode, "--delay", "0.05"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (the CI script installs it when it is missing)");
    let mut demo = Demo(child);
    let mut stdout = demo.0.stdout.take().expect("piped stdout");
    let mut stderr = demo.0.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + DEMO_PATIENCE;
    let status = loop {
        if let Some(status) = demo.0.try_wait().expect("the demo's status") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the {mode} demo did not end in {DEMO_PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().expect("stdout reader");
    let stderr = err.join().expect("stderr reader");
    (status.success(), stdout, stderr)
}

#[test]
fn the_python_demo_stops_and_resumes_a_run_served_by_python() {
    let server = Server::start(&[], &[]);
    for (mode, kept) in [
        ("graceful", "ok: graceful stop kept the whole answer"),
        ("force", "ok: force stop kept the partial text"),
    ] {
        let (ok, stdout, stderr) = demo(&server, mode);
        assert!(
            ok,
            "the {mode} demo failed:\n{stdout}\n{stderr}\nserver log:\n{}",
            server.log()
        );
        for line in [
            kept,
            "says stopped",
            "ok: the resumed run completed; review saw the whole answer",
            "ok: every request carried its run, thread, node, path and attempt",
            &format!("demo passed ({mode} stop)"),
        ] {
            assert!(stdout.contains(line), "{line:?} in:\n{stdout}");
        }
        assert!(stdout.contains("  chunk  answer: ' stop'"), "{stdout}");
    }
    assert!(
        !server.log().contains("panicked"),
        "server log:\n{}",
        server.log()
    );
}
