//! Run records on Redis: one HASH per run (`<p>:run:{<thread>}:<run_id>`), field by field, a
//! per-thread index ZSET (`<p>:runs:{<thread>}`, score 0, members in run id order, which is
//! start order for UUIDv7) for `list_thread`, and a pointer from each run to its thread
//! (`<p>:runthread:<run_id>`) for `get`.
//!
//! `put` writes the pointer (the same value every time: a run never changes thread) and, in
//! the same pipeline, one Lua script in the thread's slot that checks the fencing token, adds
//! the index entry and replaces the record's fields (fields of the record that are `None` are
//! deleted; fields other tools added are kept), or does nothing. `put_end`, the record of a
//! run's end, carries the rest of the end in the same script, run only once the record is
//! written: the run's flags deleted, the notices that they were cleared published (not on a
//! cluster, where notices travel on a shard channel a script cannot reach: the engine
//! publishes them), the lease deleted if it still holds the run's token. On a cluster, a run
//! with a flag outside its thread's slot writes its record alone, and the engine clears and
//! releases after it, as before. A reader skips an index
//! entry whose hash does not exist (an expired record). Records written before they moved
//! into their thread's slot (`<p>:run:<run_id>`) are still read.
//!
//! A record lives for the data TTL while its run is open (running or awaiting input; a running
//! run's lease renewals refresh it), and for the shorter finished-run TTL once the run ended
//! ([`RedisConfig::finished_run_ttl`](super::RedisConfig::finished_run_ttl)); the pointer lives
//! as long as the record. A thread keeps the records of its newest ended runs only
//! ([`RedisConfig::keep_ended_runs`](super::RedisConfig::keep_ended_runs)): in the thread's
//! index an open run scores 0 and an ended one 1, and the script that records a run's end
//! removes the oldest ended runs past the limit (hash and index entry) in the same step; their
//! pointers and their entries in the open and recent indexes go right after it.
//!
//! Across threads, two ZSETs with members `<run_id> <thread>` scored by start time list runs
//! for operators: `<p>:open` (running or awaiting input) and `<p>:recent` (every run, entries
//! older than the data TTL trimmed on each write). Three SETs find threads for checkpoint
//! stats and cleanup: `<p>:threads` (every thread), `<p>:threads:<user_id>` (a user's) and
//! `<p>:users`. They are updated with separate commands (they live in slots of their own),
//! sent in the record's pipeline (the runs it prunes leave them after it), so they are hints:
//! `list_open` checks each record and drops entries whose run is no longer open (or has no
//! record: its script was refused); `list_recent` and `list_thread` drop entries whose record
//! expired.

use std::fmt;
use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;
use runvisor_actors::store::{EndWritten, Notice, RunRecord, RunStatus, RunStore};
use runvisor_actors::{Fence, Lease, RunId, RunLabels, StoreError, ThreadId};

use super::conn::Conn;
use super::keys::Keys;
use super::keys::{hash_slot, ttl_ms};
use super::lease::{FENCE_CHECK, fenced, token_arg};
use super::reply::{self, Fields, corrupt};
use super::scripts::{Lua, Part};
use super::signal::encode;

