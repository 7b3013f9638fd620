//! Forks on Redis: a fork from checkpoint K, made by another process, is a new thread whose
//! history is the source thread's history as of K and whose checkpoints start with K; the
//! source thread's history and checkpoints are untouched. Through the library and through
//! `runvisor resume --checkpoint K [--fork-into ID]`.

use std::process::{Command, Output};

use runvisor::redis::RedisStores;
use runvisor::snapshot::Snapshot;
use runvisor::store::StoredCheckpoint;
use runvisor::{
    CheckpointId, Map, Message, ResumeFrom, ResumeInput, RunStatus, Runtime, RuntimeBuilder,
    ThreadId, Value,
};
use runvisor_actors::testkit::{Interrupt, Script};

use super::support::{RedisServer, stores, thread, within};

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// `start -> a -> b -> c`, each appending `NODE done` to history.
const CHAIN: &str = r#"{"id": "chain", "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "a", "kind": "message", "params": {"template": "a done"}},
    {"id": "b", "kind": "message", "params": {"template": "b done"}},
    {"id": "c", "kind": "message", "params": {"template": "c done"}}
], "edges": [
    {"from": "start", "to": "a"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"}
]}"#;

fn on_redis(builder: RuntimeBuilder, stores: &RedisStores) -> Runtime {
    stores.install(builder).build()
}

fn texts(history: &[Message]) -> Vec<&str> {
    history.iter().map(|m| m.content.as_str()).collect()
}

async fn checkpoints(stores: &RedisStores, t: &ThreadId) -> Vec<StoredCheckpoint> {
    let mut out = Vec::new();
    for id in stores.checkpoints.list(t).await.expect("list") {
        out.push(
            stores
                .checkpoints
                .get(t, id)
                .await
                .expect("get")
                .expect("listed"),
        );
    }
    out
}

#[tokio::test]
async fn a_fork_in_another_process_has_the_history_as_of_its_checkpoint() {
    let server = RedisServer::start();
    let source = thread("chat:source");

    // Process one: the run stops before `b` (cp1).
    let first_stores = stores(&server).await;
    let first = on_redis(
        Script::new()
            .interrupt(Interrupt::before("b"))
            .install(Runtime::builder()),
        &first_stores,
    );
    let workflow = first.load_json(CHAIN).expect("valid workflow");
    let inputs: Map = [("query".to_owned(), Value::from("hello"))]
        .into_iter()
        .collect();
    let run1 = first
        .start(&workflow, inputs, source.clone())
        .await
        .expect("start");
    let outcome = within("run 1", run1.wait()).await;
    let cp1 = outcome
        .stop_result()
        .and_then(|s| s.checkpoint_id)
        .expect("stopped with a checkpoint");

    // Process two: the source thread goes on to its end.
    let second_stores = stores(&server).await;
    let second = on_redis(Runtime::builder(), &second_stores);
    let run2 = within(
        "resume",
        second.resume(source.clone(), ResumeInput::Continue),
    )
    .await
    .expect("resumes");
    assert_eq!(
        within("run 2", run2.wait()).await.status(),
        RunStatus::Succeeded
    );
    let source_history = second_stores.history.load(&source).await.expect("history");
    assert_eq!(
        texts(&source_history),
        ["hello", "a done", "b done", "c done"]
    );
    let source_checkpoints = checkpoints(&second_stores, &source).await;

    // Process three forks from cp1.
    let third_stores = stores(&server).await;
    let third = on_redis(Runtime::builder(), &third_stores);
    let into = thread("chat:fork");
    let forked = within(
        "fork",
        third.resume(
            ResumeFrom::Fork {
                thread: source.clone(),
                checkpoint: cp1,
                into: Some(into.clone()),
            },
            ResumeInput::Continue,
        ),
    )
    .await
    .expect("forks");
    assert_eq!(forked.thread(), &into);
    assert_eq!(
        within("fork", forked.wait()).await.status(),
        RunStatus::Succeeded
    );

    // The fork: the source's first two messages (the same ones), then its own.
    let fork_history = third_stores.history.load(&into).await.expect("history");
    assert_eq!(
        texts(&fork_history),
        ["hello", "a done", "b done", "c done"]
    );
    assert_eq!(fork_history[..2], source_history[..2]);
    for m in &fork_history[2..] {
        assert_eq!(m.run_id, Some(forked.run_id()), "{m:?}");
    }
    // Its checkpoints start with cp1, re-encoded for it; its definition is stored for it.
    let fork_checkpoints = checkpoints(&third_stores, &into).await;
    assert_eq!(fork_checkpoints[0].id, cp1);
    let copy = Snapshot::decode(&fork_checkpoints[0].bytes).expect("decodes");
    assert_eq!(
        (copy.thread.clone(), copy.run_id),
        (into.clone(), run1.run_id())
    );
    // As of cp1: what the history held before run 1 (nothing), plus run 1's messages, which
    // a stop checkpoint carries as pending.
    assert_eq!(copy.history_len, Some(0));
    assert_eq!(
        texts(&Vec::from_iter(copy.pending_messages.iter().cloned())),
        ["hello", "a done"]
    );
    assert!(
        third_stores
            .checkpoints
            .get_workflow(&into, &copy.workflow_hash)
            .await
            .expect("workflow")
            .is_some()
    );
    // The source: untouched.
    assert_eq!(
        third_stores.history.load(&source).await.expect("history"),
        source_history
    );
    assert_eq!(
        checkpoints(&third_stores, &source).await,
        source_checkpoints
    );
}

