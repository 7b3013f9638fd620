//! The cluster harness: a private 3-master Redis Cluster per test. Three `redis-server`s in
//! cluster mode (each in its own temporary directory, on free loopback ports for clients and
//! for the cluster bus), joined by `redis-cli --cluster create`; the harness waits until every
//! node reports `cluster_state:ok` and stops the servers by PID when dropped. It never touches
//! any other Redis.
//!
//! Also: stores connected to the cluster with short timeouts, a raw cluster connection for
//! poking at keys, and a node's view of a key's slot (`CLUSTER KEYSLOT`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use runvisor::redis::{RedisConfig, RedisStores};

use super::support::{PATIENCE, RedisServer, free_port, within};

/// How long the cluster may take to agree on its slots once created.
const FORMING: Duration = Duration::from_secs(20);

/// A 3-master Redis Cluster owned by one test.
#[derive(Debug)]
pub(crate) struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three masters, creates the cluster (16,384 slots split among them, no replicas)
    /// and waits until every node says the cluster is ok.
    pub(crate) fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output();
        let created = match created {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-cli is not installed; the cluster tests need it (it comes with redis-server)"
            ),
            Err(e) => panic!("cannot run redis-cli --cluster create: {e}"),
        };
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and knows all three masters.
    fn wait_ok(&self) {
        let deadline = Instant::now() + FORMING;
        for node in &self.nodes {
            loop {
                let info = cluster_info(node.port()).unwrap_or_default();
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster was not ok within {FORMING:?}: node {} says {info:?}",
                    node.port()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The cluster URL runvisor connects with: every node as a seed.
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The three masters.
    pub(crate) fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The master listening on `port`, to kill or freeze it.
    pub(crate) fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node of this cluster listens on {port}"))
    }
}

/// `CLUSTER INFO` of the node on `port`, over a plain connection.
fn cluster_info(port: u16) -> Option<String> {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    ::redis::cmd("CLUSTER").arg("INFO").query(&mut con).ok()
}

/// A config for a test cluster: short timeouts, as [`super::support::config`].
pub(crate) fn cluster_config(cluster: &RedisCluster) -> RedisConfig {
    RedisConfig {
        connect_timeout: Duration::from_millis(300),
        response_timeout: Duration::from_millis(500),
        call_timeout: Duration::from_secs(2),
        ..RedisConfig::new(cluster.url())
    }
}

/// Stores connected to a test cluster with [`cluster_config`].
pub(crate) async fn cluster_stores(cluster: &RedisCluster) -> RedisStores {
    within(
        "connect to the cluster",
        RedisStores::connect(cluster_config(cluster)),
    )
    .await
    .expect("connect to the test cluster")
}

/// A raw cluster connection, to look at and tamper with keys (routed by slot).
pub(crate) async fn raw_cluster(cluster: &RedisCluster) -> ClusterConnection {
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}/", n.port()))
        .collect();
    let client = ClusterClient::builder(nodes)
        .connection_timeout(PATIENCE)
        .response_timeout(PATIENCE)
        .build()
        .expect("valid cluster client");
    within("raw cluster connection", client.get_async_connection())
        .await
        .expect("raw connection to the test cluster")
}

/// Runs a raw command on the cluster (routed by its first key) and converts its reply.
pub(crate) async fn cluster_cmd<T: ::redis::FromRedisValue>(
    con: &mut ClusterConnection,
    args: &[&str],
) -> T {
    let mut cmd = ::redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    within(args[0], cmd.query_async(con))
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The slot of `key` as the cluster computes it (`CLUSTER KEYSLOT`).
pub(crate) async fn keyslot(con: &mut ClusterConnection, key: &str) -> u16 {
    cluster_cmd(con, &["CLUSTER", "KEYSLOT", key]).await
}

/// The port of the master that owns `key`'s slot.
pub(crate) async fn owner(cluster: &RedisCluster, con: &mut ClusterConnection, key: &str) -> u16 {
    let slot = i64::from(keyslot(con, key).await);
    let ranges: ::redis::Value = cluster_cmd(con, &["CLUSTER", "SLOTS"]).await;
    let ::redis::Value::Array(ranges) = ranges else {
        panic!("CLUSTER SLOTS answered {ranges:?}");
    };
    for range in ranges {
        let ::redis::Value::Array(fields) = range else {
            continue;
        };
        if let (
            Some(::redis::Value::Int(start)),
            Some(::redis::Value::Int(end)),
            Some(::redis::Value::Array(master)),
        ) = (fields.first(), fields.get(1), fields.get(2))
            && (*start..=*end).contains(&slot)
            && let Some(::redis::Value::Int(port)) = master.get(1)
        {
            let port = u16::try_from(*port).expect("a port");
            assert!(cluster.nodes.iter().any(|n| n.port() == port));
            return port;
        }
    }
    panic!("no master owns slot {slot}");
}
