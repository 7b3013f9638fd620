//! `StopWatcher`: one actor per runtime that turns stop and cancel flags, set by any process
//! in the signal source, into stops of this process's runs.
//!
//! Each tick (default 100 ms) it reads the flags of every watched run in one round trip; a
//! subscription to the signal channel wakes it between ticks so a published stop is seen at
//! once. The flags are the source of truth: a notice only makes the watcher read the flag now,
//! and after a broken subscription every flag is read again. A source error means "not
//! stopping": runs go on, the error is counted and logged (rate-limited), and the
//! subscription is re-established with backoff.
//!
//! A raised flag stops its run through the run's supervisor, with the stop or cancel timeout
//! the runtime was configured with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::exec::RunMsg;
use crate::model::{RunId, StopMode, StopReason};
use crate::persist::{Notice, Signal, SignalSource, WatchedKeys};
use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;
/// Messages the watcher handles.
#[derive(Debug)]
pub(crate) enum WatchMsg {
    /// Watch a run's flags; a raised one stops it through its supervisor.
    Watch(RunId, WatchedKeys, ActorRef<RunMsg>),
    Unwatch(RunId),
    /// The tick timer fired: read every flag, then re-arm.
    Tick,
    /// Read every flag now (after a (re)subscription), without touching the timer.
    Reread,
    Notice(Notice),
    /// A read came back: the keys read and their flags (or the source's error).
    Read(Vec<String>, Result<Vec<bool>, String>, bool),
}

pub(crate) struct StopWatcher;

pub(crate) struct WatcherArgs {
    pub(crate) source: Arc<dyn SignalSource>,
    /// Alive while the runtime is: once it is gone, the watcher ends.
    pub(crate) alive: Weak<()>,
    pub(crate) errors: Arc<AtomicU64>,
    /// How often every watched flag is read.
    pub(crate) tick: Duration,
    /// How a raised stop flag stops its run.
    pub(crate) stop: StopMode,
    /// How a raised cancel flag stops its run.
    pub(crate) cancel: StopMode,
}

struct Watched {
    keys: WatchedKeys,
    supervisor: ActorRef<RunMsg>,
    fired: Vec<Signal>,
}

pub(crate) struct WatcherState {
    source: Arc<dyn SignalSource>,
    alive: Weak<()>,
    stop: StopMode,
    cancel: StopMode,
    runs: HashMap<RunId, Watched>,
    index: HashMap<String, (RunId, Signal)>,
    errors: Arc<AtomicU64>,
    last_log: Option<tokio::time::Instant>,
    tick: Duration,
    subscription: Option<tokio::task::JoinHandle<()>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    /// A full read is in flight (ticks do not pile up behind a slow source).
    reading: bool,
}

