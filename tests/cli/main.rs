//! The `runvisor` binary end to end: runs and validates the sample workflows in
//! `examples/workflows/`, and checks that every bad input is a one-line error with a non-zero
//! exit code, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Exit code of a failed run.
const RUN_FAILED: i32 = 1;
/// Exit code of bad input (unreadable file, invalid workflow, bad flag value).
const BAD_INPUT: i32 = 2;

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/workflows")
        .join(name)
}

/// What one invocation of the binary did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn runvisor<I, S>(args: I) -> Ran
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_runvisor"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("the runvisor binary runs");
    Ran {
        code: status.code(),
        stdout: String::from_utf8(stdout).expect("stdout is utf-8"),
        stderr: String::from_utf8(stderr).expect("stderr is utf-8"),
    }
}

/// Asserts a clean refusal: the given exit code, exactly one `error: ...` line, no panic.
fn assert_one_line_error(ran: &Ran, code: i32, needle: &str) {
    assert_eq!(ran.code, Some(code), "{ran:?}");
    assert!(!ran.stderr.contains("panicked"), "{ran:?}");
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {ran:?}");
    assert!(lines[0].starts_with("error: "), "{ran:?}");
    assert!(lines[0].contains(needle), "wanted {needle:?}: {ran:?}");
}

/// The JSON that follows `outputs:` in the human-readable output.
fn printed_outputs(stdout: &str) -> serde_json::Value {
    let (_, json) = stdout
        .split_once("outputs:\n")
        .expect("outputs are printed");
    serde_json::from_str(json).expect("outputs are JSON")
}

