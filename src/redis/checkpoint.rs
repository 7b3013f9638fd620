//! Checkpoints on Redis: one STRING per checkpoint (`<p>:cp:{<thread>}:<id>`: a short text
//! header naming its run, sequence, and for a delta its base and parent, then the payload; see
//! [`encode_value`]), a per-thread index ZSET (`<p>:cpidx:{<thread>}`, score 0 so members sort
//! by id text, which is time order for UUIDv7) and a per-run sequence
//! (`<p>:cpseq:{<thread>}:<run>`). Earlier releases wrote each checkpoint as a HASH (`bytes`,
//! `run`, `sequence`, and `base` and `parent` for a delta); those are still read, restored and
//! pruned.
//!
//! `put` is one Lua script: it refuses a sequence not greater than the stored one (compared as
//! decimal text, so every `u64` is exact), then writes payload, index entry and sequence with
//! the TTL, and prunes the thread to its newest checkpoints ([`RedisConfig::keep_checkpoints`](
//! super::RedisConfig::keep_checkpoints)): the oldest payloads, their index entries and the
//! sequence keys of their runs (but the writer's) go in the same script, or nothing happens.
//! A delta (see [`runvisor_actors::delta`]) names its base and parent; `put` of a delta checks
//! in the same script that both are stored, pruning never removes what a kept checkpoint
//! builds on (`prune_skipped`, after a merged delta, lets go of the deltas it
//! skips once no kept checkpoint builds on them), and a chain's TTL is renewed with its
//! newest delta (the thread's
//! freshness key, `<p>:cpfresh:{<thread>}`, spares most writes reading the base's TTL and
//! the index's oldest entry for it).
//! `prune` trims in batches, each batch one script. Reads follow the index and drop the entries
//! whose payload expired (checked again inside a script): `list` every one it sees, `latest`
//! those newer than the checkpoint it returns, `get` the one asked for. `chain` reads what a
//! delta builds on (its parent, the parent's parent, and so on back to the base, by the links
//! the headers name) in one script, so restoring a checkpoint is one round trip whatever its
//! chain's length. The scripts are in
//! [`lua`].
//!
//! One value instead of a hash of five fields: Redis keeps a hash whose payload field is over
//! 64 bytes as a hash table, about 590 bytes per checkpoint besides its payload; a value with a
//! header costs the header (61 or 133 bytes) and the key.

mod lua;

use std::fmt;
use std::io::Write as _;
use std::time::Duration;

use ::redis::{Script, Value};
use async_trait::async_trait;
use runvisor_actors::store::{CheckpointStore, DeltaLink, StoredCheckpoint};
use runvisor_actors::{CheckpointId, Fence, RunId, StoreError, ThreadId};

use super::conn::Conn;
use super::keys::{Keys, ttl_ms};
use super::lease::{fenced, fenced_script, token_arg};
use super::reply::{self, Fields, corrupt};
use super::scripts::{Lua, Part};

pub(crate) use lua::{COUNT, HELPERS, PUT, TRIM};

/// The most checkpoints one write prunes: a thread far over its retention (after the
/// retention was lowered) comes down over its next writes, or at once with `prune`.
const PUT_PRUNE_MAX: usize = 1000;
/// The most index entries one trim or count script handles.
pub(crate) const THREAD_BUDGET: usize = 1000;
/// How many index entries `latest` reads per round trip when it has to skip expired ones.
const LATEST_BATCH: isize = 16;
/// How many index entries one `list` script reads.
const LIST_BATCH: usize = 1000;

/// [`CheckpointStore`] on Redis: a value per checkpoint, an index per thread, a sequence per
/// run, and `put` as one script that keeps each thread within its retention. See the
/// [key layout](super).
pub struct RedisCheckpointStore {
    conn: Conn,
    keys: Keys,
    ttl_ms: u64,
    /// How many checkpoints a thread keeps; `None`: all.
    keep: Option<usize>,
    put: Script,
    scripts: ThreadScripts,
}

impl fmt::Debug for RedisCheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCheckpointStore")
            .field("keys", &self.keys)
            .field("ttl_ms", &self.ttl_ms)
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}

/// The per-thread scripts the store and checkpoint cleanup share.
#[derive(Debug, Clone)]
pub(crate) struct ThreadScripts {
    pub(crate) trim: Lua,
    skipped: Lua,
    pub(crate) count: Lua,
    list: Lua,
    drop: Lua,
    chain: Lua,
    read: Lua,
}

