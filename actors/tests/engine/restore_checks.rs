//! Hand-made snapshots whose loop and parallel progress does not add up (indices past the
//! items, counts that differ, an item both done and in progress, nodes the workflow lacks):
//! a resume refuses each with `ResumeError::Inconsistent` naming what is wrong, nothing
//! panics, and the thread still resumes from its good checkpoint.

use runvisor_actors::snapshot::{
    CompletedNode, FrameState, ItemError, IterationDetail, LoopState, ParallelState, Snapshot,
    Vector,
};
use runvisor_actors::testkit::{Interrupt, Script, persisted};
use runvisor_actors::{
    CheckpointId, NodeId, ResumeError, ResumeFrom, ResumeInput, Route, RunStatus, Runtime, Value,
};
use serde_json::json;

use super::crafted::put_snapshot;
use super::support::{finish, host_with, inputs, load, thread, within};

/// A run of `workflow` stopped when `node` first completes: the runtime, its snapshot, and
/// its checkpoint.
async fn stopped_at(
    name: &str,
    node: &str,
    workflow: serde_json::Value,
) -> (Runtime, Snapshot, CheckpointId) {
    let node = node.to_owned();
    let h = host_with(move |b, _| {
        Script::new()
            .interrupt(Interrupt::on_completion(node))
            .install(b)
    });
    let wf = load(&h.rt, workflow);
    let t = thread(name);
    let run = h.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    assert_eq!(finish(&run).await.status(), RunStatus::Stopped);
    let state = persisted(&h.rt, &t).await;
    let id = state.checkpoint.as_ref().map(|(id, _)| *id).expect("saved");
    (h.rt, state.snapshot().clone(), id)
}

/// A way to break a snapshot, and words the refusal must contain.
type Case = (&'static str, Box<dyn Fn(&mut Snapshot)>);

fn saved_frame<'a>(snapshot: &'a mut Snapshot, node: &str) -> &'a mut FrameState {
    match snapshot
        .graph
        .frames
        .iter_mut()
        .find(|f| f.node.as_str() == node)
    {
        Some(frame) => &mut frame.state,
        None => panic!("no saved frame of {node}"),
    }
}

fn loop_of(snapshot: &mut Snapshot) -> &mut LoopState {
    match saved_frame(snapshot, "l") {
        FrameState::Loop(l) => l,
        other => panic!("not a loop: {other:?}"),
    }
}

fn parallel_of(snapshot: &mut Snapshot) -> &mut ParallelState {
    match saved_frame(snapshot, "p") {
        FrameState::Parallel(p) => p,
        other => panic!("not a parallel: {other:?}"),
    }
}

/// Puts each broken variant of `good` as the newest checkpoint; each resume must be refused
/// as inconsistent with a reason containing the expected words. Then the good checkpoint
/// resumes to the end.
async fn refuses_each(rt: &Runtime, good: &Snapshot, good_id: CheckpointId, cases: Vec<Case>) {
    for (expected, break_it) in cases {
        let mut bad = good.clone();
        break_it(&mut bad);
        let id = put_snapshot(rt, &bad).await;
        let refused = within(
            "a refused resume",
            rt.resume(bad.thread.clone(), ResumeInput::Continue),
        )
        .await
        .map(|run| run.run_id());
        match refused {
            Err(ResumeError::Inconsistent { checkpoint, reason }) => {
                assert_eq!(checkpoint, id);
                assert!(
                    reason.contains(expected),
                    "expected {expected:?} in the reason, got {reason:?}"
                );
            }
            other => panic!("expected {expected:?} to be refused, got {other:?}"),
        }
    }
    assert!(rt.registry().is_empty(), "no refused resume left a run");
    let run = within(
        "resume from the good checkpoint",
        rt.resume(
            ResumeFrom::Checkpoint {
                thread: good.thread.clone(),
                checkpoint: good_id,
            },
            ResumeInput::Continue,
        ),
    )
    .await
    .expect("the good checkpoint resumes");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
}

fn node(id: &str) -> NodeId {
    NodeId::new(id).expect("valid id")
}

