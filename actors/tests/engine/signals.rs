//! Stop from anywhere: flags in the signal source (FastGPT and RAGFlow key formats, native
//! keys) stop runs through the watcher, which reads every watched flag in one read per tick;
//! stop requests wait for the run to end, or for their configured wait; a failing source never
//! stops a run. All on tokio's paused clock: ticks and waits are timers, not wall time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runvisor_actors::store::memory::MemorySignalSource;
use runvisor_actors::store::{MemoryLeaseStore, Notice, NoticeStream, SignalSource};
use runvisor_actors::testkit::Streamer;
use runvisor_actors::{Fence, ThreadId};
use runvisor_actors::{
    NodeContext, NodeError, NodeHandler, NodeOutput, RunLabels, RunStatus, Runtime, SignalConfig,
    StopReason, StoreError, Value, async_trait,
};
use serde_json::json;

use super::support::*;

fn streaming_runtime(source: Arc<dyn SignalSource>) -> Runtime {
    Runtime::builder()
        .handler(
            "llm",
            Streamer::new(&"word ".repeat(400), Duration::from_millis(5)),
        )
        .signal_source(source)
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .build()
}

fn workflow(rt: &Runtime) -> runvisor_actors::Workflow {
    load(
        rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "llm", "kind": "llm"}
        ], "edges": [{"from": "start", "to": "llm"}]}),
    )
}

#[tokio::test(start_paused = true)]
async fn a_fastgpt_stop_flag_stops_the_run_and_the_request_waits_for_its_end() {
    let source = Arc::new(MemorySignalSource::new());
    let rt = streaming_runtime(source.clone());
    let wf = workflow(&rt);
    let run = rt
        .start_with(
            &wf,
            inputs([]),
            thread("chat9"),
            RunLabels::app_chat("app1", "chat9").expect("valid labels"),
        )
        .await
        .expect("start");
    // Let it stream a little, then ask from "another process" (the shared source).
    tokio::time::sleep(Duration::from_millis(30)).await;
    let request = within("stop request", rt.request_stop("app1", "chat9")).await;
    assert_eq!(request.key, "agent_runtime_stopping:app1:chat9");
    assert!(request.ended, "{request:?}");
    assert_eq!(request.error, None);
    let outcome = finish(&run).await;
    let stop = outcome.stop_result().expect("stopped");
    assert_eq!(stop.reason, StopReason::UserInterrupted);
    assert!(
        stop.partial_response
            .as_deref()
            .is_some_and(|p| p.starts_with("word"))
    );
    // The run deleted its flag when it ended.
    let flags = source
        .read(std::slice::from_ref(&request.key))
        .await
        .expect("read");
    assert_eq!(flags, [false]);
}

#[tokio::test(start_paused = true)]
async fn a_ragflow_cancel_flag_cancels_the_run() {
    let source = Arc::new(MemorySignalSource::new());
    let rt = streaming_runtime(source.clone());
    let wf = workflow(&rt);
    let run = rt
        .start_with(
            &wf,
            inputs([]),
            thread("task"),
            RunLabels::task("T42").expect("valid labels"),
        )
        .await
        .expect("start");
    // Set by a foreign process with no notice at all: the tick finds it.
    source
        .raise("T42-cancel", Duration::from_secs(60))
        .await
        .expect("raise");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Cancelled);
    assert_eq!(
        outcome.stop_result().map(|s| s.reason),
        Some(StopReason::Cancelled)
    );
}

#[tokio::test(start_paused = true)]
async fn a_flag_nobody_clears_is_waited_for_until_the_wait_is_over() {
    const WAIT: Duration = Duration::from_millis(200);
    let rt = Runtime::builder()
        .config(runvisor_actors::RuntimeConfig {
            signals: SignalConfig {
                request_wait: WAIT,
                ..Default::default()
            },
            ..Default::default()
        })
        .build();
    let request = tokio::spawn({
        let rt = rt.clone();
        async move { rt.request_flag("some:flag").await }
    });
    // Nobody clears the flag: just before its wait is over, the request still waits.
    tokio::time::sleep(WAIT - Duration::from_millis(1)).await;
    assert!(!request.is_finished(), "answered before its wait was over");
    let request = within("stop request", request).await.expect("request task");
    assert!(!request.ended);
    assert_eq!(request.waited, WAIT, "{request:?}");
    assert_eq!(request.error, None);
}

#[tokio::test(start_paused = true)]
async fn a_stop_for_labels_no_run_carries_sets_no_flag_and_a_stale_flag_stops_no_later_run() {
    let source = Arc::new(MemorySignalSource::new());
    let rt = streaming_runtime(source.clone());
    // Nothing runs for A/C: the answer comes at once, and no flag is left.
    let request = rt.request_stop("A", "C").await;
    assert!(request.no_live_run, "{request:?}");
    assert!(!request.ended);
    assert_eq!(request.waited, Duration::ZERO);
    let key = "agent_runtime_stopping:A:C".to_owned();
    assert_eq!(
        source.read(std::slice::from_ref(&key)).await,
        Ok(vec![false])
    );
    let cancel = rt.request_cancel("T").await;
    assert!(cancel.no_live_run, "{cancel:?}");
    assert_eq!(source.read(&["T-cancel".to_owned()]).await, Ok(vec![false]));

    // Another system left a flag for A/C while nothing ran: the next run of A/C clears it
    // when it starts and runs to its end.
    source
        .raise(&key, Duration::from_secs(60))
        .await
        .expect("raise");
    let wf = workflow(&rt);
    let labels = RunLabels::app_chat("A", "C").expect("labels");
    let run = rt
        .start_with(&wf, Default::default(), thread("stale-flag"), labels)
        .await
        .expect("start");
    assert_eq!(
        source.read(std::slice::from_ref(&key)).await,
        Ok(vec![false])
    );
    let outcome = within("the run", run.wait()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:?}");
}

