//! `Checkpointer`: one actor per runtime, writing snapshots in the background; with it, the
//! awaited writes its runs make themselves ([`write_awaited`]), against the chains it shares.
//!
//! Snapshots are written in one of two ways:
//! - **awaited** (`sync` durability after each node and each iteration or item of a loop or
//!   parallel at any depth, and every run's final snapshot at a stop,
//!   pause, failure or finish): written in the caller's task (no hop through this actor's
//!   mailbox; it is only told, so a background snapshot of the run still waiting goes), which
//!   waits until the snapshot is stored, retried with
//!   backoff while the store fails transiently, until the caller's deadline; a permanent error
//!   answers at once. A snapshot that was not stored is handed back, encoded, to the caller;
//! - **background** (`async` durability): the newest pending snapshot of each run replaces any
//!   older one still waiting (coalescing), and pending snapshots are written in a batch. A write
//!   that failed transiently stays pending and is retried with backoff, so when the store comes
//!   back the newest state lands; the store's sequence check refuses anything older than what
//!   it holds. One refused for good is dropped (logged): the run's final snapshot, awaited,
//!   meets the same refusal and reports it. However many flushes a write takes, it is one
//!   write: one span (each failed attempt an event on it) and one report to the
//!   [`CheckpointObserver`] when it ends, stored, refused, or superseded by a newer snapshot.
//!
//! Background writes are paced by their cost: after a run's snapshot took `t` to encode and
//! store, its next one waits `PACE × t` (at most [`MAX_PACE`]), newer snapshots replacing it
//! meanwhile. A run whose state grows large (a long loop's history) is then saved less often,
//! and the time spent saving stays a small, fixed share of the run's time.
//!
//! Incremental checkpoints: a run's first checkpoint is a whole snapshot (a base), unless the
//! run continues a thread from its newest checkpoint (a resume): then its chain is that
//! checkpoint's (`Chains::continue_from`, before its first write). Each checkpoint after the base is a delta of the
//! chain's last stored checkpoint (see
//! [`delta`](crate::delta)), holding only what changed since: a node's output, its
//! messages, the frame's cursor and variables, one iteration's or item's result. Deltas are
//! computed when written, against what the store holds, so coalesced background snapshots
//! merge into one delta. A chain is compacted into a new base by size: once the deltas a
//! restore of its last checkpoint applies add up to more than
//! [`checkpoint_compact_percent`](crate::RuntimeConfig::checkpoint_compact_percent) of its
//! base's bytes (counted before compression: a compressed base costs as much to encode and
//! restore), so the bytes encoded for bases stay a bounded share of the deltas' (a step's
//! cost does not grow with the run's state). A restore applies at most
//! [`checkpoint_compact_every`](crate::RuntimeConfig::checkpoint_compact_every) deltas: a chain
//! that reaches that bound while it is still small next to its base gets a merged delta (a
//! delta of the chain's last merge point, holding every change since; see `Chains::encode`)
//! rather than a base, so a large state is not written whole every that many steps. A run's
//! final snapshot (stopped, paused, failed, finished)
//! is a delta too, so a thread stopped and resumed again and again keeps one chain rather
//! than a whole snapshot per stop; one that is not stored is handed back whole (it may be
//! kept in a spill file and written long after its chain moved on). A delta the store
//! refuses because what it builds on is gone ([`StoreError::MissingParent`]) is written
//! again whole.
//!
//! Pending bytes are counted; a run whose background snapshot would exceed the configured
//! buffer waits for an awaited write instead, so a long outage slows runs down rather than
//! losing their state or growing memory without bound.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use dashmap::DashMap;

use crate::model::{CheckpointError, CheckpointId, RunId, RunStatus, StoreError, ThreadId};
use crate::persist::delta::{ChainInfo, DeltaLink, MAX_CHAIN, SnapshotDelta};
use crate::persist::retry::Backoff;
use crate::persist::snapshot::{SaveFailed, Snapshot, SnapshotError, SnapshotWrite, plain_size};
use crate::persist::{CheckpointStore, StoredCheckpoint};
/// Snapshot bytes waiting to be written, shared with the runs that read it.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    bytes: AtomicUsize,
}

