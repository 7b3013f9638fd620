//! Stop from anywhere, on real Redis: the signal source's contract (FastGPT's stop flag with
//! its 60 s TTL, absent and deleted flags, notices on `<p>:signals`, broken subscriptions,
//! errors instead of panics), stop requests that wait for the run's end or time out, flags
//! set by another process (a raw connection, no notice) or published, RAGFlow cancel flags,
//! an outage while runs are live, the flags of 10,000 live runs read in full `MGET` batches,
//! and two runtimes sharing one Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use runvisor::redis::signal::READ_BATCH;
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::store::{Notice, NoticeStream};
use runvisor::{
    Map, NodeContext, NodeError, NodeHandler, NodeOutput, RunHandle, RunLabels, RunOutcome,
    RunStatus, Runtime, RuntimeConfig, SignalConfig, StopMode, StopReason, StoreError, Value,
    Workflow, async_trait, render_key,
};

use super::support::{PATIENCE, RedisServer, cmd, raw, stores, thread, within};

const FASTGPT_KEY: &str = "agent_runtime_stopping:app:chat";
const MINUTE: Duration = Duration::from_secs(60);

/// The host kind: streams `words` words, one every `interval`, and returns `Stopped` as soon
/// as the run is asked to stop. Counts the runs that reached it.
#[derive(Debug, Clone)]
struct Talk {
    words: usize,
    interval: Duration,
    started: Arc<AtomicUsize>,
}

impl Talk {
    /// Talks for about `words × interval`.
    fn new(words: usize, interval: Duration) -> Self {
        Self {
            words,
            interval,
            started: Arc::default(),
        }
    }

    /// Talks until stopped (about an hour).
    fn endless() -> Self {
        Self::new(36_000, Duration::from_millis(100))
    }

    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Waits until `n` runs have reached the node.
    async fn wait_started(&self, n: usize) {
        within("runs to reach the node", async {
            while self.started() < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
}

#[async_trait]
impl NodeHandler for Talk {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let mut text = String::new();
        for i in 0..self.words {
            if i > 0 {
                tokio::select! {
                    () = tokio::time::sleep(self.interval) => {}
                    () = ctx.stopped() => return Err(NodeError::Stopped),
                }
            }
            let chunk = if i == 0 { "word" } else { " word" };
            ctx.emit(chunk).map_err(|_| NodeError::Stopped)?;
            text.push_str(chunk);
        }
        Ok(NodeOutput::new(Value::from(text)))
    }
}

/// Waits for the stop and returns `Stopped`: a live run that costs nothing while it waits.
#[derive(Debug, Clone, Default)]
struct Idle {
    started: Arc<AtomicUsize>,
}

#[async_trait]
impl NodeHandler for Idle {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        ctx.stopped().await;
        Err(NodeError::Stopped)
    }
}

fn config(signals: SignalConfig) -> RuntimeConfig {
    RuntimeConfig {
        signals,
        ..RuntimeConfig::default()
    }
}

/// A runtime on every Redis store and the Redis signal source, with `kind` as the host node.
fn redis_runtime(stores: &RedisStores, kind: impl NodeHandler, signals: SignalConfig) -> Runtime {
    stores
        .install(Runtime::builder())
        .handler("host", kind)
        .config(config(signals))
        .build()
}

/// A runtime on the in-memory stores and the Redis signal source only.
fn signals_only_runtime(
    stores: &RedisStores,
    kind: impl NodeHandler,
    signals: SignalConfig,
) -> Runtime {
    Runtime::builder()
        .signal_source(stores.signals.clone())
        .lease_store(stores.leases.clone())
        .handler("host", kind)
        .config(config(signals))
        .build()
}

/// `begin -> host`.
fn workflow(runtime: &Runtime) -> Workflow {
    runtime
        .load_json(
            r#"{"id": "signals", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "host", "kind": "host"}
            ], "edges": [{"from": "start", "to": "host"}]}"#,
        )
        .expect("valid workflow")
}

