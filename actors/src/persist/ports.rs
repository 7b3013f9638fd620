//! Ports: the engine's only ways to the outside world. Checkpoints, run metadata, history and
//! stop/cancel signals. The engine depends on these traits, never on a database client; the
//! in-memory implementations in [`memory`] are the embedded default, and the `runvisor` crate
//! implements them on Redis.
//!
//! Every method is fallible with a [`StoreError`]; none may panic on what it reads.
//!
//! Writes a run makes carry its fencing token (its thread's lease, see [`LeaseStore`]): a store
//! refuses a write whose token is not the thread's current one ([`StoreError::Fenced`]), in the
//! same atomic step as the write, so a run that lost its thread can never write for it. Writes
//! without a token (tools, tests) are not checked.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::model::{
    CheckpointId, Fence, Lease, LeaseError, LeaseHolder, Message, RunId, RunRecord, StoreError,
    ThreadId, WorkerId, WorkerInfo,
};

/// Where a delta sits among its thread's checkpoints (see
/// [`delta`](crate::delta)): the checkpoint it applies to and the whole snapshot its chain
/// starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeltaLink {
    /// The whole snapshot the chain starts from.
    pub base: CheckpointId,
    /// The checkpoint the delta applies to (the base, or the delta before it).
    pub parent: CheckpointId,
}

/// A snapshot as the checkpoint store sees it: opaque, encoded bytes plus what indexes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// Time-ordered id.
    pub id: CheckpointId,
    /// The run that wrote it.
    pub run: RunId,
    /// The run's write sequence: strictly increasing per run.
    pub sequence: u64,
    /// The encoded snapshot, or delta.
    pub bytes: Vec<u8>,
    /// For a delta, what it builds on; `None` for a whole snapshot.
    pub link: Option<DeltaLink>,
}

/// Stores snapshots per thread.
///
/// Contract: `put` is atomic (payload and index together) and refuses a sequence that is not
/// greater than the newest stored for the same run on the same thread
/// ([`StoreError::StaleSequence`]), so a retry or a late write never replaces newer state. (A
/// fork copies a checkpoint of a run into a new thread, where that run has stored nothing.)
/// Ids are time-ordered; `latest` returns the checkpoint with the greatest id.
///
/// A store may keep only each thread's newest checkpoints (its retention): then a `put` past
/// it removes the oldest in the same atomic step, and the store may forget the sequences of
/// the runs whose checkpoints it removed, never the writer's (only a live run writes, and its
/// writes are fenced). Reads never return an id whose checkpoint is gone.
///
/// Deltas: a checkpoint with a [`link`](StoredCheckpoint::link) restores only with the
/// checkpoints it builds on. `put` of a delta whose base or parent is not stored refuses it
/// ([`StoreError::MissingParent`]), in the same atomic step. Retention never removes a
/// checkpoint that a kept one builds on: it stops pruning at the base of the oldest kept
/// checkpoint (a thread's chains follow one another in id order, one run writing at a time),
/// so a thread may hold up to one chain's length more than it keeps. A store with expiry keeps
/// a chain's checkpoints alive as long as its newest delta.
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Writes a checkpoint of a thread; with a fencing token, only if it is the thread's.
    async fn put(
        &self,
        thread: &ThreadId,
        checkpoint: StoredCheckpoint,
        fence: Option<Fence>,
    ) -> Result<(), StoreError>;
    /// Reads one checkpoint.
    async fn get(
        &self,
        thread: &ThreadId,
        id: CheckpointId,
    ) -> Result<Option<StoredCheckpoint>, StoreError>;
    /// Reads checkpoint `from` and what it builds on, newest first: `from`, then the parent
    /// its link names, and so on, up to and including the first whole snapshot (a base), at
    /// most `max` of them. It stops early at a checkpoint that is not stored: the caller knows
    /// which one it asked for next, and names it. A delta's parent need not be the checkpoint
    /// written just before it (a merged delta builds on an older one), so this reads only what
    /// a restore applies. A store may answer in one round trip; this default reads each one.
    async fn chain(
        &self,
        thread: &ThreadId,
        from: CheckpointId,
        max: usize,
    ) -> Result<Vec<StoredCheckpoint>, StoreError> {
        let mut found = Vec::new();
        let mut next = Some(from);
        while let Some(id) = next
            && found.len() < max
        {
            let Some(checkpoint) = self.get(thread, id).await? else {
                break;
            };
            next = checkpoint.link.map(|link| link.parent);
            found.push(checkpoint);
        }
        Ok(found)
    }
    /// Lets go of a thread's checkpoints that are older than the oldest one its retention
    /// keeps and that no kept checkpoint builds on, though older ones are kept: the deltas
    /// a merged delta skips. Retention otherwise removes the oldest checkpoints only, up to
    /// the base the oldest kept one builds on, so a chain's skipped deltas would stay until
    /// its base goes. The checkpointer calls this after it stored a merged delta. Returns how
    /// many went; the default, for a store without retention, lets go of nothing.
    async fn prune_skipped(&self, thread: &ThreadId) -> Result<usize, StoreError> {
        let _ = thread;
        Ok(0)
    }
    /// Reads the newest checkpoint of a thread.
    async fn latest(&self, thread: &ThreadId) -> Result<Option<StoredCheckpoint>, StoreError>;
    /// The id of a thread's newest checkpoint, `None` when it has none. A run started without
    /// a [`StartStore`] reads it so its own checkpoints sort after it, whatever the clock of
    /// the process that wrote it. The default reads the checkpoint with
    /// [`latest`](Self::latest); a store that can answer the id alone should.
    async fn newest_id(&self, thread: &ThreadId) -> Result<Option<CheckpointId>, StoreError> {
        Ok(self.latest(thread).await?.map(|checkpoint| checkpoint.id))
    }
    /// The ids of a thread's checkpoints, oldest first.
    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointId>, StoreError>;
    /// Deletes all but the newest `keep` checkpoints of a thread; returns how many went.
    async fn prune(&self, thread: &ThreadId, keep: usize) -> Result<usize, StoreError>;
    /// Stores a workflow definition under its content hash, once for all the snapshots of a
    /// thread that refer to it. Idempotent; refreshes its expiry.
    async fn put_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
        definition: &str,
    ) -> Result<(), StoreError>;
    /// Reads a workflow definition by its content hash.
    async fn get_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
    ) -> Result<Option<String>, StoreError>;
}

