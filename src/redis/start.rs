//! A new run's start in one script on Redis ([`StartStore`]): the lease's acquire
//! ([`lease::ACQUIRE`]), then the run's first record ([`run::PUT`]) with the new token as its
//! fencing token and its `fence` field, then the thread's history (whole, or its newest
//! messages within the runtime's window, with its length) and its newest
//! checkpoint id (the index's greatest member: the run's checkpoints sort after it, whatever
//! the clock of the process that wrote it), all in the thread's slot. Each step is the script
//! it is alone, called as a Lua function with its own keys and arguments, and runs only when
//! the one before it answered `ok`. The record's
//! pointer and its index entries go in the same pipeline, as a record's write sends them.
//!
//! A new run on Redis then takes one round trip before it runs instead of two (the lease,
//! then the record beside the history read).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;
use runvisor_actors::store::{Begun, HistoryTail, RunRecord, StartStore};
use runvisor_actors::{CheckpointId, Fence, LeaseError, LeaseHolder, StoreError};

use super::history;
use super::keys::Keys;
use super::lease::{self, Attempt, FENCE_CHECK, RedisLeaseStore, acquired};
use super::reply;
use super::run::{self, RedisRunStore};
use super::scripts::{Lua, Part};

/// Runs the steps in order.
///
/// KEYS: the acquire's, then the record's, then the thread's history list and its checkpoint
/// index. ARGV: the acquire's, then the record's (its fencing token and `fence` field as
/// placeholders), then how many of the history's newest messages to read (empty: all), then
/// the acquire's key and argument counts and where the `fence` field's value is among the
/// record's arguments (1-based). Returns `{'lease', reply}` when the lease is not taken,
/// `{'record', reply, lease reply}` when the record is not written (the lease is), or
/// `{'ok', lease reply, record reply, history, newest, length}` (`history` and `length`:
/// `false` when the list is a key of another type; `newest`: the index's greatest member,
/// `false` when there is none or the index is a key of another type).
const STEPS: &str = r#"
local n = #ARGV
local lease_keys, lease_args = tonumber(ARGV[n - 2]), tonumber(ARGV[n - 1])
local at = tonumber(ARGV[n])
local k, a, rk, ra = {}, {}, {}, {}
for i = 1, lease_keys do k[i] = KEYS[i] end
for i = 1, lease_args do a[i] = ARGV[i] end
for i = lease_keys + 1, #KEYS - 2 do rk[#rk + 1] = KEYS[i] end
for i = lease_args + 1, n - 4 do ra[#ra + 1] = ARGV[i] end
local taken = acquire(k, a)
if taken[1] ~= 'ok' then return {'lease', taken} end
ra[2] = taken[2]
ra[at] = taken[2]
local recorded = record(rk, ra)
if recorded[1] ~= 'ok' then return {'record', recorded, taken} end
local history, length = history_tail(KEYS[#KEYS - 1], ARGV[n - 3])
local newest = redis.pcall('ZRANGE', KEYS[#KEYS], -1, -1)
if failed(newest) or #newest == 0 then newest = false else newest = newest[1] end
return {'ok', taken, recorded, history, newest, length}
"#;

/// The start's script: the steps' scripts as functions whose parameters `KEYS` and `ARGV`
/// stand for the globals they read alone, then [`STEPS`].
fn start_script() -> String {
    format!(
        "{FENCE_CHECK}{tail}\
         local function acquire(KEYS, ARGV)\n{acquire}end\n\
         local function record(KEYS, ARGV)\n{alone}{record}end\n\
         {STEPS}",
        acquire = lease::ACQUIRE,
        alone = run::PUT_ALONE,
        record = run::PUT,
        tail = history::TAIL_READ,
    )
}

/// [`StartStore`] on Redis: a new run's lease, first record and history read in one script
/// in the thread's slot. See [Atomicity and fencing](super#atomicity-and-fencing).
pub struct RedisStartStore {
    leases: Arc<RedisLeaseStore>,
    runs: Arc<RedisRunStore>,
    keys: Keys,
    lua: Lua,
}

impl fmt::Debug for RedisStartStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStartStore").finish_non_exhaustive()
    }
}

impl RedisStartStore {
    /// The start through these stores' scripts (which must share one connection).
    pub(crate) fn new(leases: Arc<RedisLeaseStore>, runs: Arc<RedisRunStore>, keys: Keys) -> Self {
        Self {
            leases,
            runs,
            keys,
            lua: Lua::new(start_script()),
        }
    }
}

#[async_trait]
impl StartStore for RedisStartStore {
    async fn begin(
        &self,
        record: &RunRecord,
        holder: &LeaseHolder,
        ttl: Duration,
        history_window: Option<usize>,
    ) -> Result<Begun, LeaseError> {
        let thread = &record.thread;
        let taking = self.leases.acquire_part(thread, holder, ttl, None);
        // The token is not known yet: the script puts it in place of these.
        let placeholder = RunRecord {
            fence: Some(0),
            ..record.clone()
        };
        let written = self.runs.record_part(&placeholder, Some(Fence(0)));
        let Some(at) = field_value_at(&written.args, "fence") else {
            return Ok(Begun::NotStarted);
        };
        let history_key = self.keys.history(thread);
        let counts = [taking.keys.len(), taking.args.len(), at];
        let key = written.keys[0].clone();
        let read = Part {
            keys: vec![history_key.clone(), self.keys.checkpoint_index(thread)],
            args: vec![
                history_window
                    .map(|w| w.to_string())
                    .unwrap_or_default()
                    .into_bytes(),
            ],
        };
        let whole = Part::joined([taking, written, read], &counts);
        let (reply, indexed) = self
            .runs
            .send(&self.lua, record, self.lua.cmd(&whole.keys, &whole.args))
            .await?;
        let items = reply::array(&reply, &key)?;
        let step = items
            .first()
            .map(|s| reply::text(s, &key))
            .transpose()?
            .unwrap_or("");
        match (step, items) {
            ("lease", [_, taken]) => match self.leases.attempt(taken, thread)? {
                Attempt::Busy(..) => Ok(Begun::NotStarted),
                Attempt::Taken(..) => Err(unexpected(&key, &reply).into()),
            },
            ("record", [_, _, taken]) => {
                // The record was refused (a key of another type): the lease goes back, and
                // the start goes step by step, where the record's error is met again.
                if let Attempt::Taken(fence, _) = self.leases.attempt(taken, thread)? {
                    let lease = acquired(holder, fence, None).lease;
                    if let Err(e) =
                        runvisor_actors::store::LeaseStore::release(&*self.leases, thread, &lease)
                            .await
                    {
                        tracing::warn!(%thread, error = %e, "could not give back the lease of a start whose record was refused");
                    }
                }
                Ok(Begun::NotStarted)
            }
            ("ok", [_, taken, recorded, read, newest, length]) => {
                let Attempt::Taken(fence, took_over) = self.leases.attempt(taken, thread)? else {
                    return Err(unexpected(&key, &reply).into());
                };
                let fenced = RunRecord {
                    fence: Some(fence.0),
                    ..record.clone()
                };
                self.runs
                    .recorded(&fenced, Some(fence), &key, recorded, indexed)
                    .await?;
                let history = match (read, length) {
                    (Value::Array(_), Value::Int(length)) => history::entries(read, &history_key)
                        .map(|messages| {
                            HistoryTail::new(messages, u64::try_from(*length).unwrap_or(0))
                        }),
                    _ => Err(reply::corrupt(
                        &history_key,
                        "the key holds a value of another type",
                    )),
                };
                Ok(Begun::Started {
                    acquired: acquired(holder, fence, took_over),
                    history,
                    newest_checkpoint: newest_id(newest),
                })
            }
            _ => Err(unexpected(&key, &reply).into()),
        }
    }
}

/// Where the value of field `name` is among a record's [`run::PUT`] arguments (1-based, as
/// Lua counts): the fields to set come after eight arguments and their count, in pairs.
fn field_value_at(args: &[Vec<u8>], name: &str) -> Option<usize> {
    let pairs: usize = std::str::from_utf8(args.get(7)?).ok()?.parse().ok()?;
    (0..pairs)
        .map(|i| 8 + 2 * i)
        .find(|&i| args.get(i).is_some_and(|field| field == name.as_bytes()))
        .map(|i| i + 2)
}

/// The index's greatest member as the script answered it: `None` when there is none, or it
/// is not a checkpoint id (the index holds only ids; anything else orders nothing).
fn newest_id(newest: &Value) -> Option<CheckpointId> {
    match newest {
        Value::BulkString(text) => std::str::from_utf8(text).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

fn unexpected(key: &str, reply: &Value) -> StoreError {
    StoreError::Unavailable(format!(
        "unexpected reply from the run start script for {key}: {reply:?}"
    ))
}
