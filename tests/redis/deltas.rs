//! Incremental checkpoints on a real `redis-server` (and a 3-master cluster), with the
//! in-memory store answering the same calls: a delta is written only while what it builds on
//! is stored; retention never removes a base or delta that a kept checkpoint builds on; a
//! stale writer's delta is fenced; a damaged delta in a chain is a typed error naming its
//! checkpoint; and a `sync` run writes deltas whose size does not grow with the run, from any
//! of which it resumes; retention racing a live writer never removes what its next delta
//! builds on.

use std::sync::Arc;

use runvisor::delta::{MaterializeError, SnapshotDelta, materialize};
use runvisor::redis::{KeepCheckpoints, RedisConfig, RedisStores};
use runvisor::snapshot::{CompletedNode, GraphState, Snapshot, SnapshotError};
use runvisor::store::memory::MemoryCheckpointStore;
use runvisor::store::{CheckpointStore, DeltaLink, RunStatus, StoredCheckpoint};
use runvisor::{
    CheckpointId, Durability, LeaseHolder, Map, NodeId, ResumeFrom, ResumeInput, Route, RunId,
    RunLabels, Runtime, RuntimeConfig, StoreError, ThreadId, Value, WorkerId,
};
use runvisor_actors::testkit::{PutWatch, WatchedCheckpoints};

/// Outputs `{"value": <its "x" param>}`.
#[derive(Debug)]
struct Step;

#[runvisor::async_trait]
impl runvisor::NodeHandler for Step {
    async fn run(
        &self,
        input: Value,
        _ctx: runvisor::NodeContext,
    ) -> Result<runvisor::NodeOutput, runvisor::NodeError> {
        let mut out = Map::new();
        out.insert(
            "value".to_owned(),
            input.get("x").cloned().unwrap_or_default(),
        );
        Ok(runvisor::NodeOutput::new(Value::Object(out)))
    }
}

use super::cluster_support::{RedisCluster, cluster_config};
use super::support::{
    RedisServer, checkpoint_payload, cmd, config, raw, set_checkpoint_payload, stores, thread,
    within,
};

fn snapshot(run: RunId, t: &ThreadId, nodes: usize) -> Snapshot {
    Snapshot {
        run_id: run,
        parent_run_id: None,
        thread: t.clone(),
        sequence: nodes as u64 + 1,
        created_at_ms: 1,
        status: RunStatus::Running,
        stop_reason: None,
        workflow_hash: "00".into(),
        workflow: None,
        inputs: Map::new(),
        query: None,
        variables: Map::new(),
        graph: GraphState {
            completed: (0..nodes)
                .map(|i| CompletedNode {
                    node: NodeId::new(format!("n{i}")).expect("id"),
                    route: Route::All,
                    output: Arc::new(Value::Int(i as i64)),
                })
                .collect(),
            frontier: Vec::new(),
            frames: Vec::new(),
        },
        interactions: Vec::new(),
        pending_messages: Default::default(),
        labels: RunLabels::default(),
        history_len: Some(0),
    }
}

/// A chain of one run: a base (state with 0 nodes), then `deltas` deltas (1, 2, ... nodes).
fn chain(run: RunId, t: &ThreadId, deltas: usize) -> Vec<StoredCheckpoint> {
    let base = CheckpointId::new();
    let mut out = vec![StoredCheckpoint {
        id: base,
        run,
        sequence: 1,
        bytes: snapshot(run, t, 0).encode().expect("encodes"),
        link: None,
    }];
    for n in 1..=deltas {
        let link = DeltaLink {
            base,
            parent: out[n - 1].id,
        };
        let bytes = SnapshotDelta::between(&snapshot(run, t, n - 1), &snapshot(run, t, n), link)
            .encode()
            .expect("encodes");
        out.push(StoredCheckpoint {
            id: CheckpointId::new(),
            run,
            sequence: n as u64 + 1,
            bytes,
            link: Some(link),
        });
    }
    out
}

/// The thread's newest checkpoint; there is one.
async fn newest(stores: &RedisStores, t: &ThreadId) -> StoredCheckpoint {
    stores
        .checkpoints
        .latest(t)
        .await
        .expect("latest")
        .expect("one")
}

async fn keeping(server: &RedisServer, keep: usize) -> RedisStores {
    within(
        "connect",
        RedisStores::connect(RedisConfig {
            keep_checkpoints: KeepCheckpoints::Newest(keep),
            ..config(server)
        }),
    )
    .await
    .expect("connect")
}

