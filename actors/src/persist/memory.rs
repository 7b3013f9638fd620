//! In-memory implementations of the ports: the embedded default. Nothing external is needed;
//! everything is lost when the process ends.
//!
//! Each store can be switched into a failing mode ([`MemoryHistoryStore::fail_appends`] and
//! friends) so hosts and tests can check what happens when persistence breaks.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use dashmap::DashMap;

use super::leases::MemoryLeaseStore;
use super::ports::{
    CheckpointStore, HistoryStore, HistoryTail, Notice, NoticeStream, RunStore, SignalSource,
    StoredCheckpoint,
};
use crate::model::{CheckpointId, Fence, Message, MessageId, RunId, ThreadId};
use crate::model::{RunRecord, StoreError};
/// How many checkpoints a thread keeps by default: the newest 20.
pub const DEFAULT_KEEP_CHECKPOINTS: usize = 20;

/// Checkpoints in memory, per thread, ordered by id. Each thread keeps its newest checkpoints
/// (20 by default): a write past that drops the oldest, and forgets the stored sequences of
/// the runs that wrote them (but the writer's), so neither a long run's progress snapshots nor
/// a thread's many runs pile up in memory.
#[derive(Debug)]
pub struct MemoryCheckpointStore {
    threads: DashMap<ThreadId, BTreeMap<CheckpointId, StoredCheckpoint>>,
    /// The newest sequence stored per run, on each thread (a fork copies a run's checkpoint
    /// into another thread, where it is that run's first).
    sequences: DashMap<(ThreadId, RunId), u64>,
    workflows: DashMap<(ThreadId, String), Arc<str>>,
    keep: Option<usize>,
    fences: Option<Arc<MemoryLeaseStore>>,
}

impl Default for MemoryCheckpointStore {
    fn default() -> Self {
        Self::keeping(Some(DEFAULT_KEEP_CHECKPOINTS))
    }
}

impl MemoryCheckpointStore {
    /// An empty store keeping the newest [`DEFAULT_KEEP_CHECKPOINTS`] checkpoints per thread.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store keeping the newest `keep` checkpoints per thread (`None`: all of them).
    /// A thread always keeps at least its newest checkpoint.
    pub fn keeping(keep: Option<usize>) -> Self {
        Self {
            threads: DashMap::new(),
            sequences: DashMap::new(),
            workflows: DashMap::new(),
            keep: keep.map(|n| n.max(1)),
            fences: None,
        }
    }

    /// Checks fenced writes against these leases (see [`CheckpointStore::put`]).
    pub fn fenced_by(mut self, leases: Arc<MemoryLeaseStore>) -> Self {
        self.fences = Some(leases);
        self
    }
}

/// Checks a fenced write against the leases, when the store has them.
fn check(
    leases: &Option<Arc<MemoryLeaseStore>>,
    thread: &ThreadId,
    fence: Option<Fence>,
) -> Result<(), StoreError> {
    match leases {
        Some(leases) => leases.check(thread, fence),
        None => Ok(()),
    }
}

/// How many of a thread's oldest checkpoints may go so that it keeps its newest `keep`: all
/// the excess, but none that the oldest kept checkpoint builds on (its base and the deltas
/// after it).
///
/// Both walks are bounded by what is kept or what may go, not by what the thread holds: the
/// oldest kept checkpoint is found from the newest end, and the checkpoints older than its base
/// are counted up to the excess. A long chain (up to a compaction's worth of deltas on one
/// base) costs each write no more than a short one.
fn prunable(stored: &BTreeMap<CheckpointId, StoredCheckpoint>, keep: usize) -> usize {
    let excess = stored.len().saturating_sub(keep);
    if excess == 0 {
        return 0;
    }
    let oldest_kept = keep
        .checked_sub(1)
        .and_then(|i| stored.values().rev().nth(i));
    match oldest_kept.and_then(|kept| kept.link) {
        Some(link) => stored.range(..link.base).take(excess).count(),
        None => excess,
    }
}