#[test]
fn run_shows_progress_streams_and_prints_outputs() {
    let agent = sample("support_agent.json");
    let ran = runvisor([
        "run".as_ref(),
        agent.as_os_str(),
        "--input".as_ref(),
        "query=I want my money back".as_ref(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let out = &ran.stdout;
    for line in [
        "▶ node answer (stream_text)",
        "  Thanks for reaching out about \"I want my money back\". Let me look into that for you.",
        "↷ node vip_reply skipped",
        "↷ node shipping_reply skipped",
        "↷ node general_reply skipped",
        "▶ node refund_reply (message)",
        "■ run succeeded",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?}: {ran:?}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("✓ node answer ") && l.ends_with("ms")),
        "{ran:?}"
    );
    let outputs = printed_outputs(out);
    assert_eq!(outputs["route"]["branch"], "refund");
    assert_eq!(
        outputs["refund_reply"]["text"],
        "I have opened a refund request. You will get an email once it is approved."
    );
    assert!(outputs.get("general_reply").is_none(), "skipped: no output");
}

#[test]
fn typed_inputs_pick_the_branch() {
    let agent = sample("support_agent.json");
    let ran = runvisor([
        "run".as_ref(),
        agent.as_os_str(),
        "-i".as_ref(),
        "query=where is my delivery?".as_ref(),
        "-i".as_ref(),
        "tier=4".as_ref(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let outputs = printed_outputs(&ran.stdout);
    assert_eq!(outputs["start"]["tier"], 4, "an integer, not text");
    assert_eq!(outputs["route"]["branch"], "vip");
}

#[test]
fn json_output_is_one_document_with_the_outcome() {
    let agent = sample("support_agent.json");
    let ran = runvisor([
        "run".as_ref(),
        agent.as_os_str(),
        "--input".as_ref(),
        "query=hello".as_ref(),
        "--thread".as_ref(),
        "chat-7".as_ref(),
        "--json".as_ref(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let doc: serde_json::Value = serde_json::from_str(&ran.stdout).expect("stdout is JSON");
    assert_eq!(doc["status"], "succeeded");
    assert_eq!(doc["thread"], "chat-7");
    assert_eq!(doc["workflow"], "support_agent");
    assert_eq!(doc["error"], serde_json::Value::Null);
    assert_eq!(doc["outputs"]["route"]["branch"], "else");
    assert_eq!(
        doc["outputs"]["general_reply"]["text"],
        "A colleague will get back to you about: hello"
    );
    let messages: Vec<(&str, &str)> = doc["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default(),
                m["content"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        messages,
        vec![
            ("user", "hello"),
            (
                "assistant",
                "Thanks for reaching out about \"hello\". Let me look into that for you."
            ),
            ("assistant", "A colleague will get back to you about: hello"),
        ]
    );
}

#[test]
fn fanout_joins_every_branch() {
    let ran = runvisor(["run".as_ref(), sample("fanout.json").as_os_str()]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let outputs = printed_outputs(&ran.stdout);
    assert_eq!(
        outputs["summary"]["text"],
        "Notes on the history of tea: sources found, key dates listed. \
         Outline: 1. Origins 2. Trade 3. Today (fetched in 150 ms)"
    );
    for node in ["research", "fetch", "outline"] {
        let started = format!("▶ node {node} ");
        assert!(ran.stdout.contains(&started), "{ran:?}");
    }
}

#[test]
fn validate_accepts_the_samples() {
    for (file, nodes) in [("support_agent.json", 7), ("fanout.json", 5)] {
        let ran = runvisor(["validate".as_ref(), sample(file).as_os_str()]);
        assert_eq!(ran.code, Some(0), "{ran:?}");
        let first = ran.stdout.lines().next().unwrap_or_default();
        assert_eq!(first, format!("ok: {nodes} nodes"), "{ran:?}");
    }
}

#[test]
fn validate_lists_every_problem_and_exits_2() {
    let invalid = sample("invalid.json");
    let ran = runvisor(["validate".as_ref(), invalid.as_os_str()]);
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    assert!(!ran.stderr.contains("panicked"), "{ran:?}");
    let errors: Vec<&str> = ran
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    let expected = [
        "node `answer`: field `params.text`: is required",
        "node `answer`: field `params.interval`: is not a duration",
        "node `answer`: field `params.txt`: is not a known field",
        "node `answer`: field `id`: duplicate id",
        "node `lookup`: field `kind`: unknown kind `web_search`",
        "node `wait`: field `params.duration`: expected a duration",
        "edge #1 (answer -> reply): field `to`: no node `reply`",
        "edge #2 (start -> wait): field `branch`",
    ];
    assert_eq!(errors.len(), expected.len(), "{ran:?}");
    for (line, want) in errors.iter().zip(expected) {
        assert!(line.contains("invalid.json: "), "names the file: {line}");
        assert!(line.contains(want), "wanted {want:?} in {line:?}");
    }
    assert!(
        ran.stderr
            .ends_with(&format!("invalid: 8 problems in {}\n", invalid.display())),
        "{ran:?}"
    );

    // `run` refuses the same workflow with the same list, before starting anything.
    let ran = runvisor(["run".as_ref(), invalid.as_os_str()]);
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    assert!(ran.stdout.is_empty(), "{ran:?}");
    assert_eq!(ran.stderr.lines().count(), expected.len() + 1, "{ran:?}");
}

/// Writes a workflow of `begin -> n0..n{count-1}` (each node made by `node`) to a temp file.
fn fan_file(dir: &Path, count: usize, node: impl Fn(usize) -> serde_json::Value) -> PathBuf {
    let mut nodes = vec![serde_json::json!({"id": "start", "kind": "begin"})];
    let mut edges = Vec::new();
    for i in 0..count {
        nodes.push(node(i));
        edges.push(serde_json::json!({"from": "start", "to": format!("n{i}")}));
    }
    let file = dir.join(format!("fan-{count}.json"));
    let workflow = serde_json::json!({"id": "big", "nodes": nodes, "edges": edges});
    std::fs::write(&file, workflow.to_string()).expect("written");
    file
}

#[test]
fn validate_output_stays_small_for_ten_thousand_nodes_of_an_unknown_kind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = fan_file(
        dir.path(),
        10_000,
        |i| serde_json::json!({"id": format!("n{i}"), "kind": "gpt"}),
    );
    let ran = runvisor(["validate".as_ref(), file.as_os_str()]);
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    assert!(
        ran.stderr.len() < 2_048,
        "{} bytes: {ran:?}",
        ran.stderr.len()
    );
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{ran:?}");
    assert!(
        lines[0].contains("nodes `n0`, `n1`, `n2`, `n3`, `n4`, `n5`, `n6`, `n7`, `n8`, `n9` and 9990 more: field `kind`: unknown kind `gpt` (known: "),
        "{ran:?}"
    );
    assert_eq!(
        lines[1],
        format!("invalid: 1 problem in {}", file.display())
    );
}

#[test]
fn validate_lists_a_hundred_problems_then_how_many_more() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = fan_file(
        dir.path(),
        150,
        |i| serde_json::json!({"id": format!("n{i}"), "kind": "template", "params": {"template": i}}),
    );
    let ran = runvisor(["validate".as_ref(), file.as_os_str()]);
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(lines.len(), 100 + 2, "{ran:?}");
    assert!(
        lines[..100].iter().all(|l| l.starts_with("error: ")),
        "{ran:?}"
    );
    assert!(
        lines[99].contains("node `n99`: field `params.template`"),
        "{ran:?}"
    );
    assert_eq!(lines[100], "and 50 more");
    assert_eq!(
        lines[101],
        format!("invalid: 150 problems in {}", file.display())
    );
}

#[test]
fn a_missing_file_is_one_line() {
    let ran = runvisor(["run", "no/such/workflow.json"]);
    assert_one_line_error(
        &ran,
        BAD_INPUT,
        "cannot read workflow no/such/workflow.json: ",
    );
    let ran = runvisor(["validate", "no/such/workflow.json"]);
    assert_one_line_error(&ran, BAD_INPUT, "cannot read workflow");
}

#[test]
fn malformed_json_is_one_line_with_its_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("broken.json");
    std::fs::write(&file, "{\"id\": \"x\",\n  nodes: []}").expect("written");
    let ran = runvisor(["validate".as_ref(), file.as_os_str()]);
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    assert!(!ran.stderr.contains("panicked"), "{ran:?}");
    let first = ran.stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "{ran:?}");
    assert!(
        first.contains("malformed workflow JSON at line 2, column 3"),
        "{ran:?}"
    );
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let agent = sample("support_agent.json");
    let cases: &[(&[&str], &str)] = &[
        (
            &[],
            "missing input query (string, required): pass --input query=VALUE",
        ),
        (
            &["--input", "query"],
            "bad --input \"query\": expected KEY=VALUE",
        ),
        (
            &["--input", "query=x", "--input", "colour=red"],
            "input `colour`: not declared by the begin node (declared: query, tier)",
        ),
        (
            &["--input", "query=x", "--input", "tier=gold"],
            "input `tier`: not valid JSON",
        ),
        (
            &["--input", "query=x", "--thread", "two words"],
            "bad --thread: invalid thread id",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["run".as_ref(), agent.as_os_str()];
        args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
        let ran = runvisor(args);
        assert_one_line_error(&ran, BAD_INPUT, needle);
        assert!(ran.stdout.is_empty(), "nothing ran: {ran:?}");
    }
}

#[test]
fn a_bad_config_file_is_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("runvisor.json");
    std::fs::write(&config, r#"{"runtime": {"stop_timeout": "soon"}}"#).expect("written");
    let ran = runvisor([
        "--config".as_ref(),
        config.as_os_str(),
        "validate".as_ref(),
        sample("fanout.json").as_os_str(),
    ]);
    assert_one_line_error(&ran, BAD_INPUT, "field `runtime.stop_timeout`");

    // A worker's config (the README's) validates workflows too.
    std::fs::write(
        &config,
        r#"{"runtime": {"stop_timeout": "5s", "worker_id": "api-1",
                        "lease": {"ttl": "15s", "renew": "5s"},
                        "adopt_orphans": true, "adopt_every": "5s"}}"#,
    )
    .expect("written");
    let ran = runvisor([
        "--config".as_ref(),
        config.as_os_str(),
        "validate".as_ref(),
        sample("fanout.json").as_os_str(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
}

#[test]
fn a_failing_node_fails_the_run_with_exit_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("fails.json");
    // Valid at load time; the reference resolves to a bad duration only when it runs.
    std::fs::write(
        &file,
        r#"{"id": "fails", "nodes": [
            {"id": "start", "kind": "begin",
             "params": {"inputs": [{"name": "wait", "type": "string", "default": "soon"}]}},
            {"id": "hello", "kind": "stream_text", "params": {"text": "hi", "interval": "1ms"}},
            {"id": "nap", "kind": "sleep", "params": {"duration": "{{start.wait}}"}}
          ],
          "edges": [{"from": "start", "to": "hello"}, {"from": "hello", "to": "nap"}]}"#,
    )
    .expect("written");

    let ran = runvisor(["run".as_ref(), file.as_os_str()]);
    assert_eq!(ran.code, Some(RUN_FAILED), "{ran:?}");
    assert!(
        ran.stdout.contains("✗ node nap failed: input `duration`"),
        "{ran:?}"
    );
    assert_eq!(printed_outputs(&ran.stdout)["hello"]["text"], "hi", "kept");
    assert!(
        ran.stderr
            .lines()
            .any(|l| l.starts_with("error: run failed: node `nap` failed")),
        "{ran:?}"
    );
    assert!(!ran.stderr.contains("panicked"), "{ran:?}");

    let ran = runvisor(["run".as_ref(), file.as_os_str(), "--json".as_ref()]);
    assert_eq!(ran.code, Some(RUN_FAILED), "{ran:?}");
    let doc: serde_json::Value = serde_json::from_str(&ran.stdout).expect("stdout is JSON");
    assert_eq!(doc["status"], "failed");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("node `nap` failed")),
        "{doc}"
    );
}

#[test]
fn no_arguments_print_usage_not_a_panic() {
    let ran = runvisor(std::iter::empty::<&str>());
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    assert!(ran.stderr.contains("Usage: runvisor"), "{ran:?}");
    assert!(!ran.stderr.contains("panicked"), "{ran:?}");
}

#[test]
fn a_fork_names_its_checkpoint_and_needs_redis() {
    // `--fork-into` only goes with `--checkpoint`: a usage error, not a panic.
    let ran = runvisor(["resume", "--thread", "t", "--fork-into", "t2"]);
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    assert!(ran.stderr.contains("--checkpoint"), "{ran:?}");
    assert!(!ran.stderr.contains("panicked"), "{ran:?}");
    // Forking reads another process's checkpoint: without Redis it is one line saying so.
    let checkpoint = "01920000-0000-7000-8000-0000000000a1";
    let ran = runvisor([
        "resume",
        "--thread",
        "t",
        "--checkpoint",
        checkpoint,
        "--fork-into",
        "t2",
    ]);
    assert_one_line_error(&ran, BAD_INPUT, "--redis");
}

/// Sends SIGINT to a child process, as Ctrl-C in a terminal would.
fn interrupt(child: &std::process::Child) {
    let status = Command::new("sh")
        .args(["-c", &format!("kill -INT {}", child.id())])
        .status()
        .expect("sh runs");
    assert!(status.success(), "kill -INT failed");
}

#[test]
fn ctrl_c_stops_the_run_and_keeps_the_streamed_text() {
    use std::io::Read;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("long.json");
    let words: Vec<String> = (1..=200).map(|i| format!("w{i}")).collect();
    let workflow = serde_json::json!({
        "id": "long",
        "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "answer", "kind": "stream_text",
             "params": {"text": words.join(" "), "interval": "50ms"}},
            {"id": "after", "kind": "message", "params": {"template": "done"}}
        ],
        "edges": [{"from": "start", "to": "answer"}, {"from": "answer", "to": "after"}]
    });
    std::fs::write(&file, workflow.to_string()).expect("written");

    let mut child = Command::new(env!("CARGO_BIN_EXE_runvisor"))
        .args(["run".as_ref(), file.as_os_str()])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runvisor starts");
    // Chunks arrive without a newline: read bytes as they come.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().expect("piped");
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                seen.lock()
                    .expect("not poisoned")
                    .extend_from_slice(&buf[..n]);
            }
        })
    };
    // Wait (bounded, so a broken binary fails instead of hanging) until two chunks streamed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&seen.lock().expect("not poisoned")).contains("w1 w2") {
        assert!(Instant::now() < deadline, "no streamed chunks");
        std::thread::sleep(Duration::from_millis(10));
    }
    interrupt(&child);
    let status = child.wait().expect("runvisor ends");
    reader.join().expect("reader ends");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .expect("stderr is utf-8");
    let stdout = String::from_utf8(seen.lock().expect("not poisoned").clone()).expect("utf-8");
    let ran = Ran {
        code: status.code(),
        stdout,
        stderr,
    };

    assert_eq!(ran.code, Some(130), "{ran:?}");
    assert!(!ran.stderr.contains("panicked"), "{ran:?}");
    assert!(
        ran.stderr.contains("stopping (user_interrupted)"),
        "{ran:?}"
    );
    for line in [
        "⏸ node answer interrupted",
        "■ run stopped",
        "stopped (user_interrupted) at answer",
    ] {
        assert!(
            ran.stdout.lines().any(|l| l == line),
            "missing {line:?}: {ran:?}"
        );
    }
    let partial = ran
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("partial response: "))
        .expect("the partial response is shown");
    assert!(partial.starts_with("\"w1 w2"), "{ran:?}");
    assert!(!partial.contains("w200"), "cut short: {ran:?}");
    let outputs = printed_outputs(&ran.stdout);
    assert!(outputs.get("answer").is_none(), "interrupted: no output");
    assert!(outputs.get("after").is_none(), "never started");
}