/// Writes two chains (a base and 5 deltas, then a base and 3 deltas) keeping 3, and checks
/// what stays after each write: the newest 3, and what the oldest of them builds on.
async fn retention_keeps_what_kept_checkpoints_build_on(store: &dyn CheckpointStore) {
    let t = thread("chains");
    let run = RunId::new();
    let first = chain(run, &t, 5);
    for c in &first {
        store.put(&t, c.clone(), None).await.expect("put");
    }
    let ids = |cs: &[StoredCheckpoint]| cs.iter().map(|c| c.id).collect::<Vec<_>>();
    // The newest 3 are deltas of the first base: the whole chain stays.
    assert_eq!(store.list(&t).await, Ok(ids(&first)));
    let latest = store.latest(&t).await.expect("latest").expect("one");
    assert_eq!(
        materialize(store, &t, &latest).await,
        Ok(snapshot(run, &t, 5))
    );
    // A second chain (a later run): once its checkpoints are the newest 3, the first goes.
    let second = chain(RunId::new(), &t, 3);
    for c in &second {
        store.put(&t, c.clone(), None).await.expect("put");
    }
    assert_eq!(store.list(&t).await, Ok(ids(&second)));
    // `prune` keeps what the kept one builds on too.
    assert_eq!(store.prune(&t, 1).await, Ok(0));
    assert_eq!(store.list(&t).await, Ok(ids(&second)));
    assert_eq!(store.prune(&t, 0).await, Ok(4));
}

