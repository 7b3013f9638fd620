//! Stop and cancel flags on Redis, shared by every process: the engine's [`SignalSource`]
//! port, so a flag set by any process (this one, another runvisor, FastGPT, RAGFlow, a
//! `redis-cli`) stops the run it names.
//!
//! - A flag is a string key with a non-empty value, in whatever format its writer uses
//!   (`agent_runtime_stopping:<appId>:<chatId>`, `<task_id>-cancel`, native keys): a missing
//!   key, an empty string or a key of another type is no flag.
//! - `read` answers for any number of keys in one round trip: one pipeline of `MGET`s of at
//!   most [`READ_BATCH`] keys each. The keys of foreign formats share no hash slot, so the
//!   pipeline is not atomic, which a flag read does not need; batching bounds how long one
//!   command holds the server, so other clients are served between batches. On a Redis
//!   Cluster each `MGET` reads keys of one slot (the keys are grouped by [`hash_slot`]), and
//!   the `MGET`s go as one pipeline per node, to every node at once.
//! - `raise` is `SET <key> 1 PX <ttl>` (FastGPT's `SETEX <key> 60 1`, to the millisecond),
//!   `clear` is one `UNLINK` of the keys (on a cluster, one per slot); a run's own clear
//!   (with its thread's fencing token) is one script that checks the token first, so a run
//!   that lost its thread leaves the flags alone. On a cluster that script clears the flags in
//!   the thread's slot; flags in other slots (compat keys have no tag) are unlinked after it
//!   accepted the token, one round trip later.
//! - Notices travel on the channel `<p>:signals` as JSON `{"key": "...", "raised": true}`;
//!   messages that are not such JSON are ignored. On one server they are `PUBLISH`ed and
//!   `SUBSCRIBE`d; on a cluster the channel is a shard channel (`SPUBLISH`, `SSUBSCRIBE`),
//!   served by the node that owns the slot of its name (`hash_slot("<p>:signals")`), so a
//!   notice is not broadcast to every node.
//! - `subscribe` shares one dedicated pub/sub connection (never the command connection)
//!   among all the subscribers of this source: the first opens it, the last to leave lets it
//!   close. The connection is pinged every [`HEALTH_INTERVAL`]; when it breaks, is closed by
//!   the server or stops answering pings, every subscriber's stream ends and the next
//!   `subscribe` opens a new one (the watcher re-subscribes with backoff and re-reads every
//!   flag). A subscriber that falls behind skips notices rather than holding the others:
//!   notices only wake readers, the flags stay the truth.
//!
//! Every call is bounded by the store's call timeout and fails with a [`StoreError`]
//! (`Unavailable` or `Timeout`), never a panic; the watcher takes an error as "not stopping".

mod subscription;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;
use runvisor_actors::store::{Notice, NoticeStream, SignalSource};
use runvisor_actors::{Fence, StoreError, ThreadId};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::conn::{Conn, Endpoint};
use super::keys::ttl_ms;
use super::keys::{Keys, hash_slot};
use super::lease::{fenced, fenced_script};
use super::reply;
use super::{ConnectError, RedisConfig};
use subscription::{Subscription, Target};

/// The most keys one `MGET` of a [`read`](RedisSignalSource::read) carries; a read of more
/// keys is one pipeline of several `MGET`s (still one round trip; on a cluster, one pipeline
/// per node, sent to all nodes at once).
pub const READ_BATCH: usize = 1000;

/// How often the shared subscription pings Redis to find a connection that died silently.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Reads of more keys than this go on the bulk connection.
const BULK_READ: usize = 64;

/// Notices buffered per subscriber before a slow one starts skipping.
const NOTICE_BUFFER: usize = 4096;

/// The longest flag TTL sent to Redis (about a thousand years), so `PX` never overflows.
const MAX_TTL_MS: u64 = 1 << 45;

/// Removes flags if the fencing token is the thread's.
///
/// KEYS: the thread's fence counter, then the flags. ARGV: the token, the data TTL in ms (for
/// a counter that was lost).
/// Returns `{"ok"}` or `{"fenced", current}`.
const CLEAR_FENCED: &str = r#"
local refused = fence_refused(KEYS[1], ARGV[1], ARGV[2])
if refused then return {'fenced', refused} end
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
return {'ok'}
"#;

