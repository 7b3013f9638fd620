//! Races at the edges of a run, each run many times: a force stop landing in the instant a
//! handler returns (top level and inside a parallel) never makes the node run twice; of
//! concurrent resumes (or starts) of one thread exactly one runs; and every stop caller, early,
//! concurrent or late, learns how the run ended.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use runvisor_actors::testkit::{Interrupt, Script, persisted};
use runvisor_actors::{
    Message, NodeContext, NodeError, NodeHandler, NodeOutput, ResumeError, ResumeInput, RunOutcome,
    RunStatus, Runtime, RuntimeConfig, StartError, StopMode, StopReply, Value, Workflow,
    async_trait,
};
use serde_json::json;

use super::support::{PATIENCE, finish, host, host_with, inputs, load, thread, within};

/// Handlers that returned, by path. A handler counts itself and appends its message only once
/// nothing can abort it any more (no await after), so an aborted call leaves no trace and a
/// call that returned is counted exactly once.
#[derive(Debug, Default)]
struct Returns(Mutex<BTreeMap<String, u64>>);

impl Returns {
    fn of(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[derive(Debug)]
struct Count(Arc<Returns>);

#[async_trait]
impl NodeHandler for Count {
    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        tokio::task::yield_now().await;
        let path = ctx.path().to_string();
        *self
            .0
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(path.clone())
            .or_default() += 1;
        ctx.append_message(Message::assistant(format!("did {path}")));
        Ok(NodeOutput::new(Value::from_iter([("path", path)])))
    }
}

fn counting(script: Script) -> (Runtime, Arc<Returns>) {
    let returns = Arc::new(Returns::default());
    let rt = script
        .install(Runtime::builder().handler("count", Count(returns.clone())))
        .build();
    (rt, returns)
}

fn chain(rt: &Runtime) -> Workflow {
    load(
        rt,
        json!({"id": "race", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "work", "kind": "count"},
            {"id": "after", "kind": "template", "params": {"template": "{{work.path}}"}}
        ], "edges": [{"from": "start", "to": "work"}, {"from": "work", "to": "after"}]}),
    )
}

fn fan_out(rt: &Runtime) -> Workflow {
    load(
        rt,
        json!({"id": "race-par", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {"items": [0, 1, 2, 3], "max_concurrency": 4},
             "body": {"nodes": [{"id": "w", "kind": "count"}]}},
            {"id": "after", "kind": "template", "params": {"template": "{{p.count}}"}}
        ], "edges": [{"from": "start", "to": "p"}, {"from": "p", "to": "after"}]}),
    )
}

