//! `sync` durability inside nested bodies: an iteration or item of a loop or parallel, at any
//! depth, begins only once a snapshot holding everything finished before it is stored, so a
//! process dying in the middle of a nested loop costs only the iteration or item in flight.

use std::sync::{Arc, Mutex};

use runvisor_actors::delta::materialize;
use runvisor_actors::snapshot::{FrameState, GraphState};
use runvisor_actors::store::memory::MemoryCheckpointStore;
use runvisor_actors::store::{CheckpointStore, MemoryLeaseStore, StoredCheckpoint};
use runvisor_actors::{
    Durability, NodeContext, NodeError, NodeHandler, NodeOutput, ResumeFrom, ResumeInput,
    RunStatus, Runtime, RuntimeConfig, StopMode, Value, async_trait,
};
use serde_json::json;

use super::support::*;

/// Finished iterations and items the graph's frames hold, at every depth: a loop's history,
/// a parallel's finished items, and what their current iteration or items in progress hold.
fn finished_units(graph: &GraphState) -> usize {
    graph
        .frames
        .iter()
        .map(|f| match &f.state {
            FrameState::Loop(l) => l.history.len() + finished_units(&l.body),
            FrameState::Parallel(p) => {
                p.done.iter().filter(|d| **d).count()
                    + p.in_progress
                        .iter()
                        .map(|i| finished_units(&i.body))
                        .sum::<usize>()
            }
            _ => 0,
        })
        .sum()
}

/// The body node: records its tag ([`tag`] of its `o` and `i` inputs), and, when it has a store, how
/// many iterations and items the thread's newest stored checkpoint says have finished. Blocks
/// (until stopped) the first time it sees `hold`.
struct Tagged {
    calls: Arc<Mutex<Vec<i64>>>,
    seen: Arc<Mutex<Vec<(i64, usize)>>>,
    store: Option<Arc<dyn CheckpointStore>>,
    hold: Option<(i64, Arc<tokio::sync::Notify>)>,
}

#[async_trait]
impl NodeHandler for Tagged {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let index = |name: &str| input.get(name).and_then(Value::as_i64).unwrap_or(-1);
        let tag = tag(index("o"), index("i"));
        let first = {
            let mut calls = self.calls.lock().expect("calls");
            calls.push(tag);
            calls.iter().filter(|c| **c == tag).count() == 1
        };
        if let Some(store) = &self.store {
            let stored = store
                .latest(ctx.thread())
                .await
                .map_err(NodeError::failed)?;
            let units = match stored {
                Some(stored) => finished_units(
                    &materialize(&**store, ctx.thread(), &stored)
                        .await
                        .map_err(NodeError::failed)?
                        .graph,
                ),
                None => 0,
            };
            self.seen.lock().expect("seen").push((tag, units));
        }
        if let Some((hold, started)) = &self.hold
            && *hold == tag
            && first
        {
            started.notify_one();
            ctx.stopped().await;
            return Err(NodeError::Stopped);
        }
        Ok(NodeOutput::new(Value::from_iter([("tag", tag)])))
    }
}

/// The three nestings, each of 3 x 3 units (iterations or items) run one at a time.
fn shapes() -> Vec<(&'static str, serde_json::Value)> {
    shapes_of(3)
}

/// The three nestings, each of `n` x `n` units run one at a time.
fn shapes_of(n: i64) -> Vec<(&'static str, serde_json::Value)> {
    let items: Vec<i64> = (0..n).collect();
    let leaf = |inner: &str| {
        json!({"nodes": [
            {"id": "w", "kind": "tagged",
             "params": {"o": "{{o.index}}", "i": format!("{{{{{inner}.index}}}}")}}
        ]})
    };
    let loop_of = |id: &str, body: serde_json::Value| {
        json!({"id": id, "kind": "loop", "params": {"mode": "array", "items": items},
               "body": body})
    };
    let parallel_of = |id: &str, body: serde_json::Value| {
        json!({"id": id, "kind": "parallel",
               "params": {"items": items, "max_concurrency": 1}, "body": body})
    };
    let workflow = |outer: serde_json::Value| {
        json!({"id": "nested", "nodes": [{"id": "start", "kind": "begin"}, outer],
               "edges": [{"from": "start", "to": "o"}]})
    };
    vec![
        (
            "loop in loop",
            workflow(loop_of("o", json!({"nodes": [loop_of("i", leaf("i"))]}))),
        ),
        (
            "parallel in loop",
            workflow(loop_of(
                "o",
                json!({"nodes": [parallel_of("i", leaf("i"))]}),
            )),
        ),
        (
            "loop in parallel",
            workflow(parallel_of(
                "o",
                json!({"nodes": [loop_of("i", leaf("i"))]}),
            )),
        ),
    ]
}

