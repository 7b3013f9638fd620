//! Values nested far past the limit (10,000 levels) wherever they enter: run inputs, handler
//! outputs and variables, values the engine builds from them, answers, and crafted snapshot
//! bytes (values and loop frames). Each is a typed error naming the limit; the process lives
//! on and the run stays resumable where it can be.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use runvisor_actors::snapshot::{MAX_FRAME_DEPTH, Snapshot, SnapshotError};
use runvisor_actors::testkit::{Interrupt, Script, persisted};
use runvisor_actors::{
    MAX_DEPTH, NodeContext, NodeError, NodeHandler, NodeOutput, NodePath, ResumeError, ResumeFrom,
    ResumeInput, RunError, RunStatus, Runtime, StartError, TooDeep, Value, async_trait,
};
use serde_json::json;

use super::crafted::{payload_with_graph, put_newest, seal};
use super::support::{finish, inputs, load, thread, within};

/// `[[...[null]...]]`, `levels` arrays deep, built without recursion.
fn nested(levels: usize) -> Value {
    let mut v = Value::Null;
    for _ in 0..levels {
        v = Value::Array(vec![v]);
    }
    v
}

/// Returns, on its first call, `{"x": <10,000 levels>}` as its output (`mode: output`), as a
/// variable (`mode: variable`) or `levels` deep exactly (`mode: exact`); then `{"ok": true}`.
#[derive(Debug, Default)]
struct Deep {
    calls: AtomicU64,
}

#[async_trait]
impl NodeHandler for Deep {
    async fn run(&self, input: Value, _ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return Ok(NodeOutput::new(Value::from_iter([("ok", true)])));
        }
        let levels = input
            .get("levels")
            .and_then(Value::as_i64)
            .unwrap_or(10_000);
        let deep = nested(usize::try_from(levels).unwrap_or(0));
        Ok(match input.get("mode").and_then(Value::as_str) {
            Some("variable") => NodeOutput::new(Value::Null).with_variable("v", deep),
            Some("exact") => NodeOutput::new(deep),
            _ => NodeOutput::new(Value::from_iter([("x", deep)])),
        })
    }
}

fn runtime_with(deep: Arc<Deep>, script: Script) -> Runtime {
    script
        .install(Runtime::builder().handler("deep", ArcHandler(deep)))
        .build()
}

#[derive(Debug)]
struct ArcHandler(Arc<Deep>);

#[async_trait]
impl NodeHandler for ArcHandler {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        self.0.run(input, ctx).await
    }
}

#[tokio::test]
async fn a_run_input_past_the_limit_is_refused_and_the_thread_stays_free() {
    let rt = Runtime::builder().build();
    let wf = load(
        &rt,
        json!({"id": "in", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "t", "kind": "template", "params": {"template": "hi"}}
        ], "edges": [{"from": "start", "to": "t"}]}),
    );
    let t = thread("deep-input");
    let refused = rt
        .start(&wf, inputs([("data", nested(10_000))]), t.clone())
        .await
        .map(|run| run.run_id());
    assert_eq!(
        refused,
        Err(StartError::InputTooDeep {
            input: "data".into(),
            limit: MAX_DEPTH - 1,
        })
    );
    // One level less than the limit is an input like any other: the inputs, as the `begin`
    // node's output, nest exactly MAX_DEPTH levels.
    let run = rt
        .start(&wf, inputs([("data", nested(MAX_DEPTH - 1))]), t.clone())
        .await
        .expect("an input at the limit is taken");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("start").map(Value::depth),
        Some(MAX_DEPTH),
        "begin outputs the inputs"
    );
    assert!(rt.registry().is_empty());
}