#[tokio::test]
async fn loop_progress_that_does_not_add_up_is_refused() {
    let (rt, good, good_id) = stopped_at(
        "bad-loop",
        "w1",
        json!({"id": "l", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {"mode": "array", "items": [10, 20, 30]},
             "body": {"nodes": [
                {"id": "w1", "kind": "echo", "params": {"i": "{{l.item}}"}},
                {"id": "w2", "kind": "echo", "params": {"i": "{{l.item}}"}}
            ], "edges": [{"from": "w1", "to": "w2"}]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    )
    .await;
    let cases: Vec<Case> = vec![
        (
            "loop `l`: iteration 4 of 3 items",
            Box::new(|s| {
                let l = loop_of(s);
                l.iteration = 4;
                l.history = std::iter::repeat_n(Value::Null, 4).collect();
                l.details = (0..4)
                    .map(|index| IterationDetail {
                        index,
                        nodes: Vec::new(),
                    })
                    .collect();
            }),
        ),
        (
            "loop `l`: 4294967295 finished iterations, but 0 outputs and 0 details",
            Box::new(|s| loop_of(s).iteration = u32::MAX),
        ),
        (
            "loop `l`: 0 finished iterations, but 1 outputs and 0 details",
            Box::new(|s| loop_of(s).history.push_back(Value::Null)),
        ),
        (
            "loop `l`: iteration details are out of order",
            Box::new(|s| {
                let l = loop_of(s);
                l.iteration = 1;
                l.history.push_back(Value::Null);
                l.details.push_back(IterationDetail {
                    index: 5,
                    nodes: Vec::new(),
                });
            }),
        ),
        (
            "loop `l`: an array loop saved without its items",
            Box::new(|s| loop_of(s).items = None),
        ),
        (
            "completed node `zzz` in iteration 0 of `l` is not a node of its graph",
            Box::new(|s| {
                loop_of(s).body.completed.push_back(CompletedNode {
                    node: node("zzz"),
                    route: Route::All,
                    output: Default::default(),
                });
            }),
        ),
        (
            "completions in iteration 0 of `l` do not replay",
            Box::new(|s| {
                let l = loop_of(s);
                let again = l.body.completed[0].clone();
                l.body.completed.push_back(again);
            }),
        ),
        (
            "parallel progress saved for node `l`, not a parallel",
            Box::new(|s| {
                *saved_frame(s, "l") = FrameState::Parallel(ParallelState {
                    items: Vec::new().into(),
                    results: Vector::new(),
                    done: Vector::new(),
                    errors: Vector::new(),
                    in_progress: Vec::new(),
                    assigned: Vector::new(),
                });
            }),
        ),
        (
            "saved frame of `nope`",
            Box::new(|s| {
                let mut frame = s.graph.frames[0].clone();
                frame.node = node("nope");
                s.graph.frames.push(frame);
            }),
        ),
    ];
    refuses_each(&rt, &good, good_id, cases).await;
}

#[tokio::test]
async fn parallel_progress_with_indices_out_of_range_is_refused() {
    let (rt, good, good_id) = stopped_at(
        "bad-parallel",
        "w1",
        json!({"id": "p", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {"items": [1, 2, 3], "max_concurrency": 1},
             "body": {"nodes": [
                {"id": "w1", "kind": "echo", "params": {"i": "{{p.item}}"}},
                {"id": "w2", "kind": "echo", "params": {"i": "{{p.item}}"}}
            ], "edges": [{"from": "w1", "to": "w2"}]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    )
    .await;
    {
        let mut probe = good.clone();
        let p = parallel_of(&mut probe);
        assert_eq!(p.items.len(), 3);
        assert_eq!(
            p.in_progress.iter().map(|i| i.index).collect::<Vec<_>>(),
            vec![0],
            "item 0 was in progress at the stop"
        );
    }
    let cases: Vec<Case> = vec![
        (
            "parallel `p`: item 99 saved in progress is not a pending item",
            Box::new(|s| parallel_of(s).in_progress[0].index = 99),
        ),
        (
            "parallel `p`: 3 items, but 2 results and 3 flags",
            Box::new(|s| {
                parallel_of(s).results.pop_back();
            }),
        ),
        (
            "parallel `p`: 3 items, but 3 results and 4 flags",
            Box::new(|s| parallel_of(s).done.push_back(false)),
        ),
        (
            "parallel `p`: error recorded for item 7 that is not a finished item",
            Box::new(|s| {
                parallel_of(s).errors.push_back(ItemError {
                    index: 7,
                    error: "x".into(),
                })
            }),
        ),
        (
            "parallel `p`: error recorded for item 2 that is not a finished item",
            Box::new(|s| {
                parallel_of(s).errors.push_back(ItemError {
                    index: 2,
                    error: "x".into(),
                })
            }),
        ),
        (
            "parallel `p`: assignments recorded for item 9 of 3",
            Box::new(|s| parallel_of(s).assigned.push_back((9, Vec::new()))),
        ),
        (
            "parallel `p`: item 0 saved in progress is not a pending item",
            Box::new(|s| {
                let p = parallel_of(s);
                let again = p.in_progress[0].clone();
                p.in_progress.push(again);
            }),
        ),
        (
            "parallel `p`: item 0 saved in progress is not a pending item",
            Box::new(|s| {
                parallel_of(s).done.set(0, true);
            }),
        ),
        (
            "completed node `zzz` in item 0 of `p` is not a node of its graph",
            Box::new(|s| {
                parallel_of(s).in_progress[0]
                    .body
                    .completed
                    .push_back(CompletedNode {
                        node: node("zzz"),
                        route: Route::All,
                        output: Default::default(),
                    });
            }),
        ),
        (
            "loop progress saved for node `p`, not a loop",
            Box::new(|s| {
                *saved_frame(s, "p") = FrameState::Loop(LoopState {
                    iteration: 0,
                    vars: Default::default(),
                    history: Vector::new(),
                    details: Vector::new(),
                    items: None,
                    body: Default::default(),
                    assigned: Vec::new(),
                });
            }),
        ),
    ];
    refuses_each(&rt, &good, good_id, cases).await;
}
