//! Stop requests from anywhere: set a run's stop or cancel flag in the signal source, publish
//! it, and wait (bounded) until the run has ended, as the FastGPT stop API does: the answer
//! says whether the run ended within the wait, and whether the flag could be set at all (a
//! signal source that fails is retried until the store deadline; one that refuses is not). A
//! request for labels no live run carries sets no flag and says so: a flag left behind would
//! stop the next run of those labels.

use std::time::Duration;

use futures::StreamExt;

use super::facade::Runtime;
use super::ops::RunQuery;
use crate::model::{RunLabels, RunStatus, StoreError};
use crate::persist::retry;
use crate::persist::{Notice, render_key};
/// What a stop or cancel request did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StopRequest {
    /// The flag set.
    pub key: String,
    /// Whether the run ended (its flag was cleared) within the wait.
    pub ended: bool,
    /// How long the request waited.
    pub waited: Duration,
    /// A signal source error, if setting or watching the flag failed.
    pub error: Option<String>,
    /// No run of these labels was running (in any process sharing the stores): no flag was
    /// set.
    pub no_live_run: bool,
    /// Why the flag could not be set, if it could not (the signal source refused, or kept
    /// failing until the store deadline): then nothing was requested.
    pub flag_error: Option<StoreError>,
}

impl Runtime {
    /// Asks the run of a FastGPT app and chat to stop (from any process sharing the signal
    /// source): sets `agent_runtime_stopping:{app_id}:{chat_id}` (per the configured stop
    /// templates), publishes it, and waits up to the configured time for the run to end.
    /// An id that is not valid (see [`RunLabels`]) is reported in the answer's `error`.
    pub async fn request_stop(&self, app_id: &str, chat_id: &str) -> StopRequest {
        let labels = match RunLabels::app_chat(app_id, chat_id) {
            Ok(labels) => labels,
            Err(e) => return refused(e),
        };
        match self.first_key(&self.config().signals.stop_keys, &labels) {
            Some(key) => self.request_for(&labels, &key).await,
            None => no_template("stop", "app_id and chat_id"),
        }
    }

    /// Asks the run of a RAGFlow task to cancel: sets `{task_id}-cancel` (per the configured
    /// cancel templates), publishes it, and waits up to the configured time for the run to end.
    /// An id that is not valid (see [`RunLabels`]) is reported in the answer's `error`.
    pub async fn request_cancel(&self, task_id: &str) -> StopRequest {
        let labels = match RunLabels::task(task_id) {
            Ok(labels) => labels,
            Err(e) => return refused(e),
        };
        match self.first_key(&self.config().signals.cancel_keys, &labels) {
            Some(key) => self.request_for(&labels, &key).await,
            None => no_template("cancel", "task_id"),
        }
    }

    /// Sets `key` if a run of `labels` is running, in any process; answers "no live run"
    /// without setting anything otherwise. When the runs cannot be listed, the flag is set
    /// anyway (a live run would otherwise miss its stop) and the error is reported.
    async fn request_for(&self, labels: &RunLabels, key: &str) -> StopRequest {
        let query = RunQuery {
            statuses: vec![RunStatus::Running],
            app_id: labels.app_id().map(str::to_owned),
            chat_id: labels.chat_id().map(str::to_owned),
            task_id: labels.task_id().map(str::to_owned),
            limit: 1,
            ..RunQuery::default()
        };
        match self.list_runs(&query).await {
            Ok(live) if live.is_empty() => StopRequest {
                key: key.to_owned(),
                ended: false,
                waited: Duration::ZERO,
                error: None,
                no_live_run: true,
                flag_error: None,
            },
            Ok(_) => self.request_flag(key).await,
            Err(e) => {
                let mut request = self.request_flag(key).await;
                request
                    .error
                    .get_or_insert(format!("could not list the live runs: {e}"));
                request
            }
        }
    }

    fn first_key(&self, templates: &[String], labels: &RunLabels) -> Option<String> {
        let prefix = &self.config().signals.prefix;
        templates
            .iter()
            .find_map(|t| render_key(t, prefix, labels, None, None))
    }

    /// Sets a flag by its key, publishes it, and waits for its run to end (the flag cleared):
    /// learned from a published notice, or by re-reading the flag as a fallback. Repeated and
    /// concurrent requests are safe: they set the same flag and wait for the same end.
    pub async fn request_flag(&self, key: &str) -> StopRequest {
        let config = &self.config().signals;
        let started = tokio::time::Instant::now();
        let source = self.signal_source();
        let done = |ended: bool, error: Option<String>| StopRequest {
            key: key.to_owned(),
            ended,
            waited: started.elapsed(),
            error,
            no_live_run: false,
            flag_error: None,
        };
        // Subscribe before raising, so the run's "cleared" notice cannot slip by.
        let mut notices = source.subscribe().await.ok();
        let deadline = started + self.config().store_deadline;
        if let Err(gave_up) = retry::until(deadline, || source.raise(key, config.flag_ttl)).await {
            return StopRequest {
                flag_error: Some(gave_up.error.clone()),
                ..done(false, Some(gave_up.error.to_string()))
            };
        }
        let raised = Notice {
            key: key.to_owned(),
            raised: true,
        };
        let mut error = source.notify(&raised).await.err().map(|e| e.to_string());
        let deadline = started + config.request_wait;
        let keys = [key.to_owned()];
        loop {
            let poll = tokio::time::sleep(
                config
                    .request_poll
                    .min(deadline.saturating_duration_since(tokio::time::Instant::now())),
            );
            let notice = async {
                match notices.as_mut() {
                    Some(stream) => stream.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                n = notice => match n {
                    Some(n) if n.key == key && !n.raised => return done(true, error),
                    Some(_) => continue,
                    // The subscription broke: fall back to polling.
                    None => notices = None,
                },
                () = poll => {}
            }
            match source.read(&keys).await {
                Ok(flags) if flags.first() == Some(&false) => return done(true, error),
                Ok(_) => {}
                Err(e) => error = Some(e.to_string()),
            }
            if tokio::time::Instant::now() >= deadline {
                return done(false, error);
            }
        }
    }
}

fn no_template(what: &str, labels: &str) -> StopRequest {
    StopRequest {
        key: String::new(),
        ended: false,
        waited: Duration::ZERO,
        error: Some(format!("no {what} key template uses only {labels}")),
        no_live_run: false,
        flag_error: None,
    }
}

fn refused(error: crate::model::InvalidId) -> StopRequest {
    StopRequest {
        key: String::new(),
        ended: false,
        waited: Duration::ZERO,
        error: Some(error.to_string()),
        no_live_run: false,
        flag_error: None,
    }
}