#[tokio::test]
async fn retention_never_removes_a_base_or_delta_a_kept_checkpoint_builds_on() {
    let server = RedisServer::start();
    let redis = keeping(&server, 3).await;
    retention_keeps_what_kept_checkpoints_build_on(&*redis.checkpoints).await;
    retention_keeps_what_kept_checkpoints_build_on(&MemoryCheckpointStore::keeping(Some(3))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_chains_on_a_cluster() {
    let cluster = RedisCluster::start();
    let stores = within(
        "connect to the cluster",
        RedisStores::connect(RedisConfig {
            keep_checkpoints: KeepCheckpoints::Newest(3),
            ..cluster_config(&cluster)
        }),
    )
    .await
    .expect("connect");
    retention_keeps_what_kept_checkpoints_build_on(&*stores.checkpoints).await;
}

/// Reads a long chain with `range` (all of it, a part of it, none of it) and restores its
/// newest delta, which reads the chain at once.
/// [`chain`], with every tenth delta merged: its parent is the tenth before it, and it holds
/// what the ten steps since changed.
fn merged_chain(run: RunId, t: &ThreadId, deltas: usize) -> Vec<StoredCheckpoint> {
    let mut out = chain(run, t, deltas);
    let base = out[0].id;
    for n in (10..=deltas).step_by(10) {
        let link = DeltaLink {
            base,
            parent: out[n - 10].id,
        };
        out[n].bytes =
            SnapshotDelta::between(&snapshot(run, t, n - 10), &snapshot(run, t, n), link)
                .encode()
                .expect("encodes");
        out[n].link = Some(link);
    }
    out
}

async fn a_chain_reads_at_once(store: &dyn CheckpointStore, t: &ThreadId) {
    let run = RunId::new();
    let cs = chain(run, t, 300);
    for c in &cs {
        store.put(t, c.clone(), None).await.expect("put");
    }
    let ids = |cs: &[StoredCheckpoint]| cs.iter().map(|c| c.id).collect::<Vec<_>>();
    let newest_first = |cs: &[StoredCheckpoint]| cs.iter().rev().cloned().collect::<Vec<_>>();
    let all = store.chain(t, cs[300].id, 1000).await.expect("chain");
    assert_eq!(all, newest_first(&cs));
    let part = store.chain(t, cs[150].id, 5).await.expect("chain");
    assert_eq!(ids(&part), ids(&newest_first(&cs[146..=150])));
    assert_eq!(
        store
            .chain(&thread("no-such-thread"), cs[300].id, 1000)
            .await,
        Ok(Vec::new())
    );
    assert_eq!(
        materialize(store, t, &cs[300]).await,
        Ok(snapshot(run, t, 300))
    );
    assert_eq!(
        materialize(store, t, &cs[150]).await,
        Ok(snapshot(run, t, 150))
    );

    // Merged deltas: only what a restore applies is read, and every checkpoint restores.
    let t = thread(&format!("{}-merged", t.as_str()));
    let cs = merged_chain(run, &t, 300);
    for c in &cs {
        store.put(&t, c.clone(), None).await.expect("put");
    }
    let read = store.chain(&t, cs[299].id, 1000).await.expect("chain");
    let mut path: Vec<usize> = (290..=299).rev().collect();
    path.extend((0..290).step_by(10).rev());
    assert_eq!(
        ids(&read),
        path.iter().map(|&n| cs[n].id).collect::<Vec<_>>()
    );
    for n in [1, 9, 10, 11, 155, 290, 299, 300] {
        assert_eq!(
            materialize(store, &t, &cs[n]).await,
            Ok(snapshot(run, &t, n)),
            "checkpoint {n}"
        );
    }
}

#[tokio::test]
async fn a_long_chain_is_read_in_one_call_and_restores() {
    let server = RedisServer::start();
    let redis = stores(&server).await;
    let t = thread("long-chain");
    a_chain_reads_at_once(&*redis.checkpoints, &t).await;
    a_chain_reads_at_once(&MemoryCheckpointStore::new(), &t).await;
    // A link that is gone is named; one off the path is not read.
    let mut con = raw(&server).await;
    let t = thread("merged-gaps");
    let run = RunId::new();
    let cs = merged_chain(run, &t, 300);
    for c in &cs {
        redis
            .checkpoints
            .put(&t, c.clone(), None)
            .await
            .expect("put");
    }
    for n in [150, 155] {
        let key = format!("runvisor:cp:{{{}}}:{}", t.as_str(), cs[n].id);
        let _: i64 = cmd(&mut con, &["DEL", &key]).await;
    }
    assert_eq!(
        materialize(&*redis.checkpoints, &t, &cs[299]).await,
        Err(MaterializeError::Snapshot(SnapshotError::MissingLink {
            checkpoint: cs[150].id
        }))
    );
    assert_eq!(
        materialize(&*redis.checkpoints, &t, &cs[145]).await,
        Ok(snapshot(run, &t, 145))
    );
    // A payload key of another type on the way is a typed error naming it.
    let t = thread("long-chain");
    let id = CheckpointId::new();
    let key = format!("runvisor:cp:{{{}}}:{id}", t.as_str());
    let _: i64 = cmd(&mut con, &["RPUSH", &key, "x"]).await;
    assert!(matches!(
        redis.checkpoints.chain(&t, id, 10).await,
        Err(StoreError::Corrupt { .. })
    ));
}

/// A store keeping 20 holding a chain of 300 deltas, every tenth merged: the deltas the merges
/// skip go, what the kept 20 build on stays, and each kept checkpoint restores.
async fn skipped_deltas_go(store: &dyn CheckpointStore, t: &ThreadId) {
    let run = RunId::new();
    let cs = merged_chain(run, t, 300);
    for c in &cs {
        store.put(t, c.clone(), None).await.expect("put");
    }
    // Everything builds on the base: retention by age lets nothing go.
    assert_eq!(store.list(t).await.expect("list").len(), 301);
    // The oldest kept, 281, builds on 280, which merges 270's, ... back to the base.
    let needed: Vec<usize> = (0..=280).step_by(10).collect();
    assert_eq!(store.prune_skipped(t).await, Ok(301 - 20 - needed.len()));
    let left = store.list(t).await.expect("list");
    let expected: Vec<CheckpointId> = needed
        .iter()
        .chain(&(281..=300).collect::<Vec<_>>())
        .map(|&n| cs[n].id)
        .collect();
    assert_eq!(left, expected);
    for (n, c) in cs.iter().enumerate().skip(281) {
        let stored = store.get(t, c.id).await.expect("get").expect("kept");
        assert_eq!(
            materialize(store, t, &stored).await,
            Ok(snapshot(run, t, n)),
            "checkpoint {n}"
        );
    }
    assert_eq!(store.prune_skipped(t).await, Ok(0));
    assert_eq!(store.prune(t, 20).await, Ok(0));
    // Retention's own trim lets the skipped deltas go as well.
    let t = thread(&format!("{}-trimmed", t.as_str()));
    let cs = merged_chain(run, &t, 300);
    for c in &cs {
        store.put(&t, c.clone(), None).await.expect("put");
    }
    assert_eq!(store.prune(&t, 20).await, Ok(301 - 20 - needed.len()));
    assert_eq!(store.list(&t).await.expect("list").len(), 20 + needed.len());
}

#[tokio::test]
async fn the_deltas_merged_deltas_skip_go_once_no_kept_checkpoint_builds_on_them() {
    let server = RedisServer::start();
    let redis = keeping(&server, 20).await;
    skipped_deltas_go(&*redis.checkpoints, &thread("skipped")).await;
    skipped_deltas_go(
        &MemoryCheckpointStore::keeping(Some(20)),
        &thread("skipped"),
    )
    .await;
}

#[tokio::test]
async fn a_delta_whose_base_or_parent_is_gone_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let redis = stores(&server).await;
    let memory = MemoryCheckpointStore::new();
    let t = thread("orphan-delta");
    for store in [&*redis.checkpoints, &memory as &dyn CheckpointStore] {
        let run = RunId::new();
        let cs = chain(run, &t, 2);
        store.put(&t, cs[0].clone(), None).await.expect("base");
        // Its parent (cs[1]) was never stored.
        assert_eq!(
            store.put(&t, cs[2].clone(), None).await,
            Err(StoreError::MissingParent {
                checkpoint: cs[1].id
            })
        );
        assert_eq!(store.list(&t).await, Ok(vec![cs[0].id]));
        let _ = store.prune(&t, 0).await;
    }
}

/// Reads a key's TTL in ms (-2: no key).
async fn pttl(con: &mut ::redis::aio::MultiplexedConnection, key: &str) -> i64 {
    cmd(con, &["PTTL", key]).await
}

#[tokio::test]
async fn a_chain_lives_as_long_as_its_newest_delta_and_its_base_ttl_is_read_once_per_half_ttl() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    let ttl_ms: i64 = 600_000;
    let stores = within(
        "connect",
        RedisStores::connect(RedisConfig {
            checkpoint_ttl: std::time::Duration::from_millis(ttl_ms as u64),
            ..config(&server)
        }),
    )
    .await
    .expect("connect");
    let t = thread("fresh-chain");
    let keys = stores.keys();
    let key = |c: &StoredCheckpoint| keys.checkpoint(&t, c.id);
    let fresh = keys.checkpoint_fresh(&t);
    let cs = chain(RunId::new(), &t, 6);
    let put = |i: usize| stores.checkpoints.put(&t, cs[i].clone(), None);
    put(0).await.expect("base");
    put(1).await.expect("first delta");
    // The first delta read the base's TTL (all of it left): the freshness key names the base
    // until the base is down to half its TTL.
    let named: Option<String> = cmd(&mut con, &["GET", &fresh]).await;
    assert_eq!(named, Some(cs[0].id.to_string()));
    let vouched = pttl(&mut con, &fresh).await;
    assert!(
        vouched > ttl_ms / 2 - 60_000 && vouched <= ttl_ms / 2,
        "the key expires when the base is down to half its TTL: {vouched}ms"
    );

    // Time passes (emulated): the base and the first delta are down to a third of their TTL,
    // so the key has expired. The next delta reads the base's TTL and renews the whole chain.
    for c in &cs[..2] {
        let _: i64 = cmd(&mut con, &["PEXPIRE", &key(c), &(ttl_ms / 3).to_string()]).await;
    }
    let _: i64 = cmd(&mut con, &["DEL", &fresh]).await;
    put(2).await.expect("second delta");
    for c in &cs[..3] {
        let left = pttl(&mut con, &key(c)).await;
        assert!(
            left > ttl_ms - 60_000,
            "{} renewed with the chain: {left}ms",
            c.id
        );
    }
    assert!(pttl(&mut con, &fresh).await > ttl_ms / 2 - 60_000);

    // While the key names the base, a write does not read the base's TTL, so it renews
    // nothing: within half a TTL nothing of the chain can expire anyway.
    let _: i64 = cmd(
        &mut con,
        &["PEXPIRE", &key(&cs[0]), &(ttl_ms / 3).to_string()],
    )
    .await;
    put(3).await.expect("third delta");
    assert!(pttl(&mut con, &key(&cs[0])).await <= ttl_ms / 3);

    // The key vouches for TTLs, not for existence: a write whose base or parent is gone is
    // refused, naming it, and writes nothing.
    let parent = key(&cs[3]);
    let aside = format!("{parent}:aside");
    let _: () = cmd(&mut con, &["RENAME", &parent, &aside]).await;
    assert_eq!(
        put(4).await,
        Err(StoreError::MissingParent {
            checkpoint: cs[3].id
        })
    );
    let _: () = cmd(&mut con, &["RENAME", &aside, &parent]).await;
    let _: i64 = cmd(&mut con, &["DEL", &key(&cs[0])]).await;
    assert_eq!(
        put(4).await,
        Err(StoreError::MissingParent {
            checkpoint: cs[0].id
        })
    );
    let ids: Vec<CheckpointId> = cs[..4].iter().map(|c| c.id).collect();
    assert_eq!(stores.checkpoints.list(&t).await, Ok(ids[1..].to_vec()));
}

