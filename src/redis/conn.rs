//! The connection the stores share, to one Redis server or to a Redis Cluster, with explicit
//! connect and response timeouts, every call bounded by a deadline on top, and Redis errors
//! mapped to [`StoreError`]s.
//!
//! - One server (`redis://`, `rediss://`, `unix://`): one auto-reconnecting multiplexed
//!   connection ([`ConnectionManager`]).
//! - A cluster (`redis+cluster://h1:p1,h2:p2`, see [`Endpoint`]): one cluster connection, which
//!   keeps a multiplexed connection per node, routes each command by its key's slot and
//!   follows `MOVED`/`ASK` (see [`cluster`]).
//!
//! During an outage no call blocks for longer than the call timeout: a dead server answers
//! [`StoreError::Unavailable`] (the connection reconnects in the background and later calls
//! succeed again), a silent one (frozen, partitioned) answers [`StoreError::Timeout`]. Errors
//! that retrying cannot fix (a refused password or permission, a command across cluster slots,
//! a script error, an endpoint that does not speak Redis) are [`StoreError::Rejected`], naming
//! the command and the key, or [`StoreError::Corrupt`] for a key of the wrong type (see
//! [`classify`]). Calls are tried once: callers retry transient errors up to their deadline.
//!
//! On a cluster a command or a script must touch one slot (every key of one thread carries the
//! thread's hash tag), and so must a [`pipeline`](Conn::pipeline); independent commands on keys
//! of any slots go through [`fan_out`](Conn::fan_out), which sends one pipeline per node.

mod classify;
pub(crate) mod cluster;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Cmd, Pipeline, RedisResult, ScriptInvocation, Value};
use runvisor_actors::StoreError;

use super::{ConnectError, RedisConfig};
use classify::{command_name, describe, pipeline_name};
pub(crate) use classify::{is_transient, server_error};

/// Reconnection attempts per outage episode before calls fail fast (the next call starts a
/// new episode).
const RECONNECT_RETRIES: usize = 2;
/// The first pause between reconnection attempts.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);

/// Where the configured URL points: one server, or the seed nodes of a cluster.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// One server, as a URL redis-rs opens.
    Single(String),
    /// A Redis Cluster: one `redis://` (or `rediss://`) URL per seed node.
    Cluster(Vec<String>),
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may hold passwords.
        match self {
            Self::Single(_) => f.write_str("Single"),
            Self::Cluster(nodes) => write!(f, "Cluster({} seed nodes)", nodes.len()),
        }
    }
}

impl Endpoint {
    /// Reads the configured URL: `redis+cluster://` and `rediss+cluster://` name a cluster,
    /// anything else one server.
    pub(crate) fn of(config: &RedisConfig) -> Result<Self, ConnectError> {
        match cluster::seed_urls(&config.url) {
            None => Ok(Self::Single(config.url.clone())),
            Some(Ok(nodes)) => Ok(Self::Cluster(nodes)),
            Some(Err(problem)) => Err(ConnectError::InvalidConfig(format!(
                "url {}: {problem}",
                config.redacted_url()
            ))),
        }
    }
}

/// One primary of the store: the server itself, or a master of the cluster.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Primary {
    /// The one server.
    Server,
    /// A cluster master, by address.
    Node {
        /// Its host, as the cluster names it.
        host: String,
        /// Its port.
        port: u16,
    },
}

impl fmt::Display for Primary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server => f.write_str("the server"),
            Self::Node { host, port } => write!(f, "node {host}:{port}"),
        }
    }
}

impl fmt::Debug for Primary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A shared, bounded connection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Conn {
    link: Link,
    response_timeout: Duration,
    call_timeout: Duration,
}

/// The connection itself.
#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(cluster::Cluster),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("cluster", &self.is_cluster())
            .field("response_timeout", &self.response_timeout)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// Maps the outcome of a connection attempt bounded by the call timeout.
