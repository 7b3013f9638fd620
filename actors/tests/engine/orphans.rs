//! Runs across workers sharing stores: open runs of every worker are listed (ended ones on
//! request), a run recorded as running whose worker stopped heartbeating is `orphaned`, and
//! workers adopting orphans take each over once, without running its finished nodes again.

use std::sync::Arc;
use std::time::Duration;

use runvisor_actors::store::memory::{
    MemoryCheckpointStore, MemoryHistoryStore, MemoryRunStore, MemorySignalSource,
};
use runvisor_actors::store::{
    CheckpointStore, HistoryStore, LeaseStore, MemoryLeaseStore, RunStore, SignalSource,
};
use runvisor_actors::testkit::stored_again_ahead;
use runvisor_actors::{
    CheckpointId, LeaseHolder, NodePath, RunId, RunQuery, RunStatus, RuntimeConfig, StopMode,
    StopReason, ThreadId, WorkerId,
};
use serde_json::json;

use super::support::*;

/// Stores several workers share, as processes share one Redis.
#[derive(Clone)]
struct Shared {
    history: Arc<dyn HistoryStore>,
    runs: Arc<dyn RunStore>,
    checkpoints: Arc<dyn CheckpointStore>,
    signals: Arc<dyn SignalSource>,
    leases: Arc<dyn LeaseStore>,
}

impl Shared {
    fn new() -> Self {
        let leases = Arc::new(MemoryLeaseStore::new());
        Self {
            history: Arc::new(MemoryHistoryStore::new().fenced_by(leases.clone())),
            runs: Arc::new(MemoryRunStore::new().fenced_by(leases.clone())),
            checkpoints: Arc::new(MemoryCheckpointStore::new().fenced_by(leases.clone())),
            signals: Arc::new(MemorySignalSource::new().fenced_by(leases.clone())),
            leases,
        }
    }

    fn worker(&self, id: &str, adopt: bool) -> Host {
        let config = RuntimeConfig {
            worker_id: Some(id.to_owned()),
            adopt_orphans: adopt,
            adopt_every: Duration::from_secs(1),
            ..RuntimeConfig::default()
        };
        let shared = self.clone();
        host_with(move |b, _| {
            b.history_store(shared.history)
                .run_store(shared.runs)
                .checkpoint_store(shared.checkpoints)
                .signal_source(shared.signals)
                .lease_store(shared.leases)
                .config(config)
        })
    }
}

/// `start -> a (echo) -> blocked (hold) -> after (echo)`.
fn workflow(h: &Host) -> runvisor_actors::Workflow {
    load(
        &h.rt,
        json!({"id": "orphans", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "a", "kind": "echo", "params": {"x": 1}},
            {"id": "blocked", "kind": "hold", "params": {"x": 2}},
            {"id": "after", "kind": "echo", "params": {"x": 3}}
        ], "edges": [
            {"from": "start", "to": "a"}, {"from": "a", "to": "blocked"},
            {"from": "blocked", "to": "after"}
        ]}),
    )
}

fn path(id: &str) -> NodePath {
    NodePath::node(runvisor_actors::NodeId::new(id).expect("node id"))
}

