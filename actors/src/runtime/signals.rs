//! Stop requests from anywhere: set a run's stop or cancel flag in the signal source, publish
//! it, and wait (bounded) until the run has ended, as the FastGPT stop API does: the answer is
//! a success either way, saying whether the run ended within the wait.

use std::time::Duration;

use futures::StreamExt;

use super::facade::Runtime;
use crate::model::RunLabels;
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
            Some(key) => self.request_flag(&key).await,
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
            Some(key) => self.request_flag(&key).await,
            None => no_template("cancel", "task_id"),
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
        };
        // Subscribe before raising, so the run's "cleared" notice cannot slip by.
        let mut notices = source.subscribe().await.ok();
        if let Err(e) = source.raise(key, config.flag_ttl).await {
            return done(false, Some(e.to_string()));
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
    }
}

fn refused(error: crate::model::InvalidId) -> StopRequest {
    StopRequest {
        key: String::new(),
        ended: false,
        waited: Duration::ZERO,
        error: Some(error.to_string()),
    }
}