impl Actor for StopWatcher {
    type Msg = WatchMsg;
    type State = WatcherState;
    type Arguments = WatcherArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: WatcherArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(WatcherState {
            source: args.source,
            alive: args.alive,
            stop: args.stop,
            cancel: args.cancel,
            runs: HashMap::new(),
            index: HashMap::new(),
            errors: args.errors,
            last_log: None,
            tick: args.tick,
            subscription: None,
            ticker: None,
            reading: false,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.subscription = Some(tokio::spawn(subscribe_forever(
            state.source.clone(),
            myself.clone(),
            state.errors.clone(),
        )));
        state.arm(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WatchMsg::Watch(run, keys, supervisor) => {
                for key in &keys.stop {
                    state.index.insert(key.clone(), (run, Signal::Stop));
                }
                for key in &keys.cancel {
                    state.index.insert(key.clone(), (run, Signal::Cancel));
                }
                state.runs.insert(
                    run,
                    Watched {
                        keys,
                        supervisor,
                        fired: Vec::new(),
                    },
                );
            }
            WatchMsg::Unwatch(run) => {
                if let Some(watched) = state.runs.remove(&run) {
                    for key in watched.keys.all() {
                        if state.index.get(&key).is_some_and(|(r, _)| *r == run) {
                            state.index.remove(&key);
                        }
                    }
                }
            }
            WatchMsg::Tick | WatchMsg::Reread if state.alive.strong_count() == 0 => {
                // The runtime is gone: nothing left to watch for.
                myself.stop(None);
            }
            WatchMsg::Tick | WatchMsg::Reread => {
                // A full read runs in its own task, so notices are handled while it is out;
                // the next tick is armed when it comes back.
                if !state.reading {
                    let keys: Vec<String> = state.index.keys().cloned().collect();
                    if keys.is_empty() {
                        if matches!(message, WatchMsg::Tick) {
                            state.arm(&myself);
                        }
                    } else {
                        state.reading = true;
                        state.read(&myself, keys, true);
                    }
                }
            }
            WatchMsg::Notice(notice) => {
                if notice.raised && state.index.contains_key(&notice.key) {
                    state.read(&myself, vec![notice.key], false);
                }
            }
            WatchMsg::Read(keys, flags, full) => {
                if full {
                    state.reading = false;
                    state.arm(&myself);
                }
                match flags {
                    Ok(flags) => state.fire(&keys, flags),
                    Err(e) => state.error(&e),
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for task in [state.subscription.take(), state.ticker.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
        Ok(())
    }
}

impl WatcherState {
    /// Schedules the next tick (re-armed after each full read, so a slow read never queues
    /// ticks; one timer at a time).
    fn arm(&mut self, myself: &ActorRef<WatchMsg>) {
        if let Some(old) = self.ticker.take() {
            old.abort();
        }
        let me = myself.clone();
        let tick = self.tick;
        self.ticker = Some(tokio::spawn(async move {
            tokio::time::sleep(tick).await;
            let _ = me.send_message(WatchMsg::Tick);
        }));
    }

    /// Reads the given flags in one round trip, in a task; the answer comes back as
    /// `WatchMsg::Read`. A read is bounded: a hung source must not hold the watcher.
    fn read(&self, myself: &ActorRef<WatchMsg>, keys: Vec<String>, full: bool) {
        let source = self.source.clone();
        let deadline = self.tick.max(Duration::from_millis(50)) * 5;
        let me = myself.clone();
        // A full read is a tick's work: its span times it (a host may turn that into a metric).
        let span = if full {
            tracing::debug_span!(
                parent: None,
                "watcher_tick",
                runvisor.watcher.flags = keys.len()
            )
        } else {
            tracing::Span::none()
        };
        tokio::spawn(
            async move {
                let flags = match tokio::time::timeout(deadline, source.read(&keys)).await {
                    Ok(Ok(flags)) => Ok(flags),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("signal read timed out after {deadline:?}")),
                };
                let _ = me.send_message(WatchMsg::Read(keys, flags, full));
            }
            .instrument(span),
        );
    }

    /// Stops the runs whose flags are set (each signal fires once per run).
    fn fire(&mut self, keys: &[String], flags: Vec<bool>) {
        for (key, set) in keys.iter().zip(flags) {
            if !set {
                continue;
            }
            let Some(&(run, signal)) = self.index.get(key) else {
                continue;
            };
            let Some(watched) = self.runs.get_mut(&run) else {
                continue;
            };
            if watched.fired.contains(&signal) {
                continue;
            }
            watched.fired.push(signal);
            let (mode, reason) = match signal {
                Signal::Stop => (self.stop, StopReason::UserInterrupted),
                Signal::Cancel => (self.cancel, StopReason::Cancelled),
            };
            tracing::info!(%run, key, ?signal, "flag set: stopping the run");
            // A run that is ending refuses the message; its end is on its way regardless.
            let _ = watched.supervisor.send_message(RunMsg::Stop {
                mode,
                reason,
                by: "signal",
            });
        }
    }

    /// Counts an error and logs it, at most every ten seconds.
    fn error(&mut self, error: &str) {
        let count = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        let now = tokio::time::Instant::now();
        if self
            .last_log
            .is_none_or(|last| now.duration_since(last) >= Duration::from_secs(10))
        {
            self.last_log = Some(now);
            tracing::warn!(
                error,
                count,
                "signal source error: runs go on (not stopping)"
            );
        }
    }
}

/// Keeps a subscription to the signal channel, re-subscribing with backoff; after each
/// (re)subscription every flag is read again (notices sent meanwhile were lost).
async fn subscribe_forever(
    source: Arc<dyn SignalSource>,
    watcher: ActorRef<WatchMsg>,
    errors: Arc<AtomicU64>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match source.subscribe().await {
            Ok(mut notices) => {
                backoff = Duration::from_millis(100);
                if watcher.send_message(WatchMsg::Reread).is_err() {
                    return;
                }
                while let Some(notice) = notices.next().await {
                    if watcher.send_message(WatchMsg::Notice(notice)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "signal channel subscription failed");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