/// [`SignalSource`] on Redis. See the [module docs](self).
pub struct RedisSignalSource {
    conn: Conn,
    /// A connection of its own for large reads (the watcher's tick over every live run), so
    /// a small read (a flag named by a notice) never queues behind one.
    bulk: Conn,
    /// Where notices are subscribed to.
    target: Target,
    keys: Keys,
    data_ttl_ms: u64,
    clear_fenced: ::redis::Script,
    channel: Arc<str>,
    response_timeout: Duration,
    call_timeout: Duration,
    hub: tokio::sync::Mutex<Hub>,
}

/// The shared subscription, as subscribers find it.
#[derive(Default)]
struct Hub {
    /// The live relay's channel; upgrading fails once the relay has ended.
    notices: Option<broadcast::WeakSender<Notice>>,
    /// When the last attempt to open the subscription failed, and why: callers that queued
    /// behind that attempt get its answer instead of waiting for one attempt each.
    failed: Option<(Instant, StoreError)>,
}

impl fmt::Debug for RedisSignalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSignalSource")
            .field("channel", &self.channel)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisSignalSource {
    /// A source on the stores' connection; its pub/sub connection opens on first `subscribe`.
    pub(crate) fn new(
        conn: Conn,
        bulk: Conn,
        config: &RedisConfig,
        endpoint: Endpoint,
    ) -> Result<Self, ConnectError> {
        let target = match endpoint {
            Endpoint::Single(url) => {
                Target::Plain(::redis::Client::open(url.as_str()).map_err(|e| {
                    ConnectError::InvalidConfig(format!("url {}: {e}", config.redacted_url()))
                })?)
            }
            Endpoint::Cluster(nodes) => Target::Sharded(nodes, config.clone()),
        };
        Ok(Self {
            conn,
            bulk,
            target,
            keys: Keys::new(&config.prefix),
            data_ttl_ms: ttl_ms(config.checkpoint_ttl),
            clear_fenced: fenced_script(CLEAR_FENCED),
            channel: Arc::from(channel(&config.prefix)),
            response_timeout: config.response_timeout,
            call_timeout: config.call_timeout,
            hub: tokio::sync::Mutex::default(),
        })
    }

    /// The channel notices travel on: `<p>:signals` (a shard channel on a cluster).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Whether notices use sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`): on a cluster.
    pub fn sharded(&self) -> bool {
        matches!(self.target, Target::Sharded(..))
    }

    /// Opens a pub/sub connection subscribed to the channel, within the call timeout.
    async fn open(&self) -> Result<Subscription, StoreError> {
        match tokio::time::timeout(self.call_timeout, self.target.open(&self.channel)).await {
            Ok(Ok(subscription)) => Ok(subscription),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout(self.response_timeout)),
            Ok(Err(e)) => Err(StoreError::Unavailable(format!(
                "redis: cannot subscribe to {}: {e}",
                self.channel
            ))),
            Err(_) => Err(StoreError::Timeout(self.call_timeout)),
        }
    }
}

/// The channel of a prefix.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:signals")
}

/// Whether an `MGET` element is a flag: a non-empty string.
fn is_flag(value: &Value) -> bool {
    match value {
        Value::BulkString(b) => !b.is_empty(),
        Value::SimpleString(s) => !s.is_empty(),
        Value::VerbatimString { text, .. } => !text.is_empty(),
        _ => false,
    }
}

/// The keys each `MGET` of a read carries, as indices into `keys`: runs of at most
/// [`READ_BATCH`] keys in key order on one server; on a cluster, runs of keys of one slot (in
/// slot order, key order within a slot).
fn batches(keys: &[String], cluster: bool) -> Vec<Vec<usize>> {
    let mut order: Vec<(u16, usize)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            (
                if cluster {
                    hash_slot(key.as_bytes())
                } else {
                    0
                },
                i,
            )
        })
        .collect();
    if cluster {
        order.sort_unstable();
    }
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut current_slot = None;
    for (slot, i) in order {
        match batches.last_mut() {
            Some(batch) if current_slot == Some(slot) && batch.len() < READ_BATCH => batch.push(i),
            _ => {
                batches.push(vec![i]);
                current_slot = Some(slot);
            }
        }
    }
    batches
}

