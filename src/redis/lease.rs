//! Workers' heartbeats, threads' leases and fencing tokens on Redis.
//!
//! - `<p>:worker:<id>` (HASH: `host`, `pid`, `started_at`, `version`) is a worker's heartbeat;
//!   it lives for the lease TTL and every renew rewrites it.
//! - `<p>:lease:{<thread>}` (HASH: `worker`, `run`, `token`, `expires`) is the thread's lease,
//!   held until `expires` (ms since the epoch, by the server's clock), which every renewal
//!   moves on by the lease TTL. An expired lease stays until it is taken or released (the key
//!   lives as long as the thread's data), so whoever takes it over learns whose it was.
//! - `<p>:fence:{<thread>}` (STRING) counts the thread's leases: every `acquire` increments it
//!   and the new value is the holder's fencing token. It lives as long as the thread's data
//!   (the checkpoint TTL), refreshed by each acquire.
//!
//! `acquire` is one script in the thread's slot: it takes the lease when there is none, when
//! it expired, or when it is the one the caller saw held by a dead worker; otherwise it answers
//! busy with the holder. A free thread costs one round trip; a held one costs a heartbeat read
//! and, when the holder is dead, a second script (a compare-and-set on the dead holder's
//! token, so two workers taking over together cannot both win).
//!
//! Fenced writes of the other stores start their script with [`FENCE_CHECK`]: a token that is
//! not the thread's current counter refuses the whole write ([`StoreError::Fenced`]).

use std::fmt;
use std::time::Duration;

use ::redis::{Script, Value};
use async_trait::async_trait;
use runvisor_actors::store::{Acquired, LeaseStore};
use runvisor_actors::{
    Fence, Lease, LeaseError, LeaseHolder, RunId, StoreError, ThreadId, WorkerId, WorkerInfo,
};

use super::conn::Conn;
use super::keys::Keys;
use super::keys::ttl_ms;
use super::reply::{self, Fields, corrupt};
use super::scripts::Part;

/// Lua prepended to every fenced script: `fence_refused(key, token, ttl)` answers the
/// thread's current token when `token` (decimal text, or empty for an unfenced write) is not
/// it, and `nil` when the write may go on.
///
/// A missing counter (Redis lost its data, or the thread was idle for longer than the data
/// TTL) means nobody took the thread since the token was issued: any later acquire makes a
/// greater token (see [`ACQUIRE`]). So the token becomes the counter again (with `ttl` in ms)
/// and the write goes on: a restart of a Redis without persistence does not cost the runs
/// that were writing to it their state.
///
/// `fence_judged(key, token, ttl, current)` is the same with the counter already read
/// (`current`: its value, or `false` when it is missing), for a script that reads it with
/// other keys in one call. `failed(reply)` tells whether a `redis.pcall` answered an error
/// (a key of another type, for the scripts that find one by the call that reads it).
pub(crate) const FENCE_CHECK: &str = r#"
local function failed(reply) return type(reply) == 'table' and reply.err ~= nil end
local function fence_judged(key, token, ttl, current)
  if token == '' then return nil end
  if not current then
    redis.call('SET', key, token, 'PX', ttl)
    return nil
  end
  if current ~= token then return current end
  return nil
end
local function fence_refused(key, token, ttl)
  if token == '' then return nil end
  return fence_judged(key, token, ttl, redis.call('GET', key))
end
"#;

/// A fenced script: [`FENCE_CHECK`] followed by `body`.
pub(crate) fn fenced_script(body: &str) -> Script {
    Script::new(&format!("{FENCE_CHECK}{body}"))
}

/// A token as a fenced script takes it: decimal, or empty for an unfenced write.
pub(crate) fn token_arg(fence: Option<Fence>) -> String {
    fence.map(|f| f.0.to_string()).unwrap_or_default()
}

/// The error for a script's `{"fenced", current}` reply.
pub(crate) fn fenced(
    thread: &ThreadId,
    fence: Option<Fence>,
    current: Option<&str>,
    key: &str,
) -> StoreError {
    let current = match current.map(str::parse::<u64>) {
        Some(Ok(current)) => current,
        _ => return corrupt(key, "the thread's fencing counter is not a number"),
    };
    StoreError::Fenced {
        thread: thread.clone(),
        token: fence.map_or(0, |f| f.0),
        current,
    }
}

