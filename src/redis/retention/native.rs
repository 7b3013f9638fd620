//! Checkpoint stats and cleanup on runvisor's own layout: threads from the run indexes, one
//! script per thread in its slot (many threads' scripts per pipeline), no keyspace scan.

use std::collections::{BTreeMap, BTreeSet};

use ::redis::Value;
use runvisor_actors::{StoreError, ThreadId};

use super::report::{self, ThreadCleanup};
use super::{CheckpointOps, Layout, RetentionError, Scope, Stats, native_thread};
use crate::redis::checkpoint::{THREAD_BUDGET, Trimmed, counted};
use crate::redis::reply;

/// How many threads' count scripts one pipeline carries.
const COUNT_BATCH: usize = 256;
/// How many threads' trim scripts one pipeline carries (each removes up to
/// [`THREAD_BUDGET`] checkpoints, so a pipeline stays well within the call timeout).
const TRIM_BATCH: usize = 64;
/// How many members one `SSCAN` asks for.
const SSCAN_COUNT: usize = 1000;

/// `stats` on the native layout.
pub(super) async fn stats(
    ops: &CheckpointOps,
    user: Option<&str>,
) -> Result<Stats, RetentionError> {
    if let Some(user) = user {
        let threads = user_threads(ops, user).await?;
        let counts = count(ops, &threads).await?;
        forget_empty(ops, &threads, &counts, Some(user)).await;
        return Ok(Stats::User(report::user_stats(
            Layout::Native,
            user,
            &named(&counts),
        )));
    }
    let all = threads_of(ops, &ops.keys.threads()).await?;
    let mut users: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    let mut labelled = BTreeSet::new();
    let mut everything: BTreeSet<ThreadId> = all.iter().cloned().collect();
    let user_ids = set_members(ops, &ops.keys.users()).await?;
    for user in &user_ids {
        let threads = user_threads(ops, user).await?;
        if threads.is_empty() {
            // The user's set expired: nothing of theirs is left.
            forget_user(ops, user).await;
        }
        labelled.extend(threads.iter().cloned());
        everything.extend(threads.iter().cloned());
        users.insert(
            Some(user.clone()),
            threads.iter().map(ToString::to_string).collect(),
        );
    }
    let unlabelled: Vec<String> = all
        .iter()
        .filter(|t| !labelled.contains(*t))
        .map(ToString::to_string)
        .collect();
    users.insert(None, unlabelled);
    let everything: Vec<ThreadId> = everything.into_iter().collect();
    let counts = count(ops, &everything).await?;
    forget_empty(ops, &everything, &counts, None).await;
    Ok(Stats::System(report::system_stats(
        Layout::Native,
        &named(&counts),
        &users,
    )))
}

/// `cleanup` on the native layout: every thread of the scope trimmed to `keep`.
pub(super) async fn cleanup(
    ops: &CheckpointOps,
    scope: &Scope,
    keep: usize,
) -> Result<BTreeMap<String, ThreadCleanup>, RetentionError> {
    let (threads, user) = match scope {
        Scope::Thread(thread) => (vec![native_thread(thread)?], None),
        Scope::User(user) => {
            let user = super::native_user(user)?;
            (user_threads(ops, &user).await?, Some(user))
        }
        Scope::All => (threads_of(ops, &ops.keys.threads()).await?, None),
    };
    let trimmed = trim(ops, &threads, keep).await?;
    let counts: BTreeMap<ThreadId, u64> = trimmed
        .iter()
        .map(|(t, (original, _))| (t.clone(), *original))
        .collect();
    if !matches!(scope, Scope::Thread(_)) {
        forget_empty(ops, &threads, &counts, user.as_deref()).await;
    }
    Ok(trimmed
        .into_iter()
        .filter(|(_, (original, _))| *original > 0)
        .map(|(thread, (original, deleted))| {
            (
                thread.to_string(),
                ThreadCleanup {
                    original_count: original,
                    deleted_count: deleted,
                    remaining_count: original.saturating_sub(deleted),
                    status: "success".to_owned(),
                },
            )
        })
        .collect())
}