/// A notice as JSON, the channel's payload.
pub(crate) fn encode(notice: &Notice) -> String {
    serde_json::json!({"key": notice.key, "raised": notice.raised}).to_string()
}

#[async_trait]
impl SignalSource for RedisSignalSource {
    async fn read(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        let batches = batches(keys, self.conn.is_cluster());
        let cmds = batches
            .iter()
            .map(|batch| {
                let mut cmd = ::redis::cmd("MGET");
                for &i in batch {
                    cmd.arg(&keys[i]);
                }
                cmd
            })
            .collect();
        let conn = if keys.len() > BULK_READ {
            &self.bulk
        } else {
            &self.conn
        };
        let replies = conn.fan_out(first, cmds).await?;
        let mut flags = vec![false; keys.len()];
        for (batch, reply) in batches.iter().zip(&replies) {
            let at = batch.first().map_or(first, |&i| &keys[i]);
            match reply {
                Value::Array(values) if values.len() == batch.len() => {
                    for (&i, value) in batch.iter().zip(values) {
                        flags[i] = is_flag(value);
                    }
                }
                Value::Array(values) => {
                    return Err(super::reply::corrupt(
                        at,
                        format!(
                            "MGET of {} keys answered {} values",
                            batch.len(),
                            values.len()
                        ),
                    ));
                }
                Value::ServerError(e) => {
                    return Err(super::conn::server_error(
                        &format!("MGET of {} keys", batch.len()),
                        at,
                        e,
                    ));
                }
                _ => return Err(super::reply::corrupt(at, "unexpected MGET reply")),
            }
        }
        Ok(flags)
    }

    async fn raise(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(key)
            .arg("1")
            .arg("PX")
            .arg(ttl_ms(ttl).min(MAX_TTL_MS));
        self.conn.query(key, &cmd).await.map(drop)
    }

    async fn clear(
        &self,
        keys: &[String],
        fence: Option<(&ThreadId, Fence)>,
    ) -> Result<(), StoreError> {
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let Some((thread, token)) = fence else {
            let mut cmd = ::redis::cmd("UNLINK");
            cmd.arg(keys);
            return self.conn.query(first, &cmd).await.map(drop);
        };
        let counter = self.keys.fence(thread);
        // A script touches one slot: on a cluster, the flags in the counter's slot are cleared
        // by it, the others once it has accepted the token.
        let (here, elsewhere): (Vec<&String>, Vec<&String>) = if self.conn.is_cluster() {
            let slot = hash_slot(counter.as_bytes());
            keys.iter()
                .partition(|key| hash_slot(key.as_bytes()) == slot)
        } else {
            (keys.iter().collect(), Vec::new())
        };
        let mut invocation = self.clear_fenced.prepare_invoke();
        invocation.key(&counter);
        for key in &here {
            invocation.key(key.as_str());
        }
        invocation.arg(token.0.to_string()).arg(self.data_ttl_ms);
        let reply = self.conn.script("flag clear", first, &invocation).await?;
        let items = reply::array(&reply, first)?;
        match items.first().map(|s| reply::text(s, first)).transpose()? {
            Some("ok") => {}
            Some("fenced") => {
                let current = items.get(1).map(|c| reply::text(c, first)).transpose()?;
                return Err(fenced(thread, Some(token), current, &counter));
            }
            _ => {
                return Err(StoreError::Unavailable(format!(
                    "unexpected reply from the flag clearing script for {first}: {reply:?}"
                )));
            }
        }
        let Some(other) = elsewhere.first() else {
            return Ok(());
        };
        let mut cmd = ::redis::cmd("UNLINK");
        cmd.arg(elsewhere.as_slice());
        self.conn.query(other, &cmd).await.map(drop)
    }

    async fn notify(&self, notice: &Notice) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd(if self.sharded() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        });
        cmd.arg(&*self.channel).arg(encode(notice));
        self.conn.query(&self.channel, &cmd).await.map(drop)
    }

    async fn subscribe(&self) -> Result<NoticeStream, StoreError> {
        let asked = Instant::now();
        let mut hub = self.hub.lock().await;
        if let Some(notices) = hub
            .notices
            .as_ref()
            .and_then(broadcast::WeakSender::upgrade)
        {
            return Ok(receive(notices.subscribe()));
        }
        if let Some((at, error)) = &hub.failed
            && *at >= asked
        {
            return Err(error.clone());
        }
        match self.open().await {
            Ok(subscription) => {
                let (notices, rx) = broadcast::channel(NOTICE_BUFFER);
                *hub = Hub {
                    notices: Some(notices.downgrade()),
                    failed: None,
                };
                tokio::spawn(relay(
                    subscription,
                    notices,
                    self.channel.clone(),
                    self.response_timeout,
                ));
                Ok(receive(rx))
            }
            Err(error) => {
                hub.failed = Some((Instant::now(), error.clone()));
                Err(error)
            }
        }
    }
}

