//! Thread histories on Redis: a LIST of messages (`<p>:hist:{<thread>}`, oldest first) and a
//! SET of their ids (`<p>:histids:{<thread>}`) that makes appends idempotent.
//!
//! `append` is one Lua script: for each message in order, it adds the id to the set and, only
//! if the id was new, pushes the message; then it refreshes both TTLs. So a retried flush (for
//! instance after a timeout whose write did land) or a resumed run never duplicates a message,
//! and a batch is stored entirely or not at all.
//!
//! Each entry is a format byte (`1`) and the message in postcard (ids as their 16 bytes, the
//! time as a varint): about 45 bytes besides the text, where JSON took about 190. The id set
//! holds each id's 16 bytes. Earlier releases wrote JSON entries (`{...}`) and text ids;
//! both are still read, and an id recorded as text still counts as present, so a thread
//! written before the change never gets a message twice.

use std::fmt;
use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;
use runvisor_actors::store::{HistoryStore, HistoryTail};
use runvisor_actors::{Fence, Message, StoreError, ThreadId};

use super::conn::Conn;
use super::keys::Keys;
use super::keys::ttl_ms;
use super::lease::{fenced, fenced_script, token_arg};
use super::reply::{self, corrupt};
use super::scripts::Part;

/// Appends the messages whose ids are new, in order.
///
/// KEYS: history list, id set, the thread's fence counter. ARGV: TTL in ms, fencing token
/// (empty: unfenced), then for each message its id (16 bytes), its id as text (how earlier
/// releases recorded it) and its entry.
/// Returns `{"ok", appended}`, `{"fenced", current}` or `{"wrongtype", key}`.
pub(crate) const APPEND: &str = r#"
local kinds = {'list', 'set', 'string'}
for i, key in ipairs(KEYS) do
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= kinds[i] then return {'wrongtype', key} end
end
local refused = fence_refused(KEYS[3], ARGV[2], ARGV[1])
if refused then return {'fenced', refused} end
local appended = 0
for i = 3, #ARGV - 2, 3 do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i + 1]) == 0
      and redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('RPUSH', KEYS[1], ARGV[i + 2])
    appended = appended + 1
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {'ok', appended}
"#;

/// Lua defining `history_tail(list, window)`: how many entries the history `list` holds and
/// its newest `window` of them, oldest first (all of them when `window` is empty text), read
/// together; `false, false` when the key holds a value of another type. Prepended with
/// [`FENCE_CHECK`](super::lease::FENCE_CHECK) (its `failed`).
pub(crate) const TAIL_READ: &str = r#"
local function history_tail(list, window)
  local total = redis.pcall('LLEN', list)
  if failed(total) then return false, false end
  local from = 0
  if window ~= '' then from = math.max(total - tonumber(window), 0) end
  if from >= total then return {}, total end
  return redis.call('LRANGE', list, from, -1), total
end
"#;

/// Reads a history's tail ([`TAIL_READ`]).
///
/// KEYS: history list. ARGV: how many of the newest entries to read (decimal; empty: all).
/// Returns `{"ok", total, entries}` or `{"wrongtype", key}`.
const TAIL: &str = r#"
local entries, total = history_tail(KEYS[1], ARGV[1])
if not entries then return {'wrongtype', KEYS[1]} end
return {'ok', total, entries}
"#;

/// [`HistoryStore`] on Redis: a list of JSON messages and a set of their ids per thread;
/// `append` is one script, idempotent by message id. See the [key layout](super).
pub struct RedisHistoryStore {
    conn: Conn,
    keys: Keys,
    ttl_ms: u64,
    append: ::redis::Script,
    tail: ::redis::Script,
}

