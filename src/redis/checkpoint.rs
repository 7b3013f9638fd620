//! Checkpoints on Redis: one HASH per checkpoint (`<p>:cp:{<thread>}:<id>`: `bytes`, `run`,
//! `sequence`), a per-thread index ZSET (`<p>:cpidx:{<thread>}`, score 0 so members sort by
//! id text, which is time order for UUIDv7) and a per-run sequence (`<p>:cpseq:{<thread>}:<run>`).
//!
//! `put` is one Lua script: it refuses a sequence not greater than the stored one (compared as
//! decimal text, so every `u64` is exact), then writes payload, index entry and sequence with
//! the TTL, or nothing. `prune` removes the oldest checkpoints in batches, each batch (payloads
//! and index entries) one script. Reads follow the index: `latest` takes the newest entry whose
//! payload exists (an index entry can outlive its payload's TTL; such entries read as absent
//! and `prune` removes them).

use std::fmt;
use std::time::Duration;

use ::redis::Script;
use async_trait::async_trait;
use runvisor_actors::store::{CheckpointStore, StoredCheckpoint};
use runvisor_actors::{CheckpointId, Fence, RunId, StoreError, ThreadId};

use super::conn::Conn;
use super::keys::{Keys, ttl_ms};
use super::lease::{fenced, fenced_script, token_arg};
use super::reply::{self, Fields, corrupt};

/// Writes one checkpoint if its sequence is newer than the run's stored one.
///
/// KEYS: payload hash, index zset, sequence string, the thread's fence counter.
/// ARGV: checkpoint id, run id, sequence (decimal, no leading zeros), bytes, TTL in ms, fencing
/// token (empty: unfenced).
/// Returns `{"ok"}`, `{"fenced", current}`, `{"stale", stored}`, `{"wrongtype", key}` or
/// `{"corrupt", key}`.
const PUT: &str = r#"
local kinds = {'hash', 'zset', 'string', 'string'}
for i, key in ipairs(KEYS) do
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= kinds[i] then return {'wrongtype', key} end
end
local refused = fence_refused(KEYS[4], ARGV[6], ARGV[5])
if refused then return {'fenced', refused} end
local stored = redis.call('GET', KEYS[3])
if stored then
  if not (stored == '0' or string.match(stored, '^[1-9]%d*$')) or #stored > 20 then
    return {'corrupt', KEYS[3]}
  end
  local seq = ARGV[3]
  if #seq < #stored or (#seq == #stored and seq <= stored) then
    return {'stale', stored}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'bytes', ARGV[4], 'run', ARGV[2], 'sequence', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[5])
return {'ok'}
"#;

/// Removes checkpoints: index entries and payloads.
///
/// KEYS: index zset, then one payload key per id. ARGV: the ids, in the same order.
/// Returns how many index entries were removed.
const PRUNE: &str = r#"
local removed = 0
for i, id in ipairs(ARGV) do
  removed = removed + redis.call('ZREM', KEYS[1], id)
  redis.call('UNLINK', KEYS[i + 1])
end
return removed
"#;

/// How many checkpoints one prune script removes.
const PRUNE_BATCH: usize = 128;
/// How many index entries `latest` reads per round trip when it has to skip expired ones.
const LATEST_BATCH: isize = 16;

/// [`CheckpointStore`] on Redis: a hash per checkpoint, an index per thread, a sequence per
/// run, and `put` as one script. See the [key layout](super).
pub struct RedisCheckpointStore {
    conn: Conn,
    keys: Keys,
    ttl_ms: u64,
    put: Script,
    prune: Script,
}