impl ThreadScripts {
    pub(crate) fn new() -> Self {
        let with_helpers = |body: &str| Lua::new(format!("{HELPERS}{body}"));
        Self {
            trim: with_helpers(TRIM),
            skipped: with_helpers(lua::SKIPPED),
            count: with_helpers(COUNT),
            list: with_helpers(lua::LIST),
            drop: with_helpers(lua::DROP),
            chain: Lua::new(lua::CHAIN.to_owned()),
            read: Lua::new(lua::READ.to_owned()),
        }
    }
}

/// What one trim script did to a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trimmed {
    /// Index entries before it.
    pub(crate) before: u64,
    /// Entries pruned (the oldest), with their payloads.
    pub(crate) pruned: u64,
    /// Kept entries dropped because their payload had expired.
    pub(crate) dropped: u64,
}

impl Trimmed {
    /// Reads a trim script's reply; `index` names the thread's index, for errors.
    pub(crate) fn read(reply: &Value, index: &str) -> Result<Self, StoreError> {
        reply::server_error(reply, "the checkpoint trim script", index)?;
        let items = reply::array(reply, index)?;
        let status = items.first().map(|s| reply::text(s, index)).transpose()?;
        match status {
            Some("ok") if items.len() == 4 => {
                let number = |i: usize| {
                    reply::int(&items[i], index).and_then(|n| {
                        u64::try_from(n).map_err(|_| corrupt(index, "a negative count"))
                    })
                };
                Ok(Self {
                    before: number(1)?,
                    pruned: number(2)?,
                    dropped: number(3)?,
                })
            }
            Some("wrongtype") => Err(wrong_type(items, index)),
            _ => Err(unexpected("trim", index, reply)),
        }
    }
}

/// Reads a count script's reply: `(checkpoints, expired entries dropped)`.
pub(crate) fn counted(reply: &Value, index: &str) -> Result<(u64, u64), StoreError> {
    reply::server_error(reply, "the checkpoint count script", index)?;
    let items = reply::array(reply, index)?;
    match items.first().map(|s| reply::text(s, index)).transpose()? {
        Some("ok") if items.len() == 3 => {
            let number = |i: usize| {
                reply::int(&items[i], index)
                    .and_then(|n| u64::try_from(n).map_err(|_| corrupt(index, "a negative count")))
            };
            Ok((number(1)?, number(2)?))
        }
        Some("wrongtype") => Err(wrong_type(items, index)),
        _ => Err(unexpected("count", index, reply)),
    }
}

fn wrong_type(items: &[Value], index: &str) -> StoreError {
    let key = items
        .get(1)
        .and_then(|k| reply::text(k, index).ok())
        .unwrap_or(index);
    corrupt(key, "the key holds a value of another type")
}

fn unexpected(script: &str, key: &str, reply: &Value) -> StoreError {
    StoreError::Unavailable(format!(
        "unexpected reply from the checkpoint {script} script for {key}: {reply:?}"
    ))
}

impl RedisCheckpointStore {
    pub(crate) fn new(conn: Conn, keys: Keys, ttl: Duration, keep: Option<usize>) -> Self {
        Self {
            conn,
            keys,
            ttl_ms: ttl_ms(ttl),
            keep: keep.map(|n| n.max(1)),
            put: fenced_script(&format!("{HELPERS}{}", lua::PUT)),
            scripts: ThreadScripts::new(),
        }
    }

    /// The keys and arguments of the put script ([`lua::PUT`]) writing `checkpoint`, also a
    /// step of a run's whole end.
    pub(crate) fn put_part(
        &self,
        thread: &ThreadId,
        checkpoint: &StoredCheckpoint,
        fence: Option<Fence>,
    ) -> Part {
        let link = |pick: fn(&DeltaLink) -> CheckpointId| {
            checkpoint
                .link
                .as_ref()
                .map(|l| pick(l).to_string())
                .unwrap_or_default()
        };
        let text = |args: &[String]| -> Vec<Vec<u8>> {
            args.iter().map(|a| a.clone().into_bytes()).collect()
        };
        let mut args = text(&[
            checkpoint.id.to_string(),
            checkpoint.run.to_string(),
            checkpoint.sequence.to_string(),
        ]);
        args.push(encode_value(checkpoint));
        args.extend(text(&[
            self.ttl_ms.to_string(),
            token_arg(fence),
            self.keep.map(|k| k.to_string()).unwrap_or_default(),
            self.keys.checkpoint_prefix(thread),
            self.keys.checkpoint_sequence_prefix(thread),
            PUT_PRUNE_MAX.to_string(),
            link(|l| l.base),
            link(|l| l.parent),
        ]));
        Part {
            keys: vec![
                self.keys.checkpoint(thread, checkpoint.id),
                self.keys.checkpoint_index(thread),
                self.keys.checkpoint_sequence(thread, checkpoint.run),
                self.keys.fence(thread),
                self.keys.checkpoint_fresh(thread),
            ],
            args,
        }
    }

