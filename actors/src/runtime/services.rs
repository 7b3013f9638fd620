//! What every run of a runtime shares: config, stores, the registry of live runs, and the
//! runtime's two service actors (the checkpointer and the stop watcher), spawned on first use.
//! The actors of a run reach all of it through [`RunServices`].

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_trait::async_trait;
use ractor::{Actor, ActorRef};

use super::trace::TraceContext;
use crate::exec::{EndParts, EndReached, LiveRun, RunMsg, RunServices, RuntimeConfig};
use crate::model::{
    CheckpointError, CheckpointId, Lease, RunId, RunOutcome, RunRecord, StopMode, StoreError,
    ThreadId, WorkerInfo,
};
use crate::persist::retry;
use crate::persist::snapshot::{SaveFailed, SnapshotWrite};
use crate::persist::{
    CheckpointStore, EndFailed, EndStep, EndStore, HistoryStore, LeaseStore, RunStore,
    SignalSource, SpillStore, StartStore, WatchedKeys, WholeEnd,
};
use crate::service::CheckpointObserver;
use crate::service::RunRegistry;
use crate::service::checkpointer::{
    Backlog, ChainSeed, Chains, CheckpointMsg, Checkpointer, CheckpointerArgs, FirstPut,
    write_awaited,
};
use crate::service::keeper::{KeeperArgs, KeeperMsg, LeaseKeeper};
use crate::service::watcher::{StopWatcher, WatchMsg, WatcherArgs};

/// What every run of a runtime shares.
pub(crate) struct Services {
    pub(crate) history: Arc<dyn HistoryStore>,
    pub(crate) runs: Arc<dyn RunStore>,
    pub(crate) checkpoints: Arc<dyn CheckpointStore>,
    pub(crate) signals: Arc<dyn SignalSource>,
    pub(crate) config: RuntimeConfig,
    pub(crate) registry: RunRegistry,
    checkpointer: tokio::sync::OnceCell<ActorRef<CheckpointMsg>>,
    /// Each running run's chain of checkpoints, shared by the checkpointer (background
    /// writes) and the awaited writes, which run in their callers' tasks.
    chains: Chains,
    /// Runs that handed the checkpointer a background write since their last awaited one:
    /// only those have a pending write for an awaited one to supersede (the others' awaited
    /// writes send the checkpointer nothing, so it is not woken once per node).
    handed: dashmap::DashSet<RunId>,
    backlog: Arc<Backlog>,
    watcher: tokio::sync::OnceCell<ActorRef<WatchMsg>>,
    pub(crate) signal_errors: Arc<AtomicU64>,
    /// Alive as long as the runtime: the stop watcher ends when it is gone.
    alive: Arc<()>,
    /// Workers' heartbeats and threads' leases.
    pub(crate) leases: Arc<dyn LeaseStore>,
    /// Where the ends of runs the stores did not take are kept, if anywhere.
    pub(crate) spill: Option<Arc<dyn SpillStore>>,
    /// Writes a run's whole end in one step, if the stores can.
    ends: Option<Arc<dyn EndStore>>,
    /// Starts a run (lease, record, history) in one step, if the stores can.
    pub(crate) starts: Option<Arc<dyn StartStore>>,
    /// This runtime as a worker.
    pub(crate) worker: WorkerInfo,
    keeper: tokio::sync::OnceCell<ActorRef<KeeperMsg>>,
    /// The task adopting orphans, when the runtime does.
    pub(crate) adopter: std::sync::OnceLock<tokio::task::AbortHandle>,
    /// How the host's tracing backend names spans, if it said.
    pub(crate) trace: Option<Arc<dyn TraceContext>>,
    /// Told of every checkpoint write, if the host asked.
    pub(crate) checkpoint_observer: Option<Arc<dyn CheckpointObserver>>,
}

/// The stores a runtime is built with.
pub(crate) struct Stores {
    pub(crate) history: Arc<dyn HistoryStore>,
    pub(crate) runs: Arc<dyn RunStore>,
    pub(crate) checkpoints: Arc<dyn CheckpointStore>,
    pub(crate) signals: Arc<dyn SignalSource>,
    pub(crate) leases: Arc<dyn LeaseStore>,
    pub(crate) ends: Option<Arc<dyn EndStore>>,
    pub(crate) starts: Option<Arc<dyn StartStore>>,
    pub(crate) spill: Option<Arc<dyn SpillStore>>,
}