/// Keeps run metadata.
///
/// Contract: `put` replaces the record of its run (idempotent); `get` of an unknown run is
/// `Ok(None)`.
#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Writes a run's record.
    async fn put(&self, record: &RunRecord, fence: Option<Fence>) -> Result<(), StoreError>;
    /// Reads a run's record.
    async fn get(&self, run: RunId) -> Result<Option<RunRecord>, StoreError>;
    /// The records of a thread's runs, oldest first.
    async fn list_thread(&self, thread: &ThreadId) -> Result<Vec<RunRecord>, StoreError>;
    /// The records of every open run (running or awaiting input), across threads and
    /// processes, oldest first: what operators list, and where orphans are found.
    async fn list_open(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// The records of the newest `limit` runs, whatever their status, newest first.
    async fn list_recent(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError>;
    /// Writes the record of a run's end under its lease and, where the store can do it in the
    /// same step, then deletes the run's `flags`, announces that they were cleared and gives
    /// the lease up: each only once what comes before it succeeded, so a stop request that
    /// sees a flag cleared finds the record in place, and no other run can hold the thread
    /// before the flags are gone. The answer says how far it went; the caller does the rest.
    ///
    /// The default writes the record alone, as [`put`](Self::put) does.
    async fn put_end(
        &self,
        record: &RunRecord,
        lease: &Lease,
        flags: &[String],
    ) -> Result<EndWritten, StoreError> {
        let _ = flags;
        self.put(record, Some(lease.fence))
            .await
            .map(|()| EndWritten::Record)
    }

    /// Writes a resumed run's first `record` and, where the store can in the same step (on
    /// Redis, one script in the thread's slot), `answered`: the record of the paused run the
    /// resume answers, now `answered`; both fenced by `fence`, the first before the second.
    /// `Err`: `record` is not written (as [`put`](Self::put) answers); `Ok` holds what came of
    /// `answered`, which the caller writes again on its own when it is an error.
    ///
    /// The default writes `record`, then `answered` once.
    async fn put_answering(
        &self,
        record: &RunRecord,
        answered: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<Result<(), StoreError>, StoreError> {
        self.put(record, fence).await?;
        Ok(self.put(answered, fence).await)
    }
}

/// How far [`RunStore::put_end`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndWritten {
    /// The record alone: the flags and the lease are the caller's to clear and give up.
    Record,
    /// The record, then the flags cleared, then the lease given up; `announced`: the notices
    /// that the flags were cleared were published too (else the caller publishes them).
    Released {
        /// Whether the notices were published.
        announced: bool,
    },
}

/// Writes a run's whole end in one step, for stores that can (on Redis, one script in the
/// thread's slot): its final checkpoint, then its messages to the history, then its record,
/// then, as [`RunStore::put_end`] does where it can, its flags deleted, the notices that they
/// were cleared published and its lease given up. Each step runs only once the one before it
/// succeeded, so the order a run's end keeps step by step holds: a stop request that sees a
/// flag cleared finds the record and the checkpoint in place, and no other run can hold the
/// thread before all of it is stored.
///
/// Every step is fenced by the run's lease and idempotent, as the step alone is (the
/// checkpoint's sequence, the messages' ids, the record of one run), so after a failure the
/// caller writes what did not go step by step, the way a run's end is written without such a
/// store; after a failure whose answer was lost (a timeout), whatever landed is found there.
#[async_trait]
pub trait EndStore: Send + Sync + 'static {
    /// Writes `end` as far as it goes. `Ok`: every step up to the record, and after it what
    /// [`EndWritten`] says. `Err`: the step that failed and why; the steps before it are
    /// stored, none after it is (unless the error is transient: then what landed is unknown).
    async fn put_whole_end(&self, end: &WholeEnd<'_>) -> Result<EndWritten, EndFailed>;
}

/// Starts a run in one step, for stores that can (on Redis, one script in the thread's
/// slot): takes the thread's lease as [`LeaseStore::acquire`] does when the thread is free
/// (or its lease expired), then writes the run's first record fenced by the new token, then
/// reads the thread's history under it. Each step runs only once the one before it
/// succeeded: a thread held by another run is left as it is, and nothing is written.
#[async_trait]
pub trait StartStore: Send + Sync + 'static {
    /// Takes `record.thread`'s lease for `holder` for `ttl`, writes `record` with its
    /// [`fence`](RunRecord::fence) set to the new token, and reads the thread's history: its
    /// newest `history_window` messages (all when `None`) and how many it holds, as
    /// [`HistoryStore::load_tail`] does.
    ///
    /// [`Begun::NotStarted`] leaves the start to the steps alone: the lease is held by another
    /// run (by a live or a dead worker: a takeover from a dead worker is
    /// [`LeaseStore::acquire`]'s), or the record could not be written (the lease taken for it
    /// is given back). An error says the store failed or answered nothing that makes sense:
    /// then what landed is unknown, as after a lost answer to [`LeaseStore::acquire`]; trying
    /// again with the same holder and record is safe (the holder's own live lease answers as
    /// taken, and the record is written again as it is).
    async fn begin(
        &self,
        record: &RunRecord,
        holder: &LeaseHolder,
        ttl: Duration,
        history_window: Option<usize>,
    ) -> Result<Begun, LeaseError>;
}

