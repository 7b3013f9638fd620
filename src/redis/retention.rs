//! Bounded checkpoint storage: how many checkpoints each thread keeps ([`KeepCheckpoints`],
//! enforced by every checkpoint write), and checkpoint stats and cleanup across threads
//! ([`CheckpointOps`]), as `runvisor checkpoints stats|cleanup` and the checkpoint-ops seed's
//! API ask them.
//!
//! Two layouts ([`Layout`]):
//!
//! - **native**: runvisor's own keys. Threads are found through indexes written with run
//!   records (`<p>:threads`, `<p>:threads:<user_id>`, `<p>:users`; see the
//!   [key layout](super)), never by scanning the keyspace. Each thread is counted or trimmed
//!   by one script in its own slot at a time, at most 1,000 index entries per script: the
//!   oldest payloads, their index entries and the sequence keys of their runs go together
//!   (the sequence of the run holding the thread's lease stays), and entries whose payload
//!   expired are dropped. Many threads' scripts travel in one pipeline (one per node on a
//!   cluster).
//! - **compat**: keys `checkpoint:<user_id>:<timestamp>:<checkpoint_id>`, as a LangGraph-based
//!   agent writes them, whose thread is `<user_id>:<timestamp>`. They are found by `SCAN`
//!   (never `KEYS`) on every primary, 1,000 keys asked per call, grouped by thread, sorted by
//!   key (the checkpoint ids are time-ordered) and deleted with pipelined `UNLINK`s (on a
//!   cluster, one per slot). A user or thread id enters a `MATCH` pattern only glob-escaped
//!   ([`glob_escape`]), and only once checked: a compat user id holds no `:`, a compat thread
//!   id is `<user_id>:<timestamp>`.
//!
//! The reports ([`Stats`], [`CleanupReport`]) carry the seed's field names.

mod compat;
mod native;
mod report;

use std::fmt;

use serde::{Deserialize, Serialize};

use runvisor_actors::{RunLabels, StoreError, ThreadId};

use super::RedisStores;
use super::checkpoint::ThreadScripts;
use super::conn::Conn;
use super::keys::Keys;

pub use compat::glob_escape;
pub use report::{
    CleanupReport, Stats, SystemStats, ThreadCleanup, ThreadCount, UserStats, UserSummary,
};

/// How many of its checkpoints, or of its ended runs' records, each thread keeps: the newest
/// `n`, or all of them. In config files a number or `"all"`; the default is 20.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The newest `n` (at least 1).
    Newest(usize),
    /// Every one, until it expires.
    All,
}

/// How many checkpoints each thread keeps ([`RedisConfig::keep_checkpoints`](super::RedisConfig::keep_checkpoints)).
pub type KeepCheckpoints = Keep;

impl Keep {
    /// The default: the newest 20.
    pub const DEFAULT: Self =
        Self::Newest(runvisor_actors::store::memory::DEFAULT_KEEP_CHECKPOINTS);

    /// How many a thread keeps; `None`: all.
    pub fn limit(&self) -> Option<usize> {
        match self {
            Self::Newest(n) => Some(*n),
            Self::All => None,
        }
    }
}

impl Default for Keep {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Newest(n) => write!(f, "{n}"),
            Self::All => f.write_str("all"),
        }
    }
}

impl Serialize for Keep {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Newest(n) => serializer.serialize_u64(*n as u64),
            Self::All => serializer.serialize_str("all"),
        }
    }
}

impl<'de> Deserialize<'de> for Keep {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Keep;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or \"all\"")
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
                usize::try_from(n)
                    .map(Keep::Newest)
                    .map_err(|_| E::custom("too many to keep"))
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
                u64::try_from(n)
                    .map_err(|_| E::custom("a number to keep cannot be negative"))
                    .and_then(|n| self.visit_u64(n))
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
                match text {
                    "all" => Ok(Keep::All),
                    other => other.parse::<usize>().map(Keep::Newest).map_err(|_| {
                        E::custom(format!("expected a number or \"all\", got {other:?}"))
                    }),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Which keys checkpoint ops work on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// runvisor's own keys, found through its indexes.
    Native,
    /// `checkpoint:<user_id>:<timestamp>:<checkpoint_id>` keys, found by `SCAN`.
    Compat,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Compat => "compat",
        })
    }
}

/// Which threads a cleanup works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every thread.
    All,
    /// Every thread of one user.
    User(String),
    /// One thread.
    Thread(String),
}

impl Scope {
    fn operation_type(&self) -> &'static str {
        match self {
            Self::All => "cleanup_all",
            Self::User(_) => "cleanup_user",
            Self::Thread(_) => "cleanup_thread",
        }
    }

    fn target(&self) -> &str {
        match self {
            Self::All => "all",
            Self::User(user) => user,
            Self::Thread(thread) => thread,
        }
    }
}

/// Why checkpoint stats or cleanup failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RetentionError {
    /// A user id that the layout cannot hold.
    #[error("invalid user id {user:?}: {reason}")]
    InvalidUser {
        /// The id given.
        user: String,
        /// Why it was refused.
        reason: String,
    },
    /// A thread id that the layout cannot hold.
    #[error("invalid thread id {thread:?}: {reason}")]
    InvalidThread {
        /// The id given.
        thread: String,
        /// Why it was refused.
        reason: String,
    },
    /// Redis failed or refused; `deleted` checkpoints had been deleted by then.
    #[error("{what}: {error} ({deleted} checkpoints deleted before)")]
    Store {
        /// What was being done (`trimming thread chat-7`, `SCAN on node 10.0.0.1:7000`).
        what: String,
        /// What Redis said.
        error: StoreError,
        /// Checkpoints deleted before the failure.
        deleted: u64,
    },
}

