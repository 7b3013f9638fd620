//! [`MemoryLeaseStore`]: workers' heartbeats, threads' leases and fencing counters in memory,
//! the embedded default. The in-memory stores check fenced writes against it, so one process
//! keeps the same rule a Redis deployment keeps across processes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::ports::{Acquired, LeaseStore};
use crate::model::{
    Fence, Lease, LeaseError, LeaseHolder, StoreError, ThreadId, WorkerId, WorkerInfo,
};

#[derive(Debug, Default)]
struct Tables {
    workers: HashMap<WorkerId, (WorkerInfo, Instant)>,
    leases: HashMap<ThreadId, (Lease, Instant)>,
    /// The newest fencing token of each thread (never goes down).
    fences: HashMap<ThreadId, u64>,
    /// Whom each thread's current lease was taken from, when it was taken over: its holder
    /// asking again is told again.
    took: HashMap<ThreadId, LeaseHolder>,
}

impl Tables {
    fn worker_alive(&self, worker: &WorkerId, now: Instant) -> bool {
        self.workers
            .get(worker)
            .is_some_and(|(_, expires)| *expires > now)
    }

    /// The thread's lease, if it is held by a live worker and not expired.
    fn live_lease(&self, thread: &ThreadId, now: Instant) -> Option<&Lease> {
        self.leases
            .get(thread)
            .filter(|(lease, expires)| {
                *expires > now && self.worker_alive(&lease.holder.worker, now)
            })
            .map(|(lease, _)| lease)
    }
}

/// Heartbeats, leases and fencing counters in memory.
#[derive(Debug, Default)]
pub struct MemoryLeaseStore {
    tables: Mutex<Tables>,
}