/// Takes a thread's lease.
///
/// The new token is the counter plus one, or the server's clock in microseconds when that is
/// greater: tokens grow across a loss of the counter too (a Redis restarted without its data),
/// so a token issued after the loss is greater than every token issued before it.
///
/// KEYS: lease hash, fence counter. ARGV: worker, run, lease TTL in ms, the token of the dead
/// holder the caller saw (empty: the caller saw none), data TTL in ms.
/// Returns `{"ok", token}`, `{"ok", token, worker, run}` (taken from that dead holder),
/// `{"busy", worker, run, token}`, `{"wrongtype", key}` or `{"corrupt", key}`. Nothing is
/// written before every check passed; a free thread's lease is taken in seven calls. A live
/// lease held by the same worker and run answers `{"ok", token}` with nothing written: run
/// ids are never reused, so it is an earlier attempt of this very acquire that landed (its
/// answer lost to a timeout), and trying again is safe; a lease taken over keeps the holder it
/// was taken from (`took_worker`, `took_run`), so that answer names it as the first would
/// have, and the orphaned run's record is closed all the same.
/// Prepended with [`FENCE_CHECK`] (for `failed`).
pub(crate) const ACQUIRE: &str = r#"
-- Reads that answer a key of another type with an error: no call asks a type.
local held = redis.pcall('HMGET', KEYS[1], 'worker', 'run', 'token', 'expires')
if failed(held) then return {'wrongtype', KEYS[1]} end
local counter = redis.pcall('GET', KEYS[2])
if failed(counter) then return {'wrongtype', KEYS[2]} end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now / 1000)
-- A hash with none of the lease's fields still exists (Redis keeps no empty hash): junk.
local exists = (held[1] or held[2] or held[3] or held[4]) and true
  or redis.call('EXISTS', KEYS[1]) == 1
if exists then
  if not (held[1] and held[2] and held[3]) then return {'corrupt', KEYS[1]} end
  local expires = tonumber(held[4] or '')
  local expired = expires ~= nil and expires <= now_ms
  -- The caller's own live lease: an earlier attempt of this acquire landed, its answer lost;
  -- it answers as that attempt did, naming the holder it took the lease from, if any.
  if held[1] == ARGV[1] and held[2] == ARGV[2] and not expired then
    local took = redis.call('HMGET', KEYS[1], 'took_worker', 'took_run')
    if took[1] and took[2] then return {'ok', held[3], took[1], took[2]} end
    return {'ok', held[3]}
  end
  if held[3] ~= ARGV[4] and not expired then return {'busy', held[1], held[2], held[3]} end
end
if counter and not (string.match(counter, '^%d+$') and #counter <= 16
    and tonumber(counter) < 9007199254740992) then
  return {'corrupt', KEYS[2]}
end
local token = string.format('%.0f', math.max((tonumber(counter) or 0) + 1, now))
redis.call('SET', KEYS[2], token, 'PX', ARGV[5])
if exists then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 'worker', ARGV[1], 'run', ARGV[2], 'token', token,
  'expires', string.format('%.0f', now_ms + tonumber(ARGV[3])))
if held[3] then
  redis.call('HSET', KEYS[1], 'took_worker', held[1], 'took_run', held[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if held[3] then return {'ok', token, held[1], held[2]} end
return {'ok', token}
"#;

/// Renews a lease while its token is the thread's (re-creating it if it expired meanwhile, and
/// the counter if it was lost: see [`FENCE_CHECK`]), and keeps the run's record alive while it
/// says the run is running.
///
/// KEYS: lease hash, fence counter, the run's record. ARGV: worker, run, token, lease TTL in
/// ms, data TTL in ms. Returns `{"ok"}`, `{"lost", worker, run}` (empty when nobody holds it)
/// or `{"wrongtype", key}`.
const RENEW: &str = r#"
local kinds = {'hash', 'string'}
for i, kind in ipairs(kinds) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= kind then return {'wrongtype', KEYS[i]} end
end
if fence_refused(KEYS[2], ARGV[3], ARGV[5]) then
  local held = redis.call('HMGET', KEYS[1], 'worker', 'run')
  return {'lost', held[1] or '', held[2] or ''}
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], 'worker', ARGV[1], 'run', ARGV[2], 'token', ARGV[3],
  'expires', string.format('%.0f', now_ms + tonumber(ARGV[4])))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if redis.call('TYPE', KEYS[3])['ok'] == 'hash'
    and redis.call('HGET', KEYS[3], 'status') == 'running' then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return {'ok'}
"#;

/// Reads a lease that has not expired.
///
/// KEYS: lease hash. Returns its fields (HGETALL), or nothing when it expired or is absent.
const READ: &str = r#"
local expires = redis.call('HGET', KEYS[1], 'expires')
if expires then
  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local at = tonumber(expires)
  if at and at <= now_ms then return {} end