impl Backlog {
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Messages the checkpointer handles.
#[derive(Debug)]
pub(crate) enum CheckpointMsg {
    /// An awaited write of the run is being made (by its caller, [`write_awaited`]): a
    /// background snapshot of the run still pending is older, and goes.
    Superseded(RunId),
    /// Write in the background; a newer snapshot of the same run replaces this one.
    Background(SnapshotWrite),
    /// Write what is pending (what is due).
    Flush,
    /// A run ended: forget its chain, if it still has one.
    Forget(RunId),
}

/// Where a run's chain of checkpoints begins when it continues a stored checkpoint: the
/// checkpoint's chain (as [`materialize_chain`](crate::persist::delta::materialize_chain)
/// read it) and the state it holds.
#[derive(Debug)]
pub(crate) struct ChainSeed {
    pub(crate) thread: ThreadId,
    pub(crate) chain: ChainInfo,
    pub(crate) snapshot: Snapshot,
}

pub(crate) struct Checkpointer;

/// Told of every checkpoint write as it ends, for metrics: its mode (`sync`, `async` or
/// `final`), its size, how long its attempts took, and whether it was stored. Called on the
/// checkpointer's path, so it must be cheap (an atomic histogram, not I/O). Set with
/// [`RuntimeBuilder::checkpoint_observer`](crate::RuntimeBuilder::checkpoint_observer).
pub trait CheckpointObserver: Send + Sync + 'static {
    /// A checkpoint write ended.
    fn written(&self, mode: &'static str, bytes: usize, took: Duration, stored: bool);
}

pub(crate) struct CheckpointerArgs {
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) observer: Option<Arc<dyn CheckpointObserver>>,
    pub(crate) backlog: Arc<Backlog>,
    /// The runs' chains, shared with the awaited writes ([`write_awaited`]).
    pub(crate) chains: Chains,
}

/// The chain of checkpoints a running run writes: its base, its last stored checkpoint, which
/// the next delta is computed against, and its last merge point, which a merged delta is.
struct Chain {
    thread: ThreadId,
    base: CheckpointId,
    sequence: u64,
    base_bytes: usize,
    last: Point,
    /// The checkpoint a merged delta would build on, when one is kept apart from `last`: the
    /// checkpoint before the first delta after a merge point (the base, the checkpoint the
    /// run continued, a merged delta) or after it, once a merge could pay.
    anchor: Option<Point>,
}

/// A stored checkpoint of a chain, with the state it holds and what restoring it costs: the
/// deltas it applies on the base (its parents back to the base) and their bytes.
struct Point {
    id: CheckpointId,
    snapshot: Snapshot,
    deltas: u32,
    delta_bytes: usize,
}

/// Each running run's chain, shared by the checkpointer and the awaited writes.
#[derive(Clone)]
pub(crate) struct Chains {
    runs: Arc<DashMap<RunId, Chain>>,
    /// The newest checkpoint id of each run that continues a checkpoint whose id is ahead of
    /// this process's clock (written by a process whose clock is ahead): the run's ids count
    /// on from it ([`CheckpointId::after`]) so they sort after what they continue. Empty
    /// while the processes' clocks agree.
    floors: Arc<DashMap<RunId, CheckpointId>>,
    compact_every: u32,
    compact_percent: u32,
}

impl Chains {
    /// No chain yet. `compact_every`: deltas a restore applies on a base at most (0: every
    /// checkpoint whole); `compact_percent`: their bytes, in percent of the base's, past which
    /// the next checkpoint is a base (0: every checkpoint whole).
    pub(crate) fn new(compact_every: u32, compact_percent: u32) -> Self {
        Self {
            runs: Arc::new(DashMap::new()),
            floors: Arc::new(DashMap::new()),
            compact_every,
            compact_percent,
        }
    }