/// `greet` says hello, `ask` waits for a choice, `bye` repeats it.
const ASK: &str = r#"{"id": "ask", "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "greet", "kind": "message", "params": {"template": "hello there"}},
    {"id": "ask", "kind": "interactive", "params": {
        "mode": "user_select", "prompt": "Go on?", "options": ["yes", "no"]
    }},
    {"id": "bye", "kind": "message", "params": {"template": "you said {{ask.value}}"}}
], "edges": [
    {"from": "start", "to": "greet"}, {"from": "greet", "to": "ask"}, {"from": "ask", "to": "bye"}
]}"#;

fn cli(server: &RedisServer, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--redis", &server.url()])
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUNVISOR_REDIS_URL")
        .output()
        .expect("run the cli")
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

#[tokio::test]
async fn the_cli_forks_into_a_new_thread_and_leaves_the_source_alone() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("ask.json");
    std::fs::write(&file, ASK).expect("write workflow");
    let file = file.to_str().expect("utf-8 path");
    let store = stores(&server).await;
    let source = thread("cli-source");

    // The run pauses at `ask` (checkpoint K); answered `yes`, the source thread ends.
    let paused = json_of(&cli(
        &server,
        &["run", file, "--thread", "cli-source", "--json"],
    ));
    assert_eq!(paused["status"], "awaiting_input", "{paused}");
    let k: CheckpointId = store
        .checkpoints
        .latest(&source)
        .await
        .expect("latest")
        .expect("the pause's checkpoint")
        .id;
    let k_text = k.to_string();
    let done = json_of(&cli(
        &server,
        &[
            "resume",
            "--thread",
            "cli-source",
            "--answer",
            "yes",
            "--json",
        ],
    ));
    assert_eq!(done["status"], "succeeded", "{done}");
    let source_history = store.history.load(&source).await.expect("history");
    assert_eq!(texts(&source_history), ["hello there", "you said yes"]);
    let source_checkpoints = checkpoints(&store, &source).await;

    // Fork from K into a named thread, answering differently.
    let forked = json_of(&cli(
        &server,
        &[
            "resume",
            "--thread",
            "cli-source",
            "--checkpoint",
            &k_text,
            "--fork-into",
            "cli-fork",
            "--answer",
            "no",
            "--json",
        ],
    ));
    assert_eq!(forked["status"], "succeeded", "{forked}");
    assert_eq!(forked["thread"], "cli-fork", "{forked}");
    let fork_history = store
        .history
        .load(&thread("cli-fork"))
        .await
        .expect("history");
    assert_eq!(texts(&fork_history), ["hello there", "you said no"]);
    assert_eq!(fork_history[0], source_history[0]);

    // Without --fork-into, a fresh thread, named on the first line.
    let out = cli(
        &server,
        &[
            "resume",
            "--thread",
            "cli-source",
            "--checkpoint",
            &k_text,
            "--answer",
            "no",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let first = stdout.lines().next().unwrap_or_default();
    let prefix = format!("forked thread cli-source at checkpoint {k} into thread ");
    let generated = first
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("expected {prefix:?}...: {stdout}"));
    let generated = thread(generated);
    assert_ne!(generated, source);
    assert_eq!(
        texts(&store.history.load(&generated).await.expect("history")),
        ["hello there", "you said no"]
    );

    // A fork into a thread that exists is refused in one line, and changes nothing.
    let again = cli(
        &server,
        &[
            "resume",
            "--thread",
            "cli-source",
            "--checkpoint",
            &k_text,
            "--fork-into",
            "cli-fork",
            "--answer",
            "no",
        ],
    );
    assert_eq!(again.status.code(), Some(2));
    let stderr = String::from_utf8(again.stderr).expect("utf-8");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("thread `cli-fork` already has"), "{stderr}");
    assert_eq!(
        store
            .history
            .load(&thread("cli-fork"))
            .await
            .expect("history"),
        fork_history
    );

    // The source thread is as the run left it.
    assert_eq!(
        store.history.load(&source).await.expect("history"),
        source_history
    );
    assert_eq!(checkpoints(&store, &source).await, source_checkpoints);
}