/// The checkpoints older than the oldest of the newest `keep` that no kept checkpoint builds
/// on (the deltas merged deltas skip), oldest first, at most `max`. What a kept checkpoint
/// builds on is found by following each one's parents while they are older than the oldest
/// kept one; each checkpoint is visited once.
fn skipped(
    stored: &BTreeMap<CheckpointId, StoredCheckpoint>,
    keep: usize,
    max: usize,
) -> Vec<CheckpointId> {
    let excess = stored.len().saturating_sub(keep);
    let Some(oldest) = stored.keys().nth(excess).copied() else {
        return Vec::new();
    };
    let mut needed = HashSet::new();
    for kept in stored.range(oldest..).map(|(_, c)| c) {
        let mut up = kept.link.map(|l| l.parent);
        while let Some(id) = up.filter(|id| *id < oldest && needed.insert(*id)) {
            up = stored.get(&id).and_then(|c| c.link).map(|l| l.parent);
        }
    }
    stored
        .range(..oldest)
        .map(|(id, _)| *id)
        .filter(|id| !needed.contains(id))
        .take(max)
        .collect()
}

#[async_trait]
impl CheckpointStore for MemoryCheckpointStore {
    async fn put(
        &self,
        thread: &ThreadId,
        checkpoint: StoredCheckpoint,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        check(&self.fences, thread, fence)?;
        if let Some(link) = checkpoint.link {
            let stored = self.threads.get(thread);
            for id in [link.base, link.parent] {
                if !stored.as_ref().is_some_and(|t| t.contains_key(&id)) {
                    return Err(StoreError::MissingParent { checkpoint: id });
                }
            }
        }
        // The sequence entry stays locked while the payload is written: the pair is atomic.
        let _guard = match self.sequences.entry((thread.clone(), checkpoint.run)) {
            dashmap::Entry::Occupied(mut stored) => {
                if checkpoint.sequence <= *stored.get() {
                    return Err(StoreError::StaleSequence {
                        run: checkpoint.run,
                        sequence: checkpoint.sequence,
                        stored: *stored.get(),
                    });
                }
                stored.insert(checkpoint.sequence);
                stored.into_ref()
            }
            dashmap::Entry::Vacant(slot) => slot.insert(checkpoint.sequence),
        };
        let writer = checkpoint.run;
        let mut stored = self.threads.entry(thread.clone()).or_default();
        stored.insert(checkpoint.id, checkpoint);
        let mut pruned_runs = Vec::new();
        if let Some(keep) = self.keep {
            for _ in 0..prunable(&stored, keep) {
                if let Some((_, pruned)) = stored.pop_first()
                    && pruned.run != writer
                {
                    pruned_runs.push(pruned.run);
                }
            }
        }
        drop(stored);
        drop(_guard);
        // Only a live run writes, so only the writer's sequence is needed to refuse a stale
        // write; the others go with their pruned checkpoints.
        for run in pruned_runs {
            self.sequences.remove(&(thread.clone(), run));
        }
        Ok(())
    }

    async fn get(
        &self,
        thread: &ThreadId,
        id: CheckpointId,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        Ok(self.threads.get(thread).and_then(|t| t.get(&id).cloned()))
    }

    async fn latest(&self, thread: &ThreadId) -> Result<Option<StoredCheckpoint>, StoreError> {
        Ok(self
            .threads
            .get(thread)
            .and_then(|t| t.values().next_back().cloned()))
    }

    async fn newest_id(&self, thread: &ThreadId) -> Result<Option<CheckpointId>, StoreError> {
        Ok(self
            .threads
            .get(thread)
            .and_then(|t| t.keys().next_back().copied()))
    }

    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointId>, StoreError> {
        Ok(self
            .threads
            .get(thread)
            .map(|t| t.keys().copied().collect())
            .unwrap_or_default())
    }

    async fn prune(&self, thread: &ThreadId, keep: usize) -> Result<usize, StoreError> {
        let Some(mut t) = self.threads.get_mut(thread) else {
            return Ok(0);
        };
        let excess = prunable(&t, keep);
        let mut runs = HashSet::new();
        let mut gone = 0;
        let mut remove = |t: &mut BTreeMap<CheckpointId, StoredCheckpoint>, ids: Vec<_>| {
            for id in ids {
                if let Some(pruned) = t.remove(&id) {
                    runs.insert(pruned.run);
                    gone += 1;
                }
            }
        };
        // The oldest, then what no kept checkpoint builds on among the rest.
        let oldest = t.keys().take(excess).copied().collect();
        remove(&mut t, oldest);
        let skipped = skipped(&t, keep, usize::MAX);
        remove(&mut t, skipped);
        // A run with no checkpoint left on the thread needs no sequence here.
        runs.retain(|run| !t.values().any(|c| c.run == *run));
        drop(t);
        for run in runs {
            self.sequences.remove(&(thread.clone(), run));
        }
        Ok(gone)
    }

