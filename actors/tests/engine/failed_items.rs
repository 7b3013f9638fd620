//! A parallel item that failed (`on_error: collect`) stays failed across a stop: the snapshot
//! lists it among the errors, not among the items in progress, and a resume does not run it
//! again, unless the resume asks to retry failures (`ResumeOptions::retry_failed`); then it
//! runs again from its start, and only it and the interrupted items run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runvisor_actors::testkit::persisted;
use runvisor_actors::{
    NodeContext, NodeError, NodeHandler, NodeOutput, ResumeInput, ResumeOptions, RunEvent,
    RunStatus, Runtime, StopMode, StopReply, Value, async_trait,
};
use serde_json::json;

use super::bodykit::parallel_frame;
use super::support::{PATIENCE, finish, inputs, load, thread, within};

/// Body nodes of the items. On its first call at a path: `a` returns; in item 1, `s` holds its
/// thread (it cannot be aborted) until released and `f` fails once `s` holds, so item 1 is
/// still winding down its failure when the stop comes (for as long as its node's abort waits); in the other items, `f` and `s` wait for the
/// stop. Every later call returns `{"item": i}`.
#[derive(Debug, Default)]
struct Flaky {
    calls: Mutex<BTreeMap<String, u64>>,
    holding: AtomicBool,
    released: AtomicBool,
}

impl Flaky {
    fn calls(&self) -> BTreeMap<String, u64> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[derive(Debug)]
struct FlakyKind(Arc<Flaky>);

#[async_trait]
impl NodeHandler for FlakyKind {
    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let flaky = &self.0;
        let path = ctx.path().to_string();
        let first = {
            let mut calls = flaky.calls.lock().unwrap_or_else(|e| e.into_inner());
            let n = calls.entry(path).or_default();
            *n += 1;
            *n == 1
        };
        let item = input.get("item").and_then(Value::as_i64).unwrap_or(-1);
        let done = Ok(NodeOutput::new(Value::from_iter([("item", item)])));
        let node = ctx.node_id().as_str();
        if !first || node == "a" {
            return done;
        }
        match (node, item) {
            ("f", 1) => {
                // Fails once `s` holds its thread.
                let until = tokio::time::Instant::now() + PATIENCE;
                while !flaky.holding.load(Ordering::SeqCst) && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(NodeError::failed("boom"))
            }
            ("s", 1) => {
                // Holds its thread (the runtime's other tasks move to another): an abort
                // cannot cut it short.
                tokio::task::block_in_place(|| {
                    flaky.holding.store(true, Ordering::SeqCst);
                    let until = std::time::Instant::now() + PATIENCE;
                    while !flaky.released.load(Ordering::SeqCst)
                        && std::time::Instant::now() < until
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
                done
            }
            _ => {
                ctx.stopped().await;
                Err(NodeError::Stopped)
            }
        }
    }
}

/// Runs the parallel until item 1 has failed, stops it, and checks what the stop saved.
async fn stopped_with_a_failed_item(
    name: &str,
) -> (Runtime, Arc<Flaky>, runvisor_actors::ThreadId) {
    let flaky = Arc::new(Flaky::default());
    let rt = Runtime::builder()
        .handler("flaky", FlakyKind(flaky.clone()))
        .build();
    let wf = load(
        &rt,
        json!({"id": "items", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {
                "items": [0, 1, 2], "max_concurrency": 3, "on_error": "collect",
                "output": "{{f.item}}"
            }, "body": {"nodes": [
                {"id": "a", "kind": "flaky", "params": {"item": "{{p.item}}"}},
                {"id": "f", "kind": "flaky", "params": {"item": "{{p.item}}"}},
                {"id": "s", "kind": "flaky", "params": {"item": "{{p.item}}"}}
            ], "edges": [{"from": "a", "to": "f"}, {"from": "a", "to": "s"}]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    );
    let t = thread(name);
    let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let mut events = run.events();
    within("item 1 fails", async {
        while let Some(event) = events.next().await {
            if let RunEvent::NodeFailed { path, .. } = &event
                && path.to_string() == "p/@1/f"
            {
                return;
            }
        }
        panic!("the run ended before item 1 failed");
    })
    .await;
    // The other items' `f` and `s` wait for the stop: a stop before one of them began would
    // leave its first call to the resume, where it would wait for a stop that never comes.
    within("items 0 and 2 to wait for the stop", async {
        let waiting = ["p/@0/f", "p/@0/s", "p/@2/f", "p/@2/s"];
        while !waiting.iter().all(|p| flaky.calls().contains_key(*p)) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let reply = within("stop", rt.stop(run.run_id(), StopMode::graceful())).await;
    flaky.released.store(true, Ordering::SeqCst);
    let Ok(StopReply::Stopped(_)) = reply else {
        panic!("the run should stop: {reply:?}");
    };
    assert_eq!(finish(&run).await.status(), RunStatus::Stopped);

    let state = persisted(&rt, &t).await;
    let saved = parallel_frame(&state.snapshot().graph, "p");
    assert_eq!(
        saved.done.iter().copied().collect::<Vec<_>>(),
        vec![false, true, false],
        "{saved:#?}"
    );
    assert_eq!(
        saved.errors.iter().map(|e| e.index).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(saved.errors[0].error, "p/@1/f: boom");
    let mut in_progress: Vec<u32> = saved.in_progress.iter().map(|i| i.index).collect();
    in_progress.sort_unstable();
    assert_eq!(
        in_progress,
        vec![0, 2],
        "the failed item is not in progress"
    );
    (rt, flaky, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_item_stays_failed_on_resume() {
    let (rt, flaky, t) = stopped_with_a_failed_item("failed-stays").await;
    let run = within("resume", rt.resume(t.clone(), ResumeInput::Continue))
        .await
        .expect("resumes");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("p"),
        Some(&Value::from(json!({
            "results": [0, null, 2],
            "errors": [{"index": 1, "error": "p/@1/f: boom"}],
            "count": 3
        })))
    );
    let calls = flaky.calls();
    assert_eq!(calls.get("p/@1/f"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("p/@1/s"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("p/@0/f"), Some(&2), "interrupted items run again");
    assert_eq!(
        calls.get("p/@0/a"),
        Some(&1),
        "what an item finished is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resume_asked_to_retry_failures_runs_the_failed_item_again() {
    let (rt, flaky, t) = stopped_with_a_failed_item("failed-retried").await;
    let run = within(
        "resume",
        rt.resume_with(
            t.clone(),
            ResumeInput::Continue,
            ResumeOptions::default().retry_failed(true),
        ),
    )
    .await
    .expect("resumes");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(
        outcome.output("p"),
        Some(&Value::from(
            json!({"results": [0, 1, 2], "errors": [], "count": 3})
        ))
    );
    let calls = flaky.calls();
    // Item 1 ran again from its start; the others continued where they were.
    assert_eq!(calls.get("p/@1/a"), Some(&2), "{calls:?}");
    assert_eq!(calls.get("p/@1/f"), Some(&2), "{calls:?}");
    assert_eq!(calls.get("p/@0/a"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("p/@2/f"), Some(&2), "{calls:?}");
}