/// A signal source that records how many keys each read asked for.
#[derive(Debug, Default)]
struct Counting {
    inner: MemorySignalSource,
    reads: Mutex<Vec<usize>>,
}

impl Counting {
    fn reads(&self) -> Vec<usize> {
        self.reads.lock().expect("not poisoned").clone()
    }
}

#[async_trait]
impl SignalSource for Counting {
    async fn read(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        self.reads.lock().expect("not poisoned").push(keys.len());
        self.inner.read(keys).await
    }
    async fn raise(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        self.inner.raise(key, ttl).await
    }
    async fn clear(
        &self,
        keys: &[String],
        fence: Option<(&ThreadId, Fence)>,
    ) -> Result<(), StoreError> {
        self.inner.clear(keys, fence).await
    }
    async fn notify(&self, notice: &Notice) -> Result<(), StoreError> {
        self.inner.notify(notice).await
    }
    async fn subscribe(&self) -> Result<NoticeStream, StoreError> {
        self.inner.subscribe().await
    }
}

/// Waits for the stop and returns `Stopped`: a live run that does nothing.
struct Idle;

#[async_trait]
impl NodeHandler for Idle {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        ctx.stopped().await;
        Err(NodeError::Stopped)
    }
}

#[tokio::test(start_paused = true)]
async fn each_tick_reads_every_watched_flag_in_one_read() {
    const RUNS: usize = 50;
    const TICKS: u32 = 10;
    let source = Arc::new(Counting::default());
    let rt = Runtime::builder()
        .handler("idle", Idle)
        .signal_source(source.clone())
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .build();
    let tick = rt.config().signals.tick;
    let wf = load(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "idle", "kind": "idle"}
        ], "edges": [{"from": "start", "to": "idle"}]}),
    );
    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(
            rt.start(&wf, inputs([]), thread(&format!("idle{i}")))
                .await
                .expect("start"),
        );
    }
    // Each run has its native stop and cancel flags (no labels for the other formats).
    let every_flag = 2 * RUNS;
    within("a read of every run's flags", async {
        while source.reads().last() != Some(&every_flag) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    // Within a millisecond of a full read: the next TICKS ticks fall in the window, the one
    // after it does not.
    let before = source.reads().len();
    tokio::time::sleep(tick * TICKS + tick / 2).await;
    let reads = source.reads().split_off(before);
    assert_eq!(
        reads,
        vec![every_flag; TICKS as usize],
        "one read of every flag per tick"
    );
    assert!(runs.iter().all(|run| run.outcome().is_none()));
    let stops = within("shutdown", rt.shutdown()).await;
    assert_eq!(stops.len(), RUNS);
}

/// A signal source whose reads fail while `broken` is set.
#[derive(Debug)]
struct Flaky {
    inner: MemorySignalSource,
    broken: AtomicBool,
}

#[async_trait]
impl SignalSource for Flaky {
    async fn read(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("signal source down".into()));
        }
        self.inner.read(keys).await
    }
    async fn raise(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        self.inner.raise(key, ttl).await
    }
    async fn clear(
        &self,
        keys: &[String],
        fence: Option<(&ThreadId, Fence)>,
    ) -> Result<(), StoreError> {
        self.inner.clear(keys, fence).await
    }
    async fn notify(&self, notice: &Notice) -> Result<(), StoreError> {
        self.inner.notify(notice).await
    }
    async fn subscribe(&self) -> Result<NoticeStream, StoreError> {
        self.inner.subscribe().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_source_never_stops_a_run_and_a_flag_set_after_recovery_is_honoured() {
    let flaky = Arc::new(Flaky {
        inner: MemorySignalSource::new(),
        broken: AtomicBool::new(true),
    });
    let rt = streaming_runtime(flaky.clone());
    let wf = load(
        &rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "message", "params": {"template": "done"}}
        ], "edges": [{"from": "start", "to": "a"}]}),
    );
    let run = rt
        .start_with(
            &wf,
            inputs([]),
            thread("f"),
            RunLabels::app_chat("a", "f").expect("valid labels"),
        )
        .await
        .expect("start");
    assert_eq!(finish(&run).await.status(), RunStatus::Succeeded);

    // A long run while the source is down: it goes on and errors are counted.
    let long = workflow(&rt);
    let run = rt
        .start_with(
            &long,
            inputs([]),
            thread("g"),
            RunLabels::app_chat("a", "g").expect("valid labels"),
        )
        .await
        .expect("start");
    within("errors counted", async {
        while rt.signal_errors() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(run.outcome().is_none(), "the run keeps going");
    // Recovery: a flag set now stops it.
    flaky.broken.store(false, Ordering::SeqCst);
    flaky
        .inner
        .raise("agent_runtime_stopping:a:g", Duration::from_secs(60))
        .await
        .expect("raise");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Stopped);
}
