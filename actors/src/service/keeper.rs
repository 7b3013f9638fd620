//! `LeaseKeeper`: one actor per runtime that keeps the worker alive and its runs' leases held.
//!
//! Every renew interval it writes the worker's heartbeat and renews the thread lease of every
//! live run, all in one call ([`LeaseStore::renew_all`]: one round trip on Redis). A lease the store says is lost (another worker took the
//! thread over, or it expired while the store was out of reach) stops its run at once, with
//! reason `lease_lost`: the run writes nothing more, and its fenced writes would be refused
//! anyway. A store error leaves the lease alone and is retried at the next tick, until the
//! lease has gone unconfirmed for the lease TTL less one renew interval: then it may have
//! expired at the store and another worker may run the thread, so the run stops the same way
//! (its nodes' side effects must not overlap the new holder's). Errors are counted and logged
//! at most every ten seconds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::exec::RunMsg;
use crate::model::{
    Lease, LeaseError, RunId, StopMode, StopReason, StoreError, ThreadId, WorkerInfo,
};
use crate::persist::LeaseStore;

/// Messages the keeper handles.
#[derive(Debug)]
pub(crate) enum KeeperMsg {
    /// Keep a run's lease; stop the run through `supervisor` if it is lost.
    Hold {
        run: RunId,
        thread: ThreadId,
        lease: Lease,
        supervisor: ActorRef<RunMsg>,
    },
    /// Stop keeping a run's lease (it ended). The reply comes once no renewal of it is in
    /// flight, so a release that follows cannot be undone by a late renewal.
    Drop(RunId, RpcReplyPort<()>),
    /// Time to write the heartbeat and renew the leases.
    Tick,
    /// Make sure the heartbeat is written (before a run takes a lease: a lease whose worker
    /// has no heartbeat may be taken over). Answers at once when it is; otherwise writes it.
    Ensure(RpcReplyPort<Result<(), StoreError>>),
    /// The runtime shuts down: remove the heartbeat and write none until a run holds a lease
    /// again. Answers once the heartbeat is gone (or could not be removed: it then expires).
    Retire(RpcReplyPort<()>),
}

pub(crate) struct LeaseKeeper;

pub(crate) struct KeeperArgs {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) worker: WorkerInfo,
    pub(crate) ttl: Duration,
    pub(crate) renew: Duration,
}

struct Held {
    thread: ThreadId,
    lease: Lease,
    supervisor: ActorRef<RunMsg>,
    /// When the lease was last known held: taken, or a renewal sent then succeeded.
    confirmed: tokio::time::Instant,
}

pub(crate) struct KeeperState {
    store: Arc<dyn LeaseStore>,
    worker: WorkerInfo,
    ttl: Duration,
    renew: Duration,
    held: HashMap<RunId, Held>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    errors: u64,
    last_log: Option<tokio::time::Instant>,
    /// Retired: no heartbeat until the next `Hold`.
    retired: bool,
    /// The last heartbeat was written (and not retired since).
    beating: bool,
}