async fn start(runtime: &Runtime, workflow: &Workflow, labels: RunLabels) -> RunHandle {
    runtime
        .start_with(workflow, Map::new(), thread("chat"), labels)
        .await
        .expect("start")
}

async fn ended(run: &RunHandle, patience: Duration) -> RunOutcome {
    match tokio::time::timeout(patience, run.wait()).await {
        Ok(outcome) => outcome,
        Err(_) => panic!("the run did not end within {patience:?}"),
    }
}

fn stop_reason(outcome: &RunOutcome) -> Option<StopReason> {
    outcome.stop_result().map(|s| s.reason)
}

/// Waits until the runtime's watcher (or anyone) listens on the signal channel.
async fn wait_subscribed(con: &mut ::redis::aio::MultiplexedConnection, channel: &str) {
    within("a subscriber on the signal channel", async {
        loop {
            let reply: Vec<::redis::Value> = cmd(con, &["PUBSUB", "NUMSUB", channel]).await;
            if matches!(reply.get(1), Some(::redis::Value::Int(n)) if *n > 0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The next notice, failing the test if none comes in time.
async fn next_notice(notices: &mut NoticeStream) -> Notice {
    within("a notice", notices.next())
        .await
        .expect("the subscription is open")
}

/// Key reads so far, from one `INFO` (one consistent snapshot).
struct KeyReads {
    /// `MGET` commands run.
    mgets: u64,
    /// Keys looked up and not found (every flag of a live, unstopped run).
    missed: u64,
}

async fn key_reads(con: &mut ::redis::aio::MultiplexedConnection) -> KeyReads {
    let info: String = cmd(con, &["INFO", "stats", "commandstats"]).await;
    let field = |prefix: &str, end: char| {
        info.lines()
            .find_map(|line| line.strip_prefix(prefix))
            .and_then(|rest| rest.split(end).next())
            .map_or(0, |n| n.trim().parse().expect("a count"))
    };
    KeyReads {
        mgets: field("cmdstat_mget:calls=", ','),
        missed: field("keyspace_misses:", '\r'),
    }
}

// ---- The signal source's contract (the seed's Redis function tests) ----

#[tokio::test]
async fn a_raised_flag_reads_true_and_lives_sixty_seconds() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let key = FASTGPT_KEY.to_owned();
    stores.signals.raise(&key, MINUTE).await.expect("raise");
    assert_eq!(
        stores
            .signals
            .read(std::slice::from_ref(&key))
            .await
            .expect("read"),
        [true]
    );
    // As FastGPT's `SETEX key 60 1` leaves it.
    let value: String = cmd(&mut con, &["GET", &key]).await;
    assert_eq!(value, "1");
    let pttl: i64 = cmd(&mut con, &["PTTL", &key]).await;
    assert!((55_000..=60_000).contains(&pttl), "PTTL {pttl}");
    // Raising again is idempotent: one key, TTL renewed.
    stores.signals.raise(&key, MINUTE).await.expect("raise");
    let keys: Vec<String> = cmd(&mut con, &["KEYS", "agent_runtime_stopping:*"]).await;
    assert_eq!(keys, [FASTGPT_KEY]);
    // A flag set by FastGPT itself reads the same.
    let _: String = cmd(
        &mut con,
        &["SETEX", "agent_runtime_stopping:a2:c2", "60", "1"],
    )
    .await;
    assert_eq!(
        stores
            .signals
            .read(&["agent_runtime_stopping:a2:c2".to_owned()])
            .await
            .expect("read"),
        [true]
    );
}

#[tokio::test]
async fn absent_empty_and_foreign_keys_are_no_flags_and_reads_keep_key_order() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    assert_eq!(
        stores
            .signals
            .read(&[FASTGPT_KEY.to_owned()])
            .await
            .expect("read"),
        [false]
    );
    assert!(stores.signals.read(&[]).await.expect("read").is_empty());
    let _: String = cmd(&mut con, &["SET", "T42-cancel", "x"]).await;
    let _: String = cmd(&mut con, &["SET", "empty", ""]).await;
    let _: i64 = cmd(&mut con, &["HSET", "a-hash", "f", "v"]).await;
    let keys = ["T42-cancel", "missing", "empty", "a-hash", "T42-cancel"].map(str::to_owned);
    assert_eq!(
        stores.signals.read(&keys).await.expect("read"),
        [true, false, false, false, true]
    );
    // Thousands of keys, across several MGET batches, answer in key order.
    let keys: Vec<String> = (0..READ_BATCH * 3 + 17)
        .map(|i| format!("flag:{i}"))
        .collect();
    for key in keys.iter().step_by(7) {
        stores.signals.raise(key, MINUTE).await.expect("raise");
    }
    let flags = stores.signals.read(&keys).await.expect("read");
    let expected: Vec<bool> = (0..keys.len()).map(|i| i % 7 == 0).collect();
    assert_eq!(flags, expected);
}

#[tokio::test]
async fn a_cleared_flag_reads_false() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let keys = [FASTGPT_KEY.to_owned(), "T42-cancel".to_owned()];
    for key in &keys {
        stores.signals.raise(key, MINUTE).await.expect("raise");
    }
    stores.signals.clear(&keys, None).await.expect("clear");
    assert_eq!(
        stores.signals.read(&keys).await.expect("read"),
        [false, false]
    );
    let exists: i64 = cmd(&mut con, &["EXISTS", FASTGPT_KEY, "T42-cancel"]).await;
    assert_eq!(exists, 0);
    // Clearing what is not there (or nothing) is fine.
    stores
        .signals
        .clear(&keys, None)
        .await
        .expect("clear again");
    stores
        .signals
        .clear(&[], None)
        .await
        .expect("clear nothing");
}

#[tokio::test]
async fn notices_reach_every_subscriber_of_every_process() {
    let server = RedisServer::start();
    let here = stores(&server).await;
    let there = stores(&server).await;
    let mut con = raw(&server).await;
    let mut first = here.signals.subscribe().await.expect("subscribe");
    let mut second = here.signals.subscribe().await.expect("subscribe");
    let mut remote = there.signals.subscribe().await.expect("subscribe");
    // One pub/sub connection per source, however many subscribers.
    let reply: Vec<::redis::Value> = cmd(&mut con, &["PUBSUB", "NUMSUB", "runvisor:signals"]).await;
    assert_eq!(reply.get(1), Some(&::redis::Value::Int(2)));

    let raised = Notice {
        key: FASTGPT_KEY.to_owned(),
        raised: true,
    };
    there.signals.notify(&raised).await.expect("notify");
    for notices in [&mut first, &mut second, &mut remote] {
        assert_eq!(next_notice(notices).await, raised);
    }
    // What another tool publishes: a notice in the same JSON, or garbage (skipped).
    let _: i64 = cmd(&mut con, &["PUBLISH", "runvisor:signals", "not json"]).await;
    let _: i64 = cmd(
        &mut con,
        &[
            "PUBLISH",
            "runvisor:signals",
            r#"{"key": "T42-cancel", "raised": false}"#,
        ],
    )
    .await;
    let cleared = Notice {
        key: "T42-cancel".to_owned(),
        raised: false,
    };
    assert_eq!(next_notice(&mut first).await, cleared);
    assert_eq!(next_notice(&mut remote).await, cleared);
}

#[tokio::test]
async fn a_subscription_ends_when_redis_dies_or_stops_answering() {
    let mut server = RedisServer::start();
    let stores = stores(&server).await;
    let mut notices = stores.signals.subscribe().await.expect("subscribe");
    server.kill9();
    assert_eq!(within("the stream to end", notices.next()).await, None);
    assert!(stores.signals.subscribe().await.is_err());

    server.restart();
    let mut notices = within("subscribe", stores.signals.subscribe())
        .await
        .expect("subscribe after the restart");
    // A frozen server keeps its sockets open: the health ping finds it out.
    server.freeze();
    let ended = tokio::time::timeout(PATIENCE, notices.next()).await;
    server.thaw();
    assert_eq!(ended, Ok(None), "the stream ends when pings go unanswered");
    let mut notices = within("subscribe", stores.signals.subscribe())
        .await
        .expect("subscribe after the thaw");
    // The command connection, broken by the kill, reconnects on its first failed call.
    within("the command connection to recover", async {
        while stores.signals.read(&[]).await.is_err()
            || stores.signals.read(&["k".to_owned()]).await.is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let raised = Notice {
        key: "k".to_owned(),
        raised: true,
    };
    stores.signals.notify(&raised).await.expect("notify");
    assert_eq!(next_notice(&mut notices).await, raised);
}

#[tokio::test]
async fn every_call_fails_with_a_store_error_while_redis_is_down() {
    let mut server = RedisServer::start();
    let stores = stores(&server).await;
    let keys = [FASTGPT_KEY.to_owned()];
    let notice = Notice {
        key: FASTGPT_KEY.to_owned(),
        raised: true,
    };
    let s = &stores.signals;

    // A frozen server never answers: each call ends with an error (its timeout is 1 s in the
    // test config) instead of hanging.
    server.freeze();
    assert!(matches!(
        within("a read while frozen", s.read(&keys)).await,
        Err(StoreError::Timeout(_) | StoreError::Unavailable(_))
    ));
    assert!(
        within("a raise while frozen", s.raise(FASTGPT_KEY, MINUTE))
            .await
            .is_err()
    );
    assert!(
        within("a clear while frozen", s.clear(&keys, None))
            .await
            .is_err()
    );
    assert!(
        within("a notify while frozen", s.notify(&notice))
            .await
            .is_err()
    );
    assert!(
        within("a subscribe while frozen", s.subscribe())
            .await
            .is_err()
    );
    server.thaw();

    server.kill9();
    assert!(matches!(
        s.read(&keys).await,
        Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
    ));
    assert!(s.raise(FASTGPT_KEY, MINUTE).await.is_err());
    assert!(s.clear(&keys, None).await.is_err());
    assert!(s.notify(&notice).await.is_err());
    assert!(s.subscribe().await.is_err());

    server.restart();
    within("recovery", async {
        while s.read(&keys).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    s.raise(FASTGPT_KEY, MINUTE)
        .await
        .expect("raise after restart");
    assert_eq!(s.read(&keys).await.expect("read"), [true]);
}

// ---- Stop requests (the seed's stop API: set, publish, wait up to the limit) ----

#[tokio::test]
async fn a_stop_request_returns_once_the_flag_is_deleted() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let runtime = redis_runtime(&stores, Idle::default(), SignalConfig::default());
    let mut con = raw(&server).await;
    // The run's end, as another process would do it: a plain DEL a little later, no notice.
    let deleting = Arc::new(AtomicBool::new(false));
    let deleter = tokio::spawn({
        let deleting = deleting.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            deleting.store(true, Ordering::SeqCst);
            let _: i64 = cmd(&mut con, &["DEL", FASTGPT_KEY]).await;
        }
    });
    let request = within("stop request", runtime.request_flag(FASTGPT_KEY)).await;
    // It answered because of the DEL, not before it.
    assert!(
        deleting.load(Ordering::SeqCst),
        "answered before the flag was deleted: {request:?}"
    );
    deleter.await.expect("deleter");
    assert_eq!(request.key, FASTGPT_KEY);
    assert!(request.ended, "{request:?}");
    assert_eq!(request.error, None);
    assert_eq!(
        stores
            .signals
            .read(&[FASTGPT_KEY.to_owned()])
            .await
            .expect("read"),
        [false]
    );
}

#[tokio::test]
async fn a_stop_request_for_no_live_run_sets_no_flag() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let runtime = redis_runtime(&stores, Idle::default(), SignalConfig::default());
    let mut con = raw(&server).await;
    let request = within("stop request", runtime.request_stop("app", "chat")).await;
    assert!(request.no_live_run && !request.ended, "{request:?}");
    assert_eq!(request.error, None);
    let exists: i64 = cmd(&mut con, &["EXISTS", FASTGPT_KEY]).await;
    assert_eq!(exists, 0, "no flag is left to stop a later run");
    let request = within("cancel request", runtime.request_cancel("T")).await;
    assert!(request.no_live_run, "{request:?}");
    let exists: i64 = cmd(&mut con, &["EXISTS", "T-cancel"]).await;
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn labels_with_separators_stop_only_their_own_run_and_stale_flags_are_cleared_at_start() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let talk = Talk::endless();
    let runtime = redis_runtime(&stores, talk.clone(), SignalConfig::default());
    let wf = workflow(&runtime);
    // A flag another system left for app `a`, chat `b:c` while nothing ran.
    let _: () = cmd(
        &mut con,
        &["SET", "agent_runtime_stopping:a:b%3Ac", "1", "EX", "60"],
    )
    .await;
    let start_on = |t: &'static str, app: &'static str, chat: &'static str| {
        let labels = RunLabels::app_chat(app, chat).expect("valid labels");
        runtime.start_with(&wf, Map::new(), thread(t), labels)
    };
    let theirs = start_on("theirs", "a", "b:c").await.expect("start");
    let ours = start_on("ours", "a:b", "c").await.expect("start");
    talk.wait_started(2).await;
    let exists: i64 = cmd(&mut con, &["EXISTS", "agent_runtime_stopping:a:b%3Ac"]).await;
    assert_eq!(exists, 0, "the stale flag was cleared when the run started");
    // Stopping app `a:b` chat `c` stops that run only.
    let request = within("stop request", runtime.request_stop("a:b", "c")).await;
    assert_eq!(request.key, "agent_runtime_stopping:a%3Ab:c");
    assert!(request.ended, "{request:?}");
    assert!(matches!(ours.wait().await, RunOutcome::Stopped(_)));
    assert!(theirs.outcome().is_none(), "the other run goes on");
    theirs.stop(StopMode::Force).await.expect("stop");
}

#[tokio::test]
async fn concurrent_stop_requests_set_one_flag_and_all_return() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;

    // Nobody runs: ten requests at once all answer "no live run"; no flag is set.
    let runtime = redis_runtime(&stores, Talk::endless(), SignalConfig::default());
    let requests = within(
        "ten stop requests",
        futures::future::join_all((0..10).map(|_| runtime.request_stop("app", "nobody"))),
    )
    .await;
    assert_eq!(requests.len(), 10);
    for request in &requests {
        assert!(
            request.no_live_run && request.error.is_none(),
            "{request:?}"
        );
    }
    let keys: Vec<String> = cmd(&mut con, &["KEYS", "agent_runtime_stopping:*"]).await;
    assert!(keys.is_empty(), "{keys:?}");

    // A live run: ten requests from ten tasks, all answered once the run has ended.
    let talk = Talk::endless();
    let runtime = redis_runtime(&stores, talk.clone(), SignalConfig::default());
    let run = start(
        &runtime,
        &workflow(&runtime),
        RunLabels::app_chat("app", "chat").expect("valid labels"),
    )
    .await;
    talk.wait_started(1).await;
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let runtime = runtime.clone();
            tokio::spawn(async move { runtime.request_stop("app", "chat").await })
        })
        .collect();
    for task in tasks {
        let request = within("a stop request", task).await.expect("task");
        assert!(request.ended, "{request:?}");
        assert_eq!(request.error, None);
    }
    let outcome = ended(&run, PATIENCE).await;
    assert_eq!(stop_reason(&outcome), Some(StopReason::UserInterrupted));
    let exists: i64 = cmd(&mut con, &["EXISTS", FASTGPT_KEY]).await;
    assert_eq!(exists, 0, "the run deleted its flag");
}