end
return redis.call('HGETALL', KEYS[1])
"#;

/// Deletes a lease if it still carries the token.
///
/// KEYS: lease hash. ARGV: token. Returns 1 when deleted, 0 otherwise (a key of another type
/// is left alone: the `HGET` that would read its token answers an error).
const RELEASE: &str = r#"
local token = redis.pcall('HGET', KEYS[1], 'token')
if token == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// How many renewals one pipeline carries.
const RENEW_BATCH: usize = 1000;

/// [`LeaseStore`] on Redis: heartbeats, leases and fencing counters, with `acquire`, `renew`
/// and `release` as Lua scripts in the thread's slot. See the [key layout](super).
pub struct RedisLeaseStore {
    conn: Conn,
    keys: Keys,
    data_ttl_ms: u64,
    acquire: Script,
    renew: Script,
    /// The renew script's text, to load it where a pipeline finds it unknown.
    renew_source: std::sync::Arc<str>,
    release: Script,
    read: Script,
}

impl fmt::Debug for RedisLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLeaseStore")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl RedisLeaseStore {
    pub(crate) fn new(conn: Conn, keys: Keys, data_ttl: Duration) -> Self {
        Self {
            conn,
            keys,
            data_ttl_ms: ttl_ms(data_ttl),
            acquire: fenced_script(ACQUIRE),
            renew: fenced_script(RENEW),
            renew_source: std::sync::Arc::from(format!("{FENCE_CHECK}{RENEW}")),
            release: Script::new(RELEASE),
            read: Script::new(READ),
        }
    }

    /// One acquire script; `dead` is the token of the dead holder the caller saw.
    async fn try_acquire(
        &self,
        thread: &ThreadId,
        holder: &LeaseHolder,
        ttl: Duration,
        dead: Option<&str>,
    ) -> Result<Attempt, StoreError> {
        let part = self.acquire_part(thread, holder, ttl, dead);
        let invocation = part.invoke(&self.acquire);
        let lease = self.keys.lease(thread);
        let reply = self
            .conn
            .script("lease acquire", &lease, &invocation)
            .await?;
        self.attempt(&reply, thread)
    }

    /// The keys and arguments of [`ACQUIRE`] taking `thread`'s lease for `holder`, also the
    /// first step of a run's start in one script.
    pub(crate) fn acquire_part(
        &self,
        thread: &ThreadId,
        holder: &LeaseHolder,
        ttl: Duration,
        dead: Option<&str>,
    ) -> Part {
        Part {
            keys: vec![self.keys.lease(thread), self.keys.fence(thread)],
            args: [
                holder.worker.to_string(),
                holder.run.to_string(),
                ttl_ms(ttl).to_string(),
                dead.unwrap_or("").to_owned(),
                self.data_ttl_ms.to_string(),
            ]
            .into_iter()
            .map(String::into_bytes)
            .collect(),
        }
    }

    /// What [`ACQUIRE`]'s `reply` says.
    pub(crate) fn attempt(&self, reply: &Value, thread: &ThreadId) -> Result<Attempt, StoreError> {
        let lease = self.keys.lease(thread);
        let items = texts(reply, &lease)?;
        match items.as_slice() {
            ["ok", token] => Ok(Attempt::Taken(
                token_of(token, &self.keys.fence(thread))?,
                None,
            )),
            ["ok", token, worker, run] => Ok(Attempt::Taken(
                token_of(token, &self.keys.fence(thread))?,
                Some(holder_of(worker, run, &lease)?),
            )),
            ["busy", worker, run, token] => Ok(Attempt::Busy(
                holder_of(worker, run, &lease)?,
                (*token).to_owned(),
            )),
            ["wrongtype", key] => Err(corrupt(key, "the key holds a value of another type")),
            ["corrupt", key] => Err(corrupt(key, "the lease or its counter is malformed")),
            _ => Err(unexpected("acquire", &lease, reply)),
        }
    }

    /// The renewal of one lease.
    fn renewal<'a>(
        &'a self,
        thread: &ThreadId,
        lease: &Lease,
        ttl: Duration,
    ) -> ::redis::ScriptInvocation<'a> {
        let mut invocation = self.renew.prepare_invoke();
        invocation
            .key(self.keys.lease(thread))
            .key(self.keys.fence(thread))
            .key(self.keys.run(thread, lease.holder.run))
            .arg(lease.holder.worker.as_str())
            .arg(lease.holder.run.to_string())
            .arg(lease.fence.0.to_string())
            .arg(ttl_ms(ttl))
            .arg(self.data_ttl_ms);
        invocation
    }

    /// The renewal of one lease as a plain `EVALSHA`, for pipelines.
    fn renewal_cmd(&self, thread: &ThreadId, lease: &Lease, ttl: Duration) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(self.renew.get_hash())
            .arg(3)
            .arg(self.keys.lease(thread))
            .arg(self.keys.fence(thread))
            .arg(self.keys.run(thread, lease.holder.run))
            .arg(lease.holder.worker.as_str())
            .arg(lease.holder.run.to_string())
            .arg(lease.fence.0.to_string())
            .arg(ttl_ms(ttl))
            .arg(self.data_ttl_ms);
        cmd
    }

    /// Whether a worker's heartbeat is there.
    async fn alive(&self, worker: &WorkerId) -> Result<bool, StoreError> {
        let key = self.keys.worker(worker);
        let mut cmd = ::redis::cmd("EXISTS");
        cmd.arg(&key);
        let reply = self.conn.query(&key, &cmd).await?;
        Ok(reply::int(&reply, &key)? == 1)
    }
}

