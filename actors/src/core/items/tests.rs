//! The parallel machine, by data and by property: the concurrency bound, input-order results,
//! collected and fail-fast failures, failed items staying failed on restore, and restore from
//! any point giving the same results as going on.

use proptest::prelude::*;

use super::*;
use crate::core::testing::parallel_spec;
use crate::model::ResolveError;

fn id(s: &str) -> NodeId {
    match NodeId::new(s) {
        Ok(id) => id,
        Err(e) => panic!("{e}"),
    }
}

fn items(n: usize) -> Value {
    Value::Object([("items", Value::Array((0..n).map(Value::from).collect()))].into())
}

fn results(out: &NodeOutput) -> Vec<Value> {
    match out.value.get("results") {
        Some(Value::Array(r)) => r.clone(),
        other => panic!("no results: {other:?}"),
    }
}

#[test]
fn at_most_max_concurrency_run_and_results_keep_input_order() {
    let mut m = ParallelMachine::begin(parallel_spec(3, true), &items(7)).expect("begins");
    let first = m.starts();
    assert_eq!(first, vec![0, 1, 2]);
    assert!(m.starts().is_empty(), "the bound is full");
    // Items finish out of order.
    assert_eq!(
        m.item_finished(2, Ok(Value::from("two")), vec![]),
        ItemStep::Continue
    );
    assert_eq!(m.starts(), vec![3]);
    for i in [0, 1, 3] {
        m.item_finished(i, Ok(Value::from(i)), vec![]);
    }
    assert_eq!(m.starts(), vec![4, 5, 6]);
    for i in [6, 5, 4] {
        m.item_finished(i, Ok(Value::from(i)), vec![]);
    }
    assert!(m.is_finished());
    let out = m.finish();
    assert_eq!(
        results(&out),
        vec![
            Value::from(0u32),
            Value::from(1u32),
            Value::from("two"),
            Value::from(3u32),
            Value::from(4u32),
            Value::from(5u32),
            Value::from(6u32)
        ]
    );
    assert_eq!(out.value.get("count"), Some(&Value::Int(7)));
}

#[test]
fn collected_failures_are_listed_by_index_and_the_others_go_on() {
    let mut m = ParallelMachine::begin(parallel_spec(2, false), &items(3)).expect("begins");
    m.starts();
    assert_eq!(
        m.item_failed(1, "b: boom".into(), vec![]),
        ItemStep::Continue
    );
    m.item_finished(0, Ok(Value::Int(0)), vec![]);
    assert_eq!(m.starts(), vec![2]);
    let bad = ResolveError {
        reference: "{{x}}".into(),
        reason: "none".into(),
    };
    assert_eq!(m.item_finished(2, Err(bad), vec![]), ItemStep::Continue);
    assert!(m.is_finished());
    let out = m.finish();
    assert_eq!(results(&out), vec![Value::Int(0), Value::Null, Value::Null]);
    let errors = out
        .value
        .get("errors")
        .and_then(Value::as_array)
        .expect("errors");
    let indices: Vec<_> = errors.iter().map(|e| e.get("index").cloned()).collect();
    assert_eq!(indices, vec![Some(Value::Int(1)), Some(Value::Int(2))]);
}

#[test]
fn fail_fast_fails_the_node_on_the_first_failure() {
    let mut m = ParallelMachine::begin(parallel_spec(2, true), &items(3)).expect("begins");
    m.starts();
    assert!(matches!(
        m.item_failed(1, "b: boom".into(), vec![]),
        ItemStep::Fail { index: 1, .. }
    ));
    assert_eq!(m.first_error().map(|e| e.index), Some(1));
}

#[test]
fn failed_items_stay_failed_on_restore_unless_retried() {
    let spec = parallel_spec(4, false);
    let mut m = ParallelMachine::begin(spec.clone(), &items(3)).expect("begins");
    m.starts();
    m.item_finished(0, Ok(Value::Int(0)), vec![]);
    m.item_failed(1, "b: boom".into(), vec![("x".into(), Value::Int(1))]);
    let saved = m.progress();

    let mut kept = ParallelMachine::restore(&id("p"), spec.clone(), saved.clone(), &[2], false)
        .expect("restores");
    assert_eq!(
        kept.starts(),
        vec![2],
        "only the item in progress runs again"
    );
    kept.item_finished(2, Ok(Value::Int(2)), vec![]);
    assert!(kept.is_finished());
    assert_eq!(kept.first_error().map(|e| e.index), Some(1));

    let mut retried =
        ParallelMachine::restore(&id("p"), spec, saved, &[2], true).expect("restores");
    assert_eq!(
        retried.starts(),
        vec![2, 1],
        "saved items first, then the failed one"
    );
    assert!(retried.first_error().is_none());
    let out = {
        retried.item_finished(1, Ok(Value::Int(1)), vec![]);
        retried.item_finished(2, Ok(Value::Int(2)), vec![]);
        retried.finish()
    };
    assert_eq!(
        results(&out),
        vec![Value::Int(0), Value::Int(1), Value::Int(2)]
    );
    assert!(
        out.variables.is_empty(),
        "the failed attempt's assignments are dropped"
    );
}