impl MemoryLeaseStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        // Plain inserts and removals: a panic elsewhere cannot leave the tables inconsistent.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks a fenced write: `Ok` when there is no token or it is the thread's current one.
    pub fn check(&self, thread: &ThreadId, fence: Option<Fence>) -> Result<(), StoreError> {
        let Some(Fence(token)) = fence else {
            return Ok(());
        };
        let current = self.lock().fences.get(thread).copied().unwrap_or(0);
        if token == current {
            Ok(())
        } else {
            Err(StoreError::Fenced {
                thread: thread.clone(),
                token,
                current,
            })
        }
    }
}

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn heartbeat(&self, worker: &WorkerInfo, ttl: Duration) -> Result<(), StoreError> {
        self.lock()
            .workers
            .insert(worker.id.clone(), (worker.clone(), Instant::now() + ttl));
        Ok(())
    }

    async fn retire(&self, worker: &WorkerId) -> Result<(), StoreError> {
        self.lock().workers.remove(worker);
        Ok(())
    }

    async fn workers(&self, ids: &[WorkerId]) -> Result<Vec<Option<WorkerInfo>>, StoreError> {
        let now = Instant::now();
        let tables = self.lock();
        Ok(ids
            .iter()
            .map(|id| {
                tables
                    .workers
                    .get(id)
                    .filter(|(_, expires)| *expires > now)
                    .map(|(info, _)| info.clone())
            })
            .collect())
    }

    async fn acquire(
        &self,
        thread: &ThreadId,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Acquired, LeaseError> {
        let now = Instant::now();
        let mut tables = self.lock();
        if let Some(lease) = tables.live_lease(thread, now) {
            // The holder's own lease (an earlier attempt of this acquire): taken already.
            if lease.holder == *holder {
                let took_over = tables.took.get(thread).cloned();
                return Ok(Acquired::new(lease.clone(), took_over));
            }
            return Err(LeaseError::Busy {
                holder: lease.holder.clone(),
            });
        }
        let took_over = tables.leases.remove(thread).map(|(lease, _)| lease.holder);
        match &took_over {
            Some(previous) => tables.took.insert(thread.clone(), previous.clone()),
            None => tables.took.remove(thread),
        };
        let token = tables.fences.entry(thread.clone()).or_insert(0);
        *token += 1;
        let lease = Lease {
            holder: holder.clone(),
            fence: Fence(*token),
        };
        tables
            .leases
            .insert(thread.clone(), (lease.clone(), now + ttl));
        Ok(Acquired::new(lease, took_over))
    }

    async fn renew(
        &self,
        thread: &ThreadId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<(), LeaseError> {
        let now = Instant::now();
        let mut tables = self.lock();
        let current = tables.fences.get(thread).copied().unwrap_or(0);
        if current != lease.fence.0 {
            return Err(LeaseError::Lost {
                current: tables
                    .leases
                    .get(thread)
                    .map(|(held, _)| held.holder.clone()),
            });
        }
        // The token is still the thread's: nobody took it over, so a lease that expired
        // meanwhile (the store was out of reach for longer than the TTL) is taken back.
        tables
            .leases
            .insert(thread.clone(), (lease.clone(), now + ttl));
        Ok(())
    }

    async fn release(&self, thread: &ThreadId, lease: &Lease) -> Result<(), StoreError> {
        let mut tables = self.lock();
        if tables
            .leases
            .get(thread)
            .is_some_and(|(held, _)| held.fence == lease.fence)
        {
            tables.leases.remove(thread);
            tables.took.remove(thread);
        }
        Ok(())
    }

    async fn lease(&self, thread: &ThreadId) -> Result<Option<Lease>, StoreError> {
        let now = Instant::now();
        Ok(self
            .lock()
            .leases
            .get(thread)
            .filter(|(_, expires)| *expires > now)
            .map(|(lease, _)| lease.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RunId;

    fn holder(worker: &str) -> LeaseHolder {
        LeaseHolder {
            worker: WorkerId::new(worker).expect("id"),
            run: RunId::new(),
        }
    }

    fn info(worker: &LeaseHolder) -> WorkerInfo {
        WorkerInfo::this_process(worker.worker.clone())
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_holder_keeps_its_thread_and_tokens_only_grow() {
        let store = MemoryLeaseStore::new();
        let t = ThreadId::new("t").expect("id");
        let ttl = Duration::from_secs(10);
        let a = holder("a");
        let b = holder("b");
        store.heartbeat(&info(&a), ttl).await.expect("beat");
        store.heartbeat(&info(&b), ttl).await.expect("beat");
        let first = store.acquire(&t, &a, ttl).await.expect("free");
        assert_eq!(first.lease.fence, Fence(1));
        assert!(matches!(
            store.acquire(&t, &b, ttl).await,
            Err(LeaseError::Busy { holder }) if holder == a
        ));
        // The same holder asking again (its first answer lost) gets its own lease back.
        let again = store.acquire(&t, &a, ttl).await.expect("its own");
        assert_eq!((again.lease, again.took_over), (first.lease.clone(), None));
        assert!(store.check(&t, Some(Fence(1))).is_ok());
        // `a`'s worker stops heartbeating: its run is orphaned, `b` takes it over.
        tokio::time::advance(Duration::from_secs(5)).await;
        store.heartbeat(&info(&b), ttl).await.expect("beat");
        tokio::time::advance(Duration::from_secs(6)).await;
        let second = store.acquire(&t, &b, ttl).await.expect("taken over");
        assert_eq!(second.lease.fence, Fence(2));
        assert_eq!(second.took_over, Some(a.clone()));
        // Asking again, `b` is told the same: its lease, taken from `a`.
        let again = store.acquire(&t, &b, ttl).await.expect("its own");
        assert_eq!(
            (&again.lease, &again.took_over),
            (&second.lease, &Some(a.clone()))
        );
        assert!(matches!(
            store.check(&t, Some(Fence(1))),
            Err(StoreError::Fenced {
                token: 1,
                current: 2,
                ..
            })
        ));
        assert!(matches!(
            store.renew(&t, &first.lease, ttl).await,
            Err(LeaseError::Lost { current: Some(h) }) if h == b
        ));
        // A stale release changes nothing.
        store.release(&t, &first.lease).await.expect("release");
        assert_eq!(
            store.lease(&t).await.expect("read"),
            Some(second.lease.clone())
        );
        store.release(&t, &second.lease).await.expect("release");
        assert_eq!(store.lease(&t).await.expect("read"), None);
        let third = store.acquire(&t, &a, ttl).await.expect("free again");
        assert_eq!(third.lease.fence, Fence(3));
    }
}