    /// Encodes a write: a delta of the run's last stored checkpoint while restoring it stays
    /// within the compaction's bounds; once the count bound is reached, a merged delta of the
    /// chain's last merge point when that is cheaper than a base by half and keeps within the
    /// bounds; otherwise whole.
    ///
    /// A merged delta holds every change since its merge point, so a restore of it (and of
    /// the deltas after it) skips the deltas between. It replaces a base that compaction by
    /// count would write: when the state outweighs the deltas since the merge point, a base
    /// would cost the whole state every `compact_every` steps, where a merged delta costs only
    /// what those steps changed. Its merge point is taken only while it is at most half the
    /// count bound deep, so at least that many steps follow each merge.
    fn encode(&self, write: &SnapshotWrite) -> Result<(Vec<u8>, Option<DeltaLink>), SnapshotError> {
        if !self.incremental() {
            return Ok((write.snapshot.encode()?, None));
        }
        let cap = self.cap();
        let Some(chain) = self
            .runs
            .get(&write.run)
            .filter(|c| c.thread == write.thread && c.sequence < write.sequence)
        else {
            return Ok((write.snapshot.encode()?, None));
        };
        let size_fits = |bytes: usize| {
            (bytes as u128) * 100 <= (chain.base_bytes as u128) * u128::from(self.compact_percent)
        };
        if size_fits(chain.last.delta_bytes) {
            if (chain.last.deltas as usize) < cap {
                let link = DeltaLink {
                    base: chain.base,
                    parent: chain.last.id,
                };
                let delta = SnapshotDelta::between(&chain.last.snapshot, &write.snapshot, link);
                drop(chain);
                return Ok((delta.encode()?, Some(link)));
            }
            if let Some(anchor) = &chain.anchor
                && (anchor.deltas as usize) < cap / 2
            {
                let link = DeltaLink {
                    base: chain.base,
                    parent: anchor.id,
                };
                let merged =
                    SnapshotDelta::between(&anchor.snapshot, &write.snapshot, link).encode()?;
                let size = plain_size(&merged);
                if size.saturating_mul(2) <= chain.base_bytes
                    && size_fits(anchor.delta_bytes.saturating_add(size))
                {
                    return Ok((merged, Some(link)));
                }
            }
        }
        drop(chain);
        Ok((write.snapshot.encode()?, None))
    }

    /// A checkpoint of the run was stored: the next delta builds on it. A run's final
    /// checkpoint ends its chain. Answers the thread when the checkpoint is a merged delta,
    /// whose skipped deltas the store may let go of ([`release_skipped`]).
    fn stored(
        &self,
        write: SnapshotWrite,
        id: CheckpointId,
        bytes: usize,
        link: Option<DeltaLink>,
    ) -> Option<ThreadId> {
        if !self.incremental() {
            return None;
        }
        if write.snapshot.status != RunStatus::Running {
            self.runs.remove(&write.run);
            return None;
        }
        let Some(link) = link else {
            if self
                .runs
                .get(&write.run)
                .is_some_and(|c| c.sequence >= write.sequence)
            {
                return None;
            }
            let last = Point {
                id,
                snapshot: *write.snapshot,
                deltas: 0,
                delta_bytes: 0,
            };
            let chain = Chain {
                thread: write.thread,
                base: id,
                sequence: write.sequence,
                base_bytes: bytes,
                last,
                anchor: None,
            };
            self.runs.insert(write.run, chain);
            return None;
        };
        let mut chain = self.runs.get_mut(&write.run)?;
        if chain.sequence >= write.sequence {
            return None;
        }
        let parent = if chain.base != link.base {
            None
        } else if chain.last.id == link.parent {
            Some(&chain.last)
        } else {
            chain.anchor.as_ref().filter(|a| a.id == link.parent)
        };
        // A delta of a chain this checkpointer no longer follows: start over with a base.
        let Some((deltas, delta_bytes)) = parent.map(|p| (p.deltas, p.delta_bytes)) else {
            drop(chain);
            self.runs.remove(&write.run);
            return None;
        };
        let point = Point {
            id,
            snapshot: *write.snapshot,
            deltas: deltas.saturating_add(1),
            delta_bytes: delta_bytes.saturating_add(bytes),
        };
        chain.sequence = write.sequence;
        if chain.last.id == link.parent {
            let before = std::mem::replace(&mut chain.last, point);
            // With no merge point kept, the checkpoint before becomes one when a merge could
            // pay: when the base outweighs as many deltas as this one as the bound allows
            // (otherwise the chain ends by size first), and it is shallow enough to be used.
            // Only then is its state held on to.
            let cap = self.cap();
            if chain.anchor.is_none()
                && (before.deltas as usize) < cap / 2
                && cap.saturating_mul(bytes) <= chain.base_bytes
            {
                chain.anchor = Some(before);
            }
            None
        } else {
            // A merged delta: the chain's new merge point.
            chain.last = point;
            chain.anchor = None;
            Some(write.thread)
        }
    }