// ---- Real runs stopped by flags ----

#[tokio::test]
async fn a_flag_set_by_another_process_without_a_notice_stops_the_run() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let talk = Talk::endless();
    let runtime = redis_runtime(&stores, talk.clone(), SignalConfig::default());
    let run = start(
        &runtime,
        &workflow(&runtime),
        RunLabels::app_chat("app", "chat").expect("valid labels"),
    )
    .await;
    talk.wait_started(1).await;
    // FastGPT's setAgentRuntimeStop: SETEX, nothing published. The tick (100 ms) finds it.
    let mut con = raw(&server).await;
    let _: String = cmd(&mut con, &["SETEX", FASTGPT_KEY, "60", "1"]).await;
    let outcome = ended(&run, PATIENCE).await;
    assert_eq!(outcome.status(), RunStatus::Stopped);
    assert_eq!(stop_reason(&outcome), Some(StopReason::UserInterrupted));
    let stop = outcome.stop_result().expect("stopped");
    assert!(
        stop.partial_response
            .as_deref()
            .is_some_and(|p| p.starts_with("word")),
        "{stop:?}"
    );
    // The run deleted its flag when it ended (FastGPT's delAgentRuntimeStopSign).
    let exists: i64 = cmd(&mut con, &["EXISTS", FASTGPT_KEY]).await;
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn a_published_flag_stops_the_run_between_ticks() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let talk = Talk::endless();
    // Ticks an hour apart: only the notice can make the watcher look.
    let runtime = redis_runtime(
        &stores,
        talk.clone(),
        SignalConfig {
            tick: Duration::from_secs(3600),
            ..SignalConfig::default()
        },
    );
    let run = start(
        &runtime,
        &workflow(&runtime),
        RunLabels::app_chat("app", "chat").expect("valid labels"),
    )
    .await;
    talk.wait_started(1).await;
    let mut con = raw(&server).await;
    wait_subscribed(&mut con, "runvisor:signals").await;
    // Another process stops it by hand, the way `request_stop` does: SETEX, then PUBLISH.
    let mut notices = stores.signals.subscribe().await.expect("subscribe");
    let _: String = cmd(&mut con, &["SETEX", FASTGPT_KEY, "60", "1"]).await;
    let _: i64 = cmd(
        &mut con,
        &[
            "PUBLISH",
            "runvisor:signals",
            &format!(r#"{{"key":"{FASTGPT_KEY}","raised":true}}"#),
        ],
    )
    .await;
    let outcome = ended(&run, PATIENCE).await;
    assert_eq!(stop_reason(&outcome), Some(StopReason::UserInterrupted));
    // The run cleared its flag and said so on the channel.
    let exists: i64 = cmd(&mut con, &["EXISTS", FASTGPT_KEY]).await;
    assert_eq!(exists, 0);
    let cleared = Notice {
        key: FASTGPT_KEY.to_owned(),
        raised: false,
    };
    within("the cleared notice", async {
        while next_notice(&mut notices).await != cleared {}
    })
    .await;
}

