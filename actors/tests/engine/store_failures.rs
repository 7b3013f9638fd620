//! Stores that fail: a transient failure (out of reach, slow) is retried with backoff until
//! the store deadline, a permanent one (refused) never; a `sync` run whose progress is refused
//! for good fails at once instead of waiting for a store that will never take it. On the
//! paused clock, so the deadlines are timers and nothing depends on the machine's speed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use runvisor_actors::store::memory::{MemoryCheckpointStore, MemoryHistoryStore};
use runvisor_actors::store::{
    Acquired, HistoryStore, LeaseStore, MemoryLeaseStore, StoredCheckpoint,
};
use runvisor_actors::testkit::{PutWatch, WatchedCheckpoints};
use runvisor_actors::{
    CheckpointError, Durability, Fence, Lease, LeaseError, LeaseHolder, Message, RunError,
    RunOutcome, RunStatus, Runtime, RuntimeConfig, StoreError, ThreadId, WorkerId, WorkerInfo,
    async_trait,
};
use serde_json::json;

use super::support::*;

/// How a failing store answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failing {
    /// As the store it wraps.
    No,
    /// The first `n` calls time out, then as the store it wraps.
    First(u64),
    /// Every call is refused for good.
    Refused,
    /// Every call times out.
    Always,
}

/// Counts calls and fails them as told.
#[derive(Debug)]
pub(crate) struct Faults {
    mode: std::sync::Mutex<Failing>,
    calls: AtomicU64,
}

impl Faults {
    pub(crate) fn new(mode: Failing) -> Self {
        Self {
            mode: std::sync::Mutex::new(mode),
            calls: AtomicU64::new(0),
        }
    }

    pub(crate) fn set(&self, mode: Failing) {
        *self.mode.lock().expect("mode") = mode;
    }

    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The error for this call, if it fails.
    pub(crate) fn check(&self, what: &str, key: &str) -> Result<(), StoreError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        match *self.mode.lock().expect("mode") {
            Failing::No => Ok(()),
            Failing::First(k) if n >= k => Ok(()),
            Failing::First(_) | Failing::Always => {
                Err(StoreError::Timeout(Duration::from_millis(100)))
            }
            Failing::Refused => Err(StoreError::Rejected {
                command: what.to_owned(),
                key: key.to_owned(),
                reason: "NOPERM no permission".to_owned(),
            }),
        }
    }
}

/// A history store whose appends fail as told.
#[derive(Debug)]
pub(crate) struct FailingHistory {
    pub(crate) inner: MemoryHistoryStore,
    pub(crate) faults: Faults,
}

#[async_trait]
impl HistoryStore for FailingHistory {
    async fn append(
        &self,
        thread: &ThreadId,
        messages: &[Message],
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        self.faults.check("append", thread.as_str())?;
        self.inner.append(thread, messages, fence).await
    }
    async fn load(&self, thread: &ThreadId) -> Result<Vec<Message>, StoreError> {
        self.inner.load(thread).await
    }
}

/// A memory lease store whose releases fail as told; everything else as the store it wraps.
#[derive(Debug)]
pub(crate) struct FailingReleases {
    pub(crate) inner: MemoryLeaseStore,
    pub(crate) faults: Faults,
}