    /// The most deltas a restore applies on a base.
    fn cap(&self) -> usize {
        (self.compact_every as usize).min(MAX_CHAIN)
    }

    /// Whether checkpoints after a run's first may be deltas.
    fn incremental(&self) -> bool {
        self.compact_every > 0 && self.compact_percent > 0
    }

    /// What the run's chain builds on is gone: its next checkpoint is whole.
    fn broken(&self, run: &RunId) {
        self.runs.remove(run);
    }

    /// The run writes no more checkpoints.
    fn forget(&self, run: &RunId) {
        self.runs.remove(run);
        self.floors.remove(run);
    }

    /// The id of the run's next checkpoint: a new one, or, while the run counts on from a
    /// checkpoint ahead of this process's clock ([`Chains::continue_after`]), the next after
    /// the run's last.
    fn next_id(&self, run: &RunId) -> CheckpointId {
        match self.floors.get_mut(run) {
            Some(mut floor) => {
                let id = CheckpointId::after(*floor);
                *floor = id;
                id
            }
            None => CheckpointId::new(),
        }
    }

    /// The run continues checkpoint `floor` (resumed from it, or from an older one of a
    /// thread whose newest is `floor`): its checkpoints sort after it, even when it was
    /// written by a process whose clock is ahead of this one's.
    pub(crate) fn continue_after(&self, run: RunId, floor: CheckpointId) {
        if CheckpointId::new() <= floor {
            self.floors.insert(run, floor);
        }
    }

    /// The run's checkpoints continue the chain of the checkpoint it resumed from, which is
    /// their first merge point.
    pub(crate) fn continue_from(&self, run: RunId, seed: ChainSeed) {
        if !self.incremental() {
            return;
        }
        let ChainSeed {
            thread,
            chain,
            snapshot,
        } = seed;
        let last = Point {
            id: chain.last,
            snapshot,
            deltas: chain.deltas,
            delta_bytes: chain.delta_bytes,
        };
        self.runs.insert(
            run,
            Chain {
                thread,
                base: chain.base,
                // The run's own sequence: its first write is newer than anything before.
                sequence: 0,
                base_bytes: chain.base_bytes,
                last,
                anchor: None,
            },
        );
    }
}

struct Pending {
    write: SnapshotWrite,
    /// Set once encoded (a failed write keeps its bytes, counted in the backlog), with the
    /// checkpoint it is a delta of, if it is one.
    bytes: Option<(Vec<u8>, Option<DeltaLink>)>,
    id: CheckpointId,
    /// Once attempted: the write's span (one however many flushes it takes), when its first
    /// attempt began, and how many attempts it made.
    tried: Option<Tried>,
}

/// A background write's attempts so far.
struct Tried {
    span: WriteSpan,
    started: Instant,
    attempts: u64,
    ended: bool,
}

impl Tried {
    /// Ends the write's span (once): stored, or not and why.
    fn end(&mut self, error: Option<&str>) {
        if !self.ended {
            self.ended = true;
            self.span.end(self.started, self.attempts, error);
        }
    }
}

impl Pending {
    fn held(&self) -> usize {
        self.bytes.as_ref().map_or(0, |(bytes, _)| bytes.len())
    }

    /// Ends the write's span if it is still open: a newer snapshot of its run replaced it.
    fn superseded(mut self) {
        if let Some(tried) = &mut self.tried {
            tried.end(Some("superseded by a newer snapshot of the run"));
        }
    }
}