/// Indexes a run and sets and deletes fields of its hash, refreshing both TTLs; when the run
/// ended, prunes the thread's older ended runs past the retention.
///
/// KEYS: the run hash, the thread's run index, the thread's fence counter. ARGV: data TTL in ms
/// (the index's), fencing token (empty: unfenced), run id, the record's TTL in ms, `1` when the
/// run ended (else `0`), how many ended runs the thread keeps (`0`: all), the prefix of the
/// thread's run hashes, the number N of field/value pairs to set, the N pairs, then the fields
/// to delete. Returns `{"ok", pruned run ids...}`, `{"fenced", current}` or
/// `{"wrongtype", key}`.
///
/// In the index an open run's entry scores 0 and an ended run's 1 (members of one score sort
/// by id, which is start order for UUIDv7), so the oldest ended runs are the first of score 1.
/// Only members that are run ids (36 characters) become key names: the script stays in the
/// thread's slot.
///
/// Nothing is written before every check passed (a script is not rolled back), in as few calls
/// as that allows: the fence counter is read by a `pcall` that answers a key of another type,
/// only the hash is asked its type, and the index entry is the first write, by a `pcall` that
/// answers an index of another type. A record's write makes six calls, or seven with fields to
/// delete (an ended run's also counts the ended runs).
pub(crate) const PUT: &str = r#"
local current = redis.pcall('GET', KEYS[3])
if failed(current) then return {'wrongtype', KEYS[3]} end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then return {'wrongtype', KEYS[1]} end
local refused = fence_judged(KEYS[3], ARGV[2], ARGV[1], current)
if refused then return {'fenced', refused} end
local ended = ARGV[5] == '1'
local added = redis.pcall('ZADD', KEYS[2], ended and 1 or 0, ARGV[3])
if failed(added) then return {'wrongtype', KEYS[2]} end
local n = tonumber(ARGV[8])
local set = {}
for i = 9, 8 + 2 * n do set[#set + 1] = ARGV[i] end
local del = {}
for i = 9 + 2 * n, ARGC do del[#del + 1] = ARGV[i] end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], unpack(set))
if #del > 0 then redis.call('HDEL', KEYS[1], unpack(del)) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local reply = {'ok'}
local keep = tonumber(ARGV[6])
if ended and keep > 0 then
  local over = redis.call('ZCOUNT', KEYS[2], 1, 1) - keep
  if over > 0 then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], 1, 1, 'LIMIT', 0, over)) do
      if id ~= ARGV[3] then
        redis.call('ZREM', KEYS[2], id)
        if #id == 36 and string.match(id, '^%x+%-%x+%-%x+%-%x+%-%x+$') then
          redis.call('UNLINK', ARGV[7] .. id)
          reply[#reply + 1] = id
        end
      end
    end
  end
end
return reply
"#;

/// Two records of one thread written by [`PUT`] (a Lua function here, with its own keys and
/// arguments), the second only once the first is: a resumed run's first record, then the
/// paused run's it answers.
///
/// KEYS: the first record's, then the second's. ARGV: the first's, then the second's, then
/// how many keys and arguments are the first's. Returns `{'first', reply}` when the first is
/// not written, or `{'ok', first reply, second reply}`.
const PAIR: &str = r#"
local n = #ARGV
local first_keys, first_args = tonumber(ARGV[n - 1]), tonumber(ARGV[n])
local k1, a1, k2, a2 = {}, {}, {}, {}
for i = 1, first_keys do k1[i] = KEYS[i] end
for i = first_keys + 1, #KEYS do k2[#k2 + 1] = KEYS[i] end
for i = 1, first_args do a1[i] = ARGV[i] end
for i = first_args + 1, n - 2 do a2[#a2 + 1] = ARGV[i] end
local first = record(k1, a1)
if first[1] ~= 'ok' then return {'first', first} end
return {'ok', first, record(k2, a2)}
"#;

/// How many of its arguments [`PUT`] reads: all of them when it runs alone.
pub(crate) const PUT_ALONE: &str = "local ARGC = #ARGV\n";

/// [`PUT`] for a run's end, followed, once the record is written, by the run's end in the
/// thread's slot: its flags deleted, the notices that they were cleared published, its lease
/// given up (if it still holds the run's token; a lease of another type is left alone, as a
/// release leaves it).
///
/// KEYS: [`PUT`]'s three, then the thread's lease, then the flags. ARGV: [`PUT`]'s, then the
/// notices' channel (empty: none published here), the notices, and last how many arguments
/// of the end there are (the channel and the notices). Returns what [`PUT`] returns; nothing
/// of the end is done unless that is `ok`.
pub(crate) fn put_end_script() -> String {
    format!(
        "local ARGC = #ARGV - tonumber(ARGV[#ARGV]) - 1\nlocal function put()\n{PUT}end\nlocal reply = put()\nif reply[1] ~= 'ok' then return reply end\n{END}return reply\n"
    )
}

/// The end of a run after its record, in [`put_end_script`].
const END: &str = r#"
for i = 5, #KEYS do redis.call('UNLINK', KEYS[i]) end
local channel = ARGV[ARGC + 1]
if channel ~= '' then
  for i = ARGC + 2, #ARGV - 1 do redis.call('PUBLISH', channel, ARGV[i]) end
end
if redis.pcall('HGET', KEYS[4], 'token') == ARGV[2] then redis.call('DEL', KEYS[4]) end
"#;

/// How many records `list_thread` reads per round trip.
const LIST_BATCH: usize = 256;

/// [`RunStore`] on Redis: a hash per run and an index of runs per thread. See the
/// [key layout](super).
pub struct RedisRunStore {
    conn: Conn,
    keys: Keys,
    ttl_ms: u64,
    /// How long the record of a run that ended lives.
    finished_ttl_ms: u64,
    /// How many ended runs' records a thread keeps; `None`: all.
    keep_ended: Option<usize>,
    /// The channel a run's end publishes its notices on from the record's script; `None`
    /// where notices travel on shard channels (a cluster), which a script cannot reach.
    notices: Option<String>,
    put: Lua,
    put_end: Lua,
    put_pair: Lua,
}

impl fmt::Debug for RedisRunStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRunStore")
            .field("keys", &self.keys)
            .field("ttl_ms", &self.ttl_ms)
            .field("finished_ttl_ms", &self.finished_ttl_ms)
            .field("keep_ended", &self.keep_ended)
            .finish_non_exhaustive()
    }
}

