//! Specs for the machines' tests: a loop or a parallel over an empty body (the machines never
//! look at the body; the actors run it).

use std::collections::HashMap;
use std::sync::Arc;

use crate::workflow::{Graph, GraphPlan, LoopMode, LoopSpec, ParallelSpec};

fn empty_body() -> Arc<GraphPlan> {
    let shape = match Graph::new(1, 0, Vec::new()) {
        Ok(shape) => shape,
        Err(e) => panic!("a one-node graph: {e}"),
    };
    Arc::new(GraphPlan {
        nodes: Vec::new(),
        index: HashMap::new(),
        shape: Arc::new(shape),
    })
}

pub(crate) fn loop_spec(mode: LoopMode, max_iterations: u32, vars: &[&str]) -> Arc<LoopSpec> {
    Arc::new(LoopSpec {
        mode,
        max_iterations,
        vars: vars.iter().map(|v| (*v).to_owned()).collect(),
        until: None,
        output: None,
        body: empty_body(),
    })
}

pub(crate) fn parallel_spec(max_concurrency: usize, fail_fast: bool) -> Arc<ParallelSpec> {
    Arc::new(ParallelSpec {
        max_concurrency,
        fail_fast,
        output: None,
        body: empty_body(),
    })
}