pub(crate) struct CheckpointerState {
    store: Arc<dyn CheckpointStore>,
    observer: Option<Arc<dyn CheckpointObserver>>,
    chains: Chains,
    backlog: Arc<Backlog>,
    pending: HashMap<RunId, Pending>,
    /// When each run's next background write may start (pacing, or a retry after a failure).
    due: HashMap<RunId, Instant>,
    /// The flush timer: when it fires, and its task.
    timer: Option<(Instant, tokio::task::JoinHandle<()>)>,
    retry_delay: Duration,
    failures: u64,
}

const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(2);
/// A run's next background write waits this many times as long as its last one took.
const PACE: u32 = 9;
/// The longest a run's background writes are held back by pacing.
pub(crate) const MAX_PACE: Duration = Duration::from_secs(1);

impl Actor for Checkpointer {
    type Msg = CheckpointMsg;
    type State = CheckpointerState;
    type Arguments = CheckpointerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: CheckpointerArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(CheckpointerState {
            store: args.store,
            observer: args.observer,
            chains: args.chains,
            backlog: args.backlog,
            pending: HashMap::new(),
            due: HashMap::new(),
            timer: None,
            retry_delay: FIRST_RETRY,
            failures: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            CheckpointMsg::Superseded(run) => {
                state.drop_pending(&run);
                state.due.remove(&run);
            }
            CheckpointMsg::Background(write) => {
                // Encoded when flushed: a newer snapshot of the run replaces this one unencoded.
                state.drop_pending(&write.run);
                let run = write.run;
                state.pending.insert(
                    run,
                    Pending {
                        write,
                        bytes: None,
                        id: state.chains.next_id(&run),
                        tried: None,
                    },
                );
                state.schedule(&myself);
            }
            CheckpointMsg::Flush => {
                state.timer = None;
                state.flush().await;
                state.schedule(&myself);
            }
            CheckpointMsg::Forget(run) => state.chains.forget(&run),
        }
        Ok(())
    }
}

impl Drop for CheckpointerState {
    fn drop(&mut self) {
        if let Some((_, task)) = self.timer.take() {
            task.abort();
        }
    }
}