#[tokio::test]
async fn open_runs_of_every_worker_are_listed_and_ended_ones_on_request() {
    let shared = Shared::new();
    let one = shared.worker("one", false);
    let two = shared.worker("two", false);
    let wf = workflow(&one);
    let user = runvisor_actors::RunLabels::default()
        .with_user("ann")
        .expect("valid user");
    let run = one
        .rt
        .start_with(&wf, Default::default(), thread("listed"), user)
        .await
        .expect("start");
    assert!(one.log.wait_mark("blocked:started", PATIENCE).await);

    // The worker running it knows what runs; another sees its record and its live worker.
    let here = one.rt.list_runs(&RunQuery::default()).await.expect("list");
    assert_eq!(here.len(), 1, "{here:#?}");
    assert!(here[0].here);
    assert_eq!(here[0].status, RunStatus::Running);
    assert_eq!(here[0].running_nodes, [path("blocked")]);
    let there = two.rt.list_runs(&RunQuery::default()).await.expect("list");
    assert_eq!(there.len(), 1, "{there:#?}");
    assert_eq!(there[0].record.run_id, run.run_id());
    assert!(!there[0].here);
    assert_eq!(there[0].status, RunStatus::Running);
    assert_eq!(
        there[0].worker.as_ref().map(|w| w.id.clone()),
        Some(WorkerId::new("one").expect("id"))
    );
    // Filters.
    let other_thread = RunQuery {
        thread: Some(thread("elsewhere")),
        ..RunQuery::default()
    };
    assert!(
        two.rt
            .list_runs(&other_thread)
            .await
            .expect("list")
            .is_empty()
    );
    let by_worker = RunQuery {
        worker: Some(WorkerId::new("one").expect("id")),
        statuses: vec![RunStatus::Running],
        ..RunQuery::default()
    };
    assert_eq!(two.rt.list_runs(&by_worker).await.expect("list").len(), 1);
    let of_user = |user: &str| RunQuery {
        user_id: Some(user.to_owned()),
        ..RunQuery::default()
    };
    assert_eq!(
        two.rt.list_runs(&of_user("ann")).await.expect("list").len(),
        1
    );
    assert!(
        two.rt
            .list_runs(&of_user("bob"))
            .await
            .expect("list")
            .is_empty()
    );

    one.log.mark("blocked:release");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded);
    assert!(
        two.rt
            .list_runs(&RunQuery::default())
            .await
            .expect("list")
            .is_empty(),
        "an ended run is not open"
    );
    let all = RunQuery {
        include_ended: true,
        ..RunQuery::default()
    };
    let ended = two.rt.list_runs(&all).await.expect("list");
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].status, RunStatus::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn an_orphan_is_listed_as_orphaned_and_adopted_once_without_rerunning_finished_nodes() {
    let shared = Shared::new();
    let crashed = shared.worker("crashed", false);
    let wf = workflow(&crashed);
    let t = thread("orphaned");
    let run = crashed
        .rt
        .start(&wf, Default::default(), t.clone())
        .await
        .expect("start");
    assert!(crashed.log.wait_mark("blocked:started", PATIENCE).await);
    run.stop(StopMode::Force).await.expect("stop");
    finish(&run).await;
    // What a worker dying at this point leaves: a checkpoint after `a`, and a record that
    // still says running, naming a worker that no longer heartbeats.
    let mut record = shared
        .runs
        .get(run.run_id())
        .await
        .expect("get")
        .expect("recorded");
    record.status = RunStatus::Running;
    record.stop_reason = None;
    record.finished_at_ms = None;
    record.worker = Some(WorkerId::new("gone").expect("id"));
    shared.runs.put(&record, None).await.expect("put");

    let observer = shared.worker("observer", false);
    let listed = observer
        .rt
        .list_runs(&RunQuery::default())
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, RunStatus::Orphaned);
    assert_eq!(listed[0].worker, None);

    // Two workers adopt orphans; whichever takes the thread, its run goes to the end.
    let adopters = [
        shared.worker("adopter-1", true),
        shared.worker("adopter-2", true),
    ];
    for a in &adopters {
        a.log.mark("blocked:release");
    }
    let runs = within("the orphan to be adopted and finished", async {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let runs = shared.runs.list_thread(&t).await.expect("runs");
            if runs.len() == 2 && runs[1].status == RunStatus::Succeeded {
                return runs;
            }
        }
    })
    .await;
    // A few more rounds: nobody adopts it again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = shared.runs.list_thread(&t).await.expect("runs");
    assert_eq!(after.len(), 2, "{after:#?}");
    assert_eq!(runs[0].run_id, run.run_id());
    assert_eq!(after[0].status, RunStatus::Stopped, "the orphan is closed");
    assert_eq!(
        after[0].stop_reason.as_deref(),
        Some(StopReason::LeaseLost.as_str())
    );
    assert_eq!(after[1].parent_run_id, Some(run.run_id()));
    // `a` finished before the crash: it never ran again; `blocked` ran once more.
    let called: Vec<String> = adopters.iter().flat_map(|a| a.log.called()).collect();
    assert_eq!(called, ["blocked", "after"]);
    assert!(
        observer
            .rt
            .list_runs(&RunQuery::default())
            .await
            .expect("list")
            .is_empty()
    );
}

