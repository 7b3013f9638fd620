//! Redis Cluster: the `redis+cluster://` URL, the cluster client with runvisor's timeouts, and
//! commands fanned out per node.
//!
//! A cluster URL names seed nodes: `redis+cluster://[user:password@]h1:p1,h2:p2[,...][/][?...]`
//! (`rediss+cluster://` for TLS, when this build of redis-rs has it, as for `rediss://`). The
//! client learns the other nodes and who owns which slot from them.
//!
//! [`Cluster::fan_out`] sends independent single-slot commands (the watcher's `MGET`s, one per
//! slot) as one pipeline per node, all nodes at once: it asks `CLUSTER SLOTS`
//! once which node owns each slot and keeps the answer. When the cluster has moved a slot, a
//! node answers its commands `MOVED` or `ASK` (and the cluster connection, which redirects a
//! pipeline as a whole, gives up on one that mixes slots): those commands, or the whole node's
//! share, are sent again one by one, each routed and redirected by the cluster connection, and
//! the slot table is asked anew on the next call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use ::redis::{Arg, Cmd, ErrorKind, RedisError, RedisResult, ServerError, Value};

use super::{RECONNECT_MIN_DELAY, RECONNECT_RETRIES};
use crate::redis::RedisConfig;
use crate::redis::keys::{SLOTS, hash_slot};

/// The seed node URLs of a cluster URL; `None` when the URL names one server.
pub(crate) fn seed_urls(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let tail = if tail.is_empty() { "/" } else { tail };
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Some(Err(
                "a cluster URL lists its seed nodes as host:port, separated by commas".to_owned(),
            ));
        }
        nodes.push(format!("{scheme}://{userinfo}{host}{tail}"));
    }
    Some(Ok(nodes))
}

/// A cluster client builder on these seed nodes with the config's timeouts: each connection
/// attempt to a node is bounded by `connect_timeout`, each answer by `response_timeout`, a
/// whole request (retries, reconnections and redirections included) by `call_timeout`.
pub(crate) fn builder(nodes: &[String], config: &RedisConfig) -> ClusterClientBuilder {
    let retries = u32::try_from(RECONNECT_RETRIES).unwrap_or(u32::MAX);
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    ClusterClient::builder(nodes.iter().map(String::as_str))
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.response_timeout)
        .overall_response_timeout(Some(config.call_timeout))
        .retries(retries)
        .min_retry_wait(millis(RECONNECT_MIN_DELAY))
        .max_retry_wait(millis(config.connect_timeout))
}

/// A cluster connection and what it knows of the slots. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Cluster {
    connection: ClusterConnection,
    /// Who owns which slot, as last asked; `None` until asked, or after a redirection.
    slots: Arc<Mutex<Option<Arc<SlotTable>>>>,
}

impl Cluster {
    pub(crate) fn new(connection: ClusterConnection) -> Self {
        Self {
            connection,
            slots: Arc::default(),
        }
    }

    /// A handle on the connection (they share it).
    pub(crate) fn connection(&self) -> ClusterConnection {
        self.connection.clone()
    }