impl CheckpointerState {
    /// Arms the flush timer for the earliest pending write that is due (at once when one is
    /// due now); an earlier timer stays.
    fn schedule(&mut self, myself: &ActorRef<CheckpointMsg>) {
        let now = Instant::now();
        let Some(at) = self
            .pending
            .keys()
            .map(|run| self.due.get(run).copied().unwrap_or(now).max(now))
            .min()
        else {
            return;
        };
        if self.timer.as_ref().is_some_and(|(when, _)| *when <= at) {
            return;
        }
        if let Some((_, old)) = self.timer.take() {
            old.abort();
        }
        let me = myself.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let _ = me.send_message(CheckpointMsg::Flush);
        });
        self.timer = Some((at, task));
    }

    fn drop_pending(&mut self, run: &RunId) {
        if let Some(old) = self.pending.remove(run) {
            self.backlog.bytes.fetch_sub(old.held(), Ordering::Relaxed);
            old.superseded();
        }
    }

    /// Writes every pending snapshot that is due once; failed ones stay pending (encoded, counted in the
    /// backlog) unless a newer snapshot of their run arrived meanwhile.
    async fn flush(&mut self) {
        let now = Instant::now();
        let due: Vec<RunId> = self
            .pending
            .keys()
            .filter(|run| self.due.get(run).is_none_or(|at| *at <= now))
            .copied()
            .collect();
        let batch: Vec<Pending> = due
            .iter()
            .filter_map(|run| self.pending.remove(run))
            .collect();
        let store = self.store.clone();
        let chains = self.chains.clone();
        let observer = self.observer.clone();
        let results = futures::future::join_all(batch.into_iter().map(|mut p| {
            let store = store.clone();
            let chains = chains.clone();
            let observer = observer.clone();
            async move {
                let attempt_started = Instant::now();
                let held = p.held();
                let (bytes, link) = match p.bytes.take() {
                    Some(encoded) => encoded,
                    None => match chains.encode(&p.write) {
                        Ok(encoded) => encoded,
                        Err(e) => {
                            tracing::error!(run = %p.write.run, error = %e, "snapshot does not encode");
                            return (p, held, None);
                        }
                    },
                };
                let stored = StoredCheckpoint {
                    id: p.id,
                    run: p.write.run,
                    sequence: p.write.sequence,
                    bytes,
                    link,
                };
                let tried = p.tried.get_or_insert_with(|| Tried {
                    span: WriteSpan::new(&p.write, &stored, observer.clone()),
                    started: attempt_started,
                    attempts: 0,
                    ended: false,
                });
                tried.attempts += 1;
                let result = store
                    .put(&p.write.thread, stored.clone(), p.write.fence)
                    .await;
                match &result {
                    // The write goes on: an event on its span, which ends when it does.
                    Err(e @ StoreError::MissingParent { .. }) => tried.span.retrying(tried.attempts, e),
                    Err(e) if e.is_transient() => tried.span.retrying(tried.attempts, e),
                    Err(e) => tried.end(Some(&e.to_string())),
                    Ok(()) => tried.end(None),
                }
                if let Err(StoreError::MissingParent { .. }) = &result {
                    // Written again, whole, on the next flush.
                    chains.broken(&p.write.run);
                } else {
                    p.bytes = Some((stored.bytes, link));
                }
                (p, held, Some((result, attempt_started.elapsed())))
            }
        }))
        .await;
        let done = Instant::now();
        for (p, held, result) in results {
            if let Some((Err(e), _)) = &result
                && !e.is_transient()
                && !matches!(
                    e,
                    StoreError::StaleSequence { .. } | StoreError::MissingParent { .. }
                )
            {
                // Refused for good (lost lease, permission, wrong key type): retrying gives
                // the same answer. The run's final, awaited snapshot reports it.
                tracing::error!(run = %p.write.run, error = %e, "background checkpoint refused; not retried");
            }
            match result {
                None | Some((Ok(()), _)) => {
                    // Stored, or unencodable (logged): nothing left to hold.
                    if result.is_some() {
                        let (len, link) = p
                            .bytes
                            .as_ref()
                            .map_or((0, None), |(b, l)| (plain_size(b), *l));
                        let run = p.write.run;
                        if let Some(thread) = self.chains.stored(p.write, p.id, len, link) {
                            release_skipped(&self.store, thread);
                        }
                        self.backlog.bytes.fetch_sub(held, Ordering::Relaxed);
                        self.retry_delay = FIRST_RETRY;
                        let cost = result.map_or(Duration::ZERO, |(_, took)| took);
                        self.due.insert(run, done + (cost * PACE).min(MAX_PACE));
                        continue;
                    }
                    self.backlog.bytes.fetch_sub(held, Ordering::Relaxed);
                    self.retry_delay = FIRST_RETRY;
                    let cost = result.map_or(Duration::ZERO, |(_, took)| took);
                    self.due
                        .insert(p.write.run, done + (cost * PACE).min(MAX_PACE));
                }
                Some((Err(StoreError::MissingParent { .. }), _))
                    if !self.pending.contains_key(&p.write.run) =>
                {
                    // Written again, whole, at once.
                    self.backlog.bytes.fetch_sub(held, Ordering::Relaxed);
                    self.due.insert(p.write.run, done);
                    self.pending.insert(p.write.run, p);
                }
                Some((Err(e), _)) if !e.is_transient() => {
                    if !matches!(e, StoreError::StaleSequence { .. }) {
                        self.chains.broken(&p.write.run);
                    }
                    // Superseded (a newer snapshot is stored) or refused for good.
                    self.backlog.bytes.fetch_sub(held, Ordering::Relaxed);
                    self.due.insert(p.write.run, done);
                    p.superseded();
                }
                Some((Err(e), _)) => {
                    self.failures += 1;
                    // The store failed: this run's write is retried later, backing off.
                    self.due.insert(p.write.run, done + self.retry_delay);
                    self.retry_delay = (self.retry_delay * 2).min(MAX_RETRY);
                    if self.failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures = self.failures, "checkpoint write failed; will retry");
                    }
                    let run = p.write.run;
                    if self.pending.contains_key(&run) {
                        self.backlog.bytes.fetch_sub(held, Ordering::Relaxed);
                        p.superseded();
                    } else {
                        self.backlog
                            .bytes
                            .fetch_add(p.held().saturating_sub(held), Ordering::Relaxed);
                        self.pending.insert(run, p);
                    }
                }
            }
        }
    }
}

