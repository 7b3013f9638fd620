//! Redis Cluster, on a real 3-master cluster (see [`super::cluster_support`]): a workflow run
//! on the cluster is stopped from another runtime (through FastGPT's flag and through the
//! native stop key), resumed in a third with nothing lost; every key of a thread shares one
//! slot, as the cluster computes it; the watcher sees flags set on every master and notices
//! travel by sharded pub/sub; a plain `redis://` URL to a cluster node is refused; and the
//! `runvisor` binary runs and stops a workflow on the cluster from two processes; and runs
//! queued on the cluster (`submit`, `worker`) whose worker is killed show as orphaned and are
//! taken over by another worker without running a finished node again.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use runvisor::redis::signal::HEALTH_INTERVAL;
use runvisor::redis::{ConnectError, RedisConfig, RedisStores, hash_slot};
use runvisor::store::{Notice, NoticeStream};
use runvisor::{
    Map, Message, NodeContext, NodeError, NodeHandler, NodeOutput, ResumeInput, RunLabels,
    RunStatus, Runtime, StopReason, ThreadId, Value, Workflow, async_trait, render_key,
};

use super::cluster_support::{
    RedisCluster, cluster_cmd, cluster_stores, keyslot, owner, raw_cluster,
};
use super::support::{PATIENCE, cmd, raw as raw_node, thread, within};

/// Counts its calls per node, appends "<node> done" to the history and returns
/// `{"node": id}`; a node named in `wait` waits until the run is asked to stop instead.
#[derive(Debug, Clone, Default)]
struct Step {
    calls: Arc<Mutex<BTreeMap<String, usize>>>,
    wait: Arc<HashSet<&'static str>>,
}