    /// What the put script's `reply` says of `checkpoint`'s write.
    pub(crate) fn put_answer(
        &self,
        reply: &Value,
        thread: &ThreadId,
        checkpoint: &StoredCheckpoint,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        let payload = self.keys.checkpoint(thread, checkpoint.id);
        let items = reply::array(reply, &payload)?;
        let status = items
            .first()
            .map(|s| reply::text(s, &payload))
            .transpose()?;
        let detail = items.get(1).map(|d| reply::text(d, &payload)).transpose()?;
        match (status, detail) {
            (Some("ok"), _) => Ok(()),
            (Some("fenced"), current) => Err(fenced(thread, fence, current, &payload)),
            (Some("missing"), Some(id)) => Err(StoreError::MissingParent {
                checkpoint: parse_id(id, &self.keys.checkpoint_index(thread))?,
            }),
            (Some("stale"), Some(stored)) => Err(StoreError::StaleSequence {
                run: checkpoint.run,
                sequence: checkpoint.sequence,
                stored: reply::parse(
                    stored.as_bytes(),
                    &self.keys.checkpoint_sequence(thread, checkpoint.run),
                    "stored sequence",
                )?,
            }),
            (Some("wrongtype"), Some(key)) => {
                Err(corrupt(key, "the key holds a value of another type"))
            }
            (Some("corrupt"), Some(key)) => {
                Err(corrupt(key, "the stored sequence is not a number"))
            }
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the checkpoint script for {payload}: {reply:?}"
            ))),
        }
    }

    /// Reads the checkpoint at `key`; `None` when it does not exist.
    async fn read(
        &self,
        key: &str,
        id: CheckpointId,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        let mut invocation = self.scripts.read.script().prepare_invoke();
        invocation.key(key);
        let reply = self
            .conn
            .script("checkpoint read", key, &invocation)
            .await?;
        reply::server_error(&reply, "the checkpoint read script", key)?;
        let items = reply::array(&reply, key)?;
        match items.first().map(|s| reply::text(s, key)).transpose()? {
            Some("value" | "hash") if items.len() == 2 => stored_from(&items[1], key, id),
            Some("none") => Ok(None),
            Some("wrongtype") => Err(corrupt(key, "the key holds a value of another type")),
            _ => Err(unexpected("read", key, &reply)),
        }
    }
}

/// The header's first bytes: format 1.
const MAGIC: &[u8; 4] = b"rvc1";
/// Digits of the sequence in a header (every `u64`, zero-padded).
const SEQUENCE_DIGITS: usize = 20;
/// A whole snapshot's header: magic, `w`, run id, sequence.
const WHOLE_HEADER: usize = MAGIC.len() + 1 + 36 + SEQUENCE_DIGITS;
/// A delta's header: magic, `d`, run id, sequence, base id, parent id.
const DELTA_HEADER: usize = WHOLE_HEADER + 36 + 36;

/// A checkpoint's value: a text header, then its payload. The header is `rvc1`, `w` (a whole
/// snapshot) or `d` (a delta), the run id, the sequence as 20 digits, and for a delta its base
/// and parent ids: fixed places the scripts read with `GETRANGE` (`cp_links` in [`lua`]).
fn encode_value(checkpoint: &StoredCheckpoint) -> Vec<u8> {
    let header = if checkpoint.link.is_some() {
        DELTA_HEADER
    } else {
        WHOLE_HEADER
    };
    let mut value = Vec::with_capacity(header + checkpoint.bytes.len());
    value.extend_from_slice(MAGIC);
    value.push(if checkpoint.link.is_some() {
        b'd'
    } else {
        b'w'
    });
    push_id(&mut value, checkpoint.run.as_uuid());
    // Writing to a Vec cannot fail.
    let _ = write!(
        value,
        "{:0width$}",
        checkpoint.sequence,
        width = SEQUENCE_DIGITS
    );
    if let Some(link) = checkpoint.link {
        push_id(&mut value, link.base.as_uuid());
        push_id(&mut value, link.parent.as_uuid());
    }
    value.extend_from_slice(&checkpoint.bytes);
    value
}