#[tokio::test]
async fn a_handler_output_past_the_limit_fails_the_node_and_a_resume_runs_it_again() {
    for (mode, what) in [("output", "the output"), ("variable", "variable `v`")] {
        let deep = Arc::new(Deep::default());
        let rt = runtime_with(deep.clone(), Script::new());
        let wf = load(
            &rt,
            json!({"id": "out", "nodes": [
                {"id": "start", "kind": "begin"},
                {"id": "d", "kind": "deep", "params": {"mode": mode}},
                {"id": "t", "kind": "template", "params": {"template": "after"}}
            ], "edges": [{"from": "start", "to": "d"}, {"from": "d", "to": "t"}]}),
        );
        let t = thread(&format!("deep-{mode}"));
        let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
        let outcome = finish(&run).await;
        assert_eq!(outcome.status(), RunStatus::Failed, "{outcome:#?}");
        assert_eq!(
            outcome.error(),
            Some(&RunError::Node {
                path: NodePath::node("d".parse().expect("id")),
                error: NodeError::TooDeep {
                    what: what.into(),
                    limit: MAX_DEPTH,
                },
            })
        );
        let run = within("resume", rt.resume(t.clone(), ResumeInput::Continue))
            .await
            .expect("a failed run resumes");
        let outcome = finish(&run).await;
        assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
        assert_eq!(outcome.output("d"), Some(&Value::from_iter([("ok", true)])));
        assert_eq!(deep.calls.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn an_item_output_the_engine_builds_past_the_limit_fails_the_item() {
    let deep = Arc::new(Deep::default());
    let rt = runtime_with(deep.clone(), Script::new());
    // The body node outputs a value exactly at the limit; the item's output wraps it in an
    // object keyed by node, one level more.
    let wf = load(
        &rt,
        json!({"id": "item", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {"items": [1], "on_error": "collect"},
             "body": {"nodes": [
                {"id": "d", "kind": "deep", "params": {"mode": "exact", "levels": MAX_DEPTH}}
            ]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    );
    let run = rt
        .start(&wf, inputs([]), thread("deep-item"))
        .await
        .expect("start");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    let p = outcome.output("p").expect("parallel output");
    assert_eq!(p.get("results"), Some(&Value::from(vec![Value::Null])));
    let error = p
        .pointer(["errors", "0", "error"])
        .and_then(Value::as_str)
        .expect("the item failed");
    assert!(
        error.contains("the item's output is nested deeper than 128"),
        "{error}"
    );
}

#[tokio::test]
async fn an_answer_past_the_limit_is_refused_and_the_run_still_waits() {
    let rt = Runtime::builder().build();
    let wf = load(
        &rt,
        json!({"id": "ask", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "ask", "kind": "interactive", "params": {
                "mode": "form_input", "fields": [{"name": "n", "type": "integer", "required": true}]
            }},
            {"id": "t", "kind": "template", "params": {"template": "n={{ask.n}}"}}
        ], "edges": [{"from": "start", "to": "ask"}, {"from": "ask", "to": "t"}]}),
    );
    let t = thread("deep-answer");
    let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let outcome = finish(&run).await;
    let interaction = outcome.interaction().expect("paused").id;
    let refused = rt
        .resume(
            t.clone(),
            ResumeInput::Answer {
                interaction_id: interaction,
                value: Value::from_iter([("n", nested(10_000))]),
            },
        )
        .await
        .map(|run| run.run_id());
    assert_eq!(
        refused,
        Err(ResumeError::AnswerTooDeep {
            interaction,
            error: TooDeep::value(),
        })
    );
    let run = rt
        .resume(
            t.clone(),
            ResumeInput::Answer {
                interaction_id: interaction,
                value: Value::from_iter([("n", 7)]),
            },
        )
        .await
        .expect("the run still waits for its answer");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("t"),
        Some(&Value::from_iter([("text", "n=7")]))
    );
}

/// A thread stopped before `t`, its snapshot, and the runtime.
async fn stopped_thread(name: &str) -> (Runtime, Snapshot) {
    let rt = Script::new()
        .interrupt(Interrupt::before("t"))
        .install(Runtime::builder())
        .build();
    let wf = load(
        &rt,
        json!({"id": "crafted", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "t", "kind": "template", "params": {"template": "done"}}
        ], "edges": [{"from": "start", "to": "t"}]}),
    );
    let t = thread(name);
    let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    assert_eq!(finish(&run).await.status(), RunStatus::Stopped);
    let snapshot = persisted(&rt, &t).await.snapshot().clone();
    (rt, snapshot)
}

/// A graph whose `completed` and `frontier` are as in `snapshot` and whose frames are `loops`
/// loop frames of node `l`, each the only frame of the previous one's body: postcard's
/// encoding, written out field by field.
fn nested_loop_frames(snapshot: &Snapshot, loops: usize) -> Vec<u8> {
    let mut graph =
        super::crafted::postcard_of(&(&snapshot.graph.completed, &snapshot.graph.frontier));
    for _ in 0..loops {
        // frames: one SavedFrame { node: "l", state: Loop(LoopState { iteration 0, no vars,
        // history, details or items, body: { completed: [], frontier: [], frames: ...
        graph.extend_from_slice(&[1, 1, b'l', 0, 0, 0, 0, 0, 0, 0, 0]);
    }
    // The innermost body has no frames; then each LoopState's `assigned`, empty.
    graph.push(0);
    graph.extend(std::iter::repeat_n(0u8, loops));
    graph
}

#[tokio::test]
async fn crafted_snapshots_nesting_too_deep_are_refused_and_the_thread_resumes_from_a_good_one() {
    let (rt, good) = stopped_thread("deep-snapshot").await;
    let t = good.thread.clone();
    let good_id = rt
        .checkpoint_store()
        .latest(&t)
        .await
        .expect("store answers")
        .expect("a checkpoint")
        .id;

    // A value 10,000 levels deep as the query: postcard's tagged form is variant 5 (array)
    // and a length of 1 per level, then variant 0 (null); `Some` is 1.
    let mut query = vec![1u8];
    query.extend([5u8, 1].repeat(10_000));
    query.push(0);
    let mut fields = super::crafted::postcard_of(&(
        &good.run_id,
        &good.parent_run_id,
        &good.thread,
        &good.sequence,
        &good.created_at_ms,
        &good.status,
        &good.stop_reason,
        &good.workflow_hash,
        &good.workflow,
        &good.inputs,
    ));
    fields.extend(query);
    fields.extend(super::crafted::postcard_of(&(
        &good.variables,
        &good.graph,
        &good.interactions,
        &good.pending_messages,
        &good.labels,
        &good.history_len,
    )));
    let deep_value = seal(&fields);
    assert_eq!(
        Snapshot::decode(&deep_value),
        Err(SnapshotError::TooDeep {
            what: "a value",
            limit: MAX_DEPTH,
        })
    );

    // 10,000 loop frames, each inside the previous one's body.
    let deep_frames = seal(&payload_with_graph(
        &good,
        &nested_loop_frames(&good, 10_000),
    ));
    assert_eq!(
        Snapshot::decode(&deep_frames),
        Err(SnapshotError::TooDeep {
            what: "loop and parallel frames",
            limit: MAX_FRAME_DEPTH,
        })
    );
    // At the limit, frames decode (and are then refused by the workflow check: there is no
    // loop `l` in this workflow).
    let at_limit = seal(&payload_with_graph(
        &good,
        &nested_loop_frames(&good, MAX_FRAME_DEPTH),
    ));
    assert!(Snapshot::decode(&at_limit).is_ok());
    let past = seal(&payload_with_graph(
        &good,
        &nested_loop_frames(&good, MAX_FRAME_DEPTH + 1),
    ));
    assert!(matches!(
        Snapshot::decode(&past),
        Err(SnapshotError::TooDeep { .. })
    ));

    for (bytes, what) in [
        (deep_value, "a value"),
        (deep_frames, "loop and parallel frames"),
    ] {
        let checkpoint = put_newest(&rt, &t, &good, bytes).await;
        let refused = rt
            .resume(t.clone(), ResumeInput::Continue)
            .await
            .map(|run| run.run_id());
        match refused {
            Err(ResumeError::Corrupt {
                checkpoint: c,
                error: SnapshotError::TooDeep { what: w, .. },
            }) => {
                assert_eq!(c, checkpoint);
                assert_eq!(w, what);
            }
            other => panic!("expected a refusal naming the depth, got {other:?}"),
        }
    }
    let refused = rt
        .resume(t.clone(), ResumeInput::Continue)
        .await
        .map(|run| run.run_id());
    assert!(matches!(refused, Err(ResumeError::Corrupt { .. })));

    // The good checkpoint is still there: resuming from it finishes the run.
    let run = rt
        .resume(
            ResumeFrom::Checkpoint {
                thread: t.clone(),
                checkpoint: good_id,
            },
            ResumeInput::Continue,
        )
        .await
        .expect("the good checkpoint resumes");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("t"),
        Some(&Value::from_iter([("text", "done")]))
    );
}