/// A merged delta of `thread` was stored: the deltas it skips may go, once retention no longer
/// keeps them ([`CheckpointStore::prune_skipped`]). In a task of its own: housekeeping never
/// holds a run up, and one that fails is done again after the next merge.
fn release_skipped(store: &Arc<dyn CheckpointStore>, thread: ThreadId) {
    let store = store.clone();
    tokio::spawn(async move {
        match store.prune_skipped(&thread).await {
            Ok(pruned) => tracing::debug!(%thread, pruned, "let go of deltas a merged delta skips"),
            Err(error) => {
                tracing::debug!(%thread, %error, "could not let go of skipped deltas; the next merge tries again");
            }
        }
    });
}

/// Writes one snapshot (a delta of the run's chain when it allows one), retrying with backoff
/// while the store fails transiently, until it is stored, refused, or `deadline` passed; what
/// was not stored is handed back.
///
/// An awaited write runs here in its caller's task (no hop through the checkpointer's
/// mailbox and another task: on a multi-threaded runtime each hop may wake a parked thread),
/// against the chains the checkpointer shares.
///
/// `first`, if given, makes the first attempt instead of the store's `put`: it writes the
/// checkpoint it is handed (and may write more after it, as a run's whole end does) and
/// answers for the checkpoint as `put` would. The attempts after it are plain puts of the
/// same checkpoint, so one that finds the first landed counts it as stored.
pub(crate) async fn write_awaited(
    store: Arc<dyn CheckpointStore>,
    chains: Chains,
    observer: Option<Arc<dyn CheckpointObserver>>,
    deadline: Instant,
    write: SnapshotWrite,
    mut first: Option<FirstPut<'_>>,
) -> Result<CheckpointId, SaveFailed> {
    let encode = |write: &SnapshotWrite| {
        chains.encode(write).map_err(|e| CheckpointError::Encode {
            reason: e.to_string(),
        })
    };
    let (bytes, link) = encode(&write).map_err(SaveFailed::from)?;
    let mut stored = StoredCheckpoint {
        id: chains.next_id(&write.run),
        run: write.run,
        sequence: write.sequence,
        bytes,
        link,
    };
    let started = Instant::now();
    let span = WriteSpan::new(&write, &stored, observer);
    let mut backoff = Backoff::until(deadline);
    let mut attempts = 0u64;
    let error = loop {
        attempts += 1;
        let put = match first.take() {
            Some(first) => first(stored.clone()).await,
            None => store.put(&write.thread, stored.clone(), write.fence).await,
        };
        match put {
            Ok(()) => {
                span.end(started, attempts, None);
                let id = stored.id;
                if let Some(thread) =
                    chains.stored(write, id, plain_size(&stored.bytes), stored.link)
                {
                    release_skipped(&store, thread);
                }
                return Ok(id);
            }
            // An earlier attempt timed out on our side yet reached the store (a frozen or slow
            // server answers late): sequences are unique per write, so the stored one is this
            // very checkpoint, same id and bytes.
            Err(StoreError::StaleSequence { stored: at, .. })
                if attempts > 1 && at == write.sequence =>
            {
                span.end(started, attempts, None);
                let id = stored.id;
                if let Some(thread) =
                    chains.stored(write, id, plain_size(&stored.bytes), stored.link)
                {
                    release_skipped(&store, thread);
                }
                return Ok(id);
            }
            // What the delta builds on is gone: write the checkpoint whole.
            Err(StoreError::MissingParent { .. }) if stored.link.is_some() => {
                chains.broken(&write.run);
                let (bytes, link) = encode(&write).map_err(SaveFailed::from)?;
                stored.bytes = bytes;
                stored.link = link;
            }
            // Refused for good: newer state is stored, the run lost its thread, or the store
            // refuses the write whatever happens.
            Err(e) if !e.is_transient() => {
                if !matches!(e, StoreError::StaleSequence { .. }) {
                    // The run writes nothing more (or fails): its chain ends here.
                    chains.broken(&write.run);
                }
                break CheckpointError::Refused(e);
            }
            Err(e) => {
                span.retrying(attempts, &e);
                if !backoff.wait().await {
                    break CheckpointError::StoreFailed {
                        attempts,
                        waited: started.elapsed(),
                        last: e,
                    };
                }
                if attempts.is_power_of_two() {
                    tracing::warn!(run = %write.run, error = %e, attempts, "checkpoint write failed; retrying");
                }
            }
        }
    };
    span.end(started, attempts, Some(&error.to_string()));
    if write.snapshot.status != RunStatus::Running {
        // The run's last write: its chain ends with it, stored or not. What was not stored
        // goes back whole: it may be written long after its chain moved on or was pruned.
        chains.broken(&write.run);
        if stored.link.is_some() {
            match write.snapshot.encode() {
                Ok(bytes) => {
                    stored.bytes = bytes;
                    stored.link = None;
                }
                Err(e) => {
                    // A delta alone cannot be kept: it needs its chain.
                    tracing::error!(run = %write.run, error = %e, "the final checkpoint cannot be kept whole");
                    return Err(SaveFailed {
                        error,
                        unwritten: None,
                    });
                }
            }
        }
    }
    Err(SaveFailed {
        error,
        unwritten: Some(stored),
    })
}