/// What [`StartStore::begin`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Begun {
    /// The lease is taken, the record written; then the thread's history, as read, or why it
    /// could not be.
    Started {
        /// The lease taken.
        acquired: Acquired,
        /// The thread's history as read (its newest messages, oldest first, and how many
        /// it holds).
        history: Result<HistoryTail, StoreError>,
        /// The thread's newest checkpoint id as the step read it (`None`: none, or the store
        /// does not tell): the run's checkpoints sort after it, even when a process whose
        /// clock runs ahead wrote it.
        newest_checkpoint: Option<CheckpointId>,
    },
    /// Nothing is held or written: the caller starts step by step.
    NotStarted,
}

/// A run's end as [`EndStore::put_whole_end`] writes it. The record's thread is the run's.
#[derive(Debug, Clone, Copy)]
pub struct WholeEnd<'a> {
    /// The final checkpoint (a delta or a whole snapshot), fenced by `lease`.
    pub checkpoint: &'a StoredCheckpoint,
    /// The messages for the history (appended by id: those it holds already are skipped);
    /// none: the history is not touched.
    pub messages: &'a [Message],
    /// The record of the run's end: it names `checkpoint`.
    pub record: &'a RunRecord,
    /// The run's lease: every step is fenced by it, and it is given up last.
    pub lease: &'a Lease,
    /// The run's stop and cancel flags, deleted after the record.
    pub flags: &'a [String],
}

