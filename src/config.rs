//! The configuration file: JSON, every field optional, durations as humantime text.
//!
//! ```json
//! {
//!   "runtime": {"stop_timeout": "30s", "durability": "sync"},
//!   "redis": {"url": "redis://127.0.0.1:6379/0", "prefix": "runvisor"},
//!   "serve": {"listen": "127.0.0.1:8080", "body_limit": 4194304, "checkpoint_layout": "native"},
//!   "http": {"allow": ["localhost", "127.0.0.0/8", "::1", "api.example.com", "10.0.0.0/8"]},
//!   "log": "info,runvisor=debug"
//! }
//! ```
//!
//! A missing field takes its default; an unknown field is an error, so a typo never passes
//! silently. Errors name the file, the field and the position.

use std::path::{Path, PathBuf};

use runvisor_actors::RuntimeConfig;
use serde::{Deserialize, Serialize};

/// Everything a `runvisor` process can be configured with.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Engine settings: stop timeout, durability, signal keys, ...
    pub runtime: RuntimeConfig,
    /// Durable stores on Redis; absent, the embedded in-memory stores are used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<crate::redis::RedisConfig>,
    /// `runvisor serve`: the address, the bearer token, the body limit.
    pub serve: crate::serve::ServeConfig,
    /// The `http` node kind: the hosts it may call (loopback only by default).
    pub http: crate::http_node::HttpConfig,
    /// The log filter used when `RUST_LOG` is not set (`tracing_subscriber::EnvFilter`
    /// syntax, e.g. `"info"` or `"warn,runvisor_actors=debug"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
}

/// Why a config file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The file is not valid JSON or a field has a wrong name, type or value.
    #[error(
        "config file {}: {}{message} (line {line}, column {column})",
        path.display(),
        field_prefix(field)
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field, as a dotted path (`runtime.stop_timeout`); `None` for the whole document.
        field: Option<String>,
        /// What the parser said.
        message: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
}

/// `field `a.b`: ` before a message about a field; nothing for the document as a whole.
fn field_prefix(field: &Option<String>) -> String {
    field
        .as_ref()
        .map(|f| format!("field `{f}`: "))
        .unwrap_or_default()
}

impl Config {
    /// Reads a config file. An empty file means every default.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::from_json(&text, path)
    }

    /// Reads the config file if one is given, else returns the defaults.
    pub fn load_or_default(path: Option<&Path>) -> Result<Self, ConfigError> {
        path.map_or_else(|| Ok(Self::default()), Self::load)
    }

    /// Parses config text; `origin` names the file in errors.
    pub fn from_json(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let invalid = |field: Option<String>, e: &serde_json::Error| ConfigError::Invalid {
            path: origin.to_owned(),
            field,
            message: strip_position(&e.to_string()),
            line: e.line(),
            column: e.column(),
        };
        let mut de = serde_json::Deserializer::from_str(text);
        let config: Self = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            // No field for errors at the top level or where the parser lost track (`?`).
            let path = e.path();
            let known = path
                .iter()
                .any(|s| !matches!(s, serde_path_to_error::Segment::Unknown));
            invalid(known.then(|| path.to_string()), e.inner())
        })?;
        de.end().map_err(|e| invalid(None, &e))?;
        Ok(config)
    }
}