#[test]
fn restore_checks_every_count_and_index() {
    let spec = parallel_spec(2, false);
    let mut m = ParallelMachine::begin(spec.clone(), &items(3)).expect("begins");
    m.starts();
    m.item_failed(0, "a: x".into(), vec![]);
    let good = m.progress();
    let restore = |p: ParallelProgress, in_progress: &[u32]| {
        ParallelMachine::restore(&id("p"), spec.clone(), p, in_progress, false).map(|_| ())
    };
    assert!(restore(good.clone(), &[1]).is_ok());
    assert!(
        restore(good.clone(), &[3]).is_err(),
        "in progress out of range"
    );
    assert!(
        restore(good.clone(), &[0]).is_err(),
        "in progress but finished"
    );
    assert!(restore(good.clone(), &[1, 1]).is_err(), "in progress twice");
    let mut bad = good.clone();
    bad.results.push_back(None);
    assert!(restore(bad, &[]).is_err(), "result count");
    let mut bad = good.clone();
    bad.done.pop_back();
    assert!(restore(bad, &[]).is_err(), "flag count");
    let mut bad = good.clone();
    bad.errors.push_back(ItemError {
        index: 9,
        error: "x".into(),
    });
    assert!(restore(bad, &[]).is_err(), "error out of range");
    let mut bad = good.clone();
    bad.errors.push_back(ItemError {
        index: 2,
        error: "x".into(),
    });
    assert!(restore(bad, &[]).is_err(), "error for an unfinished item");
    let mut bad = good;
    bad.assigned.push_back((5, vec![]));
    assert!(restore(bad, &[]).is_err(), "assignment out of range");
}

/// One step of a random schedule: finish (or fail) the `k`-th running item.
#[derive(Debug, Clone)]
struct Pick {
    k: usize,
    fail: bool,
}

fn picks() -> impl Strategy<Value = Vec<Pick>> {
    prop::collection::vec(
        (0usize..64, prop::bool::weighted(0.15)).prop_map(|(k, fail)| Pick { k, fail }),
        0..200,
    )
}

/// Drives a machine with the picks; returns the item finish order.
fn drive(m: &mut ParallelMachine, running: &mut Vec<u32>, picks: &[Pick], bound: usize) {
    for pick in picks {
        running.extend(m.starts());
        assert!(
            running.len() <= bound,
            "more than max_concurrency in flight"
        );
        if running.is_empty() {
            return;
        }
        let index = running.remove(pick.k % running.len());
        if pick.fail {
            m.item_failed(index, format!("n: item {index}"), vec![]);
        } else {
            m.item_finished(index, Ok(Value::from(index * 10)), vec![]);
        }
    }
}

fn drain(m: &mut ParallelMachine, running: &mut Vec<u32>) {
    loop {
        running.extend(m.starts());
        let Some(index) = running.pop() else {
            return;
        };
        m.item_finished(index, Ok(Value::from(index * 10)), vec![]);
    }
}

proptest! {
    /// Whatever the order items end in: the bound holds, every item runs once, results are
    /// by input index, failures are listed once each.
    #[test]
    fn any_schedule_keeps_the_bound_and_the_order(
        n in 0usize..60,
        bound in 1usize..8,
        picks in picks(),
    ) {
        let mut m = ParallelMachine::begin(parallel_spec(bound, false), &items(n)).expect("begins");
        let mut running = Vec::new();
        drive(&mut m, &mut running, &picks, bound);
        drain(&mut m, &mut running);
        prop_assert!(m.is_finished());
        let out = m.finish();
        let errors = out.value.get("errors").and_then(Value::as_array).map_or(0, <[Value]>::len);
        let results = results(&out);
        prop_assert_eq!(results.len(), n);
        let nulls = results.iter().filter(|r| r.is_null()).count();
        prop_assert_eq!(nulls, errors, "exactly the failed items have no result");
        for (i, r) in results.iter().enumerate() {
            prop_assert!(r.is_null() || *r == Value::from(i * 10));
        }
    }

    /// Saving at any point and restoring (the running items continue first) ends with the
    /// same results as going on, and no finished item runs again.
    #[test]
    fn restoring_anywhere_equals_going_on(
        n in 1usize..50,
        bound in 1usize..6,
        picks in picks(),
    ) {
        let spec = parallel_spec(bound, false);
        let mut m = ParallelMachine::begin(spec.clone(), &items(n)).expect("begins");
        let mut running = Vec::new();
        drive(&mut m, &mut running, &picks, bound);
        let saved = m.progress();
        running.sort_unstable();
        let finished_before: Vec<u32> = (0..n as u32).filter(|i| saved.done[*i as usize]).collect();
        let mut restored =
            ParallelMachine::restore(&id("p"), spec, saved, &running, false).expect("restores");
        let mut again = Vec::new();
        loop {
            let starts = restored.starts();
            for i in &starts {
                prop_assert!(!finished_before.contains(i), "item {} ran twice", i);
            }
            again.extend(starts);
            let Some(index) = again.pop() else { break };
            restored.item_finished(index, Ok(Value::from(index * 10)), vec![]);
        }
        prop_assert!(restored.is_finished());
        let out = restored.finish();
        for (i, r) in results(&out).iter().enumerate() {
            prop_assert!(r.is_null() || *r == Value::from(i * 10));
        }
    }
}