    async fn prune_skipped(&self, thread: &ThreadId) -> Result<usize, StoreError> {
        let Some(keep) = self.keep else {
            return Ok(0);
        };
        let Some(mut t) = self.threads.get_mut(thread) else {
            return Ok(0);
        };
        let doomed = skipped(&t, keep, usize::MAX);
        for id in &doomed {
            t.remove(id);
        }
        Ok(doomed.len())
    }

    async fn put_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
        definition: &str,
    ) -> Result<(), StoreError> {
        self.workflows
            .entry((thread.clone(), hash.to_owned()))
            .or_insert_with(|| Arc::from(definition));
        Ok(())
    }

    async fn get_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self
            .workflows
            .get(&(thread.clone(), hash.to_owned()))
            .map(|d| d.to_string()))
    }
}

/// Run records in memory.
#[derive(Debug, Default)]
pub struct MemoryRunStore {
    runs: DashMap<RunId, RunRecord>,
    fences: Option<Arc<MemoryLeaseStore>>,
}

impl MemoryRunStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks fenced writes against these leases (see [`RunStore::put`]).
    pub fn fenced_by(mut self, leases: Arc<MemoryLeaseStore>) -> Self {
        self.fences = Some(leases);
        self
    }
}

#[async_trait]
impl RunStore for MemoryRunStore {
    async fn put(&self, record: &RunRecord, fence: Option<Fence>) -> Result<(), StoreError> {
        check(&self.fences, &record.thread, fence)?;
        self.runs.insert(record.run_id, record.clone());
        Ok(())
    }

    async fn get(&self, run: RunId) -> Result<Option<RunRecord>, StoreError> {
        Ok(self.runs.get(&run).map(|r| r.clone()))
    }

    async fn list_thread(&self, thread: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let mut records: Vec<RunRecord> = self
            .runs
            .iter()
            .filter(|r| &r.thread == thread)
            .map(|r| r.clone())
            .collect();
        records.sort_by_key(|r| r.run_id);
        Ok(records)
    }

    async fn list_open(&self) -> Result<Vec<RunRecord>, StoreError> {
        let mut records: Vec<RunRecord> = self
            .runs
            .iter()
            .filter(|r| r.status.is_open())
            .map(|r| r.clone())
            .collect();
        records.sort_by_key(|r| (r.started_at_ms, r.run_id));
        Ok(records)
    }

    async fn list_recent(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let mut records: Vec<RunRecord> = self.runs.iter().map(|r| r.clone()).collect();
        records.sort_by_key(|r| std::cmp::Reverse((r.started_at_ms, r.run_id)));
        records.truncate(limit);
        Ok(records)
    }
}

/// Histories in memory; appends are idempotent by message id.
#[derive(Debug, Default)]
pub struct MemoryHistoryStore {
    threads: DashMap<ThreadId, (Vec<Message>, HashSet<MessageId>)>,
    fail_appends: AtomicBool,
    fences: Option<Arc<MemoryLeaseStore>>,
}

impl MemoryHistoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks fenced writes against these leases (see [`HistoryStore::append`]).
    pub fn fenced_by(mut self, leases: Arc<MemoryLeaseStore>) -> Self {
        self.fences = Some(leases);
        self
    }

    /// Makes every `append` fail (or succeed again), to exercise what a run does when its
    /// history cannot be persisted.
    pub fn fail_appends(&self, fail: bool) {
        self.fail_appends.store(fail, Ordering::SeqCst);
    }
}