    /// Runs independent commands, each on keys of one slot, and returns one reply per command
    /// in order (a command's own error reply as [`Value::ServerError`]): one pipeline per node,
    /// all at once; commands redirected by the cluster are sent again one by one.
    pub(crate) async fn fan_out(&self, cmds: Vec<Cmd>) -> RedisResult<Vec<Value>> {
        let table = self.slot_table().await?;
        // Commands by node, in order; those whose slot nobody owns go alone.
        let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); table.nodes];
        let mut alone = Vec::new();
        let mut first_slot = vec![0u16; table.nodes];
        for (i, cmd) in cmds.iter().enumerate() {
            let slot = cmd_slot(cmd);
            match table.owner(slot) {
                Some(node) => {
                    if by_node[node].is_empty() {
                        first_slot[node] = slot;
                    }
                    by_node[node].push(i);
                }
                None => alone.push(i),
            }
        }
        let sent = by_node
            .iter()
            .zip(&first_slot)
            .filter(|(group, _)| !group.is_empty())
            .map(|(group, &slot)| {
                let mut pipe = ::redis::pipe();
                for &i in group {
                    pipe.add_command(cmds[i].clone());
                }
                let mut con = self.connection();
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                async move {
                    let count = pipe.len();
                    con.route_pipeline(pipe, 0, count, route).await
                }
            });
        let answers = futures::future::join_all(sent).await;
        let mut replies = vec![Value::Nil; cmds.len()];
        for (group, answer) in by_node.iter().filter(|g| !g.is_empty()).zip(answers) {
            let values = match answer {
                Ok(values) if values.len() == group.len() => values,
                // The cluster connection redirects a whole pipeline when one of its commands is
                // answered MOVED, which fails for commands of other slots: send them alone.
                Err(e) if e.code().is_some_and(redirects) => {
                    self.forget_slots();
                    alone.extend_from_slice(group);
                    continue;
                }
                Ok(values) => {
                    self.forget_slots();
                    return Err(RedisError::from((
                        ErrorKind::UnexpectedReturnType,
                        "a node answered a pipeline with the wrong number of replies",
                        format!("{} replies to {} commands", values.len(), group.len()),
                    )));
                }
                Err(e) => {
                    self.forget_slots();
                    return Err(e);
                }
            };
            for (&i, value) in group.iter().zip(values) {
                if is_redirection(&value) {
                    alone.push(i);
                } else {
                    replies[i] = value;
                }
            }
        }
        if !alone.is_empty() {
            self.forget_slots();
            let resent = alone.iter().map(|&i| {
                let mut con = self.connection();
                let cmd = &cmds[i];
                async move { cmd.query_async::<Value>(&mut con).await }
            });
            for (&i, answer) in alone.iter().zip(futures::future::join_all(resent).await) {
                replies[i] = match answer {
                    Ok(value) => value,
                    Err(e) => Value::ServerError(ServerError::try_from(e)?),
                };
            }
        }
        Ok(replies)
    }

    /// The address (host, port) of every master, as `CLUSTER SLOTS` answers.
    pub(crate) async fn primaries(&self) -> RedisResult<Vec<(String, u16)>> {
        Ok(self.slot_table().await?.addresses.clone())
    }

    /// Runs a command on the master at this address.
    pub(crate) async fn on_node(&self, host: &str, port: u16, cmd: &Cmd) -> RedisResult<Value> {
        let mut con = self.connection();
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        });
        let reply = con.route_command(cmd.clone(), routing).await;
        if reply
            .as_ref()
            .is_err_and(|e| e.code().is_some_and(redirects))
        {
            // The node is no longer a master (a failover): ask the slot table anew next time.
            self.forget_slots();
        }
        reply
    }

    /// Runs a command on every master; each reply named by the node's address.
    pub(crate) async fn on_every_primary(
        &self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<(Option<String>, Value)>> {
        let mut con = self.connection();
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let reply = con.route_command(cmd.clone(), routing).await?;
        match reply {
            Value::Map(entries) => Ok(entries
                .into_iter()
                .map(|(node, value)| {
                    let node = match node {
                        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                        other => format!("{other:?}"),
                    };
                    (Some(node), value)
                })
                .collect()),
            other => Ok(vec![(None, other)]),
        }
    }

    /// The slot table, asked of the cluster when not known.
    async fn slot_table(&self) -> RedisResult<Arc<SlotTable>> {
        if let Some(table) = self.known_slots() {
            return Ok(table);
        }
        let mut cmd = ::redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = cmd.query_async::<Value>(&mut self.connection()).await?;
        let table = Arc::new(SlotTable::parse(&reply)?);
        if let Ok(mut slots) = self.slots.lock() {
            *slots = Some(table.clone());
        }
        Ok(table)
    }

    fn known_slots(&self) -> Option<Arc<SlotTable>> {
        self.slots.lock().ok().and_then(|slots| slots.clone())
    }

    fn forget_slots(&self) {
        if let Ok(mut slots) = self.slots.lock() {
            *slots = None;
        }
    }
}

/// The slot of a command's key: its first argument after the name (every command runvisor
/// fans out names its keys first, all in one slot), or for a script (`EVALSHA sha numkeys
/// key...`) its first key.
fn cmd_slot(cmd: &Cmd) -> u16 {
    let mut args = cmd.args_iter();
    let script = matches!(
        args.next(),
        Some(Arg::Simple(name)) if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")
    );
    let key = if script { args.nth(2) } else { args.next() };
    match key {
        Some(Arg::Simple(key)) => hash_slot(key),
        _ => 0,
    }
}

/// Whether a reply says the command went to the wrong node, or should be tried again.
fn is_redirection(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => redirects(e.code()),
        _ => false,
    }
}

/// Whether an error code says a command went to the wrong node or should be tried again.
fn redirects(code: &str) -> bool {
    matches!(code, "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN")
}

/// Which node owns each slot, as `CLUSTER SLOTS` answered.
#[derive(Debug)]
struct SlotTable {
    /// The owner's index per slot; [`NOBODY`] for a slot no node serves.
    owners: Box<[u16]>,
    /// How many nodes own slots.
    nodes: usize,
    /// Each of those nodes' address (host, port), by index.
    addresses: Vec<(String, u16)>,
}

/// The owner of a slot that no node serves.
const NOBODY: u16 = u16::MAX;

impl SlotTable {
    fn owner(&self, slot: u16) -> Option<usize> {
        match self.owners.get(usize::from(slot)) {
            Some(&NOBODY) | None => None,
            Some(&node) => Some(usize::from(node)),
        }
    }

