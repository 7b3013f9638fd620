//! A whole workflow on Redis: a run force-stopped in one runtime resumes in a brand-new
//! runtime (as another process would) connected to the same Redis. Completed nodes do not run
//! again, the interrupted one runs from its start, and the history holds every message once.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runvisor::redis::RedisStores;
use runvisor::{
    Map, Message, NodeContext, NodeError, NodeHandler, NodeOutput, ResumeInput, RunHandle,
    RunStatus, Runtime, StopMode, StopReply, StopResult, ThreadId, Value, async_trait,
};
use runvisor_actors::testkit::stored_again_ahead;

use super::support::{RedisServer, stores, thread, within};

/// Counts its calls per node, appends "<node> done" to history and returns `{"node": id}`.
/// With `hang`, it never returns (until its task is aborted by a forced stop).
#[derive(Debug, Clone, Default)]
struct Step {
    calls: Arc<Mutex<BTreeMap<String, usize>>>,
    hang: Arc<HashSet<&'static str>>,
}

impl Step {
    fn hanging(nodes: &[&'static str]) -> Self {
        Self {
            hang: Arc::new(nodes.iter().copied().collect()),
            ..Self::default()
        }
    }

    fn calls(&self, node: &str) -> usize {
        self.calls
            .lock()
            .expect("calls")
            .get(node)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl NodeHandler for Step {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let node = ctx.node_id().as_str().to_owned();
        *self
            .calls
            .lock()
            .expect("calls")
            .entry(node.clone())
            .or_default() += 1;
        if self.hang.contains(node.as_str()) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        ctx.append_message(Message::assistant(format!("{node} done")));
        let output: Map = [("node".to_owned(), Value::from(node))]
            .into_iter()
            .collect();
        Ok(NodeOutput::new(Value::from(output)))
    }
}

const WORKFLOW: &str = r#"{
  "id": "durable",
  "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "intro", "kind": "step"},
    {"id": "slow", "kind": "step"},
    {"id": "outro", "kind": "step"}
  ],
  "edges": [
    {"from": "start", "to": "intro"},
    {"from": "intro", "to": "slow"},
    {"from": "slow", "to": "outro"}
  ]
}"#;

fn runtime(stores: &RedisStores, step: &Step) -> Runtime {
    stores
        .install(Runtime::builder().handler("step", step.clone()))
        .build()
}

fn texts(history: &[Message]) -> Vec<&str> {
    history.iter().map(|m| m.content.as_str()).collect()
}