/// A subscriber's stream: ends when the relay ends (the connection broke).
fn receive(rx: broadcast::Receiver<Notice>) -> NoticeStream {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(notice) => return Some((notice, rx)),
                // Skipped notices: the watcher's next tick reads every flag anyway, and a
                // waiting stop request also polls.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }))
}

/// Relays the channel's messages to the subscribers until the connection breaks, stops
/// answering pings, or nobody listens any more. Dropping `notices` ends every subscriber.
async fn relay(
    mut subscription: Subscription,
    notices: broadcast::Sender<Notice>,
    channel: Arc<str>,
    response_timeout: Duration,
) {
    let mut health = tokio::time::interval_at(Instant::now() + HEALTH_INTERVAL, HEALTH_INTERVAL);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            payload = subscription.next() => {
                let Some(payload) = payload else {
                    tracing::debug!(%channel, "signal subscription closed by the connection");
                    return;
                };
                match serde_json::from_slice::<Notice>(&payload) {
                    // No subscriber right now is fine.
                    Ok(notice) => drop(notices.send(notice)),
                    Err(error) => {
                        tracing::debug!(%channel, %error, "ignoring a message that is not a notice");
                    }
                }
            }
            _ = health.tick() => {
                if notices.receiver_count() == 0 {
                    return;
                }
                if let Err(problem) = subscription.ping(response_timeout).await {
                    tracing::debug!(%channel, %problem, "signal subscription ended");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_non_empty_strings() {
        assert!(is_flag(&Value::BulkString(b"1".to_vec())));
        assert!(is_flag(&Value::BulkString(b"x".to_vec())));
        assert!(!is_flag(&Value::BulkString(Vec::new())));
        assert!(!is_flag(&Value::Nil));
        assert!(!is_flag(&Value::Int(1)));
    }

    #[test]
    fn notices_are_small_json() {
        let notice = Notice {
            key: "agent_runtime_stopping:a:\"c\"".to_owned(),
            raised: true,
        };
        let json = encode(&notice);
        assert_eq!(
            json,
            r#"{"key":"agent_runtime_stopping:a:\"c\"","raised":true}"#
        );
        let back: Notice = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, notice);
        assert_eq!(channel("rv"), "rv:signals");
    }

    #[test]
    fn reads_are_batched_in_key_order_or_by_slot() {
        let keys: Vec<String> = (0..2500).map(|i| format!("k{i}")).collect();
        let single = batches(&keys, false);
        assert_eq!(
            single.iter().map(Vec::len).collect::<Vec<_>>(),
            [READ_BATCH, READ_BATCH, 500]
        );
        assert!(single.concat().iter().copied().eq(0..keys.len()));

        // Many keys of one slot (one tag) and keys of many slots.
        let mut keys: Vec<String> = (0..1500).map(|i| format!("{{t}}:{i}")).collect();
        keys.extend((0..300).map(|i| format!("agent_runtime_stopping:a:{i}")));
        let cluster = batches(&keys, true);
        let mut seen: Vec<usize> = cluster.concat();
        seen.sort_unstable();
        assert!(seen.iter().copied().eq(0..keys.len()), "every key once");
        for batch in &cluster {
            assert!(!batch.is_empty() && batch.len() <= READ_BATCH);
            let slot = hash_slot(keys[batch[0]].as_bytes());
            assert!(batch.iter().all(|&i| hash_slot(keys[i].as_bytes()) == slot));
            assert!(
                batch.windows(2).all(|w| w[0] < w[1]),
                "key order within a slot"
            );
        }
        let tagged = cluster
            .iter()
            .filter(|b| keys[b[0]].starts_with("{t}"))
            .count();
        assert_eq!(tagged, 2, "1,500 keys of one slot in two MGETs");
    }
}