/// Runs `workflow` with a stop at `node`'s return, resumes until it completes, and checks that
/// every handler returned once and left one message.
async fn race_once(round: usize, interrupt: Interrupt, parallel: bool) {
    let (rt, returns) = counting(Script::new().interrupt(interrupt));
    let wf = if parallel { fan_out(&rt) } else { chain(&rt) };
    let t = thread(&format!("race-{parallel}-{round}"));
    let run = rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let mut outcome = finish(&run).await;
    let mut resumes = 0;
    while outcome.status() == RunStatus::Stopped {
        resumes += 1;
        assert!(resumes <= 2, "round {round}: still stopped: {outcome:#?}");
        let run = within("resume", rt.resume(t.clone(), ResumeInput::Continue))
            .await
            .expect("a stopped run resumes");
        outcome = finish(&run).await;
    }
    assert_eq!(
        outcome.status(),
        RunStatus::Succeeded,
        "round {round}: {outcome:#?}"
    );
    let expected: BTreeMap<String, u64> = if parallel {
        (0..4).map(|i| (format!("p/@{i}/w"), 1)).collect()
    } else {
        [("work".to_owned(), 1)].into()
    };
    assert_eq!(returns.of(), expected, "round {round}: a node ran twice");
    let history = persisted(&rt, &t).await.history;
    for path in expected.keys() {
        let said = format!("did {path}");
        let count = history.iter().filter(|m| m.content == said).count();
        assert_eq!(count, 1, "round {round}: {said:?} in history {count} times");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_stop_in_the_instant_a_handler_returns_never_runs_it_again() {
    for round in 0..2_000 {
        let interrupt = match round % 2 {
            0 => Interrupt::on_return("work").force(),
            // The graceful timeout escalating to force at once.
            _ => Interrupt::on_return("work").graceful(Duration::ZERO),
        };
        race_once(round, interrupt, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_parallel_a_force_stop_at_an_item_return_never_runs_it_again() {
    for round in 0..1_000 {
        let interrupt = match round % 2 {
            0 => Interrupt::on_return("w").force(),
            _ => Interrupt::on_return("w").graceful(Duration::ZERO),
        };
        race_once(round, interrupt, true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_twenty_concurrent_resumes_of_a_thread_exactly_one_runs() {
    let h = host_with(|b, _| {
        Script::new()
            .interrupt(Interrupt::before("hold"))
            .install(b)
    });
    let wf = load(
        &h.rt,
        json!({"id": "busy", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "hold", "kind": "hold"},
            {"id": "done", "kind": "echo"}
        ], "edges": [{"from": "start", "to": "hold"}, {"from": "hold", "to": "done"}]}),
    );
    let t = thread("busy");
    let first = h.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    assert_eq!(finish(&first).await.status(), RunStatus::Stopped);

    let resumes = (0..20).map(|_| {
        let rt = h.rt.clone();
        let t = t.clone();
        tokio::spawn(async move { rt.resume(t, ResumeInput::Continue).await })
    });
    let answers: Vec<_> = join_all(resumes)
        .await
        .into_iter()
        .map(|joined| joined.expect("task joins"))
        .collect();
    let runs: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    assert_eq!(runs.len(), 1, "{answers:?}");
    let live = runs[0].run_id();
    for answer in &answers {
        match answer {
            Ok(run) => assert_eq!(run.run_id(), live),
            Err(ResumeError::ThreadBusy { thread, run, .. }) => {
                assert_eq!(thread, &t);
                assert_eq!(*run, live, "the refusal names the live run");
            }
            Err(other) => panic!("unexpected refusal: {other}"),
        }
    }
    // A start on the thread is refused the same way while the run is live.
    let refused =
        h.rt.start(&wf, inputs([]), t.clone())
            .await
            .map(|run| run.run_id());
    assert_eq!(
        refused,
        Err(StartError::ThreadBusy {
            thread: t.clone(),
            run: live,
            worker: Some(h.rt.worker().id.clone()),
        })
    );
    assert_eq!(h.rt.registry().holder(&t), Some(live));
    assert!(h.log.wait_mark("hold:started", PATIENCE).await);
    h.log.mark("hold:release");
    let winner = answers.into_iter().find_map(Result::ok).expect("one run");
    let outcome = finish(&winner).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(h.log.inputs("hold").len(), 1, "hold ran once");
    assert_eq!(h.log.inputs("done").len(), 1, "done ran once");
    // The run ended: the thread is free again, with nothing left to resume.
    assert_eq!(h.rt.registry().holder(&t), None);
    let again =
        h.rt.resume(t.clone(), ResumeInput::Continue)
            .await
            .map(|run| run.run_id());
    assert!(
        matches!(again, Err(ResumeError::NothingToResume { .. })),
        "{again:?}"
    );
}

/// Runs holding at `hold`, each with twenty stop requests racing its end and twenty arriving
/// after it: all get the same stop result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_stop_caller_early_concurrent_or_late_gets_the_outcome() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "stops", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "hold", "kind": "hold"},
            {"id": "after", "kind": "template", "params": {"template": "x"}}
        ], "edges": [{"from": "start", "to": "hold"}, {"from": "hold", "to": "after"}]}),
    );
    for round in 0..20 {
        let t = thread(&format!("stops-{round}"));
        let run = h.rt.start(&wf, inputs([]), t).await.expect("start");
        let id = run.run_id();
        assert!(h.log.wait_mark("hold:started", PATIENCE).await);
        let callers = (0..20).map(|i| {
            let rt = h.rt.clone();
            tokio::spawn(async move {
                if i % 4 == 3 {
                    tokio::task::yield_now().await;
                }
                rt.stop(id, StopMode::Force).await
            })
        });
        let early: Vec<_> = join_all(callers).await;
        let outcome = finish(&run).await;
        let RunOutcome::Stopped(result) = &outcome else {
            panic!("round {round}: {outcome:#?}");
        };
        let late = join_all((0..20).map(|_| h.rt.stop(id, StopMode::Force))).await;
        for reply in early
            .into_iter()
            .map(|j| j.expect("task joins"))
            .chain(late)
        {
            assert_eq!(
                reply,
                Ok(StopReply::Stopped(result.clone())),
                "round {round}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_after_a_run_completed_gets_its_outcome_then_its_record_once_evicted() {
    let config = RuntimeConfig {
        finished_outcomes: 2,
        ..RuntimeConfig::default()
    };
    let rt = Runtime::builder().config(config).build();
    let wf = load(
        &rt,
        json!({"id": "done", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "t", "kind": "template", "params": {"template": "ok"}}
        ], "edges": [{"from": "start", "to": "t"}]}),
    );
    let mut ids = Vec::new();
    for i in 0..3 {
        let run = rt
            .start(&wf, inputs([]), thread(&format!("done-{i}")))
            .await
            .expect("start");
        let outcome = finish(&run).await;
        assert_eq!(outcome.status(), RunStatus::Succeeded);
        ids.push((run.run_id(), outcome));
    }
    // The two newest are kept: a late stop gets the whole outcome.
    for (id, outcome) in &ids[1..] {
        let replies = join_all((0..10).map(|_| rt.stop(*id, StopMode::Force))).await;
        for reply in replies {
            match reply {
                Ok(StopReply::AlreadyFinished(finished)) => {
                    assert_eq!(finished.status, RunStatus::Succeeded);
                    assert_eq!(finished.outcome.as_ref(), Some(outcome));
                    assert!(finished.record.is_some());
                }
                other => panic!("{other:?}"),
            }
        }
    }
    // The oldest was pushed out: its record still says how it ended.
    match rt.stop(ids[0].0, StopMode::Force).await {
        Ok(StopReply::AlreadyFinished(finished)) => {
            assert_eq!(finished.status, RunStatus::Succeeded);
            assert_eq!(finished.outcome, None);
            assert_eq!(
                finished.record.map(|r| r.status),
                Some(RunStatus::Succeeded)
            );
        }
        other => panic!("{other:?}"),
    }
}

/// Kept outcomes are bounded by bytes as well as by count: outcomes of about 80 KB each (the
/// begin node's 40 KB input and the template's copy of it), in a budget of 200 KB, keep the
/// two newest; one of 600 KB is not kept, and pushes none of them out. Past the budget a late
/// stop gets the run's record, as past the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_outcomes_are_kept_within_a_byte_budget() {
    let config = RuntimeConfig {
        finished_outcomes: 100,
        finished_outcomes_bytes: 200 * 1024,
        ..RuntimeConfig::default()
    };
    let rt = Runtime::builder().config(config).build();
    let wf = load(
        &rt,
        json!({"id": "big", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "t", "kind": "template", "params": {"template": "{{start.text}}"}}
        ], "edges": [{"from": "start", "to": "t"}]}),
    );
    let mut ids = Vec::new();
    for (i, size) in [40_000, 40_000, 40_000, 40_000, 300_000]
        .into_iter()
        .enumerate()
    {
        let text = Value::String("x".repeat(size));
        let run = rt
            .start(&wf, inputs([("text", text)]), thread(&format!("big-{i}")))
            .await
            .expect("start");
        let outcome = finish(&run).await;
        assert_eq!(outcome.status(), RunStatus::Succeeded);
        ids.push(run.run_id());
    }
    let kept: Vec<bool> = ids
        .iter()
        .map(|id| rt.registry().outcome(id).is_some())
        .collect();
    assert_eq!(kept, [false, false, true, true, false]);
    // A late stop of a run whose outcome went still gets how it ended, from its record.
    match rt.stop(ids[0], StopMode::Force).await {
        Ok(StopReply::AlreadyFinished(finished)) => {
            assert_eq!(finished.status, RunStatus::Succeeded);
            assert_eq!(finished.outcome, None);
            assert!(finished.record.is_some());
        }
        other => panic!("{other:?}"),
    }
}