#[tokio::test]
async fn the_freshness_key_names_a_new_base_once_retention_let_the_chain_before_it_go() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    let stores = keeping(&server, 3).await;
    let t = thread("fresh-retention");
    let fresh = stores.keys().checkpoint_fresh(&t);
    let first = chain(RunId::new(), &t, 2);
    let second = chain(RunId::new(), &t, 3);
    for c in &first {
        stores
            .checkpoints
            .put(&t, c.clone(), None)
            .await
            .expect("first chain");
    }
    assert_eq!(
        cmd::<Option<String>>(&mut con, &["GET", &fresh]).await,
        Some(first[0].id.to_string())
    );
    let ids = |cs: &[StoredCheckpoint]| cs.iter().map(|c| c.id).collect::<Vec<_>>();
    // A new base and its first delta: the newest three build on the first chain's base too,
    // so it all stays, and the key does not name the new base (retention still has work).
    for c in &second[..2] {
        stores
            .checkpoints
            .put(&t, c.clone(), None)
            .await
            .expect("second chain");
    }
    let mut all = ids(&first);
    all.extend(ids(&second[..2]));
    assert_eq!(stores.checkpoints.list(&t).await, Ok(all));
    assert_eq!(
        cmd::<Option<String>>(&mut con, &["GET", &fresh]).await,
        Some(first[0].id.to_string())
    );
    // The next delta lets the first chain go; now the key names the new base, and the write
    // after it prunes nothing (the newest three build on that base).
    stores
        .checkpoints
        .put(&t, second[2].clone(), None)
        .await
        .expect("second chain");
    assert_eq!(stores.checkpoints.list(&t).await, Ok(ids(&second[..3])));
    assert_eq!(
        cmd::<Option<String>>(&mut con, &["GET", &fresh]).await,
        Some(second[0].id.to_string())
    );
    stores
        .checkpoints
        .put(&t, second[3].clone(), None)
        .await
        .expect("second chain");
    assert_eq!(stores.checkpoints.list(&t).await, Ok(ids(&second)));
}

