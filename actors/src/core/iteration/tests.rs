//! The loop machine, by data: modes, `until`, `max_iterations`, loop variables, failures, and
//! restore from any point giving the same run as going on.

use proptest::prelude::*;

use super::*;
use crate::core::testing::loop_spec;
use crate::workflow::LoopMode;

fn id(s: &str) -> NodeId {
    match NodeId::new(s) {
        Ok(id) => id,
        Err(e) => panic!("{e}"),
    }
}

fn input(items: Option<Vec<Value>>, vars: &[(&str, Value)]) -> Value {
    let mut m = Map::new();
    if let Some(items) = items {
        m.insert("items".into(), Value::Array(items));
    }
    m.insert(
        "variables".into(),
        Value::Object(vars.iter().map(|(k, v)| (*k, v.clone())).collect()),
    );
    Value::Object(m)
}

/// `until` as a switch case: `{{l.index}} >= n`.
fn until_index_at_least(index: u32, n: i64) -> Value {
    let condition: Map = [
        ("left", Value::from(index)),
        ("op", Value::from("gte")),
        ("right", Value::Int(n)),
    ]
    .into_iter()
    .collect();
    Value::Object([("conditions", Value::Array(vec![Value::Object(condition)]))].into())
}

fn end(index: u32, frame: Map, until: Option<Value>) -> IterationEnd {
    IterationEnd {
        output: Ok(Value::from(index)),
        until: until.map(Ok),
        frame,
        nodes: vec![id("b")],
        assigned: vec![("total".into(), Value::from(index))],
    }
}

fn start_index(step: &LoopStep) -> Option<u32> {
    match step {
        LoopStep::Start { index, .. } => Some(*index),
        _ => None,
    }
}

fn finished(step: LoopStep) -> Map {
    match step {
        LoopStep::Finish(out) => match out.value {
            Value::Object(m) => m,
            other => panic!("loop output is not an object: {other:?}"),
        },
        other => panic!("expected the loop to finish, got {other:?}"),
    }
}

#[test]
fn array_mode_runs_one_iteration_per_item_with_index_and_item() {
    let items = vec![Value::Int(0), Value::from(""), Value::Bool(false)];
    let mut m = LoopMachine::begin(
        id("l"),
        loop_spec(LoopMode::Array, 10, &[]),
        &input(Some(items.clone()), &[]),
    )
    .expect("begins");
    let mut step = m.current();
    for (i, item) in items.iter().enumerate() {
        match &step {
            LoopStep::Start { index, frame } => {
                assert_eq!(*index as usize, i);
                assert_eq!(frame.get("item"), Some(item), "falsy items are items");
                assert_eq!(frame.get("index"), Some(&Value::from(i)));
            }
            other => panic!("expected iteration {i}, got {other:?}"),
        }
        step = m.iteration_done(end(i as u32, Map::new(), None));
    }
    let out = finished(step);
    assert_eq!(out.get("iterations"), Some(&Value::Int(3)));
    assert_eq!(
        out.get("history"),
        Some(&Value::Array(vec![
            Value::Int(0),
            Value::Int(1),
            Value::Int(2)
        ]))
    );
}