impl fmt::Debug for RedisCheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCheckpointStore")
            .field("keys", &self.keys)
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl RedisCheckpointStore {
    pub(crate) fn new(conn: Conn, keys: Keys, ttl: Duration) -> Self {
        Self {
            conn,
            keys,
            ttl_ms: ttl_ms(ttl),
            put: fenced_script(PUT),
            prune: Script::new(PRUNE),
        }
    }

    /// Reads the payload hash at `key`; `None` when it does not exist.
    async fn read(
        &self,
        key: &str,
        id: CheckpointId,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        let mut cmd = ::redis::cmd("HGETALL");
        cmd.arg(key);
        let reply = self.conn.query(key, &cmd).await?;
        let fields = Fields::read(&reply, key)?;
        if fields.is_empty() {
            return Ok(None);
        }
        Ok(Some(StoredCheckpoint {
            id,
            run: fields.required_parsed::<RunId>("run")?,
            sequence: fields.required_parsed::<u64>("sequence")?,
            bytes: fields.required("bytes")?.to_vec(),
        }))
    }

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
        let payload = self.keys.checkpoint(thread, checkpoint.id);
        let index = self.keys.checkpoint_index(thread);
        let sequence = self.keys.checkpoint_sequence(thread, checkpoint.run);
        let mut invocation = self.put.prepare_invoke();
        invocation
            .key(&payload)
            .key(&index)
            .key(&sequence)
            .key(self.keys.fence(thread))
            .arg(checkpoint.id.to_string())
            .arg(checkpoint.run.to_string())
            .arg(checkpoint.sequence.to_string())
            .arg(checkpoint.bytes.as_slice())
            .arg(self.ttl_ms)
            .arg(token_arg(fence));
        let reply = self
            .conn
            .script("checkpoint put", &payload, &invocation)
            .await?;
        let items = reply::array(&reply, &payload)?;
        let status = items
            .first()
            .map(|s| reply::text(s, &payload))
            .transpose()?;
        let detail = items.get(1).map(|d| reply::text(d, &payload)).transpose()?;
        match (status, detail) {
            (Some("ok"), _) => Ok(()),
            (Some("fenced"), current) => Err(fenced(thread, fence, current, &payload)),
            (Some("stale"), Some(stored)) => Err(StoreError::StaleSequence {
                run: checkpoint.run,
                sequence: checkpoint.sequence,
                stored: reply::parse(stored.as_bytes(), &sequence, "stored sequence")?,
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

    async fn get(
        &self,
        thread: &ThreadId,
        id: CheckpointId,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.read(&self.keys.checkpoint(thread, id), id).await
    }

    async fn latest(&self, thread: &ThreadId) -> Result<Option<StoredCheckpoint>, StoreError> {
        let index = self.keys.checkpoint_index(thread);
        let mut start = 0;
        loop {
            let members = self
                .members(&index, start, start + LATEST_BATCH - 1, true)
                .await?;
            if members.is_empty() {
                return Ok(None);
            }
            for member in &members {
                let id = parse_id(member, &index)?;
                if let Some(found) = self.read(&self.keys.checkpoint(thread, id), id).await? {
                    return Ok(Some(found));
                }
            }
            start += LATEST_BATCH;
        }
    }

    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointId>, StoreError> {
        let index = self.keys.checkpoint_index(thread);
        self.members(&index, 0, -1, false)
            .await?
            .iter()
            .map(|m| parse_id(m, &index))
            .collect()
    }

    async fn prune(&self, thread: &ThreadId, keep: usize) -> Result<usize, StoreError> {
        let index = self.keys.checkpoint_index(thread);
        // Everything but the newest `keep`, oldest first. Members are removed as stored, so a
        // malformed entry is cleaned up too.
        let Some(stop) = isize::try_from(keep)
            .ok()
            .and_then(|k| k.checked_add(1))
            .map(|k| -k)
        else {
            // More than any index can hold: keep everything.
            return Ok(0);
        };
        let doomed = self.members(&index, 0, stop, false).await?;
        let mut removed = 0usize;
        for batch in doomed.chunks(PRUNE_BATCH) {
            let mut invocation = self.prune.prepare_invoke();
            invocation.key(&index);
            for member in batch {
                invocation.key(self.keys.checkpoint_member(thread, member));
            }
            for member in batch {
                invocation.arg(member.as_str());
            }
            let reply = self
                .conn
                .script("checkpoint prune", &index, &invocation)
                .await?;
            let count = reply::int(&reply, &index)?;
            removed += usize::try_from(count).unwrap_or(0);
        }
        Ok(removed)
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
