//! The connection the stores share: one auto-reconnecting multiplexed connection
//! ([`ConnectionManager`]) with explicit connect and response timeouts, every call bounded by a
//! deadline on top, and Redis errors mapped to [`StoreError`]s.
//!
//! During an outage no call blocks for longer than the call timeout: a dead server answers
//! [`StoreError::Unavailable`] (the manager reconnects in the background and later calls
//! succeed again), a silent one (frozen, partitioned) answers [`StoreError::Timeout`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Cmd, Pipeline, RedisResult, ScriptInvocation, Value};
use runvisor_actors::StoreError;

use super::{ConnectError, RedisConfig};

/// Reconnection attempts per outage episode before calls fail fast (the next call starts a
/// new episode).
const RECONNECT_RETRIES: usize = 2;
/// The first pause between reconnection attempts.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);

/// A shared, bounded connection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Conn {
    manager: ConnectionManager,
    response_timeout: Duration,
    call_timeout: Duration,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("response_timeout", &self.response_timeout)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Opens the connection, bounded by the call timeout.
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Self, ConnectError> {
        let url = config.redacted_url();
        let client = ::redis::Client::open(config.url.as_str())
            .map_err(|e| ConnectError::InvalidConfig(format!("url {url}: {e}")))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(config.connect_timeout);
        let manager = match tokio::time::timeout(
            config.call_timeout,
            ConnectionManager::new_with_config(client, manager_config),
        )
        .await
        {
            Ok(Ok(manager)) => manager,
            Ok(Err(e)) if e.is_timeout() => {
                return Err(ConnectError::Timeout {
                    url,
                    timeout: config.connect_timeout,
                });
            }
            Ok(Err(e)) => {
                return Err(ConnectError::Connect {
                    url,
                    error: e.to_string(),
                });
            }
            Err(_) => {
                return Err(ConnectError::Timeout {
                    url,
                    timeout: config.call_timeout,
                });
            }
        };
        Ok(Self {
            manager,
            response_timeout: config.response_timeout,
            call_timeout: config.call_timeout,
        })
    }

    /// Runs one command; `key` names what it reads or writes, for errors.
    pub(crate) async fn query(&self, key: &str, cmd: &Cmd) -> Result<Value, StoreError> {
        let mut con = self.manager.clone();
        self.bounded(key, async move { cmd.query_async::<Value>(&mut con).await })
            .await
    }

    /// Runs a pipeline and returns one reply per command.
    pub(crate) async fn pipeline(
        &self,
        key: &str,
        pipe: &Pipeline,
    ) -> Result<Vec<Value>, StoreError> {
        let mut con = self.manager.clone();
        self.bounded(key, async move {
            pipe.query_async::<Vec<Value>>(&mut con).await
        })
        .await
    }

    /// Runs a script (EVALSHA, loading it first if the server does not know it).
    pub(crate) async fn script(
        &self,
        key: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let mut con = self.manager.clone();
        self.bounded(key, async move {
            invocation.invoke_async::<Value>(&mut con).await
        })
        .await
    }

    async fn bounded<T>(
        &self,
        key: &str,
        call: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.store_error(key, &e)),
            Err(_) => Err(StoreError::Timeout(self.call_timeout)),
        }
    }

    fn store_error(&self, key: &str, e: &::redis::RedisError) -> StoreError {
        if e.is_timeout() {
            StoreError::Timeout(self.response_timeout)
        } else if e.code() == Some("WRONGTYPE") {
            StoreError::Corrupt {
                key: key.to_owned(),
                reason: "the key holds a value of another type".to_owned(),
            }
        } else {
            StoreError::Unavailable(format!("redis: {e}"))
        }
    }
}