#[async_trait]
impl LeaseStore for FailingReleases {
    async fn heartbeat(&self, worker: &WorkerInfo, ttl: Duration) -> Result<(), StoreError> {
        self.inner.heartbeat(worker, ttl).await
    }
    async fn retire(&self, worker: &WorkerId) -> Result<(), StoreError> {
        self.inner.retire(worker).await
    }
    async fn workers(&self, ids: &[WorkerId]) -> Result<Vec<Option<WorkerInfo>>, StoreError> {
        self.inner.workers(ids).await
    }
    async fn acquire(
        &self,
        thread: &ThreadId,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Acquired, LeaseError> {
        self.inner.acquire(thread, holder, ttl).await
    }
    async fn renew(
        &self,
        thread: &ThreadId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<(), LeaseError> {
        self.inner.renew(thread, lease, ttl).await
    }
    async fn release(&self, thread: &ThreadId, lease: &Lease) -> Result<(), StoreError> {
        self.faults.check("release", thread.as_str())?;
        self.inner.release(thread, lease).await
    }
    async fn lease(&self, thread: &ThreadId) -> Result<Option<Lease>, StoreError> {
        self.inner.lease(thread).await
    }
}

#[async_trait]
impl PutWatch for Faults {
    async fn before(&self, thread: &ThreadId, _: &StoredCheckpoint) -> Result<(), StoreError> {
        self.check("put", thread.as_str())
    }
}

/// A memory checkpoint store whose writes fail as its [`Faults`] (its watch) tell.
pub(crate) type FailingCheckpoints = WatchedCheckpoints<Faults>;

/// A memory checkpoint store whose writes fail as `mode` says.
pub(crate) fn failing_checkpoints(mode: Failing) -> Arc<FailingCheckpoints> {
    Arc::new(WatchedCheckpoints::new(
        Arc::new(MemoryCheckpointStore::new()),
        Faults::new(mode),
    ))
}

fn config(durability: Durability, deadline: Duration) -> RuntimeConfig {
    RuntimeConfig {
        durability,
        store_deadline: deadline,
        ..RuntimeConfig::default()
    }
}

fn chain(rt: &Runtime) -> runvisor_actors::Workflow {
    load(
        rt,
        json!({"id": "w", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "message", "params": {"template": "a"}},
            {"id": "b", "kind": "message", "params": {"template": "b"}}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]}),
    )
}

/// Runs [`chain`] on `thread` to its end.
async fn run_chain(rt: &Runtime, thread: ThreadId) -> RunOutcome {
    let run = rt
        .start(&chain(rt), inputs([]), thread)
        .await
        .expect("start");
    finish(&run).await
}

