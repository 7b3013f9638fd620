//! `runvisor serve --stdio`: the real binary with in-memory stores, spoken to in JSON-RPC 2.0
//! over its stdin and stdout, one message per line: runs started (waiting or not) and stopped
//! with `agent.stop` (NexAU's `StopResponse`), errors with their standard codes, a
//! notification unanswered, a batch, and end of input shutting down with exit 0.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::server::PATIENCE;
use super::sleepy;

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// A running `runvisor serve --stdio`: requests written to its stdin, answers read from its
/// stdout (each line must be JSON).
struct RpcProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    answers: mpsc::Receiver<Value>,
}

impl RpcProcess {
    fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(["serve", "--stdio"])
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("RUNVISOR_REDIS_URL")
            .env_remove("RUNVISOR_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn runvisor serve --stdio");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            answers,
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write a request");
        stdin.flush().expect("flush");
    }

    fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write a line");
        stdin.flush().expect("flush");
    }

    fn call(&mut self, id: u64, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    /// The next answer.
    fn next(&self) -> Value {
        self.answers
            .recv_timeout(PATIENCE)
            .expect("an answer within the patience")
    }

    /// Closes stdin and returns the exit code.
    fn finish(mut self) -> Option<i32> {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("serve --stdio did not exit after end of input");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RpcProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn run_start_waits_for_the_outcome() {
    let mut rpc = RpcProcess::start(&[]);
    rpc.call(
        7,
        "run.start",
        json!({"workflow": sleepy(), "inputs": {"query": "10ms"}, "wait": true}),
    );
    let answer = rpc.next();
    assert_eq!(answer["jsonrpc"], "2.0");
    assert_eq!(answer["id"], 7);
    assert_eq!(answer["result"]["status"], "succeeded", "{answer}");
    assert_eq!(answer["result"]["outputs"]["b"]["text"], "done after 10ms");
    let thread = answer["result"]["thread"].clone();

    // A thread whose run succeeded has nothing to resume: the service's 409 is a server
    // error, its code in `data`.
    rpc.call(8, "run.resume", json!({"thread": thread, "say": "20ms"}));
    let answer = rpc.next();
    assert_eq!(answer["id"], 8, "{answer}");
    assert_eq!(answer["error"]["code"], -32000, "{answer}");
    assert_eq!(
        answer["error"]["data"]["code"], "nothing_to_resume",
        "{answer}"
    );
    assert_eq!(rpc.finish(), Some(0));
}

#[test]
fn a_line_over_the_body_limit_is_an_invalid_request() {
    let mut rpc = RpcProcess::start(&["--body-limit", "200"]);
    rpc.call(1, "agent.stop", json!({"session_id": "x".repeat(300)}));
    let answer = rpc.next();
    assert_eq!(answer["id"], Value::Null, "{answer}");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    // The next line is read as usual.
    rpc.call(2, "no.such", json!({}));
    let answer = rpc.next();
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(rpc.finish(), Some(0));
}

#[test]
fn agent_stop_stops_a_started_run_while_a_waiting_start_is_pending() {
    let mut rpc = RpcProcess::start(&[]);
    // A start that waits a minute blocks nothing sent after it.
    rpc.call(
        1,
        "run.start",
        json!({"workflow": sleepy(), "inputs": {"query": "60s"}, "thread": "waiting", "wait": true}),
    );
    rpc.call(
        2,
        "run.start",
        json!({"workflow": sleepy(), "inputs": {"query": "60s"}, "thread": "sess-1",
               "user": "u-1"}),
    );
    let started = rpc.next();
    assert_eq!(started["id"], 2, "{started}");
    assert_eq!(started["result"]["status"], "running", "{started}");
    assert_eq!(started["result"]["thread"], "sess-1");

    rpc.call(
        3,
        "agent.stop",
        json!({"user_id": "u-1", "session_id": "sess-1", "agent_id": null, "force": false,
               "timeout": 5.0}),
    );
    let stopped = rpc.next();
    assert_eq!(stopped["id"], 3, "{stopped}");
    // NexAU's StopResponse, field by field; the user's query is the one message persisted.
    assert_eq!(
        stopped["result"],
        json!({"status": "success", "stop_reason": "USER_INTERRUPTED", "message_count": 1,
               "error": null}),
        "{stopped}"
    );

    // No running agent on that session any more: NexAU's error answer, as a result.
    rpc.call(
        4,
        "agent.stop",
        json!({"user_id": "u-1", "session_id": "sess-1"}),
    );
    let again = rpc.next();
    assert_eq!(
        again["result"],
        json!({"status": "error", "stop_reason": null, "message_count": 0,
               "error": "No running agent found for user_id=u-1, session_id=sess-1, agent_id=any"}),
        "{again}"
    );

    // The stopped thread resumed with a new instruction.
    rpc.call(
        5,
        "run.resume",
        json!({"thread": "sess-1", "say": "10ms", "wait": true}),
    );
    let resumed = rpc.next();
    assert_eq!(resumed["id"], 5, "{resumed}");
    assert_eq!(resumed["result"]["status"], "succeeded", "{resumed}");
    assert_eq!(resumed["result"]["thread"], "sess-1", "{resumed}");
    assert_eq!(resumed["result"]["outputs"]["b"]["text"], "done after 10ms");

    // End of input: the waiting run stops with reason shutdown, its request is answered, and
    // the process exits 0.
    drop(rpc.stdin.take());
    let last = rpc.next();
    assert_eq!(last["id"], 1, "{last}");
    assert_eq!(last["result"]["status"], "stopped", "{last}");
    assert_eq!(last["result"]["stop"]["reason"], "shutdown", "{last}");
    assert_eq!(rpc.finish(), Some(0));
}

#[test]
fn errors_carry_the_standard_codes_and_notifications_get_no_answer() {
    let mut rpc = RpcProcess::start(&[]);
    // A notification (no id) is handled but not answered: the next answer is id 1's.
    rpc.send(&json!({"jsonrpc": "2.0", "method": "agent.stop", "params": {"session_id": "x"}}));
    rpc.send(&json!({"jsonrpc": "2.0", "method": "no.such"}));
    rpc.call(1, "no.such", json!({}));
    let answer = rpc.next();
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(answer["error"]["code"], -32601, "{answer}");

    rpc.send_raw("{not json");
    let answer = rpc.next();
    assert_eq!(answer["id"], Value::Null, "{answer}");
    assert_eq!(answer["error"]["code"], -32700, "{answer}");

    rpc.send(&json!({"jsonrpc": "1.0", "id": 2, "method": "run.start"}));
    let answer = rpc.next();
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");

    // Invalid params: the service's error code and message in `data`.
    rpc.call(3, "run.start", json!({"workflow": 42}));
    let answer = rpc.next();
    assert_eq!(answer["id"], 3, "{answer}");
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert_eq!(answer["error"]["data"]["code"], "bad_request", "{answer}");
    assert_eq!(answer["error"]["data"]["field"], "workflow", "{answer}");

    rpc.call(4, "agent.stop", json!({"user_id": "u-1"}));
    let answer = rpc.next();
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(
        answer["error"]["data"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("session_id")),
        "{answer}"
    );

    rpc.call(
        5,
        "run.resume",
        json!({"thread": "never-ran", "wait": true}),
    );
    let answer = rpc.next();
    assert_eq!(answer["id"], 5, "{answer}");
    assert!(answer["error"]["data"]["code"].is_string(), "{answer}");

    // A batch: the answers of its requests, in one line.
    rpc.send(&json!([
        {"jsonrpc": "2.0", "id": 6, "method": "no.such"},
        {"jsonrpc": "2.0", "method": "no.such"},
    ]));
    let answer = rpc.next();
    assert_eq!(answer.as_array().map(Vec::len), Some(1), "{answer}");
    assert_eq!(answer[0]["id"], 6, "{answer}");
    rpc.send_raw("[]");
    let answer = rpc.next();
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    rpc.send_raw("[1]");
    let answer = rpc.next();
    assert_eq!(answer[0]["id"], Value::Null, "{answer}");
    assert_eq!(answer[0]["error"]["code"], -32600, "{answer}");
    assert_eq!(rpc.finish(), Some(0));
}