impl fmt::Debug for RedisHistoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisHistoryStore")
            .field("keys", &self.keys)
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl RedisHistoryStore {
    pub(crate) fn new(conn: Conn, keys: Keys, ttl: Duration) -> Self {
        Self {
            conn,
            keys,
            ttl_ms: ttl_ms(ttl),
            append: fenced_script(APPEND),
            tail: fenced_script(&format!("{TAIL_READ}{TAIL}")),
        }
    }

    /// The keys and arguments of the append script ([`APPEND`]) adding `messages`, also a step
    /// of a run's whole end.
    pub(crate) fn append_part(
        &self,
        thread: &ThreadId,
        messages: &[Message],
        fence: Option<Fence>,
    ) -> Result<Part, StoreError> {
        let mut args = vec![
            self.ttl_ms.to_string().into_bytes(),
            token_arg(fence).into_bytes(),
        ];
        for message in messages {
            let entry = encode(message).map_err(|e| {
                StoreError::Unavailable(format!("cannot encode message {}: {e}", message.id))
            })?;
            args.push(message.id.as_uuid().as_bytes().to_vec());
            args.push(message.id.to_string().into_bytes());
            args.push(entry);
        }
        Ok(Part {
            keys: vec![
                self.keys.history(thread),
                self.keys.history_ids(thread),
                self.keys.fence(thread),
            ],
            args,
        })
    }

    /// What the append script's `reply` says.
    pub(crate) fn append_answer(
        &self,
        reply: &Value,
        thread: &ThreadId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        let list = self.keys.history(thread);
        let items = reply::array(reply, &list)?;
        match items.first().map(|s| reply::text(s, &list)).transpose()? {
            Some("ok") => Ok(()),
            Some("fenced") => {
                let current = items.get(1).map(|c| reply::text(c, &list)).transpose()?;
                Err(fenced(thread, fence, current, &list))
            }
            Some("wrongtype") => {
                let key = items
                    .get(1)
                    .map(|k| reply::text(k, &list))
                    .transpose()?
                    .unwrap_or(&list);
                Err(corrupt(key, "the key holds a value of another type"))
            }
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the history script for {list}: {reply:?}"
            ))),
        }
    }
}

#[async_trait]
impl HistoryStore for RedisHistoryStore {
    async fn append(
        &self,
        thread: &ThreadId,
        messages: &[Message],
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let part = self.append_part(thread, messages, fence)?;
        let invocation = part.invoke(&self.append);
        let list = self.keys.history(thread);
        let reply = self
            .conn
            .script("history append", &list, &invocation)
            .await?;
        self.append_answer(&reply, thread, fence)
    }

    async fn load(&self, thread: &ThreadId) -> Result<Vec<Message>, StoreError> {
        let list = self.keys.history(thread);
        let mut cmd = ::redis::cmd("LRANGE");
        cmd.arg(&list).arg(0).arg(-1);
        let reply = self.conn.query(&list, &cmd).await?;
        entries(&reply, &list)
    }

    async fn load_tail(
        &self,
        thread: &ThreadId,
        window: Option<usize>,
    ) -> Result<HistoryTail, StoreError> {
        let Some(window) = window else {
            return Ok(HistoryTail::of(self.load(thread).await?, None));
        };
        let list = self.keys.history(thread);
        let mut invocation = self.tail.prepare_invoke();
        invocation.key(&list).arg(window);
        let reply = self.conn.script("history tail", &list, &invocation).await?;
        let items = reply::array(&reply, &list)?;
        match items {
            [status, total, read] if reply::text(status, &list)? == "ok" => {
                let total = match total {
                    Value::Int(n) => u64::try_from(*n).ok(),
                    _ => None,
                }
                .ok_or_else(|| corrupt(&list, format!("the history's length reads {total:?}")))?;
                Ok(HistoryTail::new(entries(read, &list)?, total))
            }
            [status, ..] if reply::text(status, &list)? == "wrongtype" => {
                Err(corrupt(&list, "the key holds a value of another type"))
            }
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the history tail script for {list}: {reply:?}"
            ))),
        }
    }
}

/// The messages of a history `list` read whole (`LRANGE 0 -1`'s `reply`).
pub(crate) fn entries(reply: &Value, list: &str) -> Result<Vec<Message>, StoreError> {
    reply::array(reply, list)?
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            decode(reply::bytes(entry, list)?)
                .map_err(|e| corrupt(list, format!("entry {i} is not a message: {e}")))
        })
        .collect()
}

/// The format byte of a postcard entry.
const POSTCARD: u8 = 1;

/// A message as a history entry: [`POSTCARD`], then the message.
fn encode(message: &Message) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_extend(message, vec![POSTCARD])
}

/// A history entry read back: postcard after its format byte, or JSON as earlier releases
/// wrote it.
fn decode(entry: &[u8]) -> Result<Message, String> {
    match entry.split_first() {
        Some((&POSTCARD, rest)) => match postcard::take_from_bytes::<Message>(rest) {
            Ok((message, [])) => Ok(message),
            Ok((_, extra)) => Err(format!("{} bytes follow the message", extra.len())),
            Err(e) => Err(e.to_string()),
        },
        Some((b'{', _)) => serde_json::from_slice(entry).map_err(|e| e.to_string()),
        Some((other, _)) => Err(format!("unknown format byte {other:#04x}")),
        None => Err("it is empty".to_owned()),
    }
}
