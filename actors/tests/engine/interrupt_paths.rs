//! Scripted interrupts aimed at a path: iteration I of a loop, item J of a parallel, a node two
//! levels deep (a parallel inside a loop), and a pattern (`#*`, `@*`). Each test checks where
//! the run stopped (the interrupted paths and the saved frames), that the resume runs exactly
//! what was left (executions counted per iteration and item) and that nothing finished ran
//! twice.
//!
//! The targeted node holds until the stop reaches it (`hold_at`, the first time at its path),
//! so the stop finds it running; every other call returns at once. An interrupt that matched
//! any other path would stop the run elsewhere, or not at all (the hold would then fail the
//! run).

use std::collections::BTreeMap;

use runvisor_actors::testkit::{Interrupt, Script, persisted};
use runvisor_actors::{NodePath, StopResult};
use serde_json::json;

use super::bodykit::*;
use super::support::{finish, inputs, load, thread, val};

/// The stop result of the first run, which the script must have stopped.
fn stop_of(outcome: &runvisor_actors::RunOutcome) -> StopResult {
    match outcome.stop_result() {
        Some(stop) => stop.clone(),
        None => panic!("the script should have stopped the run: {outcome:#?}"),
    }
}

fn paths(texts: &[&str]) -> Vec<NodePath> {
    texts.iter().map(|t| at(t)).collect()
}

fn interrupted(stop: &StopResult) -> Vec<NodePath> {
    stop.interrupted.iter().map(|i| i.path.clone()).collect()
}

/// No path finished twice, across every run of the tally.
fn nothing_finished_twice(tally: &Tally) {
    let mut seen = BTreeMap::new();
    for path in tally.finished() {
        *seen.entry(path).or_insert(0usize) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "finished more than once: {twice:?}");
}

