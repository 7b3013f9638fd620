//! Bounded storage and checkpoint ops on a real 3-master Redis Cluster (see
//! [`super::cluster_support`]): a checkpoint write prunes its thread within the thread's slot;
//! native stats and cleanup reach threads on every master through the indexes; compat stats
//! and cleanup `SCAN` every master and unlink keys of many slots.

use std::collections::BTreeMap;

use runvisor::redis::retention::{Layout, Scope, Stats};
use runvisor::redis::{KeepCheckpoints, RedisConfig, RedisStores};
use runvisor::store::{RunRecord, RunStatus, StoredCheckpoint};
use runvisor::{CheckpointId, RunId, RunLabels, ThreadId};

use super::cluster_support::{RedisCluster, cluster_cmd, cluster_config, owner, raw_cluster};
use super::support::{cmd, raw, run_record, thread, within};

async fn connect(cluster: &RedisCluster, keep: KeepCheckpoints) -> RedisStores {
    within(
        "connect to the cluster",
        RedisStores::connect(RedisConfig {
            keep_checkpoints: keep,
            ..cluster_config(cluster)
        }),
    )
    .await
    .expect("connect")
}

fn checkpoint(run: RunId, sequence: u64) -> StoredCheckpoint {
    StoredCheckpoint {
        id: CheckpointId::new(),
        run,
        sequence,
        bytes: b"snapshot".to_vec(),
        link: None,
    }
}

fn counts(stats: &Stats) -> BTreeMap<String, u64> {
    let threads = match stats {
        Stats::System(system) => system
            .users
            .iter()
            .flat_map(|u| u.threads.clone())
            .collect(),
        Stats::User(user) => user.threads.clone(),
    };
    threads
        .into_iter()
        .map(|t| (t.thread_id, t.checkpoint_count))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_stats_and_cleanup_work_on_a_cluster() {
    let cluster = RedisCluster::start();
    let mut con = raw_cluster(&cluster).await;

    // A write prunes in the thread's slot: 30 writes, the newest 20 stay, payloads too.
    let kept = connect(&cluster, KeepCheckpoints::default()).await;
    let t: ThreadId = thread("chat:{c}:1");
    let run = RunId::new();
    for sequence in 1..=30 {
        kept.checkpoints
            .put(&t, checkpoint(run, sequence), None)
            .await
            .expect("put");
    }
    let listed = kept.checkpoints.list(&t).await.expect("list");
    assert_eq!(listed.len(), 20);
    let oldest_kept = format!("runvisor:cp:{{{t}}}:{}", listed[0]);
    assert_eq!(
        cluster_cmd::<i64>(&mut con, &["EXISTS", &oldest_kept]).await,
        1
    );

    // Native threads spread over the masters: 12 threads of 3 users, 10 checkpoints each.
    let stores = connect(&cluster, KeepCheckpoints::All).await;
    let mut masters = std::collections::BTreeSet::new();
    for i in 0..12 {
        let t = thread(&format!("t-{i}"));
        let user = format!("user-{}", i % 3);
        let run = RunId::new();
        let record = RunRecord {
            status: RunStatus::Stopped,
            labels: RunLabels::default().with_user(user).expect("valid user"),
            ..run_record(run, &t)
        };
        stores.runs.put(&record, None).await.expect("record");
        for sequence in 1..=10 {
            stores
                .checkpoints
                .put(&t, checkpoint(run, sequence), None)
                .await
                .expect("put");
        }
        masters.insert(owner(&cluster, &mut con, &format!("runvisor:cpidx:{{t-{i}}}")).await);
    }
    assert_eq!(masters.len(), 3, "the threads live on every master");
    let ops = stores.checkpoint_ops();
    let stats = ops.stats(Layout::Native, None).await.expect("stats");
    let Stats::System(system) = &stats else {
        panic!("system stats expected: {stats:?}");
    };
    // The first thread (chat:{c}:1) was written without a run record: not in the indexes.
    assert_eq!(
        (
            system.total_users,
            system.total_threads,
            system.total_checkpoints
        ),
        (3, 12, 120)
    );
    let one = ops
        .stats(Layout::Native, Some("user-1"))
        .await
        .expect("stats");
    assert_eq!(counts(&one).len(), 4);
    let report = ops
        .cleanup(Layout::Native, &Scope::User("user-1".into()), 4)
        .await
        .expect("cleanup");
    assert_eq!(report.total_deleted, 4 * 6, "{report:#?}");
    let report = ops
        .cleanup(Layout::Native, &Scope::All, 2)
        .await
        .expect("cleanup");
    assert_eq!(report.total_deleted, 8 * 8 + 4 * 2);
    for i in 0..12 {
        let index = format!("runvisor:cpidx:{{t-{i}}}");
        assert_eq!(cluster_cmd::<i64>(&mut con, &["ZCARD", &index]).await, 2);
    }
    let stats = ops.stats(Layout::Native, None).await.expect("stats");
    assert!(counts(&stats).values().all(|&n| n == 2));

    // Compat keys have no hash tag: they land on every master.
    let mut written = 0;
    for user in ["wang1", "wang2", "w*"] {
        for ts in 0..4 {
            for i in 0..6 {
                let key = format!("checkpoint:{user}:{ts}:{i:02}-{}", CheckpointId::new());
                let _: () = cluster_cmd(&mut con, &["SET", &key, "{}"]).await;
                written += 1;
            }
        }
    }
    let mut per_node = Vec::new();
    for node in cluster.nodes() {
        let mut node_con = raw(node).await;
        let keys: Vec<String> = cmd(&mut node_con, &["KEYS", "checkpoint:*"]).await;
        per_node.push(keys.len());
    }
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
    assert_eq!(per_node.iter().sum::<usize>(), written);
    let stats = ops.stats(Layout::Compat, None).await.expect("stats");
    let Stats::System(system) = &stats else {
        panic!("system stats expected: {stats:?}");
    };
    assert_eq!(
        (
            system.total_users,
            system.total_threads,
            system.total_checkpoints
        ),
        (3, 12, 72)
    );
    let star = ops.stats(Layout::Compat, Some("w*")).await.expect("stats");
    assert_eq!(counts(&star).values().sum::<u64>(), 24);
    let report = ops
        .cleanup(Layout::Compat, &Scope::Thread("wang2:3".into()), 1)
        .await
        .expect("cleanup");
    assert_eq!(report.total_deleted, 5);
    let report = ops
        .cleanup(Layout::Compat, &Scope::All, 2)
        .await
        .expect("cleanup");
    assert_eq!(report.total_deleted, 11 * 4);
    let mut left = 0;
    for node in cluster.nodes() {
        let mut node_con = raw(node).await;
        let keys: Vec<String> = cmd(&mut node_con, &["KEYS", "checkpoint:*"]).await;
        left += keys.len();
    }
    assert_eq!(left, 11 * 2 + 1);
}