#[tokio::test]
async fn a_stale_writers_delta_is_fenced() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let t = thread("fenced-delta");
    let ttl = std::time::Duration::from_secs(30);
    let holder = |name: &str| LeaseHolder {
        worker: WorkerId::new(name).expect("id"),
        run: RunId::new(),
    };
    let stale = stores
        .leases
        .acquire(&t, &holder("old"), ttl)
        .await
        .expect("free")
        .lease
        .fence;
    let cs = chain(RunId::new(), &t, 1);
    stores
        .checkpoints
        .put(&t, cs[0].clone(), Some(stale))
        .await
        .expect("the holder writes its base");
    // Another run takes the thread (the old holder never heartbeat).
    let current = stores
        .leases
        .acquire(&t, &holder("new"), ttl)
        .await
        .expect("take over")
        .lease
        .fence;
    assert!(matches!(
        stores.checkpoints.put(&t, cs[1].clone(), Some(stale)).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(stores.checkpoints.list(&t).await, Ok(vec![cs[0].id]));
    stores
        .checkpoints
        .put(&t, cs[1].clone(), Some(current))
        .await
        .expect("the new holder's token writes");
}

#[tokio::test]
async fn a_damaged_delta_in_a_chain_is_an_error_naming_its_checkpoint() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let mut con = raw(&server).await;
    let t = thread("damaged");
    let cs = chain(RunId::new(), &t, 3);
    for c in &cs {
        stores
            .checkpoints
            .put(&t, c.clone(), None)
            .await
            .expect("put");
    }
    let mut damaged = cs[2].bytes.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x01;
    let key = format!("runvisor:cp:{{damaged}}:{}", cs[2].id);
    assert_eq!(checkpoint_payload(&mut con, &key).await, cs[2].bytes);
    set_checkpoint_payload(&mut con, &key, &damaged).await;
    let latest = newest(&stores, &t).await;
    assert_eq!(latest.id, cs[3].id);
    match materialize(&*stores.checkpoints, &t, &latest).await {
        Err(MaterializeError::Snapshot(SnapshotError::InChain { checkpoint, error })) => {
            assert_eq!(checkpoint, cs[2].id);
            assert!(
                matches!(*error, SnapshotError::Checksum { .. }),
                "{error:?}"
            );
        }
        other => panic!("expected an error naming the damaged delta: {other:?}"),
    }
    // The damaged delta itself: its own error.
    let own = stores
        .checkpoints
        .get(&t, cs[2].id)
        .await
        .expect("get")
        .expect("one");
    assert!(matches!(
        materialize(&*stores.checkpoints, &t, &own).await,
        Err(MaterializeError::Snapshot(SnapshotError::Checksum { .. }))
    ));
    // A missing link (the damaged delta mended first).
    set_checkpoint_payload(&mut con, &key, &cs[2].bytes).await;
    assert_eq!(
        materialize(&*stores.checkpoints, &t, &latest).await,
        Ok(snapshot(cs[3].run, &t, 3))
    );
    let _: i64 = cmd(
        &mut con,
        &["DEL", &format!("runvisor:cp:{{damaged}}:{}", cs[1].id)],
    )
    .await;
    assert_eq!(
        materialize(&*stores.checkpoints, &t, &latest).await,
        Err(MaterializeError::Snapshot(SnapshotError::MissingLink {
            checkpoint: cs[1].id
        }))
    );
}

/// A workflow of `begin` followed by `nodes` steps in a row.
fn chain_def(nodes: usize) -> runvisor::WorkflowDef {
    let mut def =
        runvisor::WorkflowDef::new("chain").node(runvisor::NodeDef::new("begin", "begin"));
    let mut prev = "begin".to_owned();
    for i in 1..=nodes {
        let id = format!("n{i}");
        def = def
            .node(runvisor::NodeDef::new(&id, "step").param("x", i as i64))
            .edge(&prev, &id);
        prev = id;
    }
    def
}

/// Runs a chain of `nodes` steps to its end on `t` with `config`, on a Redis keeping every
/// checkpoint; returns the stores, the runtime and the checkpoints written, oldest first,
/// each checked to read back whole.
async fn run_sync_chain(
    server: &RedisServer,
    config: RuntimeConfig,
    nodes: usize,
    inputs: Map,
    t: &ThreadId,
) -> (RedisStores, Runtime, Vec<StoredCheckpoint>) {
    let stores = within(
        "connect",
        RedisStores::connect(RedisConfig {
            keep_checkpoints: KeepCheckpoints::All,
            ..super::support::config(server)
        }),
    )
    .await
    .expect("connect");
    let runtime = stores
        .install(Runtime::builder().handler("step", Step).config(config))
        .build();
    let workflow = runtime.validate(chain_def(nodes)).expect("valid");
    let run = runtime
        .start(&workflow, inputs, t.clone())
        .await
        .expect("start");
    let outcome = within("the run", run.wait()).await;
    assert_eq!(
        outcome.status(),
        runvisor::RunStatus::Succeeded,
        "{outcome:?}"
    );
    let mut written = Vec::new();
    for id in stores.checkpoints.list(t).await.expect("list") {
        let stored = stores
            .checkpoints
            .get(t, id)
            .await
            .expect("get")
            .expect("listed");
        let whole = materialize(&*stores.checkpoints, t, &stored)
            .await
            .expect("materializes");
        assert_eq!(&whole.thread, t);
        written.push(stored);
    }
    (stores, runtime, written)
}