impl RedisRunStore {
    pub(crate) fn new(
        conn: Conn,
        keys: Keys,
        ttl: Duration,
        finished_ttl: Duration,
        keep_ended: Option<usize>,
        notices: Option<String>,
    ) -> Self {
        Self {
            conn,
            keys,
            ttl_ms: ttl_ms(ttl),
            finished_ttl_ms: ttl_ms(finished_ttl),
            keep_ended,
            notices,
            put: Lua::new(format!("{FENCE_CHECK}{PUT_ALONE}{PUT}")),
            put_end: Lua::new(format!("{FENCE_CHECK}{}", put_end_script())),
            put_pair: Lua::new(format!(
                "{FENCE_CHECK}local function record(KEYS, ARGV)\n{PUT_ALONE}{PUT}end\n{PAIR}"
            )),
        }
    }

    /// How long a record with this status lives: the data TTL while the run is open, the
    /// finished-run TTL once it ended.
    fn record_ttl_ms(&self, status: RunStatus) -> u64 {
        if status.is_open() {
            self.ttl_ms
        } else {
            self.finished_ttl_ms
        }
    }
}

/// The hash fields of a record: those to set and the optional ones to delete.
fn fields(record: &RunRecord) -> (Vec<(&'static str, String)>, Vec<&'static str>) {
    let mut set = vec![
        ("status", record.status.as_str().to_owned()),
        ("thread", record.thread.to_string()),
        ("workflow_id", record.workflow_id.clone()),
        ("started_at", record.started_at_ms.to_string()),
    ];
    let mut delete = Vec::new();
    let optional = [
        ("checkpoint_id", record.checkpoint_id.map(|c| c.to_string())),
        ("parent_run_id", record.parent_run_id.map(|r| r.to_string())),
        ("finished_at", record.finished_at_ms.map(|t| t.to_string())),
        ("stop_reason", record.stop_reason.clone()),
        ("failure_reason", record.failure_reason.clone()),
        ("unpersisted", record.unpersisted.clone()),
        ("app_id", record.labels.app_id().map(str::to_owned)),
        ("chat_id", record.labels.chat_id().map(str::to_owned)),
        ("task_id", record.labels.task_id().map(str::to_owned)),
        ("user_id", record.labels.user_id().map(str::to_owned)),
        ("not_resumable", record.not_resumable.clone()),
        ("worker", record.worker.as_ref().map(ToString::to_string)),
        ("fence", record.fence.map(|f| f.to_string())),
        ("traceparent", record.traceparent.clone()),
    ];
    for (name, value) in optional {
        match value {
            Some(value) => set.push((name, value)),
            None => delete.push(name),
        }
    }
    (set, delete)
}

/// Reads a record from its hash; `None` when the hash does not exist.
fn record(run_id: RunId, fields: &Fields<'_>, key: &str) -> Result<Option<RunRecord>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let status_text = fields.required_text("status")?;
    let status = RunStatus::parse(status_text).map_err(|_| {
        corrupt(
            key,
            format!("field `status`: unknown status {status_text:?}"),
        )
    })?;
    Ok(Some(RunRecord {
        run_id,
        thread: fields.required_parsed::<ThreadId>("thread")?,
        workflow_id: fields.required_text("workflow_id")?.to_owned(),
        status,
        parent_run_id: fields.optional_parsed("parent_run_id")?,
        checkpoint_id: fields.optional_parsed("checkpoint_id")?,
        started_at_ms: fields.required_parsed("started_at")?,
        finished_at_ms: fields.optional_parsed("finished_at")?,
        failure_reason: fields.optional_text("failure_reason")?.map(str::to_owned),
        stop_reason: fields.optional_text("stop_reason")?.map(str::to_owned),
        unpersisted: fields.optional_text("unpersisted")?.map(str::to_owned),
        labels: labels(fields).map_err(|e| corrupt(key, format!("labels: {e}")))?,
        not_resumable: fields.optional_text("not_resumable")?.map(str::to_owned),
        worker: fields.optional_parsed("worker")?,
        fence: fields.optional_parsed("fence")?,
        traceparent: fields.optional_text("traceparent")?.map(str::to_owned),
    }))
}

/// A record's labels, each checked.
fn labels(fields: &Fields<'_>) -> Result<RunLabels, String> {
    let text = |name: &str| {
        fields
            .optional_text(name)
            .map(|t| t.map(str::to_owned))
            .map_err(|e| e.to_string())
    };
    let labels = RunLabels::new(text("app_id")?, text("chat_id")?, text("task_id")?)
        .map_err(|e| e.to_string())?;
    match text("user_id")? {
        Some(user) => labels.with_user(user).map_err(|e| e.to_string()),
        None => Ok(labels),
    }
}

impl RedisRunStore {
    /// Reads the record at `key`; `None` when the hash does not exist.
    async fn read(&self, run: RunId, key: &str) -> Result<Option<RunRecord>, StoreError> {
        let mut cmd = ::redis::cmd("HGETALL");
        cmd.arg(key);
        let reply = self.conn.query(key, &cmd).await?;
        record(run, &Fields::read(&reply, key)?, key)
    }
}

#[async_trait]
impl RunStore for RedisRunStore {
    async fn put(&self, record: &RunRecord, fence: Option<Fence>) -> Result<(), StoreError> {
        self.write(record, fence, None).await
    }

    async fn put_end(
        &self,
        record: &RunRecord,
        lease: &Lease,
        flags: &[String],
    ) -> Result<EndWritten, StoreError> {
        // On a cluster, flags outside the thread's slot are cleared by the caller, after the
        // record, and the lease given up after them.
        if !self.end_in_script(&record.thread, flags) {
            return self
                .write(record, Some(lease.fence), None)
                .await
                .map(|()| EndWritten::Record);
        }
        self.write(record, Some(lease.fence), Some(flags)).await?;
        Ok(EndWritten::Released {
            announced: self.announces(),
        })
    }

    /// Both records in one script in their thread's slot (they share it: a resume answers a
    /// paused run of its own thread), their pointers and index entries in the same pipeline.
    async fn put_answering(
        &self,
        record: &RunRecord,
        answered: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<Result<(), StoreError>, StoreError> {
        if record.thread != answered.thread {
            self.put(record, fence).await?;
            return Ok(self.put(answered, fence).await);
        }
        let (first, second) = (
            self.record_part(record, fence),
            self.record_part(answered, fence),
        );
        let counts = [first.keys.len(), first.args.len()];
        let (key, answered_key) = (first.keys[0].clone(), second.keys[0].clone());
        let whole = Part::joined([first, second], &counts);
        let script = self.put_pair.cmd(&whole.keys, &whole.args);
        let (reply, indexed) = self
            .send_many(&self.put_pair, &[record, answered], script)
            .await?;
        let mut indexed = indexed.into_iter();
        let (first_indexed, second_indexed) = (
            indexed.next().unwrap_or(Ok(())),
            indexed.next().unwrap_or(Ok(())),
        );
        let items = reply::array(&reply, &key)?;
        match (
            items.first().map(|s| reply::text(s, &key)).transpose()?,
            items,
        ) {
            (Some("first"), [_, refused]) => {
                self.recorded(record, fence, &key, refused, first_indexed)
                    .await?;
                Err(StoreError::Unavailable(format!(
                    "the run record script for {key} answered a refusal as a write: {reply:?}"
                )))
            }
            (Some("ok"), [_, written, then]) => {
                self.recorded(record, fence, &key, written, first_indexed)
                    .await?;
                Ok(self
                    .recorded(answered, fence, &answered_key, then, second_indexed)
                    .await)
            }
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the run record pair script for {key}: {reply:?}"
            ))),
        }
    }

    async fn get(&self, run: RunId) -> Result<Option<RunRecord>, StoreError> {
        let pointer = self.keys.run_thread(run);
        let mut cmd = ::redis::cmd("GET");
        cmd.arg(&pointer);
        let reply = self.conn.query(&pointer, &cmd).await?;
        if matches!(reply, ::redis::Value::Nil) {
            return self.read(run, &self.keys.legacy_run(run)).await;
        }
        let thread: ThreadId = reply::parse(reply::bytes(&reply, &pointer)?, &pointer, "thread")?;
        self.read(run, &self.keys.run(&thread, run)).await
    }

    async fn list_thread(&self, thread: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let index = self.keys.thread_runs(thread);
        let mut cmd = ::redis::cmd("ZRANGE");
        cmd.arg(&index).arg(0).arg(-1);
        let reply = self.conn.query(&index, &cmd).await?;
        let entries = reply::array(&reply, &index)?
            .iter()
            .map(|m| {
                let member = reply::text(m, &index)?;
                member
                    .parse::<RunId>()
                    .map(|id| (id, thread.clone()))
                    .map_err(|_| corrupt(&index, format!("member {member:?} is not a run id")))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let found = self.read_many(&entries, &index).await?;
        let expired: Vec<String> = entries
            .iter()
            .zip(&found)
            .filter(|(_, record)| record.is_none())
            .map(|((run, _), _)| run.to_string())
            .collect();
        self.drop_entries(&index, expired).await;
        Ok(found
            .into_iter()
            .flatten()
            // A record of another thread is not this thread's.
            .filter(|found| &found.thread == thread)
            .collect())
    }

    async fn list_open(&self) -> Result<Vec<RunRecord>, StoreError> {
        let index = self.keys.open_runs();
        let entries = self.members(&index, 0, -1, false).await?;
        let found = self.read_many(&entries, &index).await?;
        let mut open = Vec::with_capacity(found.len());
        let mut stale = Vec::new();
        for ((run, thread), record) in entries.iter().zip(found) {
            match record {
                Some(record) if record.status.is_open() => open.push(record),
                // Ended (its index update was cut short) or expired: not open any more.
                _ => stale.push(member(*run, thread)),
            }
        }
        self.drop_entries(&index, stale).await;
        Ok(open)
    }

    async fn list_recent(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let index = self.keys.recent_runs();
        let mut records = Vec::with_capacity(limit.min(LIST_BATCH));
        let mut start = 0isize;
        // Entries whose record expired are skipped: read on until `limit` records are found.
        while records.len() < limit {
            let want = isize::try_from(limit - records.len()).unwrap_or(isize::MAX);
            let stop = start.saturating_add(want.min(LIST_BATCH as isize)) - 1;
            let entries = self.members(&index, start, stop, true).await?;
            if entries.is_empty() {
                break;
            }
            let found = self.read_many(&entries, &index).await?;
            // The entries whose record expired go; the next window starts after those kept.
            let expired: Vec<String> = entries
                .iter()
                .zip(&found)
                .filter(|(_, record)| record.is_none())
                .map(|((run, thread), _)| member(*run, thread))
                .collect();
            start = stop + 1 - isize::try_from(expired.len()).unwrap_or(0);
            self.drop_entries(&index, expired).await;
            records.extend(found.into_iter().flatten());
        }
        records.truncate(limit);
        Ok(records)
    }
}

/// An entry of the open and recent indexes: `<run_id> <thread>` (thread ids hold no spaces).
fn member(run: RunId, thread: &ThreadId) -> String {
    format!("{run} {thread}")
}

/// Reads an index entry back.
fn parse_member(member: &str, index: &str) -> Result<(RunId, ThreadId), StoreError> {
    member
        .split_once(' ')
        .and_then(|(run, thread)| Some((run.parse().ok()?, ThreadId::new(thread).ok()?)))
        .ok_or_else(|| {
            corrupt(
                index,
                format!("member {member:?} is not `<run_id> <thread>`"),
            )
        })
}

impl RedisRunStore {
    /// Entries of an open or recent index from `start` to `stop` (ZRANGE indices).
    async fn members(
        &self,
        index: &str,
        start: isize,
        stop: isize,
        newest_first: bool,
    ) -> Result<Vec<(RunId, ThreadId)>, StoreError> {
        let mut cmd = ::redis::cmd(if newest_first { "ZREVRANGE" } else { "ZRANGE" });
        cmd.arg(index).arg(start).arg(stop);
        let reply = self.conn.query(index, &cmd).await?;
        reply::array(&reply, index)?
            .iter()
            .map(|m| parse_member(reply::text(m, index)?, index))
            .collect()
    }

    /// The records of these runs, in order (`None` for one that does not exist), read in
    /// pipelined batches; `index` names where the entries came from, for errors.
    async fn read_many(
        &self,
        entries: &[(RunId, ThreadId)],
        index: &str,
    ) -> Result<Vec<Option<RunRecord>>, StoreError> {
        let mut records = Vec::with_capacity(entries.len());
        for batch in entries.chunks(LIST_BATCH) {
            let keys: Vec<String> = batch
                .iter()
                .map(|(id, thread)| self.keys.run(thread, *id))
                .collect();
            // Records of several threads live in several slots: on a cluster, one pipeline
            // per node. Errors come per reply, so a bad record is named by its own key.
            let reads = keys
                .iter()
                .map(|key| {
                    let mut cmd = ::redis::cmd("HGETALL");
                    cmd.arg(key);
                    cmd
                })
                .collect();
            let replies = self.conn.fan_out(index, reads).await?;
            for (((id, _), key), reply) in batch.iter().zip(&keys).zip(&replies) {
                reply::server_error(reply, "HGETALL", key)?;
                let found = match record(*id, &Fields::read(reply, key)?, key)? {
                    Some(found) => Some(found),
                    None => self.read(*id, &self.keys.legacy_run(*id)).await?,
                };
                records.push(found);
            }
        }
        Ok(records)
    }

    /// Removes index entries that point at nothing (or at a run no longer open). A failure
    /// only leaves them for the next reader: it is logged, not returned.
    async fn drop_entries(&self, index: &str, members: Vec<String>) {
        if members.is_empty() {
            return;
        }
        let mut cmd = ::redis::cmd("ZREM");
        cmd.arg(index).arg(members);
        if let Err(e) = self.conn.query(index, &cmd).await {
            tracing::debug!(error = %e, "could not drop stale entries of {index}");
        }
    }

    /// The commands that file a record in the open and recent indexes, and its thread in the
    /// thread indexes (every thread's, and its user's), each with the key it writes (for
    /// errors).
    fn index(&self, record: &RunRecord) -> Vec<(String, ::redis::Cmd)> {
        let entry = member(record.run_id, &record.thread);
        let (open, recent) = (self.keys.open_runs(), self.keys.recent_runs());
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let oldest = now_ms.saturating_sub(self.ttl_ms);
        let mut cmds: Vec<(String, ::redis::Cmd)> = Vec::with_capacity(11);
        let mut push = |key: &str, name: &str, args: &[&str]| {
            let mut cmd = ::redis::cmd(name);
            cmd.arg(key).arg(args);
            cmds.push((key.to_owned(), cmd));
        };
        let (started, ttl) = (record.started_at_ms.to_string(), self.ttl_ms.to_string());
        push(&recent, "ZADD", &[&started, &entry]);
        push(
            &recent,
            "ZREMRANGEBYSCORE",
            &["-inf", &format!("({oldest}")],
        );
        push(&recent, "PEXPIRE", &[&ttl]);
        if record.status.is_open() {
            push(&open, "ZADD", &[&started, &entry]);
            push(&open, "PEXPIRE", &[&ttl]);
        } else {
            push(&open, "ZREM", &[&entry]);
        }
        let thread = record.thread.to_string();
        let mut sets = vec![(self.keys.threads(), thread.as_str())];
        if let Some(user) = record.labels.user_id() {
            sets.push((self.keys.user_threads(user), thread.as_str()));
            sets.push((self.keys.users(), user));
        }
        for (set, member) in &sets {
            push(set, "SADD", &[member]);
            push(set, "PEXPIRE", &[&ttl]);
        }
        cmds
    }

    /// Removes runs the record script pruned from the open and recent indexes, with their
    /// pointers.
    async fn forget(&self, thread: &ThreadId, pruned: &[RunId]) -> Result<(), StoreError> {
        if pruned.is_empty() {
            return Ok(());
        }
        let (open, recent) = (self.keys.open_runs(), self.keys.recent_runs());
        let mut cmds: Vec<(String, ::redis::Cmd)> = Vec::with_capacity(3 * pruned.len());
        for run in pruned {
            let gone = member(*run, thread);
            for index in [&recent, &open] {
                let mut zrem = ::redis::cmd("ZREM");
                zrem.arg(index).arg(&gone);
                cmds.push((index.clone(), zrem));
            }
            let pointer = self.keys.run_thread(*run);
            let mut del = ::redis::cmd("DEL");
            del.arg(&pointer);
            cmds.push((pointer, del));
        }
        // The indexes and pointers may live on several nodes: one round trip to each.
        let (keys, cmds): (Vec<String>, Vec<::redis::Cmd>) = cmds.into_iter().unzip();
        let replies = self.conn.fan_out(&recent, cmds).await?;
        for (key, reply) in keys.iter().zip(&replies) {
            reply::server_error(reply, "a run index update", key)?;
        }
        Ok(())
    }
}

impl RedisRunStore {
    /// Writes a record (see [`put`](RunStore::put)); with `end`, the run's end after it, in
    /// its script (see [`put_end_script`]): these flags cleared and announced, the lease given up.
    async fn write(
        &self,
        record: &RunRecord,
        fence: Option<Fence>,
        end: Option<&[String]>,
    ) -> Result<(), StoreError> {
        let mut part = self.record_part(record, fence);
        let lua = match end {
            None => &self.put,
            Some(flags) => {
                self.end_part(&record.thread, flags, &mut part);
                &self.put_end
            }
        };
        let key = &part.keys[0];
        let (reply, indexed) = self
            .send(lua, record, lua.cmd(&part.keys, &part.args))
            .await?;
        self.recorded(record, fence, key, &reply, indexed).await
    }

    /// The keys and arguments of [`PUT`] writing `record`.
    pub(crate) fn record_part(&self, record: &RunRecord, fence: Option<Fence>) -> Part {
        let thread = &record.thread;
        let (set, delete) = fields(record);
        let mut args = vec![
            self.ttl_ms.to_string(),
            token_arg(fence),
            record.run_id.to_string(),
            self.record_ttl_ms(record.status).to_string(),
            if record.status.is_open() { "0" } else { "1" }.to_owned(),
            self.keep_ended.unwrap_or(0).to_string(),
            self.keys.run_prefix(thread),
            set.len().to_string(),
        ];
        for (name, value) in set {
            args.push(name.to_owned());
            args.push(value);
        }
        args.extend(delete.into_iter().map(str::to_owned));
        Part {
            keys: vec![
                self.keys.run(thread, record.run_id),
                self.keys.thread_runs(thread),
                self.keys.fence(thread),
            ],
            args: args.into_iter().map(String::into_bytes).collect(),
        }
    }

    /// Adds to `part` (a record's, see [`Self::record_part`]) what [`put_end_script`] reads
    /// after it: the lease and the flags, the notices' channel and the notices.
    pub(crate) fn end_part(&self, thread: &ThreadId, flags: &[String], part: &mut Part) {
        part.keys.push(self.keys.lease(thread));
        part.keys.extend(flags.iter().cloned());
        let before = part.args.len();
        part.args
            .push(self.notices.clone().unwrap_or_default().into_bytes());
        if self.notices.is_some() {
            part.args.extend(flags.iter().map(|key| {
                encode(&Notice {
                    key: key.clone(),
                    raised: false,
                })
                .into_bytes()
            }));
        }
        part.args
            .push((part.args.len() - before).to_string().into_bytes());
    }

    /// Whether a run's end may clear these flags in its record's script: a script reaches its
    /// own slot only, so on a cluster every flag must be in the thread's.
    pub(crate) fn end_in_script(&self, thread: &ThreadId, flags: &[String]) -> bool {
        if !self.conn.is_cluster() {
            return true;
        }
        let slot = hash_slot(self.keys.lease(thread).as_bytes());
        flags.iter().all(|key| hash_slot(key.as_bytes()) == slot)
    }

    /// Whether the record's script publishes the notices that a run's end cleared its flags.
    pub(crate) fn announces(&self) -> bool {
        self.notices.is_some()
    }

    /// Sends `script` (an invocation of `lua` that writes `record`) with the record's pointer
    /// and its index entries in one pipeline (one round trip; on a cluster one per node, at
    /// once): the pointer and the indexes live in slots of their own, and the pointer's value
    /// never changes. Answers the script's reply and whether the index updates went.
    pub(crate) async fn send(
        &self,
        lua: &Lua,
        record: &RunRecord,
        script: ::redis::Cmd,
    ) -> Result<(Value, Result<(), StoreError>), StoreError> {
        let (reply, indexed) = self.send_many(lua, &[record], script).await?;
        Ok((reply, indexed.into_iter().next().unwrap_or(Ok(()))))
    }

    /// [`Self::send`] for a script that writes several records: their pointers first, then
    /// the script, then their index entries; whether each record's index updates went, in
    /// order.
    async fn send_many(
        &self,
        lua: &Lua,
        records: &[&RunRecord],
        script: ::redis::Cmd,
    ) -> Result<(Value, Vec<Result<(), StoreError>>), StoreError> {
        let Some(first) = records.first() else {
            return Err(StoreError::Unavailable(
                "a run record script sent for no record".to_owned(),
            ));
        };
        let key = self.keys.run(&first.thread, first.run_id);
        let (pointers, sets): (Vec<String>, Vec<::redis::Cmd>) = records
            .iter()
            .map(|record| {
                let pointer = self.keys.run_thread(record.run_id);
                let mut set = ::redis::cmd("SET");
                set.arg(&pointer)
                    .arg(record.thread.as_str())
                    .arg("PX")
                    .arg(self.record_ttl_ms(record.status));
                (pointer, set)
            })
            .unzip();
        let mut index_keys: Vec<Vec<String>> = Vec::with_capacity(records.len());
        let mut index_cmds = Vec::new();
        for record in records {
            let (keys, cmds): (Vec<String>, Vec<::redis::Cmd>) =
                self.index(record).into_iter().unzip();
            index_keys.push(keys);
            index_cmds.extend(cmds);
        }
        let cmds = sets.into_iter().chain([script]).chain(index_cmds).collect();
        let mut replies = lua.run_many(&self.conn, &key, cmds).await?.into_iter();
        for pointer in &pointers {
            let Some(pointed) = replies.next() else {
                return Err(StoreError::Unavailable(format!(
                    "redis answered no reply to the run record of {key}"
                )));
            };
            reply::server_error(&pointed, "SET", pointer)?;
        }
        let Some(reply) = replies.next() else {
            return Err(StoreError::Unavailable(format!(
                "redis answered no reply to the run record of {key}"
            )));
        };
        reply::server_error(&reply, "the run record script", &key)?;
        // Every reply is read, an error or not, so each record's are its own.
        let indexed = index_keys
            .iter()
            .map(|keys| {
                let mut outcome = Ok(());
                for key in keys {
                    let checked = match replies.next() {
                        Some(reply) => reply::server_error(&reply, "a run index update", key),
                        None => Err(StoreError::Unavailable(format!(
                            "redis answered no reply to the index update of {key}"
                        ))),
                    };
                    outcome = outcome.and(checked);
                }
                outcome
            })
            .collect();
        Ok((reply, indexed))
    }

    /// What [`PUT`]'s `reply` says of `record`'s write at `key`; once it is written, the runs
    /// it pruned leave the indexes (after `indexed`, the index updates sent with it, went).
    pub(crate) async fn recorded(
        &self,
        record: &RunRecord,
        fence: Option<Fence>,
        key: &str,
        reply: &Value,
        indexed: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let items = reply::array(reply, key)?;
        match items.first().map(|s| reply::text(s, key)).transpose()? {
            Some("ok") => {
                let pruned = items[1..]
                    .iter()
                    .map(|id| {
                        let id = reply::text(id, key)?;
                        id.parse::<RunId>()
                            .map_err(|_| corrupt(key, format!("pruned {id:?} is not a run id")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                indexed?;
                self.forget(&record.thread, &pruned).await
            }
            Some("fenced") => {
                let current = items.get(1).map(|c| reply::text(c, key)).transpose()?;
                Err(fenced(&record.thread, fence, current, key))
            }
            Some("wrongtype") => {
                let bad = items
                    .get(1)
                    .map(|k| reply::text(k, key))
                    .transpose()?
                    .unwrap_or(key);
                Err(corrupt(bad, "the key holds a value of another type"))
            }
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the run script for {key}: {reply:?}"
            ))),
        }
    }
}