/// Appends an id's 36 characters (lowercase, hyphenated), as its text form reads.
fn push_id(value: &mut Vec<u8>, id: uuid::Uuid) {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    value.extend_from_slice(id.hyphenated().encode_lower(&mut text).as_bytes());
}

/// A checkpoint read back from its value ([`encode_value`]).
fn decode_value(value: &[u8], key: &str, id: CheckpointId) -> Result<StoredCheckpoint, StoreError> {
    let bad = |what: &str| corrupt(key, format!("the checkpoint's header {what}"));
    if value.len() < WHOLE_HEADER || &value[..MAGIC.len()] != MAGIC {
        return Err(bad("is missing or of an unknown format"));
    }
    let field = |at: usize, len: usize, what: &str| -> Result<&str, StoreError> {
        std::str::from_utf8(&value[at..at + len])
            .map_err(|_| bad(&format!("has a {what} that is not text")))
    };
    let id_at = |at: usize, what: &str| -> Result<CheckpointId, StoreError> {
        field(at, 36, what)?
            .parse()
            .map_err(|_| bad(&format!("has a {what} that is not an id")))
    };
    let run: RunId = field(5, 36, "run id")?
        .parse()
        .map_err(|_| bad("has a run id that is not an id"))?;
    let sequence = field(41, SEQUENCE_DIGITS, "sequence")?
        .parse::<u64>()
        .map_err(|_| bad("has a sequence that is not a number"))?;
    let (link, payload) = match value[MAGIC.len()] {
        b'w' => (None, WHOLE_HEADER),
        b'd' if value.len() >= DELTA_HEADER => (
            Some(DeltaLink {
                base: id_at(WHOLE_HEADER, "base")?,
                parent: id_at(WHOLE_HEADER + 36, "parent")?,
            }),
            DELTA_HEADER,
        ),
        b'd' => return Err(bad("is cut short")),
        _ => return Err(bad("names neither a whole snapshot nor a delta")),
    };
    Ok(StoredCheckpoint {
        id,
        run,
        sequence,
        bytes: value[payload..].to_vec(),
        link,
    })
}

/// A checkpoint read back from its value, or from the hash an earlier release wrote
/// (`HGETALL`'s reply); `None` when that hash has no fields.
fn stored_from(
    reply: &Value,
    key: &str,
    id: CheckpointId,
) -> Result<Option<StoredCheckpoint>, StoreError> {
    if let Value::BulkString(value) = reply {
        return decode_value(value, key, id).map(Some);
    }
    let fields = Fields::read(reply, key)?;
    if fields.is_empty() {
        return Ok(None);
    }
    let link = match fields.optional_parsed::<CheckpointId>("base")? {
        Some(base) => Some(DeltaLink {
            base,
            parent: fields.required_parsed("parent")?,
        }),
        None => None,
    };
    Ok(Some(StoredCheckpoint {
        id,
        run: fields.required_parsed("run")?,
        sequence: fields.required_parsed::<u64>("sequence")?,
        bytes: fields.required("bytes")?.to_vec(),
        link,
    }))
}

impl RedisCheckpointStore {
    /// Index members from `start` to `stop` (ZRANGE indices), in the given direction.
    async fn members(
        &self,
        index: &str,
        start: isize,
        stop: isize,
        newest_first: bool,
    ) -> Result<Vec<String>, StoreError> {
        let mut cmd = ::redis::cmd(if newest_first { "ZREVRANGE" } else { "ZRANGE" });
        cmd.arg(index).arg(start).arg(stop);
        let reply = self.conn.query(index, &cmd).await?;
        reply::array(&reply, index)?
            .iter()
            .map(|m| reply::text(m, index).map(str::to_owned))
            .collect()
    }

    /// Drops these index entries of a thread if their payload does not exist (checked again
    /// in the script). A failure only leaves them for the next reader: it is logged, not
    /// returned.
    async fn drop_missing(&self, thread: &ThreadId, ids: &[CheckpointId]) {
        if ids.is_empty() {
            return;
        }
        let index = self.keys.checkpoint_index(thread);
        let mut invocation = self.scripts.drop.script().prepare_invoke();
        invocation
            .key(&index)
            .arg(self.keys.checkpoint_prefix(thread));
        for id in ids {
            invocation.arg(id.to_string());
        }
        match self
            .conn
            .script("checkpoint drop", &index, &invocation)
            .await
        {
            Ok(reply) => tracing::debug!(
                %thread,
                dropped = ?reply,
                "dropped index entries of expired checkpoints"
            ),
            Err(error) => tracing::debug!(
                %thread,
                %error,
                "could not drop index entries of expired checkpoints"
            ),
        }
    }