impl RetentionError {
    /// The seed's error type: `INVALID_THREAD_ID`, `INVALID_USER_ID`, `REDIS_CONNECTION_ERROR`
    /// (Redis unreachable or silent) or `DELETE_FAILED` (Redis refused).
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::InvalidUser { .. } => "INVALID_USER_ID",
            Self::InvalidThread { .. } => "INVALID_THREAD_ID",
            Self::Store {
                error: StoreError::Unavailable(_) | StoreError::Timeout(_),
                ..
            } => "REDIS_CONNECTION_ERROR",
            Self::Store { .. } => "DELETE_FAILED",
        }
    }

    fn store(what: impl Into<String>, deleted: u64) -> impl FnOnce(StoreError) -> Self {
        move |error| Self::Store {
            what: what.into(),
            error,
            deleted,
        }
    }
}

/// Checkpoint stats and cleanup on the stores' Redis. Made by [`RedisStores::checkpoint_ops`];
/// cheap to clone.
#[derive(Clone)]
pub struct CheckpointOps {
    conn: Conn,
    keys: Keys,
    scripts: ThreadScripts,
    scan_count: usize,
}

impl fmt::Debug for CheckpointOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointOps")
            .field("keys", &self.keys)
            .field("scan_count", &self.scan_count)
            .finish_non_exhaustive()
    }
}

impl RedisStores {
    /// Checkpoint stats and cleanup on these stores' Redis.
    pub fn checkpoint_ops(&self) -> CheckpointOps {
        CheckpointOps {
            conn: self.conn.clone(),
            keys: self.keys.clone(),
            scripts: ThreadScripts::new(),
            scan_count: compat::SCAN_COUNT,
        }
    }
}

impl CheckpointOps {
    /// How many keys each `SCAN` call asks for (compat layout; default 1,000).
    pub fn scan_count(mut self, count: usize) -> Self {
        self.scan_count = count.max(1);
        self
    }

    /// Counts checkpoints per thread, for every user or for one.
    pub async fn stats(&self, layout: Layout, user: Option<&str>) -> Result<Stats, RetentionError> {
        match layout {
            Layout::Native => {
                let user = user.map(native_user).transpose()?;
                native::stats(self, user.as_deref()).await
            }
            Layout::Compat => {
                let user = user.map(compat::check_user).transpose()?;
                compat::stats(self, user).await
            }
        }
    }

    /// Deletes all but the newest `keep` checkpoints of each thread in the scope.
    pub async fn cleanup(
        &self,
        layout: Layout,
        scope: &Scope,
        keep: usize,
    ) -> Result<CleanupReport, RetentionError> {
        let details = match layout {
            Layout::Native => native::cleanup(self, scope, keep).await?,
            Layout::Compat => compat::cleanup(self, scope, keep).await?,
        };
        Ok(CleanupReport {
            operation_type: scope.operation_type().to_owned(),
            target: scope.target().to_owned(),
            keep_count: keep,
            total_processed: details.len() as u64,
            total_deleted: details.values().map(|d| d.deleted_count).sum(),
            details,
            timestamp: report::timestamp(),
            layout,
        })
    }
}

/// A user id as run labels accept it.
fn native_user(user: &str) -> Result<String, RetentionError> {
    RunLabels::default()
        .with_user(user)
        .map(|_| user.to_owned())
        .map_err(|e| RetentionError::InvalidUser {
            user: user.to_owned(),
            reason: e.reason.to_owned(),
        })
}

/// A thread id as runs accept it.
fn native_thread(thread: &str) -> Result<ThreadId, RetentionError> {
    ThreadId::new(thread).map_err(|e| RetentionError::InvalidThread {
        thread: thread.to_owned(),
        reason: e.reason.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_reads_numbers_and_all() {
        let read = |json: &str| serde_json::from_str::<KeepCheckpoints>(json);
        assert_eq!(read("20").ok(), Some(KeepCheckpoints::Newest(20)));
        assert_eq!(read("\"all\"").ok(), Some(KeepCheckpoints::All));
        assert_eq!(read("\"5\"").ok(), Some(KeepCheckpoints::Newest(5)));
        assert!(read("-1").is_err());
        assert!(read("\"some\"").is_err());
        assert!(read("1.5").is_err());
        assert_eq!(
            serde_json::to_string(&KeepCheckpoints::All).ok().as_deref(),
            Some("\"all\"")
        );
        assert_eq!(KeepCheckpoints::default().limit(), Some(20));
        assert_eq!(KeepCheckpoints::All.limit(), None);
    }

    #[test]
    fn error_types_are_the_seeds() {
        let store = |error| RetentionError::Store {
            what: "x".into(),
            error,
            deleted: 0,
        };
        assert_eq!(
            store(StoreError::Timeout(std::time::Duration::from_secs(1))).error_type(),
            "REDIS_CONNECTION_ERROR"
        );
        assert_eq!(
            store(StoreError::Corrupt {
                key: "k".into(),
                reason: "r".into()
            })
            .error_type(),
            "DELETE_FAILED"
        );
        assert!(native_thread("a b").is_err());
        assert!(native_user("").is_err());
        assert_eq!(native_user("wang1").ok().as_deref(), Some("wang1"));
    }
}