#[tokio::test(start_paused = true)]
async fn a_sync_run_whose_progress_is_refused_fails_at_once_instead_of_waiting() {
    let checkpoints = failing_checkpoints(Failing::Refused);
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .checkpoint_store(checkpoints.clone())
        .config(config(Durability::Sync, Duration::from_secs(3600)))
        .build();
    let outcome = run_chain(&rt, thread("refused")).await;
    assert_eq!(outcome.status(), RunStatus::Failed, "{outcome:#?}");
    match outcome.error() {
        Some(RunError::Storage(CheckpointError::Refused(StoreError::Rejected {
            command,
            key,
            ..
        }))) => assert_eq!((command.as_str(), key.as_str()), ("put", "refused")),
        other => panic!("expected a storage failure, got {other:?}"),
    }
    // `b` never ran unsaved, and neither the progress snapshot nor the final one was retried.
    assert_eq!(outcome.output("b"), None);
    assert_eq!(checkpoints.watch().calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_store_failing_for_a_while_at_the_end_is_retried_until_it_is_back() {
    let history = Arc::new(FailingHistory {
        inner: MemoryHistoryStore::new(),
        faults: Faults::new(Failing::First(3)),
    });
    let rt = Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .history_store(history.clone())
        .config(config(Durability::Exit, Duration::from_secs(30)))
        .build();
    let t = thread("blip");
    let outcome = run_chain(&rt, t.clone()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert!(outcome.history().not_persisted.is_empty(), "{outcome:#?}");
    assert_eq!(history.faults.calls(), 4);
    let texts: Vec<String> = history
        .inner
        .load(&t)
        .await
        .expect("load")
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(texts, ["a", "b"]);
}

/// A lease the run could not give up at its first try would keep the thread busy until it
/// expires: the release is tried again until the store deadline, in the background, so the
/// outcome does not wait for it, and the thread is free once the store is back.
#[tokio::test(start_paused = true)]
async fn a_lease_release_failing_for_a_while_is_retried_and_the_thread_is_free_at_the_end() {
    let leases = Arc::new(FailingReleases {
        inner: MemoryLeaseStore::new(),
        faults: Faults::new(Failing::First(2)),
    });
    let rt = Runtime::builder()
        .lease_store(leases.clone())
        .config(config(Durability::Exit, Duration::from_secs(30)))
        .build();
    let t = thread("release");
    let outcome = run_chain(&rt, t.clone()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert!(leases.inner.lease(&t).await.expect("lease").is_some());
    // The first retry after 50 ms, the second 100 ms later (the paused clock).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(leases.faults.calls(), 3);
    assert_eq!(leases.inner.lease(&t).await.expect("lease"), None);
}

/// A release the store refuses for good is not tried again: the lease expires by itself, and
/// the run's outcome is as it would be.
#[tokio::test(start_paused = true)]
async fn a_lease_release_refused_is_not_retried() {
    let leases = Arc::new(FailingReleases {
        inner: MemoryLeaseStore::new(),
        faults: Faults::new(Failing::Refused),
    });
    let rt = Runtime::builder()
        .lease_store(leases.clone())
        .config(config(Durability::Exit, Duration::from_secs(30)))
        .build();
    let t = thread("refused-release");
    let outcome = run_chain(&rt, t.clone()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    // Past several retries' worth of backoff, within the lease's life (the paused clock).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(leases.faults.calls(), 1);
    assert!(leases.inner.lease(&t).await.expect("lease").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_store_failing_past_the_deadline_is_given_up_and_a_refusal_is_not_retried() {
    for (mode, retried) in [(Failing::Always, true), (Failing::Refused, false)] {
        let history = Arc::new(FailingHistory {
            inner: MemoryHistoryStore::new(),
            faults: Faults::new(mode),
        });
        let rt = Runtime::builder()
            .lease_store(Arc::new(MemoryLeaseStore::new()))
            .history_store(history.clone())
            .config(config(Durability::Exit, Duration::from_secs(1)))
            .build();
        let outcome = run_chain(&rt, thread("outage")).await;
        let flush = outcome.history();
        assert_eq!(flush.not_persisted.len(), 2, "{mode:?}");
        let error = flush.error.as_ref().expect("the store's error");
        assert_eq!(error.is_transient(), retried, "{mode:?}: {error}");
        assert_eq!(history.faults.calls() > 1, retried, "{mode:?}");
        history.faults.set(Failing::No);
    }
}

/// A signal source whose `raise` fails as told.
struct FailingFlags {
    inner: runvisor_actors::store::memory::MemorySignalSource,
    faults: Faults,
}

#[async_trait]
impl runvisor_actors::store::SignalSource for FailingFlags {
    async fn read(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        self.inner.read(keys).await
    }
    async fn raise(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        self.faults.check("SET", key)?;
        self.inner.raise(key, ttl).await
    }
    async fn clear(
        &self,
        keys: &[String],
        fence: Option<(&ThreadId, Fence)>,
    ) -> Result<(), StoreError> {
        self.inner.clear(keys, fence).await
    }
    async fn notify(&self, notice: &runvisor_actors::store::Notice) -> Result<(), StoreError> {
        self.inner.notify(notice).await
    }
    async fn subscribe(&self) -> Result<runvisor_actors::store::NoticeStream, StoreError> {
        self.inner.subscribe().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_stop_request_whose_flag_cannot_be_set_says_so() {
    use runvisor_actors::store::SignalSource;
    for (mode, set) in [
        (Failing::First(2), true),
        (Failing::Refused, false),
        (Failing::Always, false),
    ] {
        let flags = Arc::new(FailingFlags {
            inner: runvisor_actors::store::memory::MemorySignalSource::new(),
            faults: Faults::new(mode),
        });
        let rt = Runtime::builder()
            .lease_store(Arc::new(MemoryLeaseStore::new()))
            .signal_source(flags.clone())
            .config(RuntimeConfig {
                store_deadline: Duration::from_secs(1),
                signals: runvisor_actors::SignalConfig {
                    request_wait: Duration::from_millis(100),
                    ..runvisor_actors::SignalConfig::default()
                },
                ..RuntimeConfig::default()
            })
            .build();
        let request = within("the request", rt.request_flag("x:flag")).await;
        let raised = flags
            .inner
            .read(&["x:flag".to_owned()])
            .await
            .expect("read");
        assert_eq!(raised, [set], "{mode:?}");
        assert_eq!(request.flag_error.is_none(), set, "{mode:?}: {request:?}");
        if mode == Failing::Refused {
            assert_eq!(flags.faults.calls(), 1, "a refusal is not retried");
            assert!(
                matches!(request.flag_error, Some(StoreError::Rejected { .. })),
                "{request:?}"
            );
        }
    }
}
