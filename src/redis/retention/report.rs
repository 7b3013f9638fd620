//! What checkpoint stats and cleanup answer: the `data` part of the checkpoint-ops seed's
//! responses, field for field (`operation_type`, `total_users`, `keep_count`, `details`, ...),
//! plus the layout they were computed on.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::Layout;

/// Checkpoint counts of one thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCount {
    /// The thread.
    pub thread_id: String,
    /// Its checkpoints.
    pub checkpoint_count: u64,
}

/// Checkpoint counts of one user's threads, within [`SystemStats`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserSummary {
    /// The user; `null` for the threads of runs without a user label (native layout only).
    pub user_id: Option<String>,
    /// How many of their threads have checkpoints.
    pub thread_count: u64,
    /// Their checkpoints, all threads together.
    pub total_checkpoints: u64,
    /// Each thread, in thread id order.
    pub threads: Vec<ThreadCount>,
}

/// Stats of every user (`operation_type: "system_stats"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemStats {
    /// Always `"system_stats"`.
    pub operation_type: String,
    /// Users with checkpoints (the `null` user of unlabelled runs is not counted).
    pub total_users: u64,
    /// Threads with checkpoints.
    pub total_threads: u64,
    /// Checkpoints.
    pub total_checkpoints: u64,
    /// Each user, in user id order (the `null` user last).
    pub users: Vec<UserSummary>,
    /// When the stats were taken (RFC 3339, UTC).
    pub timestamp: String,
    /// The layout counted.
    pub layout: Layout,
}

/// Stats of one user (`operation_type: "user_stats"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserStats {
    /// Always `"user_stats"`.
    pub operation_type: String,
    /// The user.
    pub user_id: String,
    /// How many of their threads have checkpoints.
    pub thread_count: u64,
    /// Their checkpoints.
    pub total_checkpoints: u64,
    /// Each thread, in thread id order.
    pub threads: Vec<ThreadCount>,
    /// When the stats were taken (RFC 3339, UTC).
    pub timestamp: String,
    /// The layout counted.
    pub layout: Layout,
}

/// What `stats` answers: every user, or one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stats {
    /// Every user.
    System(SystemStats),
    /// One user.
    User(UserStats),
}

/// What cleanup did to one thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCleanup {
    /// Checkpoints before.
    pub original_count: u64,
    /// Checkpoints deleted.
    pub deleted_count: u64,
    /// Checkpoints left.
    pub remaining_count: u64,
    /// `"success"`.
    pub status: String,
}

/// What `cleanup` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupReport {
    /// `"cleanup_all"`, `"cleanup_user"` or `"cleanup_thread"`.
    pub operation_type: String,
    /// `"all"`, the user or the thread.
    pub target: String,
    /// How many checkpoints each thread was left with at most.
    pub keep_count: usize,
    /// Threads with checkpoints that were looked at.
    pub total_processed: u64,
    /// Checkpoints deleted, all threads together.
    pub total_deleted: u64,
    /// Each thread with checkpoints, by thread id.
    pub details: BTreeMap<String, ThreadCleanup>,
    /// When the cleanup ended (RFC 3339, UTC).
    pub timestamp: String,
    /// The layout cleaned.
    pub layout: Layout,
}

