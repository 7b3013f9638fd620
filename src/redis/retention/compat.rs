//! Checkpoint stats and cleanup on the compat layout, `checkpoint:<user_id>:<timestamp>:<id>`:
//! keys found by `SCAN` on every primary with a glob-escaped pattern, grouped by thread
//! (`<user_id>:<timestamp>`), deleted with pipelined `UNLINK`s.

use std::collections::BTreeMap;

use ::redis::{Cmd, Value};
use runvisor_actors::StoreError;

use super::report::{self, ThreadCleanup};
use super::{CheckpointOps, Layout, RetentionError, Scope, Stats};
use crate::redis::conn::Primary;
use crate::redis::keys::hash_slot;
use crate::redis::reply;

/// What every key of the layout starts with.
const PREFIX: &str = "checkpoint:";
/// How many keys one `SCAN` asks for by default.
pub(super) const SCAN_COUNT: usize = 1000;
/// How many keys one `UNLINK` deletes at most.
const UNLINK_KEYS: usize = 500;
/// How many `UNLINK`s one round trip carries.
const UNLINK_PIPELINE: usize = 32;

/// Escapes the characters a Redis `MATCH` pattern gives a meaning (`*`, `?`, `[`, `]` and
/// `\`), so that `text` matches only itself.
pub fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// A user id the layout can hold: not empty, no `:` (it separates the key's parts), no
/// whitespace or control characters.
pub(super) fn check_user(user: &str) -> Result<&str, RetentionError> {
    let reason = if user.is_empty() {
        Some("is empty")
    } else if user.contains(':') {
        Some("contains `:`, which separates the parts of a checkpoint key")
    } else if user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("contains whitespace or a control character")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(RetentionError::InvalidUser {
            user: user.to_owned(),
            reason: reason.to_owned(),
        }),
        None => Ok(user),
    }
}

/// A thread id of the layout: `<user_id>:<timestamp>`, both parts as [`check_user`] wants.
fn check_thread(thread: &str) -> Result<(&str, &str), RetentionError> {
    let invalid = |reason: &str| RetentionError::InvalidThread {
        thread: thread.to_owned(),
        reason: reason.to_owned(),
    };
    let (user, timestamp) = thread
        .split_once(':')
        .ok_or_else(|| invalid("is not `<user_id>:<timestamp>`"))?;
    for part in [user, timestamp] {
        check_user(part).map_err(|e| match e {
            RetentionError::InvalidUser { reason, .. } => {
                invalid(&format!("is not `<user_id>:<timestamp>`: a part {reason}"))
            }
            other => other,
        })?;
    }
    Ok((user, timestamp))
}

/// The `MATCH` pattern of a scope, every id in it escaped.
fn pattern(scope: &Scope) -> Result<String, RetentionError> {
    Ok(match scope {
        Scope::All => format!("{PREFIX}*"),
        Scope::User(user) => format!("{PREFIX}{}:*", glob_escape(check_user(user)?)),
        Scope::Thread(thread) => {
            let (user, timestamp) = check_thread(thread)?;
            format!("{PREFIX}{}:{}:*", glob_escape(user), glob_escape(timestamp))
        }
    })
}

/// A key of the layout, read: `(user_id, thread_id)`; `None` for a key of another shape.
fn parse(key: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = key.strip_prefix(PREFIX.as_bytes())?;
    let user_end = rest.iter().position(|&b| b == b':')?;
    let after_user = &rest[user_end + 1..];
    let ts_end = after_user.iter().position(|&b| b == b':')?;
    let id = &after_user[ts_end + 1..];
    if user_end == 0 || ts_end == 0 || id.is_empty() {
        return None;
    }
    Some((&rest[..user_end], &rest[..user_end + 1 + ts_end]))
}

/// A thread's keys and its user.
#[derive(Debug, Default)]
struct ThreadKeys {
    user: Vec<u8>,
    /// Sorted (oldest first), without repeats.
    keys: Vec<Vec<u8>>,
}