/// `l` loops over five items; its body is `a -> b`; `b` holds at iteration `hold_at`.
fn five_iterations(hold_at: i64) -> serde_json::Value {
    json!({"id": "five", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "l", "kind": "loop", "params": {
            "mode": "array", "items": ["v", "w", "x", "y", "z"], "output": "{{b.item}}{{l.index}}"
        }, "body": {"nodes": [
            {"id": "a", "kind": "work", "params": {"at": "{{l.index}}"}},
            {"id": "b", "kind": "work", "params": {
                "at": "{{l.index}}", "hold_at": hold_at, "item": "{{l.item}}"
            }}
        ], "edges": [{"from": "a", "to": "b"}]}}
    ], "edges": [{"from": "start", "to": "l"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_during_iteration_3_stops_there_and_the_resume_runs_the_rest() {
    let b = bodies_with(Script::new().interrupt(Interrupt::during("l/#3/b")));
    let wf = load(&b.rt, five_iterations(3));
    let t = thread("path-loop-during");
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let stop = stop_of(&finish(&run).await);
    assert_eq!(interrupted(&stop), paths(&["l/#3/b"]));
    assert_eq!(stop.stopped_at(), paths(&["l/#3/b"]));
    assert_eq!(b.tally.stopped(), ["l/#3/b"]);
    // Saved: three finished iterations, and `a` of the fourth.
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(&saved.snapshot().graph, "l");
    assert_eq!((l.iteration, l.history.len()), (3, 3));
    assert_eq!(done_nodes(&l.body), ["a"]);
    assert_eq!(
        l.body
            .frontier
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );

    let outcome = finish(&resume_continue(&b.rt, &t).await).await;
    completed(&outcome);
    assert_eq!(
        field(out(&outcome, "l"), "history"),
        &val(json!(["v0", "w1", "x2", "y3", "z4"]))
    );
    for i in 0..5 {
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/a")), 1, "a in #{i}");
        let b_calls = if i == 3 { 2 } else { 1 };
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/b")), b_calls, "b in #{i}");
    }
    nothing_finished_twice(&b.tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_before_a_node_of_iteration_3_leaves_it_unstarted() {
    let b = bodies_with(Script::new().interrupt(Interrupt::before("l/#3/b")));
    // Nothing holds: the interrupt alone stops the run.
    let wf = load(&b.rt, five_iterations(-1));
    let t = thread("path-loop-before");
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let stop = stop_of(&finish(&run).await);
    // No body node was running: the loop itself was cut short, between two of its nodes.
    assert_eq!(interrupted(&stop), paths(&["l"]));
    assert_eq!(b.tally.calls_at("l/#3/a"), 1);
    assert_eq!(b.tally.calls_at("l/#3/b"), 0, "b of #3 never started");
    assert_eq!(b.tally.calls_of("b"), 3);
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(&saved.snapshot().graph, "l");
    assert_eq!((l.iteration, l.history.len()), (3, 3));
    assert_eq!(done_nodes(&l.body), ["a"]);
    assert_eq!(
        l.body
            .frontier
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );

    let outcome = finish(&resume_continue(&b.rt, &t).await).await;
    completed(&outcome);
    for i in 0..5 {
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/a")), 1, "a in #{i}");
        assert_eq!(b.tally.calls_at(&format!("l/#{i}/b")), 1, "b in #{i}");
    }
    nothing_finished_twice(&b.tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_at_item_5_stops_that_item_and_the_resume_runs_what_was_left() {
    let b = bodies_with(Script::new().interrupt(Interrupt::during("p/@5/w")));
    let wf = load(
        &b.rt,
        json!({"id": "eight", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "p", "kind": "parallel", "params": {
                "items": ["a", "b", "c", "d", "e", "f", "g", "h"], "max_concurrency": 2,
                "output": "{{w.item}}{{p.index}}"
            }, "body": {"nodes": [
                {"id": "w", "kind": "work", "params": {
                    "at": "{{p.index}}", "hold_at": 5, "item": "{{p.item}}"
                }}
            ]}}
        ], "edges": [{"from": "start", "to": "p"}]}),
    );
    let t = thread("path-item");
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let stop = stop_of(&finish(&run).await);
    // Only item 5 was cut: any other item in flight returned by itself.
    assert_eq!(interrupted(&stop), paths(&["p/@5/w"]));
    assert_eq!(b.tally.stopped(), ["p/@5/w"]);
    let saved = persisted(&b.rt, &t).await;
    let p = parallel_frame(&saved.snapshot().graph, "p");
    assert!(!p.done[5], "item 5 is not done");
    assert!(p.in_progress.iter().any(|i| i.index == 5), "{p:#?}");
    // Items start in input order: 0 to 4 had run (some may still be saved in progress, with
    // their node completed).
    let first_run: BTreeMap<String, usize> = calls_by_path(&b.tally, |_| true);

    let outcome = finish(&resume_continue(&b.rt, &t).await).await;
    completed(&outcome);
    assert_eq!(
        out(&outcome, "p"),
        &val(json!({
            "results": ["a0", "b1", "c2", "d3", "e4", "f5", "g6", "h7"], "errors": [], "count": 8
        }))
    );
    // Item 5 ran again; every other item ran once in all, in whichever run it started.
    for i in 0..8 {
        let path = format!("p/@{i}/w");
        let expected = if i == 5 { 2 } else { 1 };
        assert_eq!(b.tally.calls_at(&path), expected, "{path}");
        if i < 5 {
            assert_eq!(first_run.get(&path), Some(&1), "{path} ran before the stop");
        }
    }
    nothing_finished_twice(&b.tally);
}

/// `l` loops over three lists of four; its body is the parallel `p` (two at once) over the
/// list, whose body is `w`, holding at `hold_at` (`"ITERATION/ITEM"`).
fn loop_of_parallels(hold_at: &str) -> serde_json::Value {
    json!({"id": "nested", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "l", "kind": "loop", "params": {
            "mode": "array", "items": [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]],
            "output": "{{p.results}}"
        }, "body": {"nodes": [
            {"id": "p", "kind": "parallel", "params": {
                "items": "{{l.item}}", "max_concurrency": 2, "output": "{{w.v}}"
            }, "body": {"nodes": [
                {"id": "w", "kind": "work", "params": {
                    "v": "{{p.item}}", "at": "{{l.index}}/{{p.index}}", "hold_at": hold_at
                }}
            ]}}
        ]}}
    ], "edges": [{"from": "start", "to": "l"}]})
}

/// Runs `loop_of_parallels` stopped by `interrupt`, which must cut `w` at `cut`
/// (`l/#I/p/@J/w`), then resumes it and checks what ran.
async fn stop_two_levels_deep(interrupt: Interrupt, hold_at: &str, cut: &str, name: &str) {
    let b = bodies_with(Script::new().interrupt(interrupt));
    let wf = load(&b.rt, loop_of_parallels(hold_at));
    let t = thread(name);
    let run = b.rt.start(&wf, inputs([]), t.clone()).await.expect("start");
    let stop = stop_of(&finish(&run).await);
    assert_eq!(interrupted(&stop), paths(&[cut]));
    assert_eq!(b.tally.stopped(), [cut]);
    let (iteration, item): (u32, usize) = {
        let mut parts = hold_at.split('/');
        let i = parts
            .next()
            .and_then(|s| s.parse().ok())
            .expect("iteration");
        let j = parts.next().and_then(|s| s.parse().ok()).expect("item");
        (i, j)
    };
    // Saved: the loop in the cut iteration, its parallel with the cut item in progress.
    let saved = persisted(&b.rt, &t).await;
    let l = loop_frame(&saved.snapshot().graph, "l");
    assert_eq!(l.iteration, iteration);
    assert_eq!(l.history.len(), iteration as usize);
    let p = parallel_frame(&l.body, "p");
    assert!(!p.done[item], "{p:#?}");
    assert!(
        p.in_progress.iter().any(|i| i.index as usize == item),
        "{p:#?}"
    );

    let outcome = finish(&resume_continue(&b.rt, &t).await).await;
    completed(&outcome);
    assert_eq!(
        field(out(&outcome, "l"), "history"),
        &val(json!([[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]]))
    );
    for i in 0..3 {
        for j in 0..4 {
            let path = format!("l/#{i}/p/@{j}/w");
            let expected = if path == cut { 2 } else { 1 };
            assert_eq!(b.tally.calls_at(&path), expected, "{path}");
        }
    }
    assert_eq!(b.tally.calls_of("w"), 13);
    nothing_finished_twice(&b.tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_at_an_item_of_a_parallel_inside_a_loop_iteration() {
    stop_two_levels_deep(
        Interrupt::during("l/#1/p/@2/w"),
        "1/2",
        "l/#1/p/@2/w",
        "path-nested",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_stops_at_the_first_path_it_matches() {
    // Any iteration, item 3: iterations run one after another, so iteration 0's item 3.
    stop_two_levels_deep(
        Interrupt::during("l/#*/p/@3/w"),
        "0/3",
        "l/#0/p/@3/w",
        "path-pattern",
    )
    .await;
}