#[tokio::test]
async fn a_ragflow_cancel_flag_cancels_the_run() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let talk = Talk::endless();
    let runtime = redis_runtime(&stores, talk.clone(), SignalConfig::default());
    let run = start(
        &runtime,
        &workflow(&runtime),
        RunLabels::task("T42").expect("valid labels"),
    )
    .await;
    talk.wait_started(1).await;
    // RAGFlow's `REDIS_CONN.set(f"{task_id}-cancel", "x")`: no TTL, no notice.
    let mut con = raw(&server).await;
    let _: String = cmd(&mut con, &["SET", "T42-cancel", "x"]).await;
    let outcome = ended(&run, PATIENCE).await;
    assert_eq!(outcome.status(), RunStatus::Cancelled);
    assert_eq!(stop_reason(&outcome), Some(StopReason::Cancelled));
    let exists: i64 = cmd(&mut con, &["EXISTS", "T42-cancel"]).await;
    assert_eq!(exists, 0, "the run deleted its cancel flag");
    let record = stores
        .runs
        .get(run.run_id())
        .await
        .expect("run record")
        .expect("recorded");
    assert_eq!(record.status, RunStatus::Cancelled);

    // `request_cancel` does the same from any runtime and waits for the end.
    let talk = Talk::endless();
    let runtime = redis_runtime(&stores, talk.clone(), SignalConfig::default());
    let run = start(
        &runtime,
        &workflow(&runtime),
        RunLabels::task("T43").expect("valid labels"),
    )
    .await;
    talk.wait_started(1).await;
    let request = within("cancel request", runtime.request_cancel("T43")).await;
    assert_eq!(request.key, "T43-cancel");
    assert!(request.ended, "{request:?}");
    assert_eq!(ended(&run, PATIENCE).await.status(), RunStatus::Cancelled);
}