/// With the default compaction (by size), the bytes written for bases after the first stay
/// within a fixed multiple of the delta bytes written, however long the run (a step's cost
/// does not grow with the state), and every checkpoint still reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bases_cost_a_bounded_share_of_the_deltas() {
    let server = RedisServer::start();
    let t = thread("sized-chain");
    let config = RuntimeConfig {
        durability: Durability::Sync,
        ..RuntimeConfig::default()
    };
    assert_eq!(config.checkpoint_compact_percent, 100);
    let (_, _, written) = run_sync_chain(&server, config, 400, Map::new(), &t).await;
    let (mut bases, mut delta_bytes) = (Vec::new(), 0);
    for stored in &written {
        match stored.link {
            Some(_) => delta_bytes += stored.bytes.len(),
            None => bases.push(stored.bytes.len()),
        }
    }
    // The first base and the compactions (the final checkpoint may be one).
    assert!(bases.len() >= 2, "bases of {bases:?}");
    // A new base is written once the chain's deltas outweigh its base, and the state grows
    // by less than the deltas that carry it: the compactions cost less than twice the deltas.
    let compactions: usize = bases[1..].iter().sum();
    assert!(
        compactions <= 2 * delta_bytes,
        "bases {bases:?} outweigh the {delta_bytes} delta bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_run_writes_deltas_of_flat_size_and_resumes_from_any_of_them() {
    let server = RedisServer::start();
    let t = thread("sync-chain");
    let (_stores, runtime, written) = run_sync_chain(
        &server,
        RuntimeConfig {
            durability: Durability::Sync,
            checkpoint_compact_every: 16,
            ..RuntimeConfig::default()
        },
        60,
        Map::new(),
        &t,
    )
    .await;
    let ids: Vec<CheckpointId> = written.iter().map(|c| c.id).collect();
    let mut deltas = Vec::new();
    let mut bases = 0;
    for stored in &written {
        match stored.link {
            Some(_) => deltas.push(stored.bytes.len()),
            None => bases += 1,
        }
    }
    assert!(
        deltas.len() >= 40,
        "{} deltas of {} checkpoints",
        deltas.len(),
        ids.len()
    );
    // A base every 17 checkpoints or so.
    assert!(bases >= 3, "{bases} bases");
    // The deltas do not grow with the run.
    let (first, last) = (deltas[0], deltas[deltas.len() - 1]);
    assert!(last <= first + 8, "delta sizes grow: {first} then {last}");
    // A fork from a delta in the middle restores its state.
    let middle = ids
        .iter()
        .copied()
        .find(|id| ids.iter().position(|x| x == id) == Some(ids.len() / 2))
        .expect("a middle checkpoint");
    fork_finishes(&runtime, &t, middle, "sync-chain-fork").await;
}