/// A unit's tag: its outer and inner indexes.
fn tag(outer: i64, inner: i64) -> i64 {
    outer * 10 + inner
}

fn runtime(
    store: Arc<dyn CheckpointStore>,
    tagged: Tagged,
    durability: Durability,
) -> (Runtime, Arc<dyn CheckpointStore>) {
    let config = RuntimeConfig {
        durability,
        ..RuntimeConfig::default()
    };
    (runtime_with(store.clone(), tagged, config), store)
}

fn runtime_with(store: Arc<dyn CheckpointStore>, tagged: Tagged, config: RuntimeConfig) -> Runtime {
    Runtime::builder()
        .lease_store(Arc::new(MemoryLeaseStore::new()))
        .checkpoint_store(store)
        .handler("tagged", tagged)
        .config(config)
        .build()
}

#[tokio::test]
async fn in_sync_mode_each_nested_iteration_and_item_begins_after_what_finished_is_stored() {
    for (shape, json) in shapes() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let store: Arc<dyn CheckpointStore> = Arc::new(MemoryCheckpointStore::new());
        let (rt, _) = runtime(
            store.clone(),
            Tagged {
                calls: Arc::default(),
                seen: seen.clone(),
                store: Some(store),
                hold: None,
            },
            Durability::Sync,
        );
        let wf = load(&rt, json);
        let outcome = run_to_end(&rt, &wf, Default::default(), "nested-sync").await;
        assert_eq!(
            outcome.status(),
            RunStatus::Succeeded,
            "{shape}: {outcome:#?}"
        );
        let seen = seen.lock().expect("seen").clone();
        let expected: Vec<(i64, usize)> = (0..3)
            .flat_map(|o| (0..3).map(move |i| (tag(o, i), (o + i) as usize)))
            .collect();
        assert_eq!(
            seen, expected,
            "{shape}: when unit (outer, inner) begins, the stored checkpoint holds the outer \
             units and the inner units of the current one that finished before it"
        );
    }
}