/// Thread counts by thread id text.
fn named(counts: &BTreeMap<ThreadId, u64>) -> BTreeMap<String, u64> {
    counts.iter().map(|(t, n)| (t.to_string(), *n)).collect()
}

/// The members of a set, read with `SSCAN` (never one long `SMEMBERS`), each once.
async fn set_members(ops: &CheckpointOps, key: &str) -> Result<BTreeSet<String>, RetentionError> {
    let mut members = BTreeSet::new();
    let mut cursor = "0".to_owned();
    loop {
        let mut cmd = ::redis::cmd("SSCAN");
        cmd.arg(key).arg(&cursor).arg("COUNT").arg(SSCAN_COUNT);
        let reply = ops
            .conn
            .query(key, &cmd)
            .await
            .map_err(RetentionError::store(format!("reading {key}"), 0))?;
        let (next, batch) =
            scan_reply(&reply, key).map_err(RetentionError::store(format!("reading {key}"), 0))?;
        members.extend(batch);
        if next == "0" {
            return Ok(members);
        }
        cursor = next;
    }
}

/// A `SCAN`-family reply: the next cursor and the batch.
fn scan_reply(reply: &Value, key: &str) -> Result<(String, Vec<String>), StoreError> {
    reply::server_error(reply, "SSCAN", key)?;
    match reply::array(reply, key)? {
        [cursor, batch] => Ok((
            reply::text(cursor, key)?.to_owned(),
            reply::array(batch, key)?
                .iter()
                .map(|m| reply::text(m, key).map(str::to_owned))
                .collect::<Result<_, _>>()?,
        )),
        _ => Err(reply::corrupt(key, "a scan reply is not [cursor, keys]")),
    }
}

/// The threads listed in a set; members that are not thread ids are skipped (and logged).
async fn threads_of(ops: &CheckpointOps, key: &str) -> Result<Vec<ThreadId>, RetentionError> {
    Ok(set_members(ops, key)
        .await?
        .into_iter()
        .filter_map(|member| match ThreadId::new(&member) {
            Ok(thread) => Some(thread),
            Err(e) => {
                tracing::warn!(key, %e, "skipping a member that is not a thread id");
                None
            }
        })
        .collect())
}

async fn user_threads(ops: &CheckpointOps, user: &str) -> Result<Vec<ThreadId>, RetentionError> {
    threads_of(ops, &ops.keys.user_threads(user)).await
}

/// Counts the checkpoints of each thread (dropping index entries whose payload expired).
async fn count(
    ops: &CheckpointOps,
    threads: &[ThreadId],
) -> Result<BTreeMap<ThreadId, u64>, RetentionError> {
    let mut counts = BTreeMap::new();
    for batch in threads.chunks(COUNT_BATCH) {
        let indexes: Vec<String> = batch.iter().map(|t| ops.keys.checkpoint_index(t)).collect();
        let cmds = batch
            .iter()
            .zip(&indexes)
            .map(|(thread, index)| {
                ops.scripts.count.cmd(
                    &[index.as_str()],
                    &[
                        ops.keys.checkpoint_prefix(thread),
                        THREAD_BUDGET.to_string(),
                    ],
                )
            })
            .collect();
        let what = format!("counting the checkpoints of thread {}", batch[0]);
        let replies = ops
            .scripts
            .count
            .run_many(&ops.conn, &indexes[0], cmds)
            .await
            .map_err(RetentionError::store(what, 0))?;
        for ((thread, index), reply) in batch.iter().zip(&indexes).zip(&replies) {
            let (count, _) = counted(reply, index).map_err(RetentionError::store(
                format!("counting the checkpoints of thread {thread}"),
                0,
            ))?;
            counts.insert(thread.clone(), count);
        }
    }
    Ok(counts)
}