impl Step {
    fn waiting_at(nodes: &[&'static str]) -> Self {
        Self {
            wait: Arc::new(nodes.iter().copied().collect()),
            ..Self::default()
        }
    }

    fn calls(&self, node: &str) -> usize {
        self.calls
            .lock()
            .expect("calls")
            .get(node)
            .copied()
            .unwrap_or(0)
    }

    async fn wait_for(&self, node: &str) {
        within("the node to start", async {
            while self.calls(node) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
}

#[async_trait]
impl NodeHandler for Step {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let node = ctx.node_id().as_str().to_owned();
        *self
            .calls
            .lock()
            .expect("calls")
            .entry(node.clone())
            .or_default() += 1;
        if self.wait.contains(node.as_str()) {
            ctx.stopped().await;
            return Err(NodeError::Stopped);
        }
        ctx.append_message(Message::assistant(format!("{node} done")));
        let output: Map = [("node".to_owned(), Value::from(node))]
            .into_iter()
            .collect();
        Ok(NodeOutput::new(Value::from(output)))
    }
}

const WORKFLOW: &str = r#"{
  "id": "clustered",
  "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "intro", "kind": "step"},
    {"id": "slow", "kind": "step"},
    {"id": "outro", "kind": "step"}
  ],
  "edges": [
    {"from": "start", "to": "intro"},
    {"from": "intro", "to": "slow"},
    {"from": "slow", "to": "outro"}
  ]
}"#;

/// A runtime on every Redis store and the Redis signal source of `stores`.
fn runtime(stores: &RedisStores, step: &Step) -> Runtime {
    stores
        .install(Runtime::builder())
        .handler("step", step.clone())
        .build()
}

fn load(runtime: &Runtime) -> Workflow {
    runtime.load_json(WORKFLOW).expect("valid workflow")
}

fn texts(history: &[Message]) -> Vec<&str> {
    history.iter().map(|m| m.content.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_a_cluster_is_stopped_from_other_runtimes_and_resumed_with_nothing_lost() {
    let cluster = RedisCluster::start();
    let mut raw = raw_cluster(&cluster).await;
    // Braces in the id: the tag is still one per thread.
    let t: ThreadId = thread("chat:{c}:1");
    let labels = RunLabels::app_chat("app", "c1").expect("valid labels");

    // Process one runs until `slow`, which waits for a stop.
    let first_step = Step::waiting_at(&["slow"]);
    let first_stores = cluster_stores(&cluster).await;
    let first_rt = runtime(&first_stores, &first_step);
    let inputs: Map = [("query".to_owned(), Value::from("hello"))]
        .into_iter()
        .collect();
    let first = first_rt
        .start_with(&load(&first_rt), inputs, t.clone(), labels.clone())
        .await
        .expect("start");
    first_step.wait_for("slow").await;

    // Process two stops it through FastGPT's flag (set, SPUBLISH, wait for the end).
    let api_stores = cluster_stores(&cluster).await;
    let api = runtime(&api_stores, &Step::default());
    let request = within("stop request", api.request_stop("app", "c1")).await;
    assert!(request.ended && request.error.is_none(), "{request:?}");
    assert_eq!(request.key, "agent_runtime_stopping:app:c1");
    let outcome = within("first run", first.wait()).await;
    assert_eq!(outcome.status(), RunStatus::Stopped, "{outcome:#?}");
    let stop = outcome.stop_result().expect("a stop result");
    assert_eq!(stop.reason, StopReason::UserInterrupted);
    assert!(stop.checkpoint_id.is_some());
    let flag: i64 = cluster_cmd(&mut raw, &["EXISTS", &request.key]).await;
    assert_eq!(flag, 0, "the run deleted its flag");
    drop(first_rt);

    // Process three resumes; a raw client stops it through the native key, with no notice.
    let second_step = Step::waiting_at(&["slow"]);
    let second_stores = cluster_stores(&cluster).await;
    let second_rt = runtime(&second_stores, &second_step);
    let second = within("resume", second_rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumable from the cluster");
    second_step.wait_for("slow").await;
    let signals = &second_rt.config().signals;
    let native = render_key(
        &signals.stop_keys[1],
        &signals.prefix,
        &labels,
        Some(&t),
        Some(second.run_id()),
    )
    .expect("a native stop key");
    let _: () = cluster_cmd(&mut raw, &["SET", &native, "1", "EX", "60"]).await;
    let outcome = within("second run", second.wait()).await;
    assert_eq!(outcome.status(), RunStatus::Stopped, "{outcome:#?}");
    let flag: i64 = cluster_cmd(&mut raw, &["EXISTS", &native]).await;
    assert_eq!(flag, 0, "the run deleted its native flag");
    drop(second_rt);

    // Process four finishes the thread.
    let last_step = Step::default();
    let last_stores = cluster_stores(&cluster).await;
    let last_rt = runtime(&last_stores, &last_step);
    let last = within("resume", last_rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumable");
    let outcome = within("last run", last.wait()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        (first_step.calls("intro"), second_step.calls("intro")),
        (1, 0)
    );
    assert_eq!(
        last_step.calls("intro"),
        0,
        "a finished node never runs again"
    );
    assert_eq!(last_step.calls("slow"), 1);
    assert_eq!(last_step.calls("outro"), 1);
    assert_eq!(
        outcome.output("intro").and_then(|o| o.get("node")),
        Some(&Value::from("intro"))
    );

    // Nothing lost, nothing twice: history, run records, checkpoints.
    let history = last_stores.history.load(&t).await.expect("history");
    assert_eq!(
        texts(&history),
        ["hello", "intro done", "slow done", "outro done"]
    );
    let runs = last_stores.runs.list_thread(&t).await.expect("runs");
    assert_eq!(
        runs.iter()
            .map(|r| (r.run_id, r.status, r.parent_run_id))
            .collect::<Vec<_>>(),
        [
            (first.run_id(), RunStatus::Stopped, None),
            (second.run_id(), RunStatus::Stopped, Some(first.run_id())),
            (last.run_id(), RunStatus::Succeeded, Some(second.run_id())),
        ]
    );
    let latest = last_stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("a checkpoint");
    assert_eq!(latest.run, last.run_id());
    let listed = last_stores.checkpoints.list(&t).await.expect("list");
    assert!(listed.contains(&stop.checkpoint_id.expect("stop checkpoint")));

    // Every key of the thread exists and lives in the thread's one slot, as the cluster says.
    let keys = last_stores.keys();
    let thread_keys = [
        keys.checkpoint(&t, latest.id),
        keys.checkpoint_index(&t),
        keys.checkpoint_sequence(&t, last.run_id()),
        keys.thread_runs(&t),
        keys.history(&t),
        keys.history_ids(&t),
        keys.run(&t, last.run_id()),
        keys.fence(&t),
    ];
    let slot = keyslot(&mut raw, &thread_keys[0]).await;
    for key in &thread_keys {
        let exists: i64 = cluster_cmd(&mut raw, &["EXISTS", key]).await;
        assert_eq!(exists, 1, "{key} is stored");
        assert_eq!(keyslot(&mut raw, key).await, slot, "{key}");
        assert_eq!(hash_slot(key.as_bytes()), slot, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_reads_flags_on_every_master_and_notices_are_sharded() {
    let mut cluster = RedisCluster::start();
    let mut raw = raw_cluster(&cluster).await;
    let stores = cluster_stores(&cluster).await;

    // Our slots are the cluster's, for keys of every shape.
    for key in [
        "agent_runtime_stopping:app:chat",
        "T9-cancel",
        "runvisor:stop:{t}:r",
        "a{}b",
        "{}",
        "x{y}z{w}",
        "runvisor:signals",
    ] {
        assert_eq!(
            hash_slot(key.as_bytes()),
            keyslot(&mut raw, key).await,
            "{key}"
        );
    }

    // Live runs whose FastGPT flags land on all three masters.
    let step = Step::waiting_at(&["intro"]);
    let rt = runtime(&stores, &step);
    let workflow = load(&rt);
    let mut runs = Vec::new();
    let mut masters = BTreeSet::new();
    for i in 0..24 {
        let chat = format!("w{i}");
        let key = format!("agent_runtime_stopping:app:{chat}");
        masters.insert(owner(&cluster, &mut raw, &key).await);
        let labels = RunLabels::app_chat("app", chat).expect("valid labels");
        let run = rt
            .start_with(&workflow, Map::new(), thread(&format!("w-{i}")), labels)
            .await
            .expect("start");
        runs.push((run, key));
    }
    assert_eq!(masters.len(), 3, "the flags are spread over every master");
    within("every run to reach its node", async {
        while step.calls("intro") < runs.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // One read answers for keys in many slots on every node, in key order.
    let keys: Vec<String> = runs.iter().map(|(_, key)| key.clone()).collect();
    let flags = stores.signals.read(&keys).await.expect("read");
    assert_eq!(flags, vec![false; keys.len()]);

    // Set and unset flags on every master read back in key order (keys no run watches: the
    // watcher clears the flags of the runs it stops, which would race with this read).
    let spare: Vec<String> = (0..24)
        .map(|i| format!("agent_runtime_stopping:app:spare{i}"))
        .collect();
    for key in spare.iter().step_by(2) {
        let _: () = cluster_cmd(&mut raw, &["SET", key, "1", "EX", "60"]).await;
    }
    let flags = stores.signals.read(&spare).await.expect("read");
    let expected: Vec<bool> = (0..spare.len()).map(|i| i % 2 == 0).collect();
    assert_eq!(flags, expected);

    // Flags set by a raw client, without notices, on every master: the watcher's tick sees
    // each (before, its read failed with CROSSSLOT on every tick).
    for (_, key) in runs.iter().step_by(2) {
        let _: () = cluster_cmd(&mut raw, &["SET", key, "1", "EX", "60"]).await;
    }
    for (i, (run, key)) in runs.iter().enumerate() {
        if i % 2 == 0 {
            let outcome = within("a flagged run to stop", run.wait()).await;
            assert_eq!(outcome.status(), RunStatus::Stopped, "{key}");
            let exists: i64 = cluster_cmd(&mut raw, &["EXISTS", key]).await;
            assert_eq!(exists, 0, "{key} was cleared");
        }
    }
    for (run, key) in runs.iter().skip(1).step_by(2) {
        assert!(run.outcome().is_none(), "{key}: an unflagged run goes on");
    }

    // Raising and clearing flags in many slots.
    let strays: Vec<String> = (0..12).map(|i| format!("stray-{i}-cancel")).collect();
    for key in &strays {
        stores.signals.raise(key, PATIENCE).await.expect("raise");
    }
    let read = stores.signals.read(&strays).await.expect("read");
    assert_eq!(read, vec![true; strays.len()]);
    stores
        .signals
        .clear(&strays, None)
        .await
        .expect("one clear of keys in many slots");
    let read = stores.signals.read(&strays).await.expect("read");
    assert_eq!(read, vec![false; strays.len()]);

    // Notices: SSUBSCRIBE on the owner of the channel's slot, SPUBLISH from another process.
    let mut notices = within("subscribe", stores.signals.subscribe())
        .await
        .expect("subscribe");
    let channel = "runvisor:signals";
    let holder = owner(&cluster, &mut raw, channel).await;
    let mut direct = raw_node(cluster.node_mut(holder)).await;
    let subscribed: Vec<::redis::Value> =
        cmd(&mut direct, &["PUBSUB", "SHARDNUMSUB", channel]).await;
    assert_eq!(
        subscribed.get(1),
        Some(&::redis::Value::Int(1)),
        "one sharded subscriber: {subscribed:?}"
    );
    let other = cluster_stores(&cluster).await;
    let notice = Notice {
        key: "agent_runtime_stopping:app:elsewhere".to_owned(),
        raised: true,
    };
    other.signals.notify(&notice).await.expect("notify");
    receive(&mut notices, &notice).await;
    // The subscription's health pings reach the channel's node: it lives on.
    tokio::time::sleep(2 * HEALTH_INTERVAL).await;
    other.signals.notify(&notice).await.expect("notify");
    receive(&mut notices, &notice).await;

    // The remaining runs end once their flags are seen again.
    for (_, key) in runs.iter().skip(1).step_by(2) {
        let _: () = cluster_cmd(&mut raw, &["SET", key, "1", "EX", "60"]).await;
    }
    for (run, _) in runs.iter().skip(1).step_by(2) {
        let outcome = within("the other runs to stop", run.wait()).await;
        assert_eq!(outcome.status(), RunStatus::Stopped);
    }
    let remaining: Vec<bool> = stores.signals.read(&keys).await.expect("read");
    assert_eq!(
        remaining,
        vec![false; keys.len()],
        "every run cleared its flag"
    );

    // The channel's node dies: the subscription ends (its subscribers re-read every flag).
    cluster.node_mut(holder).kill9();
    // (Notices of the runs that ended meanwhile may come first.)
    within("the subscription to end", async {
        while notices.next().await.is_some() {}
    })
    .await;

    // A plain URL to one node of the cluster is refused, with the URL to use instead.
    let alive = cluster
        .nodes()
        .iter()
        .find(|n| n.port() != holder)
        .expect("two nodes live");
    let plain = RedisConfig::new(alive.url());
    match RedisStores::connect(plain).await {
        Err(ConnectError::InvalidConfig(message)) => {
            assert!(message.contains("redis+cluster://"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_follows_a_slot_the_cluster_moved_to_another_node() {
    let cluster = RedisCluster::start();
    let mut raw = raw_cluster(&cluster).await;
    let stores = cluster_stores(&cluster).await;
    let keys: Vec<String> = (0..30)
        .map(|i| format!("agent_runtime_stopping:app:m{i}"))
        .collect();
    let moved = &keys[7];
    let _: () = cluster_cmd(&mut raw, &["SET", moved, "1"]).await;
    let mut expected = vec![false; keys.len()];
    expected[7] = true;
    // The first read learns who owns which slot.
    assert_eq!(stores.signals.read(&keys).await.expect("read"), expected);

    // Move the flag's slot, with the flag, to another master (as a resharding does).
    let slot = keyslot(&mut raw, moved).await.to_string();
    let from = owner(&cluster, &mut raw, moved).await;
    let to = cluster
        .nodes()
        .iter()
        .map(|n| n.port())
        .find(|&p| p != from)
        .expect("another master");
    let node = |port: u16| {
        cluster
            .nodes()
            .iter()
            .find(|n| n.port() == port)
            .expect("a node of ours")
    };
    let mut source = raw_node(node(from)).await;
    let mut target = raw_node(node(to)).await;
    let source_id: String = cmd(&mut source, &["CLUSTER", "MYID"]).await;
    let target_id: String = cmd(&mut target, &["CLUSTER", "MYID"]).await;
    let _: () = cmd(
        &mut target,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id],
    )
    .await;
    let _: () = cmd(
        &mut source,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id],
    )
    .await;
    let to_port = to.to_string();
    let _: () = cmd(
        &mut source,
        &[
            "MIGRATE",
            "127.0.0.1",
            &to_port,
            "",
            "0",
            "5000",
            "KEYS",
            moved,
        ],
    )
    .await;
    for node in cluster.nodes() {
        let mut con = raw_node(node).await;
        let _: () = cmd(&mut con, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]).await;
    }
    assert_eq!(owner(&cluster, &mut raw, moved).await, to);

    // The old owner answers MOVED; the read sends that MGET again where it belongs.
    assert_eq!(stores.signals.read(&keys).await.expect("read"), expected);
    assert_eq!(stores.signals.read(&keys).await.expect("read"), expected);
}

/// Waits for `notice` on the stream (notices of runs ending may come before it).
async fn receive(notices: &mut NoticeStream, notice: &Notice) {
    within("the notice", async {
        loop {
            match notices.next().await {
                Some(received) if &received == notice => return,
                Some(_) => {}
                None => panic!("the subscription ended before {notice:?} came"),
            }
        }
    })
    .await;
}

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_on_a_cluster_and_another_process_stops_it() {
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("slow.json");
    std::fs::write(
        &file,
        r#"{"id": "slow", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "first", "kind": "message", "params": {"template": "first"}},
            {"id": "think", "kind": "sleep", "params": {"duration": "60s"}}
        ], "edges": [{"from": "start", "to": "first"}, {"from": "first", "to": "think"}]}"#,
    )
    .expect("write workflow");
    let url = cluster.url();
    let run = Command::new(BIN)
        .args(["--redis", &url, "run"])
        .arg(&file)
        .args(["--thread", "k1", "--app", "A", "--chat", "k1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runvisor run");
    let mut raw = raw_cluster(&cluster).await;
    within("the run to start", async {
        loop {
            let runs: i64 = cluster_cmd(&mut raw, &["ZCARD", "runvisor:runs:{k1}"]).await;
            if runs > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The run's first node has started once its record exists; give the sleep a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let stop = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            Command::new(BIN)
                .args(["--redis", &url, "stop", "--app", "A", "--chat", "k1"])
                .output()
                .expect("run runvisor stop")
        }
    })
    .await
    .expect("stop process");
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&stop.stdout).expect("JSON");
    assert_eq!(answer["ended"], true, "{answer}");

    let out = tokio::task::spawn_blocking(move || run.wait_with_output())
        .await
        .expect("run process")
        .expect("run output");
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("stopped (user_interrupted) at think"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let history = cluster_stores(&cluster)
        .await
        .history
        .load(&thread("k1"))
        .await
        .expect("history");
    assert_eq!(
        history
            .iter()
            .filter(|m| m.content.contains("first"))
            .count(),
        1,
        "{history:?}"
    );
    let checkpoints: i64 = cluster_cmd(&mut raw, &["ZCARD", "runvisor:cpidx:{k1}"]).await;
    assert!(checkpoints > 0, "the stop was checkpointed");
    let flag: i64 = cluster_cmd(&mut raw, &["EXISTS", "agent_runtime_stopping:A:k1"]).await;
    assert_eq!(flag, 0);
}

/// Runs the binary with `args` on the cluster; its output.
fn on_cluster(
    cluster: &RedisCluster,
    config: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(["--redis", &cluster.url()])
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run runvisor")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_runs_of_a_killed_worker_are_taken_over_on_a_cluster_with_nothing_lost() {
    const JOBS: usize = 12;
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"runtime": {"lease": {"ttl": "1s", "renew": "200ms"}, "adopt_every": "200ms",
            "durability": "sync"}}"#,
    )
    .expect("config");
    let file = dir.path().join("two.json");
    std::fs::write(
        &file,
        r#"{"id": "two", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "one", "kind": "stream_text", "params": {"text": "one", "interval": "0s"}},
            {"id": "w", "kind": "sleep", "params": {"duration": "3s"}},
            {"id": "two", "kind": "stream_text", "params": {"text": "two", "interval": "0s"}}
        ], "edges": [{"from": "start", "to": "one"}, {"from": "one", "to": "w"},
            {"from": "w", "to": "two"}]}"#,
    )
    .expect("workflow");
    let threads: Vec<String> = (0..JOBS).map(|i| format!("q{{{i}}}")).collect();
    for t in &threads {
        let out = on_cluster(
            &cluster,
            &config,
            &[
                "submit",
                file.to_str().expect("utf-8"),
                "--thread",
                t,
                "--json",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let spawn_worker = |adopt: bool| {
        let mut cmd = Command::new(BIN);
        cmd.arg("--config")
            .arg(&config)
            .args(["--redis", &cluster.url(), "worker"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if adopt {
            cmd.arg("--adopt-orphans");
        }
        cmd.spawn().expect("spawn runvisor worker")
    };
    let mut first = spawn_worker(false);
    let stores = cluster_stores(&cluster).await;
    let sleeping = within("every job to reach its sleep", async {
        loop {
            let mut started = 0;
            for t in &threads {
                let checkpoints = stores.checkpoints.list(&thread(t)).await.expect("list");
                started += usize::from(!checkpoints.is_empty());
            }
            if started == JOBS {
                return started;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(sleeping, JOBS);
    // A thread with runs is refused: a job starts a new thread.
    let refused = on_cluster(
        &cluster,
        &config,
        &[
            "submit",
            file.to_str().expect("utf-8"),
            "--thread",
            &threads[0],
        ],
    );
    assert_eq!(refused.status.code(), Some(4));

    first.kill().expect("SIGKILL the worker");
    first.wait().expect("reap it");
    // Its runs show as orphaned within a lease TTL.
    within("the orphans to show", async {
        loop {
            let out = on_cluster(&cluster, &config, &["ps", "--json", "--status", "orphaned"]);
            let rows: Vec<serde_json::Value> =
                serde_json::from_slice(&out.stdout).expect("ps --json");
            if rows.len() == JOBS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    let mut second = spawn_worker(true);
    let finished = tokio::time::timeout(PATIENCE * 4, async {
        loop {
            let mut done = 0;
            for t in &threads {
                let records = stores.runs.list_thread(&thread(t)).await.expect("runs");
                let newest = records.iter().max_by_key(|r| (r.started_at_ms, r.run_id));
                done += usize::from(newest.map(|r| r.status) == Some(RunStatus::Succeeded));
            }
            if done == JOBS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    second.kill().expect("stop the second worker");
    second.wait().expect("reap it");
    assert!(finished.is_ok(), "not every taken-over run finished");
    for t in &threads {
        let history = stores.history.load(&thread(t)).await.expect("history");
        let texts: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(
            texts,
            ["one", "two"],
            "thread {t}: finished nodes ran again or lost"
        );
        let records = stores.runs.list_thread(&thread(t)).await.expect("runs");
        assert!(
            records.iter().any(|r| r.status == RunStatus::Stopped
                && r.stop_reason.as_deref() == Some("lease_lost")),
            "thread {t}: the orphan's record was closed"
        );
    }
}

/// A run's end on a cluster: with every flag in its thread's slot, the record's script
/// deletes them and gives the lease up (the notices are the engine's to publish, on the shard
/// channel); with a flag in another slot the record is written alone, and the flags and the
/// lease are left for the engine to clear and give up after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_end_on_a_cluster_clears_and_releases_in_its_record_only_within_its_slot() {
    use runvisor::store::EndWritten;
    use runvisor::{LeaseHolder, RunId, WorkerId};

    let cluster = RedisCluster::start();
    let mut raw = raw_cluster(&cluster).await;
    let stores = cluster_stores(&cluster).await;
    for (name, elsewhere) in [("end-here", false), ("end-there", true)] {
        let t = thread(name);
        let run = RunId::new();
        let holder = LeaseHolder {
            worker: WorkerId::new("w1").expect("worker id"),
            run,
        };
        let lease = stores
            .leases
            .acquire(&t, &holder, Duration::from_secs(10))
            .await
            .expect("free")
            .lease;
        let mut flags = vec![format!("stop:{{{t}}}:{run}")];
        if elsewhere {
            let label = "agent_runtime_stopping:app:chat".to_owned();
            assert_ne!(
                hash_slot(label.as_bytes()),
                hash_slot(flags[0].as_bytes()),
                "the label flag must sit in another slot than the thread's"
            );
            flags.push(label);
        }
        for flag in &flags {
            let _: () = cluster_cmd(&mut raw, &["SET", flag, "1", "EX", "60"]).await;
        }
        let ended = runvisor::store::RunRecord {
            status: RunStatus::Succeeded,
            finished_at_ms: Some(1),
            ..super::support::run_record(run, &t)
        };
        let written = stores
            .runs
            .put_end(&ended, &lease, &flags)
            .await
            .expect("end");
        assert_eq!(stores.runs.get(run).await.expect("get"), Some(ended));
        let mut left = 0;
        for flag in &flags {
            let exists: i64 = cluster_cmd(&mut raw, &["EXISTS", flag]).await;
            left += exists;
        }
        let held = stores.leases.lease(&t).await.expect("read lease");
        if elsewhere {
            assert_eq!(written, EndWritten::Record, "{name}");
            assert_eq!(left, 2, "{name}: no flag is cleared by the record");
            assert_eq!(held, Some(lease), "{name}: the lease is kept");
        } else {
            assert_eq!(written, EndWritten::Released { announced: false }, "{name}");
            assert_eq!(left, 0, "{name}: the flag is gone");
            assert_eq!(held, None, "{name}: the lease is given up");
        }
    }
}

/// A run's whole end on a cluster: checkpoint, messages and record in one script in the
/// thread's slot, and the flags and the lease in it too only when every flag is in that slot.
#[tokio::test]
async fn a_whole_end_on_a_cluster_is_one_script_in_its_threads_slot() {
    use runvisor::store::{EndWritten, StoredCheckpoint, WholeEnd};
    use runvisor::{CheckpointId, LeaseHolder, RunId, WorkerId};

    let cluster = RedisCluster::start();
    let mut raw = raw_cluster(&cluster).await;
    let stores = cluster_stores(&cluster).await;
    for (name, elsewhere) in [("whole-here", false), ("whole-there", true)] {
        let t = thread(name);
        let run = RunId::new();
        let holder = LeaseHolder {
            worker: WorkerId::new("w1").expect("worker id"),
            run,
        };
        let lease = stores
            .leases
            .acquire(&t, &holder, Duration::from_secs(10))
            .await
            .expect("free")
            .lease;
        let mut flags = vec![format!("stop:{{{t}}}:{run}")];
        if elsewhere {
            flags.push("agent_runtime_stopping:app:chat".to_owned());
        }
        for flag in &flags {
            let _: () = cluster_cmd(&mut raw, &["SET", flag, "1", "EX", "60"]).await;
        }
        let checkpoint = StoredCheckpoint {
            id: CheckpointId::new(),
            run,
            sequence: 1,
            bytes: b"final".to_vec(),
            link: None,
        };
        let messages = [Message::user("question"), Message::assistant("answer")];
        let ended = runvisor::store::RunRecord {
            status: RunStatus::Succeeded,
            finished_at_ms: Some(1),
            checkpoint_id: Some(checkpoint.id),
            ..super::support::run_record(run, &t)
        };
        let written = stores
            .ends
            .put_whole_end(&WholeEnd {
                checkpoint: &checkpoint,
                messages: &messages,
                record: &ended,
                lease: &lease,
                flags: &flags,
            })
            .await
            .expect("whole end");
        assert_eq!(
            stores
                .checkpoints
                .get(&t, checkpoint.id)
                .await
                .expect("get"),
            Some(checkpoint.clone()),
            "{name}"
        );
        assert_eq!(
            stores.history.load(&t).await.expect("history"),
            messages.to_vec(),
            "{name}"
        );
        assert_eq!(
            stores.runs.get(run).await.expect("get"),
            Some(ended),
            "{name}"
        );
        let mut left = 0;
        for flag in &flags {
            let exists: i64 = cluster_cmd(&mut raw, &["EXISTS", flag]).await;
            left += exists;
        }
        let held = stores.leases.lease(&t).await.expect("read lease");
        if elsewhere {
            assert_eq!(written, EndWritten::Record, "{name}");
            assert_eq!(left, 2, "{name}: no flag is cleared by the script");
            assert_eq!(held, Some(lease), "{name}: the lease is kept");
        } else {
            assert_eq!(written, EndWritten::Released { announced: false }, "{name}");
            assert_eq!(left, 0, "{name}: the flag is gone");
            assert_eq!(held, None, "{name}: the lease is given up");
        }
    }
}

/// A new run's start on a cluster: lease, record, history and the newest checkpoint id read
/// in one script in the thread's slot.
#[tokio::test]
async fn a_start_on_a_cluster_is_one_script_in_its_threads_slot() {
    use runvisor::store::{Begun, HistoryTail};
    use runvisor::{LeaseHolder, RunId, WorkerId};

    let cluster = RedisCluster::start();
    let stores = cluster_stores(&cluster).await;
    let t = thread("start-here");
    let earlier = [Message::user("question"), Message::assistant("answer")];
    stores
        .history
        .append(&t, &earlier, None)
        .await
        .expect("append");
    let earlier_run = RunId::new();
    let mut newest = None;
    for sequence in 1..=3 {
        let id = runvisor::CheckpointId::new();
        stores
            .checkpoints
            .put(
                &t,
                runvisor::store::StoredCheckpoint {
                    id,
                    run: earlier_run,
                    sequence,
                    bytes: vec![1, 2, 3],
                    link: None,
                },
                None,
            )
            .await
            .expect("put");
        newest = Some(id);
    }
    let run = RunId::new();
    let holder = LeaseHolder {
        worker: WorkerId::new("w1").expect("worker id"),
        run,
    };
    let first = super::support::run_record(run, &t);
    let Begun::Started {
        acquired,
        history,
        newest_checkpoint,
    } = stores
        .starts
        .begin(&first, &holder, Duration::from_secs(10), None)
        .await
        .expect("begin")
    else {
        panic!("a free thread must be started")
    };
    assert_eq!(
        history.expect("history"),
        HistoryTail::new(earlier.to_vec(), 2)
    );
    assert_eq!(newest_checkpoint, newest);
    assert_eq!(
        stores.leases.lease(&t).await.expect("lease"),
        Some(acquired.lease.clone())
    );
    assert_eq!(
        stores.runs.get(run).await.expect("get"),
        Some(runvisor::store::RunRecord {
            fence: Some(acquired.lease.fence.0),
            ..first
        })
    );
}