/// The keys of a scope by thread.
async fn keys_by_thread(
    ops: &CheckpointOps,
    scope: &Scope,
) -> Result<BTreeMap<Vec<u8>, ThreadKeys>, RetentionError> {
    let pattern = pattern(scope)?;
    let wanted: Option<&[u8]> = match scope {
        Scope::All => None,
        Scope::User(user) => Some(user.as_bytes()),
        Scope::Thread(thread) => Some(thread.as_bytes()),
    };
    let primaries = ops
        .conn
        .primaries()
        .await
        .map_err(RetentionError::store("listing the primaries", 0))?;
    let scans = primaries.iter().map(|primary| scan(ops, primary, &pattern));
    let mut threads: BTreeMap<Vec<u8>, ThreadKeys> = BTreeMap::new();
    for found in futures::future::join_all(scans).await {
        for key in found? {
            let Some((user, thread)) = parse(&key) else {
                continue;
            };
            let in_scope = match (scope, wanted) {
                (Scope::User(_), Some(w)) => user == w,
                (Scope::Thread(_), Some(w)) => thread == w,
                _ => true,
            };
            if !in_scope {
                continue;
            }
            let (user, thread) = (user.to_vec(), thread.to_vec());
            threads
                .entry(thread)
                .or_insert_with(|| ThreadKeys {
                    user,
                    keys: Vec::new(),
                })
                .keys
                .push(key);
        }
    }
    for thread in threads.values_mut() {
        thread.keys.sort_unstable();
        thread.keys.dedup();
    }
    Ok(threads)
}