#[test]
fn a_stopped_run_is_described_in_json() {
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("nap.json");
    std::fs::write(
        &file,
        r#"{"id": "nap", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "nap", "kind": "sleep", "params": {"duration": "1h"}}
          ],
          "edges": [{"from": "start", "to": "nap"}]}"#,
    )
    .expect("written");
    let child = Command::new(env!("CARGO_BIN_EXE_runvisor"))
        .args(["run".as_ref(), file.as_os_str(), "--json".as_ref()])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runvisor starts");
    // Nothing is printed before the end in --json mode; the nap lasts an hour, so any moment
    // after start-up finds the run sleeping.
    std::thread::sleep(Duration::from_millis(500));
    interrupt(&child);
    let output = child.wait_with_output().expect("runvisor ends");
    let ran = Ran {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).expect("utf-8"),
        stderr: String::from_utf8(output.stderr).expect("utf-8"),
    };
    assert_eq!(ran.code, Some(130), "{ran:?}");
    let doc: serde_json::Value = serde_json::from_str(&ran.stdout).expect("stdout is JSON");
    assert_eq!(doc["status"], "stopped", "{ran:?}");
    assert_eq!(doc["stop"]["reason"], "user_interrupted");
    assert_eq!(doc["stop"]["stopped_at"], serde_json::json!(["nap"]));
    assert_eq!(doc["stop"]["frontier"], serde_json::json!(["nap"]));
    assert_eq!(doc["stop"]["finished"], serde_json::json!(["start"]));
}