/// The steps of [`EndStore::put_whole_end`], in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndStep {
    /// The final checkpoint.
    Checkpoint,
    /// The messages to the history.
    History,
    /// The record, with what follows it.
    Record,
}

/// The step of a whole end that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{step:?} step of the run's end: {error}")]
pub struct EndFailed {
    /// The step: those before it are stored.
    pub step: EndStep,
    /// Why it failed.
    pub error: StoreError,
}

/// Keeps each thread's history.
///
/// Contract: `append` is idempotent by message id (appending a message already stored does
/// nothing), so a retried flush or a resumed run never duplicates a message. On error nothing
/// of the batch may be assumed stored; the caller reports the batch as not persisted.
#[async_trait]
pub trait HistoryStore: Send + Sync + 'static {
    /// Appends messages to a thread, in order.
    async fn append(
        &self,
        thread: &ThreadId,
        messages: &[Message],
        fence: Option<Fence>,
    ) -> Result<(), StoreError>;
    /// Reads a thread's history, oldest first.
    async fn load(&self, thread: &ThreadId) -> Result<Vec<Message>, StoreError>;
    /// Reads a thread's newest `window` messages (all of them when `None`), oldest first, and
    /// how many the history holds, read together: what a run reads at its start.
    ///
    /// The default reads the whole history with [`load`](Self::load) and keeps its tail; a
    /// store that can read the tail alone (as Redis does) overrides it.
    async fn load_tail(
        &self,
        thread: &ThreadId,
        window: Option<usize>,
    ) -> Result<HistoryTail, StoreError> {
        Ok(HistoryTail::of(self.load(thread).await?, window))
    }
}

/// A thread's newest messages and how many its history holds ([`HistoryStore::load_tail`]).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct HistoryTail {
    /// The newest messages, oldest first.
    pub messages: Vec<Message>,
    /// How many messages the history holds, those above included.
    pub total: u64,
}

impl HistoryTail {
    /// `messages` as read and how many the history holds (at least as many as were read).
    pub fn new(messages: Vec<Message>, total: u64) -> Self {
        let total = total.max(u64::try_from(messages.len()).unwrap_or(u64::MAX));
        Self { messages, total }
    }

    /// The newest `window` of a whole history (all of it when `None`).
    pub fn of(mut history: Vec<Message>, window: Option<usize>) -> Self {
        let total = u64::try_from(history.len()).unwrap_or(u64::MAX);
        if let Some(window) = window {
            history.drain(..history.len().saturating_sub(window));
        }
        Self {
            messages: history,
            total,
        }
    }
}

/// What a signal flag asks of its run. The key a flag sits under says which one: the
/// watcher knows each run's stop keys and cancel keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Signal {
    /// Stop gracefully and stay resumable.
    Stop,
    /// Cancel.
    Cancel,
}

/// A wake-up on the signal channel: a flag was raised, or cleared because its run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// The flag's key.
    pub key: String,
    /// Raised or cleared.
    pub raised: bool,
}

/// Notices, as they arrive. Ends when the subscription breaks; notices sent meanwhile are
/// lost, so the reader re-subscribes and re-reads every flag.
pub type NoticeStream = futures::stream::BoxStream<'static, Notice>;