/// Now, as the reports give it: `2025-01-31T10:30:00Z`.
pub(crate) fn timestamp() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Groups thread counts by user into system stats; `user_of` names each thread's users (a
/// thread may be several users'; `None`: a thread of no user).
pub(crate) fn system_stats(
    layout: Layout,
    counts: &BTreeMap<String, u64>,
    users: &BTreeMap<Option<String>, Vec<String>>,
) -> SystemStats {
    let mut summaries = Vec::new();
    let mut threads_seen = std::collections::BTreeSet::new();
    // BTreeMap order puts `None` first: named users first, then the unlabelled threads.
    let named = users.iter().filter(|(u, _)| u.is_some());
    let unnamed = users.iter().filter(|(u, _)| u.is_none());
    for (user, threads) in named.chain(unnamed) {
        let mut listed: Vec<ThreadCount> = threads
            .iter()
            .filter_map(|t| {
                let count = counts.get(t).copied().unwrap_or(0);
                (count > 0).then(|| ThreadCount {
                    thread_id: t.clone(),
                    checkpoint_count: count,
                })
            })
            .collect();
        listed.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
        listed.dedup_by(|a, b| a.thread_id == b.thread_id);
        if listed.is_empty() {
            continue;
        }
        threads_seen.extend(listed.iter().map(|t| t.thread_id.clone()));
        summaries.push(UserSummary {
            user_id: user.clone(),
            thread_count: listed.len() as u64,
            total_checkpoints: listed.iter().map(|t| t.checkpoint_count).sum(),
            threads: listed,
        });
    }
    SystemStats {
        operation_type: "system_stats".to_owned(),
        total_users: summaries.iter().filter(|u| u.user_id.is_some()).count() as u64,
        total_threads: threads_seen.len() as u64,
        total_checkpoints: threads_seen
            .iter()
            .map(|t| counts.get(t).copied().unwrap_or(0))
            .sum(),
        users: summaries,
        timestamp: timestamp(),
        layout,
    }
}

/// The stats of one user's threads.
pub(crate) fn user_stats(layout: Layout, user: &str, counts: &BTreeMap<String, u64>) -> UserStats {
    let threads: Vec<ThreadCount> = counts
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(t, count)| ThreadCount {
            thread_id: t.clone(),
            checkpoint_count: *count,
        })
        .collect();
    UserStats {
        operation_type: "user_stats".to_owned(),
        user_id: user.to_owned(),
        thread_count: threads.len() as u64,
        total_checkpoints: threads.iter().map(|t| t.checkpoint_count).sum(),
        threads,
        timestamp: timestamp(),
        layout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_have_the_seed_shape() {
        let counts: BTreeMap<String, u64> = [
            ("wang1:1".to_owned(), 36),
            ("wang1:2".to_owned(), 16),
            ("wang2:1".to_owned(), 16),
            ("solo".to_owned(), 3),
            ("empty".to_owned(), 0),
        ]
        .into_iter()
        .collect();
        let users: BTreeMap<Option<String>, Vec<String>> = [
            (None, vec!["solo".to_owned(), "empty".to_owned()]),
            (
                Some("wang1".to_owned()),
                vec!["wang1:2".to_owned(), "wang1:1".to_owned()],
            ),
            (Some("wang2".to_owned()), vec!["wang2:1".to_owned()]),
            (Some("ghost".to_owned()), vec!["empty".to_owned()]),
        ]
        .into_iter()
        .collect();
        let stats = system_stats(Layout::Native, &counts, &users);
        assert_eq!(stats.total_users, 2);
        assert_eq!(stats.total_threads, 4);
        assert_eq!(stats.total_checkpoints, 71);
        let json = serde_json::to_value(Stats::System(stats)).expect("serializes");
        assert_eq!(json["operation_type"], "system_stats");
        assert_eq!(json["users"][0]["user_id"], "wang1");
        assert_eq!(json["users"][0]["thread_count"], 2);
        assert_eq!(json["users"][0]["total_checkpoints"], 52);
        assert_eq!(json["users"][0]["threads"][0]["thread_id"], "wang1:1");
        assert_eq!(json["users"][0]["threads"][0]["checkpoint_count"], 36);
        assert_eq!(json["users"][2]["user_id"], serde_json::Value::Null);
        assert_eq!(json["layout"], "native");
        assert!(json["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));

        let one = user_stats(Layout::Compat, "wang2", &counts);
        let json = serde_json::to_value(Stats::User(one)).expect("serializes");
        assert_eq!(json["operation_type"], "user_stats");
        assert_eq!(json["user_id"], "wang2");
        assert_eq!(json["thread_count"], 4);
        assert_eq!(json["layout"], "compat");
    }
}
