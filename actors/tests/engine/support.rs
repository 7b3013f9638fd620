//! Shared helpers: runtimes, inputs, and host handlers that record what they saw.

use runvisor_actors::{Map, RunOutcome, Runtime, ThreadId, Value};

pub(crate) fn runtime() -> Runtime {
    Runtime::builder().build()
}

pub(crate) fn thread(id: &str) -> ThreadId {
    ThreadId::new(id).expect("valid thread id")
}

pub(crate) fn inputs<const N: usize>(pairs: [(&str, Value); N]) -> Map {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The `text` field of a node's output.
pub(crate) fn text(outcome: &RunOutcome, node: &str) -> String {
    match outcome.output(node).and_then(|o| o.get("text")) {
        Some(Value::String(s)) => s.clone(),
        other => panic!("node {node} has no text output ({other:?}); outcome: {outcome:#?}"),
    }
}
