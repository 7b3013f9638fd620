//! Signal key naming: how a run's stop and cancel flags are named from its labels.
//!
//! Key templates name a run's flags from its labels: `{app_id}`, `{chat_id}`, `{task_id}`,
//! `{thread}`, `{run_id}`, `{prefix}`; `{{` and `}}` are literal braces (Redis Cluster hash
//! tags). A template naming a label the run does not have gives no key.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::{RunId, RunLabels, ThreadId};

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

/// A label as keys carry it: as it is, except `%` and `:` (written `%25` and `%3A`), so that
/// two different labels never make one key (app `a:b` with chat `c`, and app `a` with chat
/// `b:c`, would otherwise both stop at `agent_runtime_stopping:a:b:c`). Ids of the systems the
/// key formats come from (hexadecimal object ids, UUIDs) have neither and stay as they are.
pub fn escape_label(label: &str) -> String {
    if !label.contains(['%', ':']) {
        return label.to_owned();
    }
    let mut out = String::with_capacity(label.len() + 8);
    for c in label.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    out
}

/// Fills a key template; `None` when it names a label the run lacks (or is malformed). Labels
/// are escaped ([`escape_label`]).
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
                "app_id" => labels.app_id().map(escape_label),
                "chat_id" => labels.chat_id().map(escape_label),
                "task_id" => labels.task_id().map(escape_label),
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

    /// The flags named after the run's labels alone (not its thread or id): the ones other
    /// systems set (`agent_runtime_stopping:<app>:<chat>`, `<task>-cancel`), which a request
    /// made before this run may have left behind.
    pub(crate) fn by_labels(config: &SignalConfig, labels: &RunLabels) -> Vec<String> {
        config
            .stop_keys
            .iter()
            .chain(&config.cancel_keys)
            .filter_map(|t| render_key(t, &config.prefix, labels, None, None))
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<String> {
        self.stop.iter().chain(&self.cancel).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_labels_and_literal_braces() {
        let labels = RunLabels::app_chat("app1", "chat9").expect("valid labels");
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
        // Labels with separators never make another target's key.
        let stop = "agent_runtime_stopping:{app_id}:{chat_id}";
        let one = RunLabels::app_chat("a:b", "c").expect("valid");
        let two = RunLabels::app_chat("a", "b:c").expect("valid");
        let key = |l: &RunLabels| render_key(stop, "p", l, None, None);
        assert_ne!(key(&one), key(&two));
        assert_eq!(key(&one).as_deref(), Some("agent_runtime_stopping:a%3Ab:c"));
        assert_eq!(key(&two).as_deref(), Some("agent_runtime_stopping:a:b%3Ac"));
        let three = RunLabels::app_chat("a%3Ab", "c").expect("valid");
        assert_ne!(key(&one), key(&three));
        assert_eq!(render_key("a}b", "p", &labels, None, None), None);
        let keys = WatchedKeys::for_run(
            &SignalConfig::default(),
            &RunLabels::task("T").expect("valid label"),
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