#[async_trait]
impl HistoryStore for MemoryHistoryStore {
    async fn append(
        &self,
        thread: &ThreadId,
        messages: &[Message],
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        check(&self.fences, thread, fence)?;
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable(
                "history store is failing appends".into(),
            ));
        }
        let mut entry = self.threads.entry(thread.clone()).or_default();
        let (list, ids) = &mut *entry;
        for m in messages {
            if ids.insert(m.id) {
                list.push(m.clone());
            }
        }
        Ok(())
    }

    async fn load(&self, thread: &ThreadId) -> Result<Vec<Message>, StoreError> {
        Ok(self
            .threads
            .get(thread)
            .map(|t| t.0.clone())
            .unwrap_or_default())
    }

    async fn load_tail(
        &self,
        thread: &ThreadId,
        window: Option<usize>,
    ) -> Result<HistoryTail, StoreError> {
        let Some(entry) = self.threads.get(thread) else {
            return Ok(HistoryTail::default());
        };
        let list = &entry.0;
        let from = window.map_or(0, |window| list.len().saturating_sub(window));
        Ok(HistoryTail::new(
            list[from..].to_vec(),
            u64::try_from(list.len()).unwrap_or(u64::MAX),
        ))
    }
}

/// Stop and cancel flags in memory, with expiry, and a notice channel.
#[derive(Debug, Clone)]
pub struct MemorySignalSource {
    flags: Arc<DashMap<String, tokio::time::Instant>>,
    notices: tokio::sync::broadcast::Sender<Notice>,
    fences: Option<Arc<MemoryLeaseStore>>,
}

impl Default for MemorySignalSource {
    fn default() -> Self {
        Self {
            flags: Arc::default(),
            notices: tokio::sync::broadcast::channel(1024).0,
            fences: None,
        }
    }
}

impl MemorySignalSource {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks fenced clears against these leases (see [`SignalSource::clear`]).
    pub fn fenced_by(mut self, leases: Arc<MemoryLeaseStore>) -> Self {
        self.fences = Some(leases);
        self
    }
}

#[async_trait]
impl SignalSource for MemorySignalSource {
    async fn read(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        let now = tokio::time::Instant::now();
        Ok(keys
            .iter()
            .map(|k| self.flags.get(k).is_some_and(|expiry| *expiry > now))
            .collect())
    }

    async fn raise(&self, key: &str, ttl: std::time::Duration) -> Result<(), StoreError> {
        self.flags
            .insert(key.to_owned(), tokio::time::Instant::now() + ttl);
        Ok(())
    }

    async fn clear(
        &self,
        keys: &[String],
        fence: Option<(&ThreadId, Fence)>,
    ) -> Result<(), StoreError> {
        if let Some((thread, fence)) = fence {
            check(&self.fences, thread, Some(fence))?;
        }
        for key in keys {
            self.flags.remove(key);
        }
        Ok(())
    }

    async fn notify(&self, notice: &Notice) -> Result<(), StoreError> {
        // No subscriber is fine.
        let _ = self.notices.send(notice.clone());
        Ok(())
    }

