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
//! Key templates name a run's flags from its labels: `{app_id}`, `{chat_id}`, `{task_id}`,
//! `{thread}`, `{run_id}`, `{prefix}`; `{{` and `}}` are literal braces (Redis Cluster hash
//! tags). A template naming a label the run does not have gives no key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::{Deserialize, Serialize};

use crate::ids::{RunId, ThreadId};
use crate::runtime::{Services, stop_run};
use crate::stop::{StopMode, StopReason};
use crate::store::{Notice, Signal, SignalSource};

/// Who a run is for the processes that may stop it: the ids its flags are named after.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLabels {
    /// The application (FastGPT `appId`).
    pub app_id: Option<String>,
    /// The conversation (FastGPT `chatId`).
    pub chat_id: Option<String>,
    /// The task (RAGFlow task id).
    pub task_id: Option<String>,
}

impl RunLabels {
    /// Labels for a FastGPT-style app and chat.
    pub fn app_chat(app_id: impl Into<String>, chat_id: impl Into<String>) -> Self {
        Self {
            app_id: Some(app_id.into()),
            chat_id: Some(chat_id.into()),
            task_id: None,
        }
    }

    /// Labels for a RAGFlow-style task.
    pub fn task(task_id: impl Into<String>) -> Self {
        Self {
            task_id: Some(task_id.into()),
            ..Self::default()
        }
    }
}

/// How stop and cancel flags are named and watched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignalConfig {
    /// Prefix of native keys (`{prefix}` in templates).
    pub prefix: String,
    /// Stop flags (graceful, reason `user_interrupted`), one template per key format.
    pub stop_keys: Vec<String>,
    /// Cancel flags (graceful up to `cancel_timeout`, then force; reason `cancelled`).
    pub cancel_keys: Vec<String>,
    /// How often every watched flag is read.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// How long a flag lives if nobody clears it.
    #[serde(with = "humantime_serde")]
    pub flag_ttl: Duration,
    /// How long a stop request waits for the run to end.
    #[serde(with = "humantime_serde")]
    pub request_wait: Duration,
    /// How often a waiting stop request re-reads the flag (when no notice comes).
    #[serde(with = "humantime_serde")]
    pub request_poll: Duration,
    /// How long a cancelled run may take to finish its running nodes before they are forced.
    #[serde(with = "humantime_serde")]
    pub cancel_timeout: Duration,
}

impl Default for SignalConfig {
    fn default() -> Self {
        Self {
            prefix: "runvisor".into(),
            stop_keys: vec![
                "agent_runtime_stopping:{app_id}:{chat_id}".into(),
                "{prefix}:stop:{{{thread}}}:{run_id}".into(),
            ],
            cancel_keys: vec![
                "{task_id}-cancel".into(),
                "{prefix}:cancel:{{{thread}}}:{run_id}".into(),
            ],
            tick: Duration::from_millis(100),
            flag_ttl: Duration::from_secs(60),
            request_wait: Duration::from_secs(5),
            request_poll: Duration::from_millis(50),
            cancel_timeout: Duration::from_secs(30),
        }
    }
}

/// Fills a key template; `None` when it names a label the run lacks (or is malformed).
pub fn render_key(
    template: &str,
    prefix: &str,
    labels: &RunLabels,
    thread: Option<&ThreadId>,
    run: Option<RunId>,
) -> Option<String> {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if tail.starts_with('}') {
            return None;
        } else {
            let end = tail.find('}')?;
            let value = match &tail[1..end] {
                "prefix" => Some(prefix.to_owned()),
                "app_id" => labels.app_id.clone(),
                "chat_id" => labels.chat_id.clone(),
                "task_id" => labels.task_id.clone(),
                "thread" => thread.map(ToString::to_string),
                "run_id" => run.map(|r| r.to_string()),
                _ => None,
            }?;
            if value.is_empty() {
                return None;
            }
            out.push_str(&value);
            rest = &tail[end + 1..];
        }
    }
    out.push_str(rest);
    Some(out)
}