#[tokio::test]
async fn runs_go_on_while_redis_is_down_and_a_flag_set_after_the_restart_is_honoured() {
    let mut server = RedisServer::start();
    let stores = stores(&server).await;
    // Signals on Redis, the other stores in memory: the outage is the signal source's alone.
    // `host` talks for about 1.5 s, `long` until stopped.
    let short = Talk::new(30, Duration::from_millis(50));
    let long = Talk::endless();
    let runtime = Runtime::builder()
        .signal_source(stores.signals.clone())
        .lease_store(stores.leases.clone())
        .handler("host", short.clone())
        .handler("long", long.clone())
        .build();
    let wf = workflow(&runtime);
    let mut runs = Vec::new();
    for i in 0..3 {
        let labels = RunLabels::app_chat("app", format!("chat{i}")).expect("valid labels");
        runs.push(
            runtime
                .start_with(&wf, Map::new(), thread(&format!("t{i}")), labels)
                .await
                .expect("start"),
        );
    }
    short.wait_started(3).await;
    server.kill9();
    // They run to their end, errors counted but never taken for a stop.
    for run in &runs {
        let outcome = ended(run, PATIENCE).await;
        assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:?}");
    }
    let errors = runtime.signal_errors();
    assert!(errors > 0, "the outage was noticed");

    // Back up (empty: nothing persisted): a flag set now stops a new run of the same runtime.
    server.restart();
    let wf = runtime
        .load_json(
            r#"{"id": "long", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "host", "kind": "long"}
            ], "edges": [{"from": "start", "to": "host"}]}"#,
        )
        .expect("valid workflow");
    let run = runtime
        .start_with(
            &wf,
            Map::new(),
            thread("after"),
            RunLabels::app_chat("app", "after").expect("valid labels"),
        )
        .await
        .expect("start");
    long.wait_started(1).await;
    let mut con = raw(&server).await;
    let _: String = cmd(
        &mut con,
        &["SETEX", "agent_runtime_stopping:app:after", "60", "1"],
    )
    .await;
    let outcome = ended(&run, Duration::from_secs(15)).await;
    assert_eq!(stop_reason(&outcome), Some(StopReason::UserInterrupted));
}