    async fn subscribe(&self) -> Result<NoticeStream, StoreError> {
        let rx = self.notices.subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(notice) => return Some((notice, rx)),
                    // Missed notices: the reader re-reads flags anyway on its next tick.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::ports::DeltaLink;

    fn thread() -> ThreadId {
        ThreadId::new("t1").expect("valid id")
    }

    fn checkpoint(run: RunId, sequence: u64) -> StoredCheckpoint {
        StoredCheckpoint {
            id: CheckpointId::new(),
            run,
            sequence,
            bytes: vec![sequence as u8],
            link: None,
        }
    }

    #[tokio::test]
    async fn checkpoints_refuse_stale_sequences_and_prune_oldest() {
        let store = MemoryCheckpointStore::new();
        let run = RunId::new();
        let first = checkpoint(run, 1);
        store
            .put(&thread(), first.clone(), None)
            .await
            .expect("first write");
        let stale = store.put(&thread(), checkpoint(run, 1), None).await;
        assert!(matches!(
            stale,
            Err(StoreError::StaleSequence {
                sequence: 1,
                stored: 1,
                ..
            })
        ));
        let second = checkpoint(run, 2);
        store
            .put(&thread(), second.clone(), None)
            .await
            .expect("second write");
        assert_eq!(store.latest(&thread()).await, Ok(Some(second.clone())));
        assert_eq!(store.newest_id(&thread()).await, Ok(Some(second.id)));
        let none = ThreadId::new("none").expect("valid id");
        assert_eq!(store.newest_id(&none).await, Ok(None));
        assert_eq!(
            store.get(&thread(), first.id).await,
            Ok(Some(first.clone()))
        );
        assert_eq!(store.prune(&thread(), 1).await, Ok(1));
        assert_eq!(store.list(&thread()).await, Ok(vec![second.id]));
    }

    #[tokio::test]
    async fn retention_drops_the_oldest_checkpoints_and_their_runs_sequences() {
        let store = MemoryCheckpointStore::keeping(Some(3));
        let t = thread();
        let mut runs = Vec::new();
        // 10 runs of 2 checkpoints each, one after the other.
        for _ in 0..10 {
            let run = RunId::new();
            runs.push(run);
            for sequence in 1..=2 {
                store
                    .put(&t, checkpoint(run, sequence), None)
                    .await
                    .expect("put");
            }
        }
        assert_eq!(store.list(&t).await.map(|l| l.len()), Ok(3));
        let sequences = store.sequences.iter().filter(|e| e.key().0 == t).count();
        assert!(sequences <= 3, "{sequences} sequences kept");
        // The writer's sequence stays: a stale write of the newest run is still refused.
        assert!(matches!(
            store.put(&t, checkpoint(runs[9], 2), None).await,
            Err(StoreError::StaleSequence { stored: 2, .. })
        ));
    }

    /// What [`prunable`] answers, by its definition: every checkpoint before the newest
    /// `keep`, but none from the oldest kept one's base on.
    fn prunable_by_definition(
        stored: &BTreeMap<CheckpointId, StoredCheckpoint>,
        keep: usize,
    ) -> usize {
        let ids: Vec<CheckpointId> = stored.keys().copied().collect();
        let excess = ids.len().saturating_sub(keep);
        match ids.get(excess).and_then(|id| stored[id].link) {
            Some(link) => ids
                .iter()
                .take_while(|id| **id < link.base)
                .count()
                .min(excess),
            None => excess,
        }
    }

    proptest::proptest! {
        /// Whatever the mix of whole checkpoints and chains of deltas, a write prunes exactly
        /// what retention's definition allows: the excess, but never what the oldest kept
        /// checkpoint builds on.
        #[test]
        fn prunable_keeps_what_the_oldest_kept_builds_on(
            wholes in proptest::collection::vec(proptest::bool::weighted(0.2), 1..80),
            keep in 0usize..8,
        ) {
            let run = RunId::new();
            let mut stored = BTreeMap::new();
            let (mut base, mut parent) = (None, None);
            for (sequence, whole) in wholes.into_iter().enumerate() {
                let id = CheckpointId::new();
                let link = match (whole, base, parent) {
                    (false, Some(base), Some(parent)) => Some(DeltaLink { base, parent }),
                    _ => {
                        base = Some(id);
                        None
                    }
                };
                parent = Some(id);
                stored.insert(id, StoredCheckpoint {
                    id,
                    run,
                    sequence: sequence as u64 + 1,
                    bytes: Vec::new(),
                    link,
                });
                proptest::prop_assert_eq!(
                    prunable(&stored, keep),
                    prunable_by_definition(&stored, keep)
                );
            }
        }
    }

    /// Puts a delta of `run` on `base` after `parent` in the test thread; answers its id.
    async fn put_delta(
        store: &MemoryCheckpointStore,
        run: RunId,
        sequence: u64,
        base: CheckpointId,
        parent: CheckpointId,
    ) -> CheckpointId {
        let mut delta = checkpoint(run, sequence);
        delta.link = Some(DeltaLink { base, parent });
        let id = delta.id;
        store.put(&thread(), delta, None).await.expect("delta");
        id
    }

    #[tokio::test]
    async fn a_kept_chain_keeps_its_base_through_many_writes() {
        let store = MemoryCheckpointStore::keeping(Some(3));
        let t = thread();
        let run = RunId::new();
        let base = checkpoint(run, 1);
        store.put(&t, base.clone(), None).await.expect("base");
        let mut parent = base.id;
        for sequence in 2..200 {
            parent = put_delta(&store, run, sequence, base.id, parent).await;
        }
        // The newest 3 are deltas on the first checkpoint: it and every delta between stay.
        let kept = store.list(&t).await.expect("list");
        assert_eq!(kept.len(), 199, "the chain is whole");
        assert_eq!(kept.first(), Some(&base.id));
        // A new base: the old chain goes once the newest 3 no longer build on it.
        let next = checkpoint(run, 200);
        store.put(&t, next.clone(), None).await.expect("new base");
        let mut parent = next.id;
        for sequence in 201..203 {
            let kept = store.list(&t).await.expect("list");
            assert_eq!(kept.first(), Some(&base.id), "still needed at {sequence}");
            parent = put_delta(&store, run, sequence, next.id, parent).await;
        }
        let kept = store.list(&t).await.expect("list");
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert_eq!(kept.first(), Some(&next.id));
    }

    #[tokio::test]
    async fn sequences_are_checked_per_thread() {
        let store = MemoryCheckpointStore::new();
        let run = RunId::new();
        let other = ThreadId::new("t2").expect("valid id");
        store
            .put(&thread(), checkpoint(run, 5), None)
            .await
            .expect("put");
        // A fork copies the run's checkpoint into another thread: its first there.
        let copy = checkpoint(run, 3);
        store.put(&other, copy.clone(), None).await.expect("copy");
        assert_eq!(store.list(&other).await, Ok(vec![copy.id]));
        assert!(matches!(
            store.put(&other, checkpoint(run, 3), None).await,
            Err(StoreError::StaleSequence { stored: 3, .. })
        ));
    }

    #[tokio::test]
    async fn history_appends_are_idempotent_and_can_fail() {
        let store = MemoryHistoryStore::new();
        let a = Message::user("hi");
        let b = Message::assistant("hello");
        store
            .append(&thread(), &[a.clone(), b.clone()], None)
            .await
            .expect("append");
        store
            .append(&thread(), std::slice::from_ref(&b), None)
            .await
            .expect("re-append");
        assert_eq!(store.load(&thread()).await, Ok(vec![a, b]));
        store.fail_appends(true);
        assert!(
            store
                .append(&thread(), &[Message::user("x")], None)
                .await
                .is_err()
        );
        assert_eq!(store.load(&thread()).await.map(|h| h.len()), Ok(2));
    }

    #[tokio::test]
    async fn a_history_tail_is_the_newest_messages_with_the_length() {
        let store = MemoryHistoryStore::new();
        let all: Vec<Message> = (0..4).map(|i| Message::user(format!("m{i}"))).collect();
        store.append(&thread(), &all, None).await.expect("append");
        for (window, from) in [
            (Some(1), 3),
            (Some(0), 4),
            (Some(4), 0),
            (Some(7), 0),
            (None, 0),
        ] {
            let tail = store.load_tail(&thread(), window).await.expect("tail");
            assert_eq!(
                tail,
                HistoryTail::new(all[from..].to_vec(), 4),
                "{window:?}"
            );
            // The trait's default, over a whole read, says the same.
            let whole = store.load(&thread()).await.expect("load");
            assert_eq!(HistoryTail::of(whole, window), tail, "{window:?}");
        }
        let none = ThreadId::new("none").expect("id");
        assert_eq!(
            store.load_tail(&none, Some(2)).await,
            Ok(HistoryTail::default())
        );
    }

    #[tokio::test]
    async fn signals_read_in_key_order_and_expire() {
        use futures::StreamExt;
        let s = MemorySignalSource::new();
        let mut notices = s.subscribe().await.expect("subscribe");
        s.raise("a", std::time::Duration::from_secs(60))
            .await
            .expect("raise");
        s.raise("c", std::time::Duration::from_millis(1))
            .await
            .expect("raise");
        s.notify(&Notice {
            key: "a".into(),
            raised: true,
        })
        .await
        .expect("notify");
        assert_eq!(
            notices.next().await,
            Some(Notice {
                key: "a".into(),
                raised: true
            })
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let keys = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        assert_eq!(s.read(&keys).await, Ok(vec![true, false, false]));
        s.clear(&keys[..1], None).await.expect("clear");
        assert_eq!(s.read(&keys[..1]).await, Ok(vec![false]));
    }
}