/// What one acquire script did.
pub(crate) enum Attempt {
    Taken(Fence, Option<LeaseHolder>),
    /// Held by this holder, with this token (as stored).
    Busy(LeaseHolder, String),
}

fn texts<'a>(reply: &'a Value, key: &str) -> Result<Vec<&'a str>, StoreError> {
    reply::array(reply, key)?
        .iter()
        .map(|item| reply::text(item, key))
        .collect()
}

/// What a renew script answered.
fn renewed(reply: &Value, key: &str) -> Result<(), LeaseError> {
    let items = texts(reply, key)?;
    match items.as_slice() {
        ["ok"] => Ok(()),
        ["lost", "", ""] => Err(LeaseError::Lost { current: None }),
        ["lost", worker, run] => Err(LeaseError::Lost {
            current: Some(holder_of(worker, run, key)?),
        }),
        ["wrongtype", bad] => Err(corrupt(bad, "the key holds a value of another type").into()),
        _ => Err(unexpected("renew", key, reply).into()),
    }
}

fn token_of(token: &str, key: &str) -> Result<Fence, StoreError> {
    reply::parse(token.as_bytes(), key, "token").map(Fence)
}

fn holder_of(worker: &str, run: &str, key: &str) -> Result<LeaseHolder, StoreError> {
    Ok(LeaseHolder {
        worker: reply::parse(worker.as_bytes(), key, "worker")?,
        run: reply::parse::<RunId>(run.as_bytes(), key, "run")?,
    })
}

fn unexpected(script: &str, key: &str, reply: &Value) -> StoreError {
    StoreError::Unavailable(format!(
        "unexpected reply from the {script} script for {key}: {reply:?}"
    ))
}