    /// One trim script on a thread: at most [`THREAD_BUDGET`] of its oldest checkpoints go.
    async fn trim_once(&self, thread: &ThreadId, keep: usize) -> Result<Trimmed, StoreError> {
        let index = self.keys.checkpoint_index(thread);
        let mut invocation = self.scripts.trim.script().prepare_invoke();
        invocation
            .key(&index)
            .key(self.keys.lease(thread))
            .arg(self.keys.checkpoint_prefix(thread))
            .arg(self.keys.checkpoint_sequence_prefix(thread))
            .arg(keep)
            .arg(THREAD_BUDGET);
        let reply = self
            .conn
            .script("checkpoint trim", &index, &invocation)
            .await?;
        Trimmed::read(&reply, &index)
    }
}

fn parse_id(member: &str, index: &str) -> Result<CheckpointId, StoreError> {
    member
        .parse()
        .map_err(|_| corrupt(index, format!("member {member:?} is not a checkpoint id")))
}

#[async_trait]
impl CheckpointStore for RedisCheckpointStore {
    async fn put(
        &self,
        thread: &ThreadId,
        checkpoint: StoredCheckpoint,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        let part = self.put_part(thread, &checkpoint, fence);
        let invocation = part.invoke(&self.put);
        let reply = self
            .conn
            .script("checkpoint put", &part.keys[0], &invocation)
            .await?;
        self.put_answer(&reply, thread, &checkpoint, fence)
    }

    async fn get(
        &self,
        thread: &ThreadId,
        id: CheckpointId,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        let found = self.read(&self.keys.checkpoint(thread, id), id).await?;
        if found.is_none() {
            // Its index entry, if any, points at nothing.
            self.drop_missing(thread, &[id]).await;
        }
        Ok(found)
    }

    async fn chain(
        &self,
        thread: &ThreadId,
        from: CheckpointId,
        max: usize,
    ) -> Result<Vec<StoredCheckpoint>, StoreError> {
        let first = self.keys.checkpoint(thread, from);
        let mut invocation = self.scripts.chain.script().prepare_invoke();
        invocation
            .key(&first)
            .arg(self.keys.checkpoint_prefix(thread))
            .arg(from.to_string())
            .arg(max);
        let reply = self
            .conn
            .script("checkpoint chain", &first, &invocation)
            .await?;
        reply::server_error(&reply, "the checkpoint chain script", &first)?;
        let items = reply::array(&reply, &first)?;
        match items.split_first() {
            Some((status, rest)) if reply::text(status, &first)? == "ok" && rest.len() % 2 == 0 => {
                let mut found = Vec::with_capacity(rest.len() / 2);
                for pair in rest.chunks_exact(2) {
                    let id = parse_id(reply::text(&pair[0], &first)?, &first)?;
                    let key = self.keys.checkpoint(thread, id);
                    match stored_from(&pair[1], &key, id)? {
                        Some(checkpoint) => found.push(checkpoint),
                        None => break,
                    }
                }
                Ok(found)
            }
            Some((status, _)) if reply::text(status, &first)? == "wrongtype" => {
                Err(wrong_type(items, &first))
            }
            _ => Err(unexpected("chain", &first, &reply)),
        }
    }

    async fn prune_skipped(&self, thread: &ThreadId) -> Result<usize, StoreError> {
        let Some(keep) = self.keep else {
            return Ok(0);
        };
        let index = self.keys.checkpoint_index(thread);
        let mut invocation = self.scripts.skipped.script().prepare_invoke();
        invocation
            .key(&index)
            .arg(self.keys.checkpoint_prefix(thread))
            .arg(keep)
            .arg(THREAD_BUDGET);
        let reply = self
            .conn
            .script("checkpoint skipped", &index, &invocation)
            .await?;
        reply::server_error(&reply, "the checkpoint skipped script", &index)?;
        let items = reply::array(&reply, &index)?;
        match items.first().map(|s| reply::text(s, &index)).transpose()? {
            Some("ok") if items.len() == 2 => {
                let n = reply::int(&items[1], &index)?;
                usize::try_from(n).map_err(|_| corrupt(&index, "a negative count"))
            }
            Some("wrongtype") => Err(wrong_type(items, &index)),
            _ => Err(unexpected("skipped", &index, &reply)),
        }
    }