    /// Reads a `CLUSTER SLOTS` reply: `[[start, end, [host, port, ...], replicas...], ...]`.
    fn parse(reply: &Value) -> RedisResult<Self> {
        let bad = |what: &'static str| {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "unexpected CLUSTER SLOTS reply",
                what.to_owned(),
            ))
        };
        let Value::Array(ranges) = reply else {
            return Err(bad("not an array"));
        };
        let mut owners = vec![NOBODY; usize::from(SLOTS)].into_boxed_slice();
        let mut ids: HashMap<String, u16> = HashMap::new();
        let mut addresses = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err(bad("a range is not an array"));
            };
            let slot = |i: usize| match fields.get(i) {
                Some(Value::Int(n)) => u16::try_from(*n).ok().filter(|s| *s < SLOTS),
                _ => None,
            };
            let (Some(start), Some(end)) = (slot(0), slot(1)) else {
                return Err(bad("a range without its slots"));
            };
            let Some(Value::Array(master)) = fields.get(2) else {
                return Err(bad("a range without its master"));
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return Err(bad("a master without its host")),
            };
            let Some(port) = master.get(1).and_then(|p| match p {
                Value::Int(port) => u16::try_from(*port).ok(),
                _ => None,
            }) else {
                return Err(bad("a master without its port"));
            };
            let next = u16::try_from(ids.len()).map_err(|_| bad("too many nodes"))?;
            let node = *ids.entry(format!("{host}:{port}")).or_insert_with(|| {
                addresses.push((host.clone(), port));
                next
            });
            for slot in start..=end {
                owners[usize::from(slot)] = node;
            }
        }
        Ok(Self {
            owners,
            nodes: ids.len(),
            addresses,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_list_seed_nodes() {
        assert_eq!(seed_urls("redis://h:1/"), None);
        assert_eq!(seed_urls("unix:///tmp/r.sock"), None);
        assert_eq!(
            seed_urls("redis+cluster://h1:7000,h2:7001"),
            Some(Ok(vec![
                "redis://h1:7000/".to_owned(),
                "redis://h2:7001/".to_owned()
            ]))
        );
        assert_eq!(
            seed_urls("rediss+cluster://u:p@h1:7000,[::1]:7001/?protocol=resp3"),
            Some(Ok(vec![
                "rediss://u:p@h1:7000/?protocol=resp3".to_owned(),
                "rediss://u:p@[::1]:7001/?protocol=resp3".to_owned()
            ]))
        );
        assert!(matches!(
            seed_urls("redis+cluster://h1:1,,h2:2"),
            Some(Err(_))
        ));
        assert!(matches!(seed_urls("redis+cluster:///"), Some(Err(_))));
    }

    #[test]
    fn slot_tables_name_an_owner_per_slot() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("10.0.0.2", 7000),
            ]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16000),
                node("10.0.0.1", 7000),
            ]),
        ]);
        let table = SlotTable::parse(&reply).expect("parses");
        assert_eq!(table.nodes, 2);
        assert_eq!(
            table.addresses,
            [("10.0.0.1".to_owned(), 7000), ("10.0.0.2".to_owned(), 7000)]
        );
        assert_eq!(table.owner(0), Some(0));
        assert_eq!(table.owner(5461), Some(1));
        assert_eq!(table.owner(16000), Some(0));
        assert_eq!(table.owner(16001), None);
        assert_eq!(table.owner(SLOTS), None);
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(99_999),
                node("h", 1),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Nil,
            ])]),
        ] {
            assert!(SlotTable::parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn commands_are_routed_by_their_first_key() {
        let mut get = ::redis::cmd("GET");
        get.arg("a{t}");
        assert_eq!(cmd_slot(&get), hash_slot(b"t"));
        let mut script = ::redis::cmd("EVALSHA");
        script
            .arg("0123abcd")
            .arg(2)
            .arg("x{t}")
            .arg("y{t}")
            .arg("arg");
        assert_eq!(cmd_slot(&script), hash_slot(b"t"));
        let mut keyless = ::redis::cmd("EVALSHA");
        keyless.arg("0123abcd").arg(0);
        assert_eq!(cmd_slot(&keyless), 0);
    }

    #[test]
    fn redirections_are_told_from_errors() {
        let parsed = |text: &[u8]| ::redis::parse_redis_value(text).expect("a reply");
        assert!(is_redirection(&parsed(b"-MOVED 3999 127.0.0.1:6381\r\n")));
        assert!(is_redirection(&parsed(b"-ASK 3999 127.0.0.1:6381\r\n")));
        assert!(is_redirection(&parsed(b"-TRYAGAIN later\r\n")));
        assert!(!is_redirection(&parsed(b"-WRONGTYPE no\r\n")));
        assert!(!is_redirection(&Value::Nil));
    }
}