/// A process's run of [`WORKFLOW`] on `t` with `inputs`, force-stopped in `slow`, which hangs:
/// its stores, runtime, run and the stop's result.
async fn stopped_at_slow(
    server: &RedisServer,
    t: &ThreadId,
    inputs: Map,
) -> (RedisStores, Runtime, RunHandle, StopResult) {
    let step = Step::hanging(&["slow"]);
    let stores = stores(server).await;
    let rt = runtime(&stores, &step);
    let workflow = rt.load_json(WORKFLOW).expect("valid workflow");
    let run = rt.start(&workflow, inputs, t.clone()).await.expect("start");
    within("`slow` to start", async {
        while step.calls("slow") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let stop = match within("force stop", run.stop(StopMode::Force)).await {
        Ok(StopReply::Stopped(result)) => result,
        other => panic!("expected the run to stop: {other:?}"),
    };
    (stores, rt, run, stop)
}

#[tokio::test]
async fn a_run_stopped_in_one_runtime_resumes_in_another() {
    let server = RedisServer::start();
    let t: ThreadId = thread("chat:durable");

    // Process one: the run reaches `slow`, which hangs; it is force-stopped there.
    let inputs: Map = [("query".to_owned(), Value::from("hello"))]
        .into_iter()
        .collect();
    let (first_stores, first_rt, first, stop) = stopped_at_slow(&server, &t, inputs).await;
    assert!(stop.checkpoint_id.is_some(), "{stop:#?}");
    assert_eq!(
        within("outcome", first.wait()).await.status(),
        RunStatus::Stopped
    );
    assert_eq!(
        texts(&first_stores.history.load(&t).await.expect("history")),
        ["hello", "intro done"]
    );
    drop(first_rt);
    drop(first_stores);

    // Process two: new stores, new runtime, same Redis.
    let second_step = Step::default();
    let second_stores = stores(&server).await;
    let second_rt = runtime(&second_stores, &second_step);
    let resumed = within("resume", second_rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumable from Redis");
    let outcome = within("resumed run", resumed.wait()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");

    // Completed nodes did not run again; the interrupted one ran from its start.
    assert_eq!(second_step.calls("intro"), 0);
    assert_eq!(second_step.calls("slow"), 1);
    assert_eq!(second_step.calls("outro"), 1);
    assert_eq!(
        outcome.output("intro").and_then(|o| o.get("node")),
        Some(&Value::from("intro"))
    );

    // Every message once, in order.
    let history = second_stores.history.load(&t).await.expect("history");
    assert_eq!(
        texts(&history),
        ["hello", "intro done", "slow done", "outro done"]
    );
    let ids: HashSet<_> = history.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), history.len(), "no message stored twice");

    // Run records and checkpoints, as another process reads them.
    let runs = second_stores.runs.list_thread(&t).await.expect("runs");
    assert_eq!(
        runs.iter()
            .map(|r| (r.run_id, r.status, r.parent_run_id))
            .collect::<Vec<_>>(),
        [
            (first.run_id(), RunStatus::Stopped, None),
            (resumed.run_id(), RunStatus::Succeeded, Some(first.run_id())),
        ]
    );
    let latest = second_stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("a checkpoint");
    assert_eq!(latest.run, resumed.run_id());
    assert_eq!(runs[1].checkpoint_id, Some(latest.id));
    let listed = second_stores.checkpoints.list(&t).await.expect("list");
    assert!(listed.contains(&stop.checkpoint_id.expect("stop checkpoint")));
    assert_eq!(listed.last(), Some(&latest.id));
}

/// The thread's newest checkpoint came from a process whose clock runs an hour ahead (here:
/// the stop checkpoint stored again, whole, under such an id). A brand-new runtime resumes the
/// thread from it: every checkpoint the resumed run writes sorts after it in the thread's
/// index, and the thread's newest is the resumed run's final one.
#[tokio::test]
async fn a_run_resumed_from_a_checkpoint_of_a_clock_ahead_stays_the_newest_on_redis() {
    after_a_checkpoint_of_a_clock_ahead(Then::Resume).await;
}

/// The same for a new run started on the thread (not resumed): the start reads the thread's
/// newest checkpoint id in its one script, and the run's checkpoints sort after it.
#[tokio::test]
async fn a_new_run_after_a_checkpoint_of_a_clock_ahead_stays_the_newest_on_redis() {
    after_a_checkpoint_of_a_clock_ahead(Then::Start).await;
}

/// How the second process goes on with the thread.
enum Then {
    Resume,
    Start,
}

async fn after_a_checkpoint_of_a_clock_ahead(then: Then) {
    let server = RedisServer::start();
    let t: ThreadId = thread("chat:clock-ahead");
    let (first_stores, first_rt, _, stop) = stopped_at_slow(&server, &t, Map::new()).await;
    let at_stop = stop.checkpoint_id.expect("stop checkpoint");
    let ahead = stored_again_ahead(
        &*first_stores.checkpoints,
        &t,
        at_stop,
        Duration::from_secs(3600),
    )
    .await
    .expect("stored again");
    drop(first_rt);
    drop(first_stores);

    let second_stores = stores(&server).await;
    let second_rt = runtime(&second_stores, &Step::default());
    let resumed = match then {
        Then::Resume => within("resume", second_rt.resume(t.clone(), ResumeInput::Continue))
            .await
            .expect("resumable from Redis"),
        Then::Start => {
            let workflow = second_rt.load_json(WORKFLOW).expect("valid workflow");
            within("start", second_rt.start(&workflow, Map::new(), t.clone()))
                .await
                .expect("start")
        }
    };
    let outcome = within("second run", resumed.wait()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let latest = second_stores
        .checkpoints
        .latest(&t)
        .await
        .expect("latest")
        .expect("a checkpoint");
    assert_eq!(
        latest.run,
        resumed.run_id(),
        "the newest is the second run's"
    );
    assert!(latest.id > ahead);
    for id in second_stores.checkpoints.list(&t).await.expect("list") {
        let checkpoint = second_stores
            .checkpoints
            .get(&t, id)
            .await
            .expect("get")
            .expect("listed");
        if checkpoint.run == resumed.run_id() {
            assert!(id > ahead, "{id} of the second run sorts before {ahead}");
        }
    }
}

/// A form pauses a run on Redis; a brand-new runtime answers it: the answering run succeeds,
/// the paused run's record says `answered` as the resume returns (written with the answering
/// run's first record), and no run of the thread is listed as open.
#[tokio::test]
async fn a_paused_run_answered_from_another_runtime_is_recorded_answered_on_redis() {
    let server = RedisServer::start();
    let t: ThreadId = thread("chat:answered");
    let form = r#"{
      "id": "form",
      "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "ask", "kind": "interactive", "params": {
          "mode": "form_input", "prompt": "Name?",
          "fields": [{"name": "name", "type": "string", "required": true}]
        }},
        {"id": "done", "kind": "step"}
      ],
      "edges": [{"from": "start", "to": "ask"}, {"from": "ask", "to": "done"}]
    }"#;
    let first_stores = stores(&server).await;
    let first_rt = runtime(&first_stores, &Step::default());
    let workflow = first_rt.load_json(form).expect("valid workflow");
    let first = first_rt
        .start(&workflow, Map::new(), t.clone())
        .await
        .expect("start");
    let paused = within("the pause", first.wait()).await;
    assert_eq!(paused.status(), RunStatus::AwaitingInput, "{paused:#?}");
    let interaction = paused.interaction().expect("a form").id;
    drop(first_rt);
    drop(first_stores);

    let second_stores = stores(&server).await;
    let second_rt = runtime(&second_stores, &Step::default());
    let answering = within(
        "resume with the answer",
        second_rt.resume(
            t.clone(),
            ResumeInput::Answer {
                interaction_id: interaction,
                value: Value::from_iter([("name", Value::from("Ann"))]),
            },
        ),
    )
    .await
    .expect("answerable");
    let runs = second_stores.runs.clone();
    assert_eq!(
        runs.get(first.run_id())
            .await
            .expect("get")
            .map(|r| r.status),
        Some(RunStatus::Answered)
    );
    let outcome = within("the answering run", answering.wait()).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let answered_by = runs
        .get(answering.run_id())
        .await
        .expect("get")
        .expect("recorded");
    assert_eq!(answered_by.parent_run_id, Some(first.run_id()));
    assert_eq!(runs.list_open().await, Ok(Vec::new()));
}