/// serde_json appends " at line L column C" to its messages; the error reports those itself.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::from_json(text, Path::new("runvisor.json")).map_err(|e| e.to_string())
    }

    #[test]
    fn checkpoint_ops_defaults_are_read_and_checked() {
        let config =
            parse(r#"{"serve": {"checkpoint_layout": "compat", "checkpoint_keep_count": 3}}"#)
                .expect("valid");
        assert_eq!(
            config.serve.checkpoint_layout,
            crate::redis::retention::Layout::Compat
        );
        assert_eq!(config.serve.checkpoint_keep_count.get(), 3);
        assert_eq!(
            Config::default().serve.checkpoint_keep_count.get(),
            10,
            "the seed's CHECKPOINT_KEEP_COUNT"
        );
        let zero = parse(r#"{"serve": {"checkpoint_keep_count": 0}}"#).expect_err("refused");
        assert!(zero.contains("serve.checkpoint_keep_count"), "{zero}");
        let bad = parse(r#"{"serve": {"checkpoint_layout": "other"}}"#).expect_err("refused");
        assert!(bad.contains("serve.checkpoint_layout"), "{bad}");
    }

    #[test]
    fn absent_fields_take_defaults() {
        assert_eq!(parse(""), Ok(Config::default()));
        assert_eq!(parse("{}"), Ok(Config::default()));
        assert_eq!(Config::load_or_default(None).ok(), Some(Config::default()));
        let config = parse(r#"{"runtime": {"stop_timeout": "2s 500ms"}}"#).expect("valid");
        assert_eq!(config.runtime.stop_timeout, Duration::from_millis(2500));
        assert_eq!(
            config.runtime.event_buffer,
            RuntimeConfig::default().event_buffer
        );
        assert_eq!(config.log, None);
    }

    #[test]
    fn a_history_window_is_a_count_of_messages() {
        let config = parse(r#"{"runtime": {"history_window": 20}}"#).expect("valid");
        assert_eq!(config.runtime.history_window, Some(20));
        assert_eq!(RuntimeConfig::default().history_window, None);
        let refused = parse(r#"{"runtime": {"history_window": -1}}"#).expect_err("negative");
        assert!(
            refused.to_string().contains("runtime.history_window"),
            "{refused}"
        );
    }

    #[test]
    fn kept_outcomes_are_bounded_by_a_count_and_a_number_of_bytes() {
        let config =
            parse(r#"{"runtime": {"finished_outcomes": 10, "finished_outcomes_bytes": 1048576}}"#)
                .expect("valid");
        assert_eq!(
            (
                config.runtime.finished_outcomes,
                config.runtime.finished_outcomes_bytes
            ),
            (10, 1 << 20)
        );
        let default = RuntimeConfig::default();
        assert_eq!(
            (default.finished_outcomes, default.finished_outcomes_bytes),
            (1024, 64 << 20)
        );
        let refused =
            parse(r#"{"runtime": {"finished_outcomes_bytes": "64MiB"}}"#).expect_err("a text");
        assert!(
            refused
                .to_string()
                .contains("runtime.finished_outcomes_bytes"),
            "{refused}"
        );
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let cases = [
            (
                r#"{"runtime": {"stop_timeout": "soon"}}"#,
                "config file runvisor.json: field `runtime.stop_timeout`: ",
            ),
            (
                r#"{"runtime": {"event_buffer": "big"}}"#,
                "field `runtime.event_buffer`: invalid type",
            ),
            (
                r#"{"runtime": {"stop_timout": "1s"}}"#,
                "field `runtime.stop_timout`: unknown field `stop_timout`, expected one of",
            ),
            (r#"{"logs": "info"}"#, "unknown field `logs`"),
            (
                r#"{"serve": {"listen": "localhost"}}"#,
                "field `serve.listen`: invalid socket address",
            ),
            (r#"{"serve": {"tokn": "x"}}"#, "unknown field `tokn`"),
            (
                r#"{"http": {"allow": ["a b"]}}"#,
                "field `http.allow`: \"a b\" is not a host name",
            ),
            (r#"{"log": "info"} x"#, "trailing characters (line 1"),
            (
                "{",
                "runvisor.json: EOF while parsing an object (line 1, column 1)",
            ),
        ];
        for (text, want) in cases {
            let got = parse(text).expect_err(text);
            assert!(got.contains(want), "{text}: {got}");
            assert!(!got.contains('\n'), "one line: {got}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = Config::load(Path::new("/nonexistent/runvisor.json"))
            .expect_err("missing")
            .to_string();
        assert!(
            err.starts_with("cannot read config file /nonexistent/runvisor.json: "),
            "{err}"
        );
    }

    #[test]
    fn round_trips_through_json() {
        let config = Config {
            runtime: RuntimeConfig {
                stop_timeout: Duration::from_secs(5),
                ..RuntimeConfig::default()
            },
            redis: Some(crate::redis::RedisConfig::new("redis://127.0.0.1:6400/0")),
            serve: crate::serve::ServeConfig {
                token: Some("secret".into()),
                ..Default::default()
            },
            http: crate::http_node::HttpConfig {
                allow: crate::http_node::AllowList::new(["api.example.com", "10.0.0.0/8"])
                    .expect("valid entries"),
            },
            log: Some("debug".into()),
        };
        let text = serde_json::to_string(&config).expect("serializes");
        assert!(text.contains(r#""stop_timeout":"5s""#), "{text}");
        assert_eq!(parse(&text), Ok(config));
    }
}