#[async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn heartbeat(&self, worker: &WorkerInfo, ttl: Duration) -> Result<(), StoreError> {
        let key = self.keys.worker(&worker.id);
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("HSET")
            .arg(&key)
            .arg("host")
            .arg(&worker.host)
            .arg("pid")
            .arg(worker.pid)
            .arg("started_at")
            .arg(worker.started_at_ms)
            .arg("version")
            .arg(&worker.version)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(ttl_ms(ttl))
            .ignore();
        self.conn.pipeline(&key, &pipe).await.map(drop)
    }

    async fn retire(&self, worker: &WorkerId) -> Result<(), StoreError> {
        let key = self.keys.worker(worker);
        let mut cmd = ::redis::cmd("UNLINK");
        cmd.arg(&key);
        self.conn.query(&key, &cmd).await.map(drop)
    }

    async fn workers(&self, ids: &[WorkerId]) -> Result<Vec<Option<WorkerInfo>>, StoreError> {
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            let key = self.keys.worker(id);
            let mut cmd = ::redis::cmd("HGETALL");
            cmd.arg(&key);
            let reply = self.conn.query(&key, &cmd).await?;
            let fields = Fields::read(&reply, &key)?;
            if fields.is_empty() {
                found.push(None);
                continue;
            }
            found.push(Some(WorkerInfo::new(
                id.clone(),
                fields.required_text("host")?.to_owned(),
                fields.required_parsed("pid")?,
                fields.required_parsed("started_at")?,
                fields.required_text("version")?.to_owned(),
            )));
        }
        Ok(found)
    }

    async fn acquire(
        &self,
        thread: &ThreadId,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Acquired, LeaseError> {
        let (busy, token) = match self.try_acquire(thread, holder, ttl, None).await? {
            Attempt::Taken(fence, took_over) => {
                return Ok(acquired(holder, fence, took_over));
            }
            Attempt::Busy(busy, token) => (busy, token),
        };
        if self.alive(&busy.worker).await? {
            return Err(LeaseError::Busy { holder: busy });
        }
        // The holder's worker stopped heartbeating: take the thread over, unless someone else
        // did first (then the lease carries another token and this answers busy).
        match self.try_acquire(thread, holder, ttl, Some(&token)).await? {
            Attempt::Taken(fence, took_over) => Ok(acquired(holder, fence, took_over)),
            Attempt::Busy(busy, _) => Err(LeaseError::Busy { holder: busy }),
        }
    }

    async fn renew(
        &self,
        thread: &ThreadId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<(), LeaseError> {
        let key = self.keys.lease(thread);
        let invocation = self.renewal(thread, lease, ttl);
        let reply = self.conn.script("lease renewal", &key, &invocation).await?;
        renewed(&reply, &key)
    }

    async fn renew_all(
        &self,
        leases: &[(ThreadId, Lease)],
        ttl: Duration,
    ) -> Vec<Result<(), LeaseError>> {
        let mut results = Vec::with_capacity(leases.len());
        for batch in leases.chunks(RENEW_BATCH) {
            let first = self.keys.lease(&batch[0].0);
            let cmds = |which: &[usize]| -> Vec<::redis::Cmd> {
                which
                    .iter()
                    .map(|&i| self.renewal_cmd(&batch[i].0, &batch[i].1, ttl))
                    .collect()
            };
            let all: Vec<usize> = (0..batch.len()).collect();
            // One round trip (one per node on a cluster); errors come per reply, so one bad
            // lease fails alone.
            let mut replies: Vec<Result<Value, StoreError>> =
                match self.conn.fan_out(&first, cmds(&all)).await {
                    Ok(replies) => replies.into_iter().map(Ok).collect(),
                    Err(error) => {
                        results.extend(batch.iter().map(|_| Err(error.clone().into())));
                        continue;
                    }
                };
            // A server that does not know the script yet (a restart, a failover, a new node):
            // load it on every primary and send those renewals again.
            let unknown: Vec<usize> = replies
                .iter()
                .enumerate()
                .filter(|(_, r)| matches!(r, Ok(Value::ServerError(e)) if e.code() == "NOSCRIPT"))
                .map(|(i, _)| i)
                .collect();
            if !unknown.is_empty() {
                let mut load = ::redis::cmd("SCRIPT");
                load.arg("LOAD").arg(&*self.renew_source);
                let again = match self.conn.on_every_primary("SCRIPT LOAD", &load).await {
                    Ok(_) => self.conn.fan_out(&first, cmds(&unknown)).await,
                    Err(e) => Err(e),
                };
                match again {
                    Ok(again) => {
                        for (i, reply) in unknown.into_iter().zip(again) {
                            replies[i] = Ok(reply);
                        }
                    }
                    Err(error) => {
                        for i in unknown {
                            replies[i] = Err(error.clone());
                        }
                    }
                }
            }
            for ((thread, _), reply) in batch.iter().zip(replies) {
                let key = self.keys.lease(thread);
                results.push(reply.map_err(LeaseError::from).and_then(|reply| {
                    reply::server_error(&reply, "the lease renewal script", &key)?;
                    renewed(&reply, &key)
                }));
            }
        }
        results
    }

    async fn release(&self, thread: &ThreadId, lease: &Lease) -> Result<(), StoreError> {
        let key = self.keys.lease(thread);
        let mut invocation = self.release.prepare_invoke();
        invocation.key(&key).arg(lease.fence.0.to_string());
        self.conn
            .script("lease release", &key, &invocation)
            .await
            .map(drop)
    }

    async fn lease(&self, thread: &ThreadId) -> Result<Option<Lease>, StoreError> {
        let key = self.keys.lease(thread);
        let mut invocation = self.read.prepare_invoke();
        invocation.key(&key);
        let reply = self.conn.script("lease read", &key, &invocation).await?;
        let fields = Fields::read(&reply, &key)?;
        if fields.is_empty() {
            return Ok(None);
        }
        Ok(Some(Lease {
            holder: LeaseHolder {
                worker: fields.required_parsed("worker")?,
                run: fields.required_parsed("run")?,
            },
            fence: Fence(fields.required_parsed("token")?),
        }))
    }
}

pub(crate) fn acquired(
    holder: &LeaseHolder,
    fence: Fence,
    took_over: Option<LeaseHolder>,
) -> Acquired {
    Acquired::new(
        Lease {
            holder: holder.clone(),
            fence,
        },
        took_over,
    )
}