fn connected<T>(
    attempt: Result<RedisResult<T>, tokio::time::error::Elapsed>,
    config: &RedisConfig,
) -> Result<T, ConnectError> {
    let url = config.redacted_url();
    match attempt {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) if e.is_timeout() => Err(ConnectError::Timeout {
            url,
            timeout: config.connect_timeout,
        }),
        Ok(Err(e)) if is_transient(&e) => Err(ConnectError::Connect {
            url,
            error: describe(&e),
        }),
        Ok(Err(e)) => Err(ConnectError::Refused {
            url,
            error: describe(&e),
        }),
        Err(_) => Err(ConnectError::Timeout {
            url,
            timeout: config.call_timeout,
        }),
    }
}

impl Conn {
    /// Opens the connection, bounded by the call timeout.
    pub(crate) async fn connect(
        config: &RedisConfig,
        endpoint: &Endpoint,
    ) -> Result<Self, ConnectError> {
        let invalid = |e: ::redis::RedisError| {
            ConnectError::InvalidConfig(format!("url {}: {e}", config.redacted_url()))
        };
        let link = match endpoint {
            Endpoint::Single(url) => {
                let client = ::redis::Client::open(url.as_str()).map_err(invalid)?;
                let manager_config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.response_timeout))
                    .set_number_of_retries(RECONNECT_RETRIES)
                    .set_min_delay(RECONNECT_MIN_DELAY)
                    .set_max_delay(config.connect_timeout);
                let attempt = tokio::time::timeout(
                    config.call_timeout,
                    ConnectionManager::new_with_config(client, manager_config),
                )
                .await;
                Link::Single(connected(attempt, config)?)
            }
            Endpoint::Cluster(nodes) => {
                let client = cluster::builder(nodes, config).build().map_err(invalid)?;
                let attempt =
                    tokio::time::timeout(config.call_timeout, client.get_async_connection()).await;
                Link::Cluster(cluster::Cluster::new(connected(attempt, config)?))
            }
        };
        Ok(Self {
            link,
            response_timeout: config.response_timeout,
            call_timeout: config.call_timeout,
        })
    }

    /// Whether this is a cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// Runs one command; `key` names what it reads or writes, for errors. On a cluster it goes
    /// to the node of its key's slot (`MGET`, `UNLINK` and `DEL` of keys in several slots are
    /// split per slot by the cluster connection).
    pub(crate) async fn query(&self, key: &str, cmd: &Cmd) -> Result<Value, StoreError> {
        let name = command_name(cmd);
        match &self.link {
            Link::Single(manager) => {
                let mut con = manager.clone();
                self.bounded(&name, key, async move {
                    cmd.query_async::<Value>(&mut con).await
                })
                .await
            }
            Link::Cluster(cluster) => {
                let mut con = cluster.connection();
                self.bounded(&name, key, async move {
                    cmd.query_async::<Value>(&mut con).await
                })
                .await
            }
        }
    }

    /// Runs a pipeline and returns one reply per command. On a cluster every command of the
    /// pipeline must touch one slot.
    pub(crate) async fn pipeline(
        &self,
        key: &str,
        pipe: &Pipeline,
    ) -> Result<Vec<Value>, StoreError> {
        let name = pipeline_name(pipe);
        match &self.link {
            Link::Single(manager) => {
                let mut con = manager.clone();
                self.bounded(&name, key, async move {
                    pipe.query_async::<Vec<Value>>(&mut con).await
                })
                .await
            }
            Link::Cluster(cluster) => {
                let mut con = cluster.connection();
                self.bounded(&name, key, async move {
                    pipe.query_async::<Vec<Value>>(&mut con).await
                })
                .await
            }
        }
    }

    /// Runs independent commands, each on keys of one slot (any slot), and returns one reply
    /// per command, in order; a command's own error reply is its reply
    /// ([`Value::ServerError`]), for the caller to name its key. One server: one pipeline.
    /// A cluster: one pipeline per node, all at once (see [`cluster::Cluster::fan_out`]).
    pub(crate) async fn fan_out(
        &self,
        key: &str,
        cmds: Vec<Cmd>,
    ) -> Result<Vec<Value>, StoreError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let count = cmds.len();
        let name = cmds.first().map(command_name).unwrap_or_default();
        let replies = match &self.link {
            Link::Single(manager) => {
                let mut pipe = ::redis::pipe();
                pipe.ignore_errors();
                for cmd in cmds {
                    pipe.add_command(cmd);
                }
                let mut con = manager.clone();
                self.bounded(&name, key, async move {
                    pipe.query_async::<Vec<Value>>(&mut con).await
                })
                .await?
            }
            Link::Cluster(cluster) => self.bounded(&name, key, cluster.fan_out(cmds)).await?,
        };
        if replies.len() != count {
            return Err(StoreError::Unavailable(format!(
                "redis answered {} replies to {count} commands on {key}",
                replies.len()
            )));
        }
        Ok(replies)
    }

    /// Runs a command on every primary (the one server, or each master of a cluster) and
    /// returns each node's reply, named by its address (`None` for the one server).
    pub(crate) async fn on_every_primary(
        &self,
        what: &str,
        cmd: &Cmd,
    ) -> Result<Vec<(Option<String>, Value)>, StoreError> {
        match &self.link {
            Link::Single(_) => Ok(vec![(None, self.query(what, cmd).await?)]),
            Link::Cluster(cluster) => {
                self.bounded(&command_name(cmd), what, cluster.on_every_primary(cmd))
                    .await
            }
        }
    }

    /// The primaries: the one server, or every master of the cluster (as the cluster last
    /// said), to run a command on each, such as `SCAN`, which sees one node's keys.
    pub(crate) async fn primaries(&self) -> Result<Vec<Primary>, StoreError> {
        match &self.link {
            Link::Single(_) => Ok(vec![Primary::Server]),
            Link::Cluster(cluster) => Ok(self
                .bounded("CLUSTER SLOTS", "the cluster's slots", cluster.primaries())
                .await?
                .into_iter()
                .map(|(host, port)| Primary::Node { host, port })
                .collect()),
        }
    }

    /// Runs one command on one primary; `what` names it, for errors.
    pub(crate) async fn query_on(
        &self,
        primary: &Primary,
        what: &str,
        cmd: &Cmd,
    ) -> Result<Value, StoreError> {
        match (&self.link, primary) {
            (Link::Cluster(cluster), Primary::Node { host, port }) => {
                self.bounded(&command_name(cmd), what, cluster.on_node(host, *port, cmd))
                    .await
            }
            _ => self.query(what, cmd).await,
        }
    }

    /// Runs a script (EVALSHA, loading it first if the server does not know it); `name` says
    /// which, for errors. On a cluster it goes to the node of its first key's slot; all its
    /// keys must share that slot.
    pub(crate) async fn script(
        &self,
        name: &str,
        key: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let command = format!("the {name} script");
        match &self.link {
            Link::Single(manager) => {
                let mut con = manager.clone();
                self.bounded(&command, key, async move {
                    invocation.invoke_async::<Value>(&mut con).await
                })
                .await
            }
            Link::Cluster(cluster) => {
                let mut con = cluster.connection();
                self.bounded(&command, key, async move {
                    invocation.invoke_async::<Value>(&mut con).await
                })
                .await
            }
        }
    }

    /// Asks the server whether it serves this client at all: a `PING` answered, or the
    /// permanent refusal (a password required or wrong, an endpoint that does not speak
    /// Redis) as a connection error. A transient failure is left for the calls to meet.
    pub(crate) async fn check_access(&self, config: &RedisConfig) -> Result<(), ConnectError> {
        let ping = ::redis::cmd("PING");
        let command = command_name(&ping);
        let result = match &self.link {
            Link::Single(manager) => {
                let mut con = manager.clone();
                tokio::time::timeout(self.call_timeout, async move {
                    ping.query_async::<Value>(&mut con).await
                })
                .await
            }
            Link::Cluster(cluster) => {
                let mut con = cluster.connection();
                tokio::time::timeout(self.call_timeout, async move {
                    ping.query_async::<Value>(&mut con).await
                })
                .await
            }
        };
        match result {
            Ok(Err(e)) if !is_transient(&e) => Err(ConnectError::Refused {
                url: config.redacted_url(),
                error: format!("{command}: {}", describe(&e)),
            }),
            _ => Ok(()),
        }
    }

    async fn bounded<T>(
        &self,
        command: &str,
        key: &str,
        call: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify::store_error(
                command,
                key,
                &e,
                self.response_timeout,
            )),
            Err(_) => Err(StoreError::Timeout(self.call_timeout)),
        }
    }
}