impl Services {
    pub(crate) fn new(stores: Stores, config: RuntimeConfig, worker: WorkerInfo) -> Self {
        let Stores {
            history,
            runs,
            checkpoints,
            signals,
            leases,
            ends,
            starts,
            spill,
        } = stores;
        let chains = Chains::new(
            config.checkpoint_compact_every,
            config.checkpoint_compact_percent,
        );
        Self {
            leases,
            spill,
            ends,
            starts,
            worker,
            keeper: tokio::sync::OnceCell::new(),
            adopter: std::sync::OnceLock::new(),
            history,
            runs,
            checkpoints,
            signals,
            registry: RunRegistry::new(config.finished_outcomes, config.finished_outcomes_bytes),
            config,
            checkpointer: tokio::sync::OnceCell::new(),
            chains,
            handed: dashmap::DashSet::new(),
            backlog: Arc::default(),
            watcher: tokio::sync::OnceCell::new(),
            signal_errors: Arc::default(),
            alive: Arc::new(()),
            trace: None,
            checkpoint_observer: None,
        }
    }

    /// The runtime's stop watcher, spawned on first use.
    async fn watcher(&self) -> Result<&ActorRef<WatchMsg>, String> {
        self.watcher
            .get_or_try_init(|| async {
                let args = WatcherArgs {
                    source: self.signals.clone(),
                    alive: Arc::downgrade(&self.alive),
                    errors: self.signal_errors.clone(),
                    tick: self.config.signals.tick,
                    stop: StopMode::Graceful {
                        timeout: self.config.stop_timeout,
                    },
                    cancel: StopMode::Graceful {
                        timeout: self.config.signals.cancel_timeout,
                    },
                };
                Actor::spawn(None, StopWatcher, args)
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| format!("could not spawn the stop watcher: {e}"))
            })
            .await
    }

    /// Makes sure this worker's heartbeat is written, before a run of it takes a lease.
    pub(crate) async fn ensure_heartbeat(&self) -> Result<(), StoreError> {
        let keeper = self.keeper().await.map_err(StoreError::Unavailable)?;
        match keeper
            .call(KeeperMsg::Ensure, Some(self.config.lease.ttl))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(result)) => result,
            Ok(_) => Err(StoreError::Timeout(self.config.lease.ttl)),
            Err(e) => Err(StoreError::Unavailable(format!("the lease keeper: {e}"))),
        }
    }

    /// Removes this worker's heartbeat until a run holds a lease again.
    pub(crate) async fn retire(&self) {
        if let Some(keeper) = self.keeper.get() {
            let _ = keeper.call(KeeperMsg::Retire, None).await;
        }
    }

    /// The runtime's lease keeper, spawned on first use.
    async fn keeper(&self) -> Result<&ActorRef<KeeperMsg>, String> {
        self.keeper
            .get_or_try_init(|| async {
                let args = KeeperArgs {
                    store: self.leases.clone(),
                    worker: self.worker.clone(),
                    ttl: self.config.lease.ttl,
                    renew: self.config.lease.renew,
                };
                Actor::spawn(None, LeaseKeeper, args)
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| format!("could not spawn the lease keeper: {e}"))
            })
            .await
    }

    /// The checkpoints of `run`, which continues a thread from its newest checkpoint, continue
    /// that checkpoint's chain (called before the run starts).
    pub(crate) fn continue_chain(&self, run: RunId, seed: Box<ChainSeed>) {
        // Into the shared chains at once: the run's first write, awaited in its own task or
        // in the background, finds it.
        self.chains.continue_from(run, *seed);
    }

    /// The checkpoints of `run` sort after checkpoint `floor` of its thread (the one it
    /// continues, or the thread's newest), even when that one was written by a process whose
    /// clock is ahead of this one's (called before the run starts).
    pub(crate) fn continue_after(&self, run: RunId, floor: CheckpointId) {
        self.chains.continue_after(run, floor);
    }

    /// `run` writes no more checkpoints: its chain, if the checkpointer still follows one,
    /// is forgotten.
    pub(crate) fn forget_chain(&self, run: RunId) {
        self.handed.remove(&run);
        if let Some(checkpointer) = self.checkpointer.get() {
            let _ = checkpointer.send_message(CheckpointMsg::Forget(run));
        }
    }

    /// An awaited checkpoint write (see [`RunServices::save_awaited`]), its first attempt
    /// `first` if given (see [`write_awaited`]).
    async fn write_checkpoint(
        &self,
        write: SnapshotWrite,
        deadline: tokio::time::Instant,
        first: Option<FirstPut<'_>>,
    ) -> Result<CheckpointId, SaveFailed> {
        let checkpointer = self
            .checkpointer()
            .await
            .map_err(|reason| CheckpointError::Unreachable { reason })?;
        // A background snapshot of the run still waiting is older than this one: it goes.
        // (One already being written is refused by the store's sequence check if it lands
        // after this one.) The run's background writes were all handed before this call: its
        // actor hands them and starts awaited writes in turn.
        if self.handed.remove(&write.run).is_some() {
            let _ = checkpointer.send_message(CheckpointMsg::Superseded(write.run));
        }
        // Written here, in the caller's task. Answered by the deadline, plus one store call
        // that began before it.
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now())
            + self.config.store_deadline.min(Duration::from_secs(5))
            + Duration::from_secs(1);
        let writing = write_awaited(
            self.checkpoints.clone(),
            self.chains.clone(),
            self.checkpoint_observer.clone(),
            deadline,
            write,
            first,
        );
        match tokio::time::timeout(timeout, writing).await {
            Ok(result) => result,
            Err(_) => Err(SaveFailed::from(CheckpointError::Unreachable {
                reason: format!("the checkpoint write did not end within {timeout:?}"),
            })),
        }
    }

    /// Whether `run`'s record names `checkpoint`: a run's whole end writes the record naming
    /// its final checkpoint after the checkpoint and the messages, in one step, so then all of
    /// those are stored. A record that cannot be read says no.
    async fn landed(&self, run: RunId, checkpoint: CheckpointId) -> bool {
        match self.runs.get(run).await {
            Ok(Some(record)) => record.checkpoint_id == Some(checkpoint),
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(%run, error = %e, "could not read the record to learn whether the run's end was stored");
                false
            }
        }
    }

    /// The runtime's checkpointer, spawned on first use.
    async fn checkpointer(&self) -> Result<&ActorRef<CheckpointMsg>, String> {
        self.checkpointer
            .get_or_try_init(|| async {
                let args = CheckpointerArgs {
                    store: self.checkpoints.clone(),
                    observer: self.checkpoint_observer.clone(),
                    backlog: self.backlog.clone(),
                    chains: self.chains.clone(),
                };
                Actor::spawn(None, Checkpointer, args)
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| format!("could not spawn the checkpointer: {e}"))
            })
            .await
    }
}