/// Forks `t` from `checkpoint` into thread `into` and runs the fork to its successful end.
async fn fork_finishes(runtime: &Runtime, t: &ThreadId, checkpoint: CheckpointId, into: &str) {
    let resumed = within(
        "fork",
        runtime.resume(
            ResumeFrom::Fork {
                thread: t.clone(),
                checkpoint,
                into: Some(thread(into)),
            },
            ResumeInput::Continue,
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("fork from {checkpoint}: {e:?}"));
    let outcome = within("the fork", resumed.wait()).await;
    assert_eq!(
        outcome.status(),
        runvisor::RunStatus::Succeeded,
        "{outcome:?}"
    );
}

/// A state that outweighs the deltas the count bound allows: where compaction by count would
/// write the state whole every `checkpoint_compact_every` steps, the chain gets a merged delta
/// (everything since its last merge point) instead. No restore applies more deltas than the
/// bound, the state is written whole once, every checkpoint restores, and a fork from one
/// right after a merge finishes, its own chain (whole in its thread first, then merging in
/// turn) restoring at every checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_state_gets_merged_deltas_instead_of_bases_and_every_checkpoint_restores() {
    let server = RedisServer::start();
    let t = thread("merged-chain");
    let mut inputs = Map::new();
    inputs.insert("document".to_owned(), Value::from("x".repeat(20_000)));
    // Merge points are taken while at most half the bound deep: 32 + 31 + ... + 17 steps
    // before a base, more than the run's.
    let every = 32;
    let (stores, runtime, written) = run_sync_chain(
        &server,
        RuntimeConfig {
            durability: Durability::Sync,
            checkpoint_compact_every: every,
            ..RuntimeConfig::default()
        },
        200,
        inputs,
        &t,
    )
    .await;
    let bases = written.iter().filter(|c| c.link.is_none()).count();
    assert_eq!(bases, 1, "the state is written whole once");
    let mut merged = Vec::new();
    for (i, stored) in written.iter().enumerate().skip(1) {
        let link = stored.link.expect("a delta");
        if link.parent != written[i - 1].id {
            merged.push(i);
        }
        let applied = stores
            .checkpoints
            .chain(&t, stored.id, 10_000)
            .await
            .expect("chain")
            .len()
            - 1;
        assert!(
            applied <= every as usize,
            "checkpoint {i} applies {applied} deltas"
        );
    }
    // A merge at least every `every` steps.
    assert!(
        merged.len() >= written.len() / every as usize,
        "merged deltas at {merged:?} of {}",
        written.len()
    );
    // Each checkpoint holds one completed node more than the one before it.
    let mut completed = Vec::new();
    for stored in &written {
        let whole = materialize(&*stores.checkpoints, &t, stored)
            .await
            .expect("materializes");
        completed.push(whole.graph.completed.len());
    }
    assert!(
        completed.windows(2).all(|w| w[1] >= w[0]),
        "completed nodes per checkpoint: {completed:?}"
    );
    let fork_at = written[merged[merged.len() / 2]].id;
    let forked_from = completed[merged[merged.len() / 2]];
    fork_finishes(&runtime, &t, fork_at, "merged-chain-fork").await;
    // The fork's own chain starts whole in its thread and merges in turn: every checkpoint
    // it wrote restores, on from where it was forked, to the run's end.
    let fork = thread("merged-chain-fork");
    let mut previous: Option<StoredCheckpoint> = None;
    let (mut fork_bases, mut fork_merged, mut fork_completed) = (0, 0, Vec::new());
    for id in stores.checkpoints.list(&fork).await.expect("list") {
        let stored = stores
            .checkpoints
            .get(&fork, id)
            .await
            .expect("get")
            .expect("listed");
        match (stored.link, &previous) {
            (None, _) => fork_bases += 1,
            (Some(link), Some(before)) if link.parent != before.id => fork_merged += 1,
            _ => {}
        }
        let whole = materialize(&*stores.checkpoints, &fork, &stored)
            .await
            .unwrap_or_else(|e| panic!("fork checkpoint {id} restores: {e:?}"));
        fork_completed.push(whole.graph.completed.len());
        previous = Some(stored);
    }
    assert!(
        fork_bases >= 1 && fork_merged >= 1,
        "{fork_bases} bases, {fork_merged} merged"
    );
    assert!(
        fork_completed.first().is_some_and(|&n| n >= forked_from)
            && fork_completed.windows(2).all(|w| w[1] >= w[0])
            && fork_completed.last() == Some(&(200 + 1)),
        "forked at {forked_from}; completed nodes per fork checkpoint: {fork_completed:?}"
    );
}

/// Records what the puts of a checkpoint store stored (id and link, in order) and the
/// refusals for a missing base or parent.
#[derive(Default)]
struct Recorded {
    stored: std::sync::Mutex<Vec<(CheckpointId, Option<DeltaLink>)>>,
    missing: std::sync::Mutex<Vec<StoreError>>,
}

impl PutWatch for Recorded {
    fn after(
        &self,
        _thread: &ThreadId,
        id: CheckpointId,
        link: Option<DeltaLink>,
        answer: &Result<(), StoreError>,
    ) {
        match answer {
            Ok(()) => self.stored.lock().expect("log").push((id, link)),
            Err(e @ StoreError::MissingParent { .. }) => {
                self.missing.lock().expect("log").push(e.clone())
            }
            Err(_) => {}
        }
    }
}

/// Text of `len` letters that does not compress: a state this large is never cheap to write
/// whole.
fn incompressible(len: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// Retention racing a live writer: while a `sync` run with a large state writes merged deltas
/// (bound 8) on a thread keeping 10, another connection (an operator's cleanup, or another
/// worker's checkpointer) prunes the thread to 10 and lets go of skipped deltas as fast as
/// it can. Whatever it removes, the writer never finds what its next delta builds on gone (a
/// merge point is always on the newest checkpoint's path), the run succeeds, and every
/// checkpoint the thread keeps reads back whole, the newest with every node completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_racing_a_live_writer_never_removes_what_its_next_delta_builds_on() {
    let server = RedisServer::start();
    let t = thread("raced-chain");
    let writer = keeping(&server, 10).await;
    let recorded = Arc::new(WatchedCheckpoints::new(
        writer.checkpoints.clone(),
        Recorded::default(),
    ));
    let runtime = writer
        .install(
            Runtime::builder()
                .handler("step", Step)
                .config(RuntimeConfig {
                    durability: Durability::Sync,
                    checkpoint_compact_every: 8,
                    ..RuntimeConfig::default()
                }),
        )
        .checkpoint_store(recorded.clone())
        .build();
    let nodes = 300;
    let workflow = runtime.validate(chain_def(nodes)).expect("valid");

    let pruner = keeping(&server, 10).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racing = tokio::spawn({
        let (done, t) = (done.clone(), t.clone());
        async move {
            let (mut rounds, mut removed) = (0usize, 0usize);
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                removed += pruner.checkpoints.prune(&t, 10).await.expect("prune");
                removed += pruner
                    .checkpoints
                    .prune_skipped(&t)
                    .await
                    .expect("prune skipped");
                rounds += 1;
            }
            (rounds, removed)
        }
    });

    let mut inputs = Map::new();
    inputs.insert("document".to_owned(), Value::from(incompressible(20_000)));
    let run = runtime
        .start(&workflow, inputs, t.clone())
        .await
        .expect("start");
    let outcome = within("the run", run.wait()).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (rounds, removed) = within("the pruner", racing).await.expect("the pruner");
    assert_eq!(
        outcome.status(),
        runvisor::RunStatus::Succeeded,
        "{outcome:?}"
    );
    assert!(
        recorded.watch().missing.lock().expect("log").is_empty(),
        "a delta found what it builds on gone: {:?}",
        recorded.watch().missing.lock().expect("log")
    );
    let stored = recorded.watch().stored.lock().expect("log").clone();
    let merged = stored
        .windows(2)
        .filter(|w| w[1].1.is_some_and(|link| link.parent != w[0].0))
        .count();
    assert!(merged >= 10, "{merged} merged deltas of {}", stored.len());
    assert!(
        rounds >= 20 && removed > 0,
        "the pruner ran {rounds} rounds and removed {removed}"
    );
    let kept = writer.checkpoints.list(&t).await.expect("list");
    assert!(kept.len() < stored.len(), "{} kept", kept.len());
    let mut newest = None;
    for id in kept {
        let checkpoint = writer
            .checkpoints
            .get(&t, id)
            .await
            .expect("get")
            .expect("listed");
        newest = Some(
            materialize(&*writer.checkpoints, &t, &checkpoint)
                .await
                .unwrap_or_else(|e| panic!("checkpoint {id} restores: {e:?}")),
        );
    }
    let newest = newest.expect("a checkpoint");
    assert_eq!(newest.status, RunStatus::Succeeded);
    assert_eq!(newest.graph.completed.len(), nodes + 1);
}