#[test]
fn an_array_loop_over_nothing_finishes_at_once() {
    let mut m = LoopMachine::begin(
        id("l"),
        loop_spec(LoopMode::Array, 10, &[]),
        &input(Some(vec![]), &[]),
    )
    .expect("begins");
    let out = finished(m.current());
    assert_eq!(out.get("iterations"), Some(&Value::Int(0)));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let spec = loop_spec(LoopMode::Array, 2, &[]);
    let too_many = input(Some(vec![Value::Null; 3]), &[]);
    let not_array = Value::Object([("items", Value::Int(1))].into());
    for bad in [too_many, not_array, Value::Object(Map::new())] {
        assert!(
            matches!(
                LoopMachine::begin(id("l"), spec.clone(), &bad),
                Err(NodeError::InvalidInput { .. })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn condition_mode_stops_when_until_holds_and_fails_past_max_iterations() {
    let spec = loop_spec(LoopMode::Condition, 5, &["n"]);
    let mut m = LoopMachine::begin(id("l"), spec.clone(), &input(None, &[("n", Value::Int(0))]))
        .expect("begins");
    let mut step = m.current();
    let mut ran = 0;
    while let Some(i) = start_index(&step) {
        ran += 1;
        let frame: Map = [("n", Value::from(i + 1))].into_iter().collect();
        step = m.iteration_done(end(i, frame, Some(until_index_at_least(i, 2))));
    }
    let out = finished(step);
    assert_eq!(ran, 3);
    assert_eq!(
        out.get("variables"),
        Some(&Value::Object([("n", Value::Int(3))].into()))
    );

    let mut m = LoopMachine::begin(id("l"), spec, &input(None, &[])).expect("begins");
    let mut step = m.current();
    let mut ran = 0;
    while let Some(i) = start_index(&step) {
        ran += 1;
        step = m.iteration_done(end(i, Map::new(), Some(until_index_at_least(i, 99))));
    }
    assert_eq!(ran, 5, "max_iterations is always enforced");
    assert!(
        matches!(
            step,
            LoopStep::Fail {
                iteration: None,
                ..
            }
        ),
        "{step:?}"
    );
}

#[test]
fn an_output_or_until_that_does_not_resolve_fails_naming_the_iteration() {
    let spec = loop_spec(LoopMode::Condition, 5, &[]);
    let mut m = LoopMachine::begin(id("l"), spec.clone(), &input(None, &[])).expect("begins");
    let bad = ResolveError {
        reference: "{{x.y}}".into(),
        reason: "no".into(),
    };
    let mut e = end(0, Map::new(), None);
    e.output = Err(bad.clone());
    assert!(matches!(
        m.iteration_done(e),
        LoopStep::Fail {
            iteration: Some(0),
            error: NodeError::Resolve(_)
        }
    ));
    let mut m = LoopMachine::begin(id("l"), spec, &input(None, &[])).expect("begins");
    let mut e = end(0, Map::new(), None);
    e.until = Some(Err(bad));
    assert!(matches!(
        m.iteration_done(e),
        LoopStep::Fail {
            iteration: Some(0),
            ..
        }
    ));
}

#[test]
fn assignments_keep_the_last_value_of_each_variable() {
    let mut m = LoopMachine::begin(
        id("l"),
        loop_spec(LoopMode::Array, 100, &[]),
        &input(Some(vec![Value::Null; 50]), &[]),
    )
    .expect("begins");
    let mut step = m.current();
    while let Some(i) = start_index(&step) {
        step = m.iteration_done(end(i, Map::new(), None));
    }
    match step {
        LoopStep::Finish(out) => {
            assert_eq!(out.variables, vec![("total".to_owned(), Value::Int(49))]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn restore_refuses_progress_that_does_not_add_up() {
    let spec = loop_spec(LoopMode::Array, 10, &[]);
    let mut m = LoopMachine::begin(
        id("l"),
        spec.clone(),
        &input(Some(vec![Value::Null; 3]), &[]),
    )
    .expect("begins");
    let _ = m.current();
    let _ = m.iteration_done(end(0, Map::new(), None));
    let good = m.progress();
    assert!(LoopMachine::restore(id("l"), spec.clone(), good.clone()).is_ok());

    let mut bad = good.clone();
    bad.iteration = 2;
    assert!(
        LoopMachine::restore(id("l"), spec.clone(), bad).is_err(),
        "count"
    );
    let mut bad = good.clone();
    bad.iteration = 7;
    bad.history = (0..7).map(Value::from).collect();
    bad.details = (0..7)
        .map(|index| IterationDetail {
            index,
            nodes: vec![],
        })
        .collect();
    assert!(
        LoopMachine::restore(id("l"), spec.clone(), bad).is_err(),
        "past the items"
    );
    let mut bad = good.clone();
    bad.items = None;
    assert!(
        LoopMachine::restore(id("l"), spec.clone(), bad).is_err(),
        "items"
    );
    let mut bad = good;
    bad.iteration = 11;
    bad.history = (0..11).map(Value::from).collect();
    bad.details = (0..11)
        .map(|index| IterationDetail {
            index,
            nodes: vec![],
        })
        .collect();
    bad.items = Some(Arc::from(vec![Value::Null; 11]));
    assert!(
        LoopMachine::restore(id("l"), spec, bad).is_err(),
        "past max_iterations"
    );
}

proptest! {
    /// Stopping after any iteration and restoring from the saved progress gives exactly the
    /// run that going on would have given.
    #[test]
    fn restoring_anywhere_equals_going_on(n in 1usize..40, cut in 0usize..40) {
        let spec = loop_spec(LoopMode::Array, 100, &["acc"]);
        let items: Vec<Value> = (0..n).map(Value::from).collect();
        let run = |m: &mut LoopMachine, from: LoopStep| -> LoopStep {
            let mut step = from;
            while let Some(i) = start_index(&step) {
                let frame: Map = [("acc", Value::from(i * 2))].into_iter().collect();
                step = m.iteration_done(end(i, frame, None));
            }
            step
        };
        let begin = || {
            LoopMachine::begin(id("l"), spec.clone(), &input(Some(items.clone()), &[]))
                .expect("begins")
        };
        let mut straight = begin();
        let first = straight.current();
        let expected = run(&mut straight, first);

        let mut first_half = begin();
        let mut step = first_half.current();
        // Cut before the last iteration ends (the loop's end hands its history over).
        for _ in 0..cut % n {
            if let Some(i) = start_index(&step) {
                let frame: Map = [("acc", Value::from(i * 2))].into_iter().collect();
                step = first_half.iteration_done(end(i, frame, None));
            }
        }
        let mut restored =
            LoopMachine::restore(id("l"), spec.clone(), first_half.progress()).expect("restores");
        let resumed = restored.current();
        let got = run(&mut restored, resumed);
        prop_assert_eq!(got, expected);
    }
}