/// Trims each thread to `keep`: `(index entries before, entries removed)` per thread.
async fn trim(
    ops: &CheckpointOps,
    threads: &[ThreadId],
    keep: usize,
) -> Result<BTreeMap<ThreadId, (u64, u64)>, RetentionError> {
    let mut done: BTreeMap<ThreadId, (u64, u64)> = BTreeMap::new();
    let mut deleted = 0u64;
    let mut pending: Vec<ThreadId> = threads.to_vec();
    while !pending.is_empty() {
        let mut again = Vec::new();
        for batch in pending.chunks(TRIM_BATCH) {
            let indexes: Vec<String> = batch.iter().map(|t| ops.keys.checkpoint_index(t)).collect();
            let cmds = batch
                .iter()
                .zip(&indexes)
                .map(|(thread, index)| {
                    ops.scripts.trim.cmd(
                        &[index.clone(), ops.keys.lease(thread)],
                        &[
                            ops.keys.checkpoint_prefix(thread),
                            ops.keys.checkpoint_sequence_prefix(thread),
                            keep.to_string(),
                            THREAD_BUDGET.to_string(),
                        ],
                    )
                })
                .collect();
            let what = format!("trimming thread {}", batch[0]);
            let replies = ops
                .scripts
                .trim
                .run_many(&ops.conn, &indexes[0], cmds)
                .await
                .map_err(RetentionError::store(what, deleted))?;
            for ((thread, index), reply) in batch.iter().zip(&indexes).zip(&replies) {
                let trimmed = Trimmed::read(reply, index).map_err(RetentionError::store(
                    format!("trimming thread {thread}"),
                    deleted,
                ))?;
                let removed = trimmed.pruned + trimmed.dropped;
                deleted += removed;
                let entry = done.entry(thread.clone()).or_insert((trimmed.before, 0));
                entry.1 += removed;
                if trimmed.pruned >= THREAD_BUDGET as u64 {
                    again.push(thread.clone());
                }
            }
        }
        pending = again;
    }
    Ok(done)
}

/// Drops from the thread indexes the threads that hold nothing any more: no checkpoint and
/// no run index (their data expired). A later run of such a thread lists it again. Failures
/// only leave the entries for next time: they are logged.
async fn forget_empty(
    ops: &CheckpointOps,
    threads: &[ThreadId],
    counts: &BTreeMap<ThreadId, u64>,
    user: Option<&str>,
) {
    let empty: Vec<&ThreadId> = threads
        .iter()
        .filter(|t| counts.get(*t).copied().unwrap_or(0) == 0)
        .collect();
    if empty.is_empty() {
        return;
    }
    let all = ops.keys.threads();
    let checks = empty
        .iter()
        .map(|t| {
            let mut cmd = ::redis::cmd("EXISTS");
            cmd.arg(ops.keys.thread_runs(t));
            cmd
        })
        .collect();
    let exists = match ops.conn.fan_out(&all, checks).await {
        Ok(replies) => replies,
        Err(error) => {
            tracing::debug!(%error, "could not check threads without checkpoints");
            return;
        }
    };
    let gone: Vec<String> = empty
        .iter()
        .zip(&exists)
        .filter(|(_, reply)| matches!(reply, Value::Int(0)))
        .map(|(t, _)| t.to_string())
        .collect();
    if gone.is_empty() {
        return;
    }
    let mut sets = vec![all];
    if let Some(user) = user {
        sets.push(ops.keys.user_threads(user));
    }
    let removals = sets
        .iter()
        .map(|set| {
            let mut cmd = ::redis::cmd("SREM");
            cmd.arg(set).arg(&gone);
            cmd
        })
        .collect();
    if let Err(error) = ops.conn.fan_out(&sets[0], removals).await {
        tracing::debug!(%error, "could not forget threads without data");
    }
}

/// Drops a user whose thread set expired from `<p>:users`.
async fn forget_user(ops: &CheckpointOps, user: &str) {
    let users = ops.keys.users();
    let mut cmd = ::redis::cmd("SREM");
    cmd.arg(&users).arg(user);
    if let Err(error) = ops.conn.query(&users, &cmd).await {
        tracing::debug!(%error, user, "could not forget a user without threads");
    }
}