/// A chain written by an earlier release (a hash per checkpoint): it is read, restored and
/// continued by deltas in today's format, and pruning keeps what a kept delta builds on.
#[tokio::test]
async fn a_chain_of_hashes_from_an_earlier_release_restores_continues_and_prunes() {
    let server = RedisServer::start();
    let stores = keeping(&server, 2).await;
    let mut con = raw(&server).await;
    let t = thread("hashes");
    let run = RunId::new();
    let cs = chain(run, &t, 3);
    // The first three as an earlier release stored them.
    for c in &cs[..3] {
        let key = format!("runvisor:cp:{{hashes}}:{}", c.id);
        let mut hset = ::redis::cmd("HSET");
        hset.arg(&key)
            .arg("bytes")
            .arg(c.bytes.as_slice())
            .arg("run")
            .arg(run.to_string())
            .arg("sequence")
            .arg(c.sequence);
        if let Some(link) = c.link {
            hset.arg("base")
                .arg(link.base.to_string())
                .arg("parent")
                .arg(link.parent.to_string());
        }
        let _: i64 = hset.query_async(&mut con).await.expect("HSET");
        let _: i64 = cmd(
            &mut con,
            &["ZADD", "runvisor:cpidx:{hashes}", "0", &c.id.to_string()],
        )
        .await;
    }
    assert_eq!(
        stores.checkpoints.get(&t, cs[2].id).await,
        Ok(Some(cs[2].clone()))
    );
    let latest = newest(&stores, &t).await;
    assert_eq!(
        materialize(&*stores.checkpoints, &t, &latest).await,
        Ok(snapshot(run, &t, 2))
    );
    // Today's delta on top: stored as a value, the chain restores through both formats.
    stores
        .checkpoints
        .put(&t, cs[3].clone(), None)
        .await
        .expect("put");
    let kind: String = cmd(
        &mut con,
        &["TYPE", &format!("runvisor:cp:{{hashes}}:{}", cs[3].id)],
    )
    .await;
    assert_eq!(kind, "string");
    let latest = newest(&stores, &t).await;
    assert_eq!(latest, cs[3]);
    assert_eq!(
        materialize(&*stores.checkpoints, &t, &latest).await,
        Ok(snapshot(run, &t, 3))
    );
    // Keeping 2 (the newest two deltas), pruning stops at their base, a hash.
    assert_eq!(stores.checkpoints.prune(&t, 2).await, Ok(0));
    assert_eq!(
        stores.checkpoints.list(&t).await,
        Ok(cs.iter().map(|c| c.id).collect())
    );
    // After a new base, everything before it goes, hashes and values alike, with the
    // sequence key of the run that wrote them.
    let next = chain(RunId::new(), &t, 0).remove(0);
    stores
        .checkpoints
        .put(&t, next.clone(), None)
        .await
        .expect("put");
    assert_eq!(stores.checkpoints.prune(&t, 1).await, Ok(4));
    assert_eq!(stores.checkpoints.list(&t).await, Ok(vec![next.id]));
    let mut left: Vec<String> = cmd(&mut con, &["KEYS", "runvisor:cp*:{hashes}:*"]).await;
    left.sort();
    assert_eq!(
        left,
        [
            format!("runvisor:cp:{{hashes}}:{}", next.id),
            format!("runvisor:cpseq:{{hashes}}:{}", next.run),
        ],
        "the new base and its run's sequence; nothing of the pruned run"
    );
}