    async fn latest(&self, thread: &ThreadId) -> Result<Option<StoredCheckpoint>, StoreError> {
        let index = self.keys.checkpoint_index(thread);
        let mut start = 0;
        let mut missing = Vec::new();
        loop {
            let members = self
                .members(&index, start, start + LATEST_BATCH - 1, true)
                .await?;
            if members.is_empty() {
                self.drop_missing(thread, &missing).await;
                return Ok(None);
            }
            for member in &members {
                let id = parse_id(member, &index)?;
                match self.read(&self.keys.checkpoint(thread, id), id).await? {
                    Some(found) => {
                        self.drop_missing(thread, &missing).await;
                        return Ok(Some(found));
                    }
                    None => missing.push(id),
                }
            }
            start += LATEST_BATCH;
        }
    }

    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointId>, StoreError> {
        let index = self.keys.checkpoint_index(thread);
        let prefix = self.keys.checkpoint_prefix(thread);
        let mut ids = Vec::new();
        let mut start = 0usize;
        loop {
            let mut invocation = self.scripts.list.script().prepare_invoke();
            invocation
                .key(&index)
                .arg(&prefix)
                .arg(start)
                .arg(LIST_BATCH);
            let reply = self
                .conn
                .script("checkpoint list", &index, &invocation)
                .await?;
            let items = reply::array(&reply, &index)?;
            let (seen, live) = match items {
                [status, seen, live] if reply::text(status, &index)? == "ok" => {
                    (reply::int(seen, &index)?, reply::array(live, &index)?)
                }
                [status, ..] if reply::text(status, &index)? == "wrongtype" => {
                    return Err(wrong_type(items, &index));
                }
                _ => return Err(unexpected("list", &index, &reply)),
            };
            for member in live {
                ids.push(parse_id(reply::text(member, &index)?, &index)?);
            }
            // The entries that went shifted the rest down: the next window starts after the
            // ones kept.
            start += live.len();
            if usize::try_from(seen).unwrap_or(0) < LIST_BATCH {
                return Ok(ids);
            }
        }
    }

    async fn prune(&self, thread: &ThreadId, keep: usize) -> Result<usize, StoreError> {
        let mut removed = 0usize;
        loop {
            let trimmed = self.trim_once(thread, keep).await?;
            removed += usize::try_from(trimmed.pruned).unwrap_or(usize::MAX);
            if trimmed.pruned < THREAD_BUDGET as u64 {
                return Ok(removed);
            }
        }
    }

    async fn put_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
        definition: &str,
    ) -> Result<(), StoreError> {
        // Same hash, same content: overwriting only refreshes the expiry.
        let key = self.keys.workflow(thread, hash);
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(&key).arg(definition).arg("PX").arg(self.ttl_ms);
        let reply = self.conn.query(&key, &cmd).await?;
        reply::server_error(&reply, "SET", &key)
    }

    async fn get_workflow(
        &self,
        thread: &ThreadId,
        hash: &str,
    ) -> Result<Option<String>, StoreError> {
        let key = self.keys.workflow(thread, hash);
        let mut cmd = ::redis::cmd("GET");
        cmd.arg(&key);
        let reply = self.conn.query(&key, &cmd).await?;
        if matches!(reply, ::redis::Value::Nil) {
            return Ok(None);
        }
        Ok(Some(reply::text(&reply, &key)?.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header holds the ids as their text and the sequence as 20 digits, at the places the
    /// scripts read; decoding gives the checkpoint back, whole or delta.
    #[test]
    fn values_hold_the_header_the_scripts_read_and_round_trip() {
        let id = CheckpointId::new();
        let link = DeltaLink {
            base: CheckpointId::new(),
            parent: CheckpointId::new(),
        };
        for (link, sequence) in [(None, 0), (Some(link), u64::MAX)] {
            let checkpoint = StoredCheckpoint {
                id,
                run: RunId::new(),
                sequence,
                bytes: b"payload".to_vec(),
                link,
            };
            let value = encode_value(&checkpoint);
            let mut header = format!(
                "rvc1{}{}{sequence:020}",
                if link.is_some() { 'd' } else { 'w' },
                checkpoint.run
            );
            if let Some(link) = link {
                header.push_str(&format!("{}{}", link.base, link.parent));
            }
            assert_eq!(&value[..value.len() - 7], header.as_bytes());
            assert_eq!(decode_value(&value, "k", id), Ok(checkpoint));
        }
    }
}