/// Where stop and cancel flags live, shared by every process.
///
/// Contract: a flag is a key with a non-empty value; its presence is the source of truth.
/// `read` looks up many keys in one round trip and answers in key order. Notices only wake
/// readers early; they carry no state. An error means "unknown", which the watcher treats as
/// "not stopping".
#[async_trait]
pub trait SignalSource: Send + Sync + 'static {
    /// Whether each key holds a flag, in key order.
    async fn read(&self, keys: &[String]) -> Result<Vec<bool>, StoreError>;
    /// Sets a flag that expires after `ttl` (a backstop if nobody clears it).
    async fn raise(&self, key: &str, ttl: std::time::Duration) -> Result<(), StoreError>;
    /// Removes flags. With a thread's fencing token, only while it is the thread's (a run that
    /// lost its thread leaves the new holder's flags alone).
    async fn clear(
        &self,
        keys: &[String],
        fence: Option<(&ThreadId, Fence)>,
    ) -> Result<(), StoreError>;
    /// Publishes a notice on the signal channel.
    async fn notify(&self, notice: &Notice) -> Result<(), StoreError>;
    /// Subscribes to the signal channel.
    async fn subscribe(&self) -> Result<NoticeStream, StoreError>;
}

/// What taking a lease gave.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acquired {
    /// The lease, with its new fencing token.
    pub lease: Lease,
    /// The holder the lease was taken from, when its worker had stopped heartbeating (a
    /// takeover of an orphaned run).
    pub took_over: Option<LeaseHolder>,
}

impl Acquired {
    /// A lease taken, from nobody or from a dead holder.
    pub fn new(lease: Lease, took_over: Option<LeaseHolder>) -> Self {
        Self { lease, took_over }
    }
}

/// Keeps workers' heartbeats and threads' leases, shared by every process.
///
/// Contract:
/// - `acquire` is atomic. It refuses ([`LeaseError::Busy`]) while the thread's lease is held
///   and its holder's worker heartbeats; otherwise it bumps the thread's fencing counter and
///   takes the lease with the new token, which is greater than every token the thread had.
///   A lease whose worker stopped heartbeating (or that expired) is taken over. A live lease
///   held by the same holder (worker and run) answers as taken, with its token and nothing
///   written: run ids are never reused, so it was an earlier attempt of the same acquire that
///   landed with its answer lost, and the caller may try again after a transient error; a
///   lease taken over says again whom it was taken from.
/// - `renew` and `release` act only while the token is the thread's. `renew` answers
///   [`LeaseError::Lost`] once another run took the thread (the token moved on); a lease that
///   merely expired, with nobody taking it since, is taken back. So a store out of reach for
///   longer than the TTL costs a run nothing unless another worker took its thread meanwhile.
/// - A caller stops renewing before it releases (a renewal after a release takes the thread
///   again).
/// - The thread's current token is what fenced writes of the other stores are checked against.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Writes (or renews) a worker's heartbeat, which lives for `ttl`.
    async fn heartbeat(&self, worker: &WorkerInfo, ttl: Duration) -> Result<(), StoreError>;
    /// Removes a worker's heartbeat (it shuts down cleanly).
    async fn retire(&self, worker: &WorkerId) -> Result<(), StoreError>;
    /// The heartbeats of these workers, in order: `None` for a worker that is not alive.
    async fn workers(&self, ids: &[WorkerId]) -> Result<Vec<Option<WorkerInfo>>, StoreError>;
    /// Takes a thread's lease for a run, for `ttl`.
    async fn acquire(
        &self,
        thread: &ThreadId,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Acquired, LeaseError>;
    /// Extends a lease for `ttl` from now.
    async fn renew(
        &self,
        thread: &ThreadId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<(), LeaseError>;
    /// Renews several leases for `ttl` from now, answering for each in order. Stores that can
    /// do it in one round trip should: a worker renews every lease it holds on each tick.
    async fn renew_all(
        &self,
        leases: &[(ThreadId, Lease)],
        ttl: Duration,
    ) -> Vec<Result<(), LeaseError>> {
        let mut results = Vec::with_capacity(leases.len());
        for (thread, lease) in leases {
            results.push(self.renew(thread, lease, ttl).await);
        }
        results
    }
    /// Gives a lease up (nothing happens when it is no longer ours).
    async fn release(&self, thread: &ThreadId, lease: &Lease) -> Result<(), StoreError>;
    /// The thread's lease, if it is held.
    async fn lease(&self, thread: &ThreadId) -> Result<Option<Lease>, StoreError>;
}