#[async_trait]
impl RunServices for Services {
    fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    fn history(&self) -> &Arc<dyn HistoryStore> {
        &self.history
    }

    fn runs(&self) -> &Arc<dyn RunStore> {
        &self.runs
    }

    fn signals(&self) -> &Arc<dyn SignalSource> {
        &self.signals
    }

    fn spill(&self) -> Option<&Arc<dyn SpillStore>> {
        self.spill.as_ref()
    }

    fn backlog_bytes(&self) -> usize {
        self.backlog.bytes()
    }

    async fn save_background(&self, write: SnapshotWrite) {
        match self.checkpointer().await {
            Ok(checkpointer) => {
                self.handed.insert(write.run);
                let _ = checkpointer.send_message(CheckpointMsg::Background(write));
            }
            Err(e) => {
                tracing::error!(run = %write.run, error = %e, "progress snapshot not written")
            }
        }
    }

    async fn save_awaited(
        &self,
        write: SnapshotWrite,
        deadline: tokio::time::Instant,
    ) -> Result<CheckpointId, SaveFailed> {
        self.write_checkpoint(write, deadline, None).await
    }

    fn writes_whole_end(&self) -> bool {
        self.ends.is_some()
    }

    async fn save_end(
        &self,
        write: SnapshotWrite,
        end: EndParts<'_>,
        deadline: tokio::time::Instant,
    ) -> (Result<CheckpointId, SaveFailed>, EndReached) {
        let Some(ends) = self.ends.as_ref() else {
            return (
                self.write_checkpoint(write, deadline, None).await,
                EndReached::Checkpoint,
            );
        };
        let reached = std::sync::Mutex::new(EndReached::Checkpoint);
        // Whether the whole end failed in a way that may have stored all of it (a timeout).
        let answer_lost = std::sync::atomic::AtomicBool::new(false);
        let lost = &answer_lost;
        let reach = |to: EndReached| {
            if let Ok(mut reached) = reached.lock() {
                *reached = to;
            }
        };
        let first: FirstPut<'_> = Box::new(|checkpoint| {
            Box::pin(async move {
                let record = RunRecord {
                    checkpoint_id: Some(checkpoint.id),
                    ..end.record.clone()
                };
                let whole = WholeEnd {
                    checkpoint: &checkpoint,
                    messages: end.messages,
                    record: &record,
                    lease: end.lease,
                    flags: end.flags,
                };
                // A step after the checkpoint that failed is written again step by step by
                // the caller, which then learns why it fails (or finds it passing).
                match ends.put_whole_end(&whole).await {
                    Ok(written) => {
                        reach(EndReached::Record(written));
                        Ok(())
                    }
                    Err(EndFailed {
                        step: EndStep::Checkpoint,
                        error,
                    }) => {
                        if error.is_transient() {
                            lost.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(error)
                    }
                    Err(
                        failed @ EndFailed {
                            step: EndStep::History,
                            ..
                        },
                    ) => {
                        tracing::debug!(run = %record.run_id, error = %failed, "the run's end stored its final checkpoint only");
                        Ok(())
                    }
                    Err(failed) => {
                        tracing::debug!(run = %record.run_id, error = %failed, "the run's end stored its final checkpoint and its messages only");
                        reach(EndReached::History);
                        Ok(())
                    }
                }
            })
        });
        let run = write.run;
        let result = self.write_checkpoint(write, deadline, Some(first)).await;
        let mut reached = reached
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let answer_lost = answer_lost.load(std::sync::atomic::Ordering::Relaxed);
        let result = match result {
            // The whole end's answer was lost and a retry was refused as fenced: another run
            // took the thread, which it can only once the end gave the lease up. The record
            // says whether the end landed: only the whole end names this checkpoint in it.
            Err(SaveFailed {
                error: CheckpointError::Refused(StoreError::Fenced { .. }),
                unwritten: Some(checkpoint),
            }) if answer_lost && self.landed(run, checkpoint.id).await => {
                reached = EndReached::Taken;
                Ok(checkpoint.id)
            }
            other => other,
        };
        (result, reached)
    }

    async fn watch(&self, run: RunId, keys: WatchedKeys, supervisor: ActorRef<RunMsg>) {
        match self.watcher().await {
            Ok(watcher) => {
                let _ = watcher.send_message(WatchMsg::Watch(run, keys, supervisor));
            }
            Err(e) => {
                tracing::warn!(run_id = %run, error = %e, "stop flags of this run are not watched")
            }
        }
    }

    async fn unwatch(&self, run: RunId) {
        if let Some(watcher) = self.watcher.get() {
            let _ = watcher.send_message(WatchMsg::Unwatch(run));
        }
    }

    fn register(&self, run: RunId, entry: LiveRun) {
        self.registry.insert(run, entry);
    }

    fn unregister(&self, run: RunId, waiting: bool, outcome: Arc<RunOutcome>) {
        self.forget_chain(run);
        self.registry.finish(run, waiting, outcome);
    }

    async fn hold_lease(
        &self,
        run: RunId,
        thread: ThreadId,
        lease: Lease,
        supervisor: ActorRef<RunMsg>,
    ) {
        match self.keeper().await {
            Ok(keeper) => {
                let _ = keeper.send_message(KeeperMsg::Hold {
                    run,
                    thread,
                    lease,
                    supervisor,
                });
            }
            Err(e) => {
                tracing::error!(%run, error = %e, "the run's lease is not renewed; it may be taken over")
            }
        }
    }

    async fn stop_renewing(&self, run: RunId) {
        if let Some(keeper) = self.keeper.get() {
            // Waits for a renewal in flight: one landing after the release would take the
            // thread again. A keeper that is gone renews nothing.
            let _ = keeper.call(|done| KeeperMsg::Drop(run, done), None).await;
        }
    }

    async fn release_lease(
        &self,
        run: RunId,
        thread: &ThreadId,
        lease: &Lease,
        deadline: tokio::time::Instant,
    ) {
        let error = match self.leases.release(thread, lease).await {
            Ok(()) => return,
            Err(error) => error,
        };
        if !error.is_transient() {
            // The lease expires by itself; the thread is busy until then.
            tracing::warn!(%run, %thread, %error, "could not give the thread's lease up");
            return;
        }
        // Tried again in the background, so a store out of reach does not hold the run's
        // outcome back. A release removes the lease only while it is this run's: made again
        // after a lost answer, or after another run took the thread, it changes nothing.
        tracing::debug!(%run, %thread, %error, "giving the thread's lease up again");
        let (leases, thread, lease) = (self.leases.clone(), thread.clone(), lease.clone());
        tokio::spawn(async move {
            if let Err(gave_up) = retry::until(deadline, || leases.release(&thread, &lease)).await {
                tracing::warn!(%run, %thread, error = %gave_up.error, attempts = gave_up.attempts + 1, "could not give the thread's lease up");
            }
        });
    }
}

impl Drop for Services {
    /// The runtime is gone: its checkpointer writes what is still queued, then ends; its
    /// watcher and lease keeper end.
    fn drop(&mut self) {
        if let Some(adopter) = self.adopter.get() {
            adopter.abort();
        }
        if let Some(keeper) = self.keeper.get() {
            keeper.stop(None);
        }
        if let Some(checkpointer) = self.checkpointer.get() {
            let _ = checkpointer.drain();
        }
        if let Some(watcher) = self.watcher.get() {
            watcher.stop(None);
        }
    }
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