/// The first attempt of an awaited write when it is not the store's `put` (see
/// [`write_awaited`]): handed the checkpoint, it answers as `put` would for it.
pub(crate) type FirstPut<'a> = Box<
    dyn FnOnce(StoredCheckpoint) -> futures::future::BoxFuture<'a, Result<(), StoreError>>
        + Send
        + 'a,
>;

/// A checkpoint write as it is traced and observed: its span (a child of its run's: mode,
/// id, sequence and size) and what the observer is told when it ends.
struct WriteSpan {
    span: tracing::Span,
    mode: &'static str,
    bytes: usize,
    observer: Option<Arc<dyn CheckpointObserver>>,
}

impl WriteSpan {
    fn new(
        write: &SnapshotWrite,
        stored: &StoredCheckpoint,
        observer: Option<Arc<dyn CheckpointObserver>>,
    ) -> Self {
        let span = tracing::info_span!(
            parent: &write.parent,
            "checkpoint",
            otel.name = "checkpoint write",
            runvisor.checkpoint.mode = write.mode,
            runvisor.checkpoint.id = %stored.id,
            runvisor.checkpoint.sequence = write.sequence,
            runvisor.checkpoint.bytes = stored.bytes.len(),
            runvisor.checkpoint.retries = tracing::field::Empty,
            runvisor.checkpoint.duration_ms = tracing::field::Empty,
            runvisor.checkpoint.outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        Self {
            span,
            mode: write.mode,
            bytes: stored.bytes.len(),
            observer,
        }
    }

    /// An attempt failed and the write goes on: an event on the write's span (one span per
    /// write, however many attempts it takes).
    fn retrying(&self, attempt: u64, error: &StoreError) {
        tracing::info!(
            parent: &self.span,
            runvisor.checkpoint.attempt = attempt,
            error = %error,
            "checkpoint write attempt failed; retrying"
        );
    }

    /// Records how the write ended: how long its attempts took, how many were retries, and
    /// the error when it was not stored.
    fn end(&self, started: Instant, attempts: u64, error: Option<&str>) {
        let took = started.elapsed();
        if let Some(observer) = &self.observer {
            observer.written(self.mode, self.bytes, took, error.is_none());
        }
        let span = &self.span;
        if span.is_disabled() {
            return;
        }
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        span.record("runvisor.checkpoint.duration_ms", micros as f64 / 1000.0);
        span.record("runvisor.checkpoint.retries", attempts.saturating_sub(1));
        match error {
            None => span.record("runvisor.checkpoint.outcome", "stored"),
            Some(error) => {
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_description", error);
                span.record("runvisor.checkpoint.outcome", "not_stored")
            }
        };
    }
}