impl Actor for LeaseKeeper {
    type Msg = KeeperMsg;
    type State = KeeperState;
    type Arguments = KeeperArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: KeeperArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(KeeperState {
            store: args.store,
            worker: args.worker,
            ttl: args.ttl,
            renew: args.renew,
            held: HashMap::new(),
            ticker: None,
            errors: 0,
            last_log: None,
            retired: false,
            beating: false,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.tick(&myself).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            KeeperMsg::Hold {
                run,
                thread,
                lease,
                supervisor,
            } => {
                if state.retired {
                    state.retired = false;
                    state.tick(&myself).await;
                }
                state.held.insert(
                    run,
                    Held {
                        thread,
                        lease,
                        supervisor,
                        confirmed: tokio::time::Instant::now(),
                    },
                );
            }
            KeeperMsg::Drop(run, done) => {
                state.held.remove(&run);
                let _ = done.send(());
            }
            KeeperMsg::Tick => state.tick(&myself).await,
            KeeperMsg::Ensure(reply) => {
                if state.retired {
                    state.retired = false;
                    state.tick(&myself).await;
                }
                let result = if state.beating {
                    Ok(())
                } else {
                    let result = state.store.heartbeat(&state.worker, state.ttl).await;
                    state.beating = result.is_ok();
                    result
                };
                let _ = reply.send(result);
            }
            KeeperMsg::Retire(done) => {
                state.retired = true;
                state.beating = false;
                if let Some(ticker) = state.ticker.take() {
                    ticker.abort();
                }
                if let Err(e) = state.store.retire(&state.worker.id).await {
                    state.error(&e.to_string());
                }
                let _ = done.send(());
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(ticker) = state.ticker.take() {
            ticker.abort();
        }
        Ok(())
    }
}

impl KeeperState {
    /// Writes the heartbeat, renews every held lease, stops the runs whose lease is lost, and
    /// arms the next tick.
    async fn tick(&mut self, myself: &ActorRef<KeeperMsg>) {
        match self.store.heartbeat(&self.worker, self.ttl).await {
            Ok(()) => self.beating = true,
            Err(e) => self.error(&e.to_string()),
        }
        let (runs, leases): (Vec<RunId>, Vec<(ThreadId, Lease)>) = self
            .held
            .iter()
            .map(|(run, held)| (*run, (held.thread.clone(), held.lease.clone())))
            .unzip();
        let sent = tokio::time::Instant::now();
        let results = if leases.is_empty() {
            Vec::new()
        } else {
            self.store.renew_all(&leases, self.ttl).await
        };
        // A lease not confirmed for this long may have expired at the store (give or take one
        // renew interval of clock and latency): its run stops rather than go on unsure.
        let unsure_after = self.ttl.saturating_sub(self.renew);
        for (run, result) in runs.into_iter().zip(results) {
            match result {
                Ok(()) => {
                    if let Some(held) = self.held.get_mut(&run) {
                        held.confirmed = sent;
                    }
                }
                Err(LeaseError::Store(e)) => {
                    self.error(&e.to_string());
                    let unconfirmed = self
                        .held
                        .get(&run)
                        .is_some_and(|held| held.confirmed.elapsed() >= unsure_after);
                    if unconfirmed && let Some(held) = self.held.remove(&run) {
                        tracing::warn!(%run, thread = %held.thread, error = %e, "lease not renewed for a whole TTL: another worker may hold the thread now; stopping the run");
                        let _ = held.supervisor.send_message(RunMsg::Stop {
                            mode: StopMode::Force,
                            reason: StopReason::LeaseLost,
                            by: "lease_keeper",
                        });
                    }
                }
                Err(lost) => {
                    if let Some(held) = self.held.remove(&run) {
                        tracing::warn!(%run, thread = %held.thread, error = %lost, "lease lost: stopping the run");
                        let _ = held.supervisor.send_message(RunMsg::Stop {
                            mode: StopMode::Force,
                            reason: StopReason::LeaseLost,
                            by: "lease_keeper",
                        });
                    }
                }
            }
        }
        let me = myself.clone();
        let every = self.renew;
        if let Some(old) = self.ticker.take() {
            old.abort();
        }
        self.ticker = Some(tokio::spawn(async move {
            tokio::time::sleep(every).await;
            let _ = me.send_message(KeeperMsg::Tick);
        }));
    }

    /// Counts an error and logs it, at most every ten seconds.
    fn error(&mut self, error: &str) {
        self.errors += 1;
        let now = tokio::time::Instant::now();
        if self
            .last_log
            .is_none_or(|last| now.duration_since(last) >= Duration::from_secs(10))
        {
            self.last_log = Some(now);
            tracing::warn!(
                error,
                count = self.errors,
                "lease store error: leases kept, will retry"
            );
        }
    }
}