#[tokio::test]
async fn a_crash_in_a_nested_body_under_sync_reruns_only_the_unit_in_flight() {
    for (shape, json) in shapes() {
        // The process dies while unit (1, 1) runs.
        let held = tag(1, 1);
        let calls = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(tokio::sync::Notify::new());
        let (first, first_store) = runtime(
            Arc::new(MemoryCheckpointStore::new()),
            Tagged {
                calls: calls.clone(),
                seen: Arc::default(),
                store: None,
                hold: Some((held, started.clone())),
            },
            Durability::Sync,
        );
        let wf = load(&first, json);
        let t = thread("nested-sync-crash");
        let run = first
            .start(&wf, Default::default(), t.clone())
            .await
            .expect("start");
        within("the held unit starts", started.notified()).await;

        // Another process, with only what was stored, takes the thread over.
        let stored = first_store
            .latest(&t)
            .await
            .expect("latest")
            .expect("a stored checkpoint");
        let snapshot = materialize(&*first_store, &t, &stored)
            .await
            .expect("decodes");
        assert_eq!(snapshot.status, RunStatus::Running, "{shape}");
        let (second, second_store) = runtime(
            Arc::new(MemoryCheckpointStore::new()),
            Tagged {
                calls: calls.clone(),
                seen: Arc::default(),
                store: None,
                hold: None,
            },
            Durability::Sync,
        );
        let definition = first_store
            .get_workflow(&t, &snapshot.workflow_hash)
            .await
            .expect("read")
            .expect("the workflow is stored");
        second_store
            .put_workflow(&t, &snapshot.workflow_hash, &definition)
            .await
            .expect("copy the workflow");
        let whole = StoredCheckpoint {
            bytes: snapshot.encode().expect("encodes"),
            link: None,
            ..stored
        };
        second_store
            .put(&t, whole, None)
            .await
            .expect("copy the checkpoint");
        let resumed = second
            .resume(ResumeFrom::Thread(t.clone()), ResumeInput::Continue)
            .await
            .expect("resume");
        let outcome = finish(&resumed).await;
        assert_eq!(
            outcome.status(),
            RunStatus::Succeeded,
            "{shape}: {outcome:#?}"
        );
        let _ = run.stop(StopMode::Force).await;
        finish(&run).await;

        let calls = calls.lock().expect("calls").clone();
        for o in 0..3 {
            for i in 0..3 {
                let t = tag(o, i);
                let times = calls.iter().filter(|c| **c == t).count();
                let want = if t == held { 2 } else { 1 };
                assert_eq!(
                    times, want,
                    "{shape}: unit ({o}, {i}) ran {times} times (calls: {calls:?})"
                );
            }
        }
    }
}

/// Every checkpoint a run stored, oldest first, read back whole.
async fn stored_states(
    store: &dyn CheckpointStore,
    t: &runvisor_actors::ThreadId,
) -> Vec<(StoredCheckpoint, runvisor_actors::snapshot::Snapshot)> {
    let mut states = Vec::new();
    for id in store.list(t).await.expect("list") {
        let stored = store.get(t, id).await.expect("get").expect("listed");
        let whole = materialize(store, t, &stored).await.expect("materializes");
        states.push((stored, whole));
    }
    states
}

/// With a large state and a low count bound, a `sync` run at any nesting gets merged deltas
/// (deltas of an earlier checkpoint than the one before), and every checkpoint reads back the
/// very state the same run stores when each checkpoint is whole.
#[tokio::test]
async fn merged_deltas_in_nested_bodies_read_back_the_states_of_whole_checkpoints() {
    let document = Value::from("x".repeat(20_000));
    for (shape, json) in shapes_of(5) {
        let mut runs = Vec::new();
        for compact_every in [8, 0] {
            let store: Arc<dyn CheckpointStore> = Arc::new(MemoryCheckpointStore::keeping(None));
            let tagged = Tagged {
                calls: Arc::default(),
                seen: Arc::default(),
                store: None,
                hold: None,
            };
            let config = RuntimeConfig {
                durability: Durability::Sync,
                checkpoint_compact_every: compact_every,
                ..RuntimeConfig::default()
            };
            let rt = runtime_with(store.clone(), tagged, config);
            let wf = load(&rt, json.clone());
            let name = "nested-merged";
            let outcome =
                run_to_end(&rt, &wf, inputs([("document", document.clone())]), name).await;
            assert_eq!(
                outcome.status(),
                RunStatus::Succeeded,
                "{shape}: {outcome:#?}"
            );
            runs.push(stored_states(&*store, &thread(name)).await);
        }
        let (merged, whole) = (&runs[0], &runs[1]);
        assert!(whole.iter().all(|(c, _)| c.link.is_none()), "{shape}");
        let merges = merged
            .windows(2)
            .filter(|w| w[1].0.link.is_some_and(|l| l.parent != w[0].0.id))
            .count();
        assert!(merges >= 3, "{shape}: {merges} merged deltas");
        assert_eq!(merged.len(), whole.len(), "{shape}: checkpoints written");
        for (i, ((_, a), (_, b))) in merged.iter().zip(whole).enumerate() {
            assert_eq!(
                (a.sequence, a.status, &a.variables, &a.graph),
                (b.sequence, b.status, &b.variables, &b.graph),
                "{shape}: checkpoint {i}"
            );
        }
    }
}
