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
//!   command holds the server, so other clients are served between batches.
//! - `raise` is `SET <key> 1 PX <ttl>` (FastGPT's `SETEX <key> 60 1`, to the millisecond),
//!   `clear` is one `UNLINK` of the keys; a run's own clear (with its thread's fencing token)
//!   is one script that checks the token first, so a run that lost its thread leaves the
//!   flags alone.
//! - Notices travel on the channel `<p>:signals` as JSON `{"key": "...", "raised": true}`;
//!   messages that are not such JSON are ignored.
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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use ::redis::aio::{PubSubSink, PubSubStream};
use async_trait::async_trait;
use futures::StreamExt;
use runvisor_actors::store::{Notice, NoticeStream, SignalSource};
use runvisor_actors::{Fence, StoreError, ThreadId};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::checkpoint::ttl_ms;
use super::conn::Conn;
use super::keys::Keys;
use super::lease::{fenced, fenced_script};
use super::reply;
use super::{ConnectError, RedisConfig};

/// The most keys one `MGET` of a [`read`](RedisSignalSource::read) carries; a read of more
/// keys is one pipeline of several `MGET`s (still one round trip).
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
    client: ::redis::Client,
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
    pub(crate) fn new(conn: Conn, bulk: Conn, config: &RedisConfig) -> Result<Self, ConnectError> {
        let client = ::redis::Client::open(config.url.as_str()).map_err(|e| {
            ConnectError::InvalidConfig(format!("url {}: {e}", config.redacted_url()))
        })?;
        Ok(Self {
            conn,
            bulk,
            client,
            keys: Keys::new(&config.prefix),
            data_ttl_ms: ttl_ms(config.checkpoint_ttl),
            clear_fenced: fenced_script(CLEAR_FENCED),
            channel: Arc::from(channel(&config.prefix)),
            response_timeout: config.response_timeout,
            call_timeout: config.call_timeout,
            hub: tokio::sync::Mutex::default(),
        })
    }

    /// The channel notices travel on: `<p>:signals`.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Opens a pub/sub connection subscribed to the channel, within the call timeout.
    async fn open(&self) -> Result<(PubSubSink, PubSubStream), StoreError> {
        let open = async {
            let (mut sink, stream) = self.client.get_async_pubsub().await?.split();
            sink.subscribe(&*self.channel).await?;
            Ok::<_, ::redis::RedisError>((sink, stream))
        };
        match tokio::time::timeout(self.call_timeout, open).await {
            Ok(Ok(pair)) => Ok(pair),
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

/// A notice as JSON, the channel's payload.
fn encode(notice: &Notice) -> String {
    serde_json::json!({"key": notice.key, "raised": notice.raised}).to_string()
}

#[async_trait]
impl SignalSource for RedisSignalSource {
    async fn read(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        let mut pipe = ::redis::pipe();
        for batch in keys.chunks(READ_BATCH) {
            pipe.cmd("MGET").arg(batch);
        }
        let conn = if keys.len() > BULK_READ {
            &self.bulk
        } else {
            &self.conn
        };
        let replies = conn.pipeline(first, &pipe).await?;
        let mut flags = Vec::with_capacity(keys.len());
        let mut batches = keys.chunks(READ_BATCH);
        for reply in &replies {
            let (Some(batch), Value::Array(values)) = (batches.next(), reply) else {
                return Err(super::reply::corrupt(first, "unexpected MGET reply"));
            };
            if values.len() != batch.len() {
                return Err(super::reply::corrupt(
                    first,
                    format!(
                        "MGET of {} keys answered {} values",
                        batch.len(),
                        values.len()
                    ),
                ));
            }
            flags.extend(values.iter().map(is_flag));
        }
        if flags.len() != keys.len() {
            return Err(super::reply::corrupt(
                first,
                format!("{} flags read for {} keys", flags.len(), keys.len()),
            ));
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
        let mut invocation = self.clear_fenced.prepare_invoke();
        invocation.key(&counter);
        for key in keys {
            invocation.key(key.as_str());
        }
        invocation.arg(token.0.to_string()).arg(self.data_ttl_ms);
        let reply = self.conn.script(first, &invocation).await?;
        let items = reply::array(&reply, first)?;
        match items.first().map(|s| reply::text(s, first)).transpose()? {
            Some("ok") => Ok(()),
            Some("fenced") => {
                let current = items.get(1).map(|c| reply::text(c, first)).transpose()?;
                Err(fenced(thread, Some(token), current, &counter))
            }
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the flag clearing script for {first}: {reply:?}"
            ))),
        }
    }

    async fn notify(&self, notice: &Notice) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd("PUBLISH");
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
            Ok((sink, stream)) => {
                let (notices, rx) = broadcast::channel(NOTICE_BUFFER);
                *hub = Hub {
                    notices: Some(notices.downgrade()),
                    failed: None,
                };
                tokio::spawn(relay(
                    sink,
                    stream,
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
    mut sink: PubSubSink,
    mut stream: PubSubStream,
    notices: broadcast::Sender<Notice>,
    channel: Arc<str>,
    response_timeout: Duration,
) {
    let mut health = tokio::time::interval_at(Instant::now() + HEALTH_INTERVAL, HEALTH_INTERVAL);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = stream.next() => {
                let Some(message) = message else {
                    tracing::debug!(%channel, "signal subscription closed by the connection");
                    return;
                };
                match serde_json::from_slice::<Notice>(message.get_payload_bytes()) {
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
                match tokio::time::timeout(response_timeout, sink.ping::<Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => {
                        tracing::debug!(%channel, %error, "signal subscription broke");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%channel, ?response_timeout, "signal subscription stopped answering");
                        return;
                    }
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
}