#[test]
fn a_command_line_clap_cannot_read_is_one_error_line_with_code_2() {
    for args in [
        vec!["run", "--bogus"],
        vec!["stop", "--app", "a"],
        vec!["frobnicate"],
        vec!["worker", "--concurrency", "0"],
    ] {
        let ran = runvisor(args.iter().copied());
        assert_eq!(ran.code, Some(BAD_INPUT), "{args:?}: {ran:?}");
        let lines: Vec<&str> = ran.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {ran:?}");
        assert!(lines[0].starts_with("error: "), "{args:?}: {ran:?}");
        assert!(
            lines[0].ends_with("(see runvisor --help)"),
            "{args:?}: {ran:?}"
        );
    }
    let ran = runvisor(["stop", "--app", "a"]);
    assert!(
        ran.stderr.contains("--chat"),
        "names what is missing: {ran:?}"
    );
}

#[test]
fn the_loop_parallel_and_interactive_samples_run_as_the_readme_says() {
    let ran = runvisor([
        "run".as_ref(),
        sample("loop.json").as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let doc: serde_json::Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(doc["status"], "succeeded", "{doc}");
    assert_eq!(doc["outputs"]["drafts"]["iterations"], 3, "{doc}");

    let ran = runvisor([
        "run".as_ref(),
        sample("parallel.json").as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let doc: serde_json::Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(doc["outputs"]["search"]["count"], 4, "{doc}");

    // The interactive sample pauses at its form (in memory: the answer needs a durable store).
    let ran = runvisor([
        "run".as_ref(),
        sample("interactive.json").as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let doc: serde_json::Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(doc["status"], "awaiting_input", "{doc}");
}

#[test]
fn http_hosts_come_from_the_allow_list_its_config_and_its_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workflow = dir.path().join("remote.json");
    std::fs::write(
        &workflow,
        serde_json::json!({"id": "remote", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "ask", "kind": "http", "params": {"url": "http://10.1.2.3:9000/ask"}}
        ], "edges": [{"from": "start", "to": "ask"}]})
        .to_string(),
    )
    .expect("written");
    // Loopback only by default.
    let ran = runvisor(["validate".as_ref(), workflow.as_os_str()]);
    assert_eq!(ran.code, Some(BAD_INPUT), "{ran:?}");
    assert!(
        ran.stderr
            .contains("node `ask`: field `params.url`: host `10.1.2.3` is not on the allow-list"),
        "{ran:?}"
    );
    let ran = runvisor([
        "--http-allow".as_ref(),
        "localhost,10.0.0.0/8".as_ref(),
        "validate".as_ref(),
        workflow.as_os_str(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let config = dir.path().join("runvisor.json");
    std::fs::write(&config, r#"{"http": {"allow": ["10.1.2.3"]}}"#).expect("written");
    let ran = runvisor([
        "--config".as_ref(),
        config.as_os_str(),
        "validate".as_ref(),
        workflow.as_os_str(),
    ]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let ran = runvisor([
        "--http-allow".as_ref(),
        "no such host".as_ref(),
        "validate".as_ref(),
        workflow.as_os_str(),
    ]);
    assert_one_line_error(
        &ran,
        BAD_INPUT,
        "--http-allow: \"no such host\" is not a host name",
    );
}
