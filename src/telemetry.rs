//! Logging setup: `tracing` events go to stderr, filtered by `RUST_LOG` (or a default), so a
//! command's own output on stdout stays clean.
//!
//! An OpenTelemetry exporter (when `OTEL_EXPORTER_OTLP_ENDPOINT` is set) will hang off the same
//! subscriber.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `RUST_LOG` could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ignoring RUST_LOG={value:?} ({reason}); using {used:?}")]
pub struct InvalidFilter {
    /// The filter as given.
    pub value: String,
    /// Why it was refused.
    pub reason: String,
    /// The filter used instead.
    pub used: String,
}

/// Installs the global subscriber: formatted events on stderr, filtered by `RUST_LOG` when it is
/// set, else by `default_filter` (`EnvFilter` syntax: `"warn"`, `"info,runvisor=debug"`).
///
/// A subscriber is always installed: an unusable `RUST_LOG` falls back to the default and is
/// reported as the error, for the caller to print as a warning. If a global subscriber is set
/// already (a second call, a test harness), that one stays.
pub fn init(default_filter: &str) -> Result<(), InvalidFilter> {
    let (filter, problem) = choose_filter(std::env::var("RUST_LOG").ok(), default_filter);
    let _already_set = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    problem.map_or(Ok(()), Err)
}

/// The filter to use, and why `RUST_LOG` was not it when it was set but unusable.
fn choose_filter(
    rust_log: Option<String>,
    default_filter: &str,
) -> (EnvFilter, Option<InvalidFilter>) {
    let default = || {
        EnvFilter::try_new(default_filter)
            .map(|f| (f, default_filter.to_owned()))
            .unwrap_or_else(|_| (EnvFilter::new("warn"), "warn".to_owned()))
    };
    match rust_log.filter(|v| !v.trim().is_empty()) {
        None => (default().0, None),
        Some(value) => match EnvFilter::try_new(&value) {
            Ok(filter) => (filter, None),
            Err(e) => {
                let (filter, used) = default();
                let problem = InvalidFilter {
                    value,
                    reason: e.to_string(),
                    used,
                };
                (filter, Some(problem))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_wins_when_usable() {
        let (filter, problem) = choose_filter(Some("debug".into()), "warn");
        assert_eq!(filter.to_string(), "debug");
        assert_eq!(problem, None);
        let (filter, problem) = choose_filter(None, "info");
        assert_eq!(filter.to_string(), "info");
        assert_eq!(problem, None);
        let (filter, _) = choose_filter(Some("  ".into()), "info");
        assert_eq!(filter.to_string(), "info");
    }

    #[test]
    fn a_bad_filter_falls_back_and_says_so() {
        let (filter, problem) = choose_filter(Some("=[".into()), "info");
        assert_eq!(filter.to_string(), "info");
        let problem = problem.expect("reported");
        assert_eq!(problem.used, "info");
        assert!(problem.to_string().starts_with("ignoring RUST_LOG=\"=[\""));
        let (filter, _) = choose_filter(None, "=[");
        assert_eq!(filter.to_string(), "warn");
    }
}