/// The watcher's reads of 10,000 live runs on Redis: every flag by `MGET`, in full batches,
/// over and over. (That it reads once per tick, each time every flag in one read, is the
/// engine's part, proved on the paused clock in its own tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_live_runs_are_read_in_full_mget_batches() {
    const RUNS: usize = 10_000;
    let server = RedisServer::start();
    // What is checked is what is read, not how fast: on an overloaded machine, 10,000 lease
    // takes and renewals may outlast the other tests' 300 ms response timeout.
    let patient = RedisConfig {
        response_timeout: Duration::from_secs(5),
        call_timeout: Duration::from_secs(10),
        ..super::support::config(&server)
    };
    let stores = within("connect", RedisStores::connect(patient))
        .await
        .expect("connect");
    let idle = Idle::default();
    // Memory stores: what is observed is the watcher's reads. No labels: each run has its
    // two native flags (stop and cancel), so a full read is of 20,000 keys.
    let runtime = signals_only_runtime(&stores, idle.clone(), SignalConfig::default());
    let wf = workflow(&runtime);
    let mut runs = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        runs.push(
            runtime
                .start(&wf, Map::new(), thread(&format!("t{i}")))
                .await
                .expect("start"),
        );
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        while idle.started.load(Ordering::SeqCst) < RUNS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("10,000 runs reach their node within a minute");

    // One read of every flag, as the watcher does it.
    let config = SignalConfig::default();
    let keys: Vec<String> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, run)| {
            let t = thread(&format!("t{i}"));
            let labels = RunLabels::default();
            config
                .stop_keys
                .iter()
                .chain(&config.cancel_keys)
                .filter_map(|template| {
                    render_key(template, "runvisor", &labels, Some(&t), Some(run.run_id()))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(keys.len(), 2 * RUNS);
    // (On an overloaded machine one read of 20,000 keys may outlast the test config's call
    // timeout: a time-out is tried again, this checks what is read, not how fast.)
    let mut tries = 0;
    let flags = loop {
        match stores.signals.read(&keys).await {
            Ok(flags) => break flags,
            Err(e @ runvisor::StoreError::Timeout(_)) if tries < 5 => {
                tries += 1;
                eprintln!("read {tries} timed out: {e}");
            }
            Err(e) => panic!("read: {e}"),
        }
    };
    assert_eq!(flags.len(), keys.len());
    assert!(flags.iter().all(|f| !f));

    // Then only the watcher reads: Redis counts a miss per absent key an `MGET` asks for, so
    // misses per `MGET` is the batch size. Observed until every flag was read twice more
    // (a check of progress, not of speed).
    let mut con = raw(&server).await;
    let before = key_reads(&mut con).await;
    let after = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let now = key_reads(&mut con).await;
            if now.missed - before.missed >= 2 * keys.len() as u64 {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the watcher reads every flag twice within a minute");
    let (mgets, missed) = (after.mgets - before.mgets, after.missed - before.missed);
    // Read per run, it would be 20,000 commands of one or two keys for each full read. Other
    // commands miss keys too (10,000 runs' lease renewals, on their own clock), so misses
    // bound the MGETs from above: at most one per full batch of misses.
    assert!(
        mgets > 0 && mgets * READ_BATCH as u64 <= missed,
        "{mgets} MGETs read {missed} keys: not in full batches of {READ_BATCH}"
    );
    // (A read slower than the watcher's deadline, on an overloaded machine, counts as an
    // error: not asserted.)
    eprintln!("signal errors: {}", runtime.signal_errors());

    let stops = tokio::time::timeout(Duration::from_secs(60), runtime.shutdown())
        .await
        .expect("10,000 runs shut down within a minute");
    assert_eq!(stops.len(), RUNS);
    for run in &runs {
        assert_eq!(
            stop_reason(&ended(run, PATIENCE).await),
            Some(StopReason::Shutdown)
        );
    }
}

#[tokio::test]
async fn a_runtime_stops_a_run_of_another_runtime_sharing_redis() {
    let server = RedisServer::start();
    // Two processes: separate connections, separate runtimes, one Redis.
    let worker_stores = stores(&server).await;
    let talk = Talk::endless();
    let worker = redis_runtime(&worker_stores, talk.clone(), SignalConfig::default());
    let run = start(
        &worker,
        &workflow(&worker),
        RunLabels::app_chat("app", "chat").expect("valid labels"),
    )
    .await;
    talk.wait_started(1).await;

    let api_stores = stores(&server).await;
    let api = redis_runtime(&api_stores, Idle::default(), SignalConfig::default());
    let request = within("stop request", api.request_stop("app", "chat")).await;
    assert!(request.ended, "{request:?}");
    assert_eq!(request.error, None);
    // It answered once the run had let go of its flag: its nodes are done, and its outcome
    // follows (the run clears its flags before its final flush).
    let outcome = ended(&run, PATIENCE).await;
    assert_eq!(stop_reason(&outcome), Some(StopReason::UserInterrupted));
    let record = api_stores
        .runs
        .get(run.run_id())
        .await
        .expect("read")
        .expect("recorded by the worker");
    assert_eq!(record.status, RunStatus::Stopped);
}