/// A new run takes over a thread whose lease a dead worker still holds (step by step: no start
/// store here), and the thread's newest checkpoint was written by a process whose clock runs
/// an hour ahead: the new run's checkpoints sort after it, and the thread's newest is the new
/// run's final one.
#[tokio::test(start_paused = true)]
async fn a_start_taking_a_dead_workers_thread_over_writes_checkpoints_after_its_newest() {
    let shared = Shared::new();
    let first = shared.worker("first", false);
    let wf = workflow(&first);
    let t = thread("taken-over");
    let run = first
        .rt
        .start(&wf, Default::default(), t.clone())
        .await
        .expect("start");
    assert!(first.log.wait_mark("blocked:started", PATIENCE).await);
    let stop = match run.stop(StopMode::Force).await.expect("stop") {
        runvisor_actors::StopReply::Stopped(result) => result,
        other => panic!("expected a stop: {other:?}"),
    };
    finish(&run).await;
    let ahead = stored_again_ahead(
        &*shared.checkpoints,
        &t,
        stop.checkpoint_id.expect("stop checkpoint"),
        Duration::from_secs(3600),
    )
    .await
    .expect("stored again");
    // A worker that no longer heartbeats holds the thread's lease.
    shared
        .leases
        .acquire(
            &t,
            &LeaseHolder {
                worker: WorkerId::new("gone").expect("id"),
                run: RunId::new(),
            },
            Duration::from_secs(3600),
        )
        .await
        .expect("free");

    next_run_is_newest(&shared, &wf, &t, ahead).await;
}

/// A new run on a thread whose last run ended cleanly in another process (step by step: no
/// start store here), that process's clock an hour ahead: the new run's checkpoints sort after
/// the thread's newest, so the thread's newest is the new run's final one, and a resume of the
/// thread would continue the new run, not the one before it.
#[tokio::test(start_paused = true)]
async fn a_start_after_a_run_that_ended_writes_checkpoints_after_the_threads_newest() {
    let shared = Shared::new();
    let first = shared.worker("first", false);
    let wf = workflow(&first);
    let t = thread("ended");
    first.log.mark("blocked:release");
    let run = first
        .rt
        .start(&wf, Default::default(), t.clone())
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let last = shared
        .checkpoints
        .newest_id(&t)
        .await
        .expect("newest")
        .expect("a checkpoint");
    let ahead = stored_again_ahead(&*shared.checkpoints, &t, last, Duration::from_secs(3600))
        .await
        .expect("stored again");

    next_run_is_newest(&shared, &wf, &t, ahead).await;
}

/// A new worker runs `wf` on `t` to its end; its final checkpoint is the thread's newest, and
/// sorts after `ahead`.
async fn next_run_is_newest(
    shared: &Shared,
    wf: &runvisor_actors::Workflow,
    t: &ThreadId,
    ahead: CheckpointId,
) {
    let next = shared.worker("next", false);
    next.log.mark("blocked:release");
    let run = next
        .rt
        .start(wf, Default::default(), t.clone())
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let newest = shared
        .checkpoints
        .latest(t)
        .await
        .expect("latest")
        .expect("a checkpoint");
    assert_eq!(newest.run, run.run_id(), "the newest is the new run's");
    assert!(newest.id > ahead);
}