/// Every key of one primary matching `pattern`.
async fn scan(
    ops: &CheckpointOps,
    primary: &Primary,
    pattern: &str,
) -> Result<Vec<Vec<u8>>, RetentionError> {
    let what = format!("SCAN on {primary}");
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let mut cmd = ::redis::cmd("SCAN");
        cmd.arg(&cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(ops.scan_count);
        let reply = ops
            .conn
            .query_on(primary, &what, &cmd)
            .await
            .map_err(RetentionError::store(what.clone(), 0))?;
        let (next, batch) =
            scan_keys(&reply, &what).map_err(RetentionError::store(what.clone(), 0))?;
        keys.extend(batch);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A `SCAN` reply with keys as bytes (a key need not be UTF-8).
fn scan_keys(reply: &Value, what: &str) -> Result<(String, Vec<Vec<u8>>), StoreError> {
    reply::server_error(reply, "SCAN", what)?;
    match reply::array(reply, what)? {
        [cursor, batch] => Ok((
            reply::text(cursor, what)?.to_owned(),
            reply::array(batch, what)?
                .iter()
                .map(|k| reply::bytes(k, what).map(<[u8]>::to_vec))
                .collect::<Result<_, _>>()?,
        )),
        _ => Err(reply::corrupt(what, "a SCAN reply is not [cursor, keys]")),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `stats` on the compat layout.
pub(super) async fn stats(
    ops: &CheckpointOps,
    user: Option<&str>,
) -> Result<Stats, RetentionError> {
    let scope = match user {
        Some(user) => Scope::User(user.to_owned()),
        None => Scope::All,
    };
    let threads = keys_by_thread(ops, &scope).await?;
    let counts: BTreeMap<String, u64> = threads
        .iter()
        .map(|(thread, found)| (text(thread), found.keys.len() as u64))
        .collect();
    if let Some(user) = user {
        return Ok(Stats::User(report::user_stats(
            Layout::Compat,
            user,
            &counts,
        )));
    }
    let mut users: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    for (thread, found) in &threads {
        users
            .entry(Some(text(&found.user)))
            .or_default()
            .push(text(thread));
    }
    Ok(Stats::System(report::system_stats(
        Layout::Compat,
        &counts,
        &users,
    )))
}

/// `cleanup` on the compat layout: the oldest keys of each thread past `keep`, unlinked.
pub(super) async fn cleanup(
    ops: &CheckpointOps,
    scope: &Scope,
    keep: usize,
) -> Result<BTreeMap<String, ThreadCleanup>, RetentionError> {
    let threads = keys_by_thread(ops, scope).await?;
    let cluster = ops.conn.is_cluster();
    // One UNLINK per (thread, slot on a cluster, chunk), so each reply counts for one thread.
    let mut cmds: Vec<(usize, Cmd)> = Vec::new();
    let mut details: Vec<(String, ThreadCleanup)> = Vec::with_capacity(threads.len());
    for (thread, ThreadKeys { keys, .. }) in &threads {
        let doomed = &keys[..keys.len().saturating_sub(keep)];
        let index = details.len();
        details.push((
            text(thread),
            ThreadCleanup {
                original_count: keys.len() as u64,
                deleted_count: 0,
                remaining_count: keys.len() as u64,
                status: "success".to_owned(),
            },
        ));
        let mut groups: BTreeMap<u16, Vec<&Vec<u8>>> = BTreeMap::new();
        for key in doomed {
            let slot = if cluster { hash_slot(key) } else { 0 };
            groups.entry(slot).or_default().push(key);
        }
        for group in groups.values() {
            for chunk in group.chunks(UNLINK_KEYS) {
                let mut cmd = ::redis::cmd("UNLINK");
                for key in chunk {
                    cmd.arg(key.as_slice());
                }
                cmds.push((index, cmd));
            }
        }
    }
    let mut deleted = 0u64;
    for batch in cmds.chunks(UNLINK_PIPELINE) {
        let owner = &details[batch[0].0].0;
        let what = format!("deleting checkpoints of thread {owner}");
        let replies = ops
            .conn
            .fan_out(&what, batch.iter().map(|(_, cmd)| cmd.clone()).collect())
            .await
            .map_err(RetentionError::store(what.clone(), deleted))?;
        for ((index, _), reply) in batch.iter().zip(&replies) {
            let (thread, detail) = &mut details[*index];
            let what = format!("deleting checkpoints of thread {thread}");
            let gone = reply::server_error(reply, "UNLINK", &what)
                .and_then(|()| reply::int(reply, &what))
                .map(|n| u64::try_from(n).unwrap_or(0))
                .map_err(RetentionError::store(what.clone(), deleted))?;
            deleted += gone;
            detail.deleted_count += gone;
            detail.remaining_count = detail.remaining_count.saturating_sub(gone);
        }
    }
    Ok(details.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("wang1"), "wang1");
        assert_eq!(glob_escape("a*b?c"), r"a\*b\?c");
        assert_eq!(glob_escape("[x]"), r"\[x\]");
        assert_eq!(glob_escape(r"back\slash"), r"back\\slash");
        assert_eq!(
            pattern(&Scope::User("w*".into())).ok().as_deref(),
            Some(r"checkpoint:w\*:*")
        );
        assert_eq!(
            pattern(&Scope::Thread("u?:[1]".into())).ok().as_deref(),
            Some(r"checkpoint:u\?:\[1\]:*")
        );
        assert_eq!(pattern(&Scope::All).ok().as_deref(), Some("checkpoint:*"));
    }

    #[test]
    fn ids_that_the_layout_cannot_hold_are_refused() {
        for user in ["", "a:b", "a b", "a\n"] {
            assert!(
                matches!(
                    pattern(&Scope::User(user.into())),
                    Err(RetentionError::InvalidUser { .. })
                ),
                "{user:?}"
            );
        }
        for thread in ["", "nots", "a:b:c", ":1", "a:", "a :1"] {
            let refused = pattern(&Scope::Thread(thread.into()));
            assert!(
                matches!(&refused, Err(e) if e.error_type() == "INVALID_THREAD_ID"),
                "{thread:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn keys_are_read_into_user_and_thread() {
        assert_eq!(
            parse(b"checkpoint:wang1:20250729235038043:01936451-dd24"),
            Some((&b"wang1"[..], &b"wang1:20250729235038043"[..]))
        );
        // The checkpoint id may hold `:`.
        assert_eq!(parse(b"checkpoint:u:1:a:b"), Some((&b"u"[..], &b"u:1"[..])));
        for other in [
            &b"checkpoint:u:1"[..],
            b"checkpoint::1:x",
            b"checkpoint:u::x",
            b"checkpoint:u:1:",
            b"checkpoint_write:u:1:x",
            b"runvisor:cp:{t}:x",
        ] {
            assert_eq!(parse(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