/// The flags of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WatchedKeys {
    pub(crate) stop: Vec<String>,
    pub(crate) cancel: Vec<String>,
}

impl WatchedKeys {
    pub(crate) fn for_run(
        config: &SignalConfig,
        labels: &RunLabels,
        thread: &ThreadId,
        run: RunId,
    ) -> Self {
        let render = |templates: &[String]| {
            templates
                .iter()
                .filter_map(|t| render_key(t, &config.prefix, labels, Some(thread), Some(run)))
                .collect()
        };
        Self {
            stop: render(&config.stop_keys),
            cancel: render(&config.cancel_keys),
        }
    }

    pub(crate) fn all(&self) -> Vec<String> {
        self.stop.iter().chain(&self.cancel).cloned().collect()
    }
}

/// Messages the watcher handles.
#[derive(Debug)]
pub(crate) enum WatchMsg {
    Watch(RunId, WatchedKeys),
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
    pub(crate) services: Weak<Services>,
    pub(crate) errors: Arc<AtomicU64>,
}

struct Watched {
    keys: WatchedKeys,
    fired: Vec<Signal>,
}

pub(crate) struct WatcherState {
    source: Arc<dyn SignalSource>,
    services: Weak<Services>,
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
        let tick = args
            .services
            .upgrade()
            .map_or(Duration::from_millis(100), |s| s.config.signals.tick);
        Ok(WatcherState {
            source: args.source,
            services: args.services,
            runs: HashMap::new(),
            index: HashMap::new(),
            errors: args.errors,
            last_log: None,
            tick,
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
            WatchMsg::Watch(run, keys) => {
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
            WatchMsg::Tick | WatchMsg::Reread if state.services.strong_count() == 0 => {
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
        tokio::spawn(async move {
            let flags = match tokio::time::timeout(deadline, source.read(&keys)).await {
                Ok(Ok(flags)) => Ok(flags),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("signal read timed out after {deadline:?}")),
            };
            let _ = me.send_message(WatchMsg::Read(keys, flags, full));
        });
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
            let Some(services) = self.services.upgrade() else {
                return;
            };
            let (mode, reason) = match signal {
                Signal::Stop => (
                    StopMode::Graceful {
                        timeout: services.config.stop_timeout,
                    },
                    StopReason::UserInterrupted,
                ),
                Signal::Cancel => (
                    StopMode::Graceful {
                        timeout: services.config.signals.cancel_timeout,
                    },
                    StopReason::Cancelled,
                ),
            };
            tracing::info!(%run, key, ?signal, "flag set: stopping the run");
            tokio::spawn(async move {
                let _ = stop_run(&services, run, mode, reason).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_labels_and_literal_braces() {
        let labels = RunLabels::app_chat("app1", "chat9");
        let thread = ThreadId::new("t1").expect("id");
        let run = RunId::new();
        assert_eq!(
            render_key(
                "agent_runtime_stopping:{app_id}:{chat_id}",
                "p",
                &labels,
                None,
                None
            ),
            Some("agent_runtime_stopping:app1:chat9".into())
        );
        assert_eq!(
            render_key(
                "{prefix}:stop:{{{thread}}}:{run_id}",
                "rv",
                &labels,
                Some(&thread),
                Some(run)
            ),
            Some(format!("rv:stop:{{t1}}:{run}"))
        );
        assert_eq!(
            render_key("{task_id}-cancel", "p", &labels, None, None),
            None
        );
        assert_eq!(render_key("{nope}", "p", &labels, None, None), None);
        assert_eq!(render_key("a}b", "p", &labels, None, None), None);
        let keys = WatchedKeys::for_run(
            &SignalConfig::default(),
            &RunLabels::task("T"),
            &thread,
            run,
        );
        assert_eq!(keys.stop, vec![format!("runvisor:stop:{{t1}}:{run}")]);
        assert_eq!(
            keys.cancel,
            vec![
                "T-cancel".to_owned(),
                format!("runvisor:cancel:{{t1}}:{run}")
            ]
        );
    }
}
