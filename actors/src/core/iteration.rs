//! A loop's progress and its next step: the pure machine behind a `loop` node.
//!
//! The body actor runs each iteration's graph and hands the machine what the iteration ended
//! with ([`IterationEnd`]: the resolved `output` and `until`, the loop variables as the
//! iteration left them, the body nodes that ran, assignments to variables the loop does not
//! own). The machine answers with the next [`LoopStep`]: start the next iteration with its frame,
//! finish with the loop's output, or fail naming the iteration.
//!
//! Cost per iteration is constant: the history, the details and the items are persistent
//! vectors, so saving progress ([`LoopMachine::progress`]) copies nothing.

use std::sync::Arc;

use imbl::Vector;
use serde::{Deserialize, Serialize};

use super::assign::Assignments;
use crate::model::{Map, NodeError, NodeId, NodeOutput, ResolveError, Value};
use crate::workflow::{LoopMode, LoopSpec, case_matches};

/// The body nodes that ran in one iteration, in completion order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationDetail {
    /// The iteration (from 0).
    pub index: u32,
    /// The body nodes, in completion order (nodes completed before a pause included).
    pub nodes: Vec<NodeId>,
}

/// How an iteration ended, as the body actor saw it.
#[derive(Debug)]
pub(crate) struct IterationEnd {
    /// The iteration's `output` (or its sink nodes' outputs), resolved in its scope.
    pub(crate) output: Result<Value, ResolveError>,
    /// The `until` condition, resolved in the iteration's scope (condition mode only).
    pub(crate) until: Option<Result<Value, ResolveError>>,
    /// The iteration's frame object at its end (loop variables as it left them).
    pub(crate) frame: Map,
    /// The body nodes that ran, in completion order.
    pub(crate) nodes: Vec<NodeId>,
    /// Assignments to variables the loop does not own, in order.
    pub(crate) assigned: Vec<(String, Value)>,
}

/// What the loop does next.
#[derive(Debug, PartialEq)]
pub(crate) enum LoopStep {
    /// Start iteration `index` with this frame object (`index`, `item`, loop variables).
    Start {
        /// The iteration.
        index: u32,
        /// Its frame object.
        frame: Map,
    },
    /// The loop is done: its output, with the assignments it hands upward.
    Finish(NodeOutput),
    /// The loop failed; `iteration` names the iteration it failed in, if any.
    Fail {
        /// The iteration, when the failure is one iteration's.
        iteration: Option<u32>,
        /// What failed.
        error: NodeError,
    },
}

/// What a loop has done so far: the saved part of a loop's state. Cloning it is cheap.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoopProgress {
    /// The current iteration (from 0): the number of finished iterations.
    pub(crate) iteration: u32,
    /// The loop variables as the finished iterations left them.
    pub(crate) vars: Map,
    /// The `output` of each finished iteration.
    pub(crate) history: Vector<Value>,
    /// The body nodes that ran in each finished iteration.
    pub(crate) details: Vector<IterationDetail>,
    /// The items, in array mode.
    pub(crate) items: Option<Arc<[Value]>>,
    /// Assignments to variables the loop does not own (the last value of each, in order).
    pub(crate) assigned: Vec<(String, Value)>,
}

/// A loop's state machine.
pub(crate) struct LoopMachine {
    node: NodeId,
    spec: Arc<LoopSpec>,
    iteration: u32,
    vars: Map,
    history: Vector<Value>,
    details: Vector<IterationDetail>,
    items: Option<Arc<[Value]>>,
    assigned: Assignments,
}

impl LoopMachine {
    /// A loop about to run, from its node's resolved input (`items`, `variables`).
    pub(crate) fn begin(
        node: NodeId,
        spec: Arc<LoopSpec>,
        input: &Value,
    ) -> Result<Self, NodeError> {
        let vars = match input.get("variables") {
            Some(Value::Object(vars)) => vars.clone(),
            _ => Map::new(),
        };
        let items = match spec.mode {
            LoopMode::Condition => None,
            LoopMode::Array => {
                let items = items_of(input)?;
                if items.len() > spec.max_iterations as usize {
                    return Err(NodeError::invalid_input(
                        "items",
                        format!(
                            "loop `{node}` has {} items, more than its max_iterations ({})",
                            items.len(),
                            spec.max_iterations
                        ),
                    ));
                }
                Some(Arc::from(items))
            }
        };
        Ok(Self {
            node,
            spec,
            iteration: 0,
            vars,
            history: Vector::new(),
            details: Vector::new(),
            items,
            assigned: Assignments::default(),
        })
    }

    /// A loop continued from saved progress. Every count is checked against the others.
    pub(crate) fn restore(
        node: NodeId,
        spec: Arc<LoopSpec>,
        saved: LoopProgress,
    ) -> Result<Self, String> {
        let done = saved.iteration as usize;
        if saved.history.len() != done || saved.details.len() != done {
            return Err(format!(
                "loop `{node}`: {done} finished iterations, but {} outputs and {} details",
                saved.history.len(),
                saved.details.len()
            ));
        }
        if saved
            .details
            .iter()
            .enumerate()
            .any(|(i, d)| d.index as usize != i)
        {
            return Err(format!("loop `{node}`: iteration details are out of order"));
        }
        match (&saved.items, spec.mode) {
            (Some(items), LoopMode::Array) if done > items.len() => {
                return Err(format!(
                    "loop `{node}`: iteration {done} of {} items",
                    items.len()
                ));
            }
            (None, LoopMode::Array) => {
                return Err(format!(
                    "loop `{node}`: an array loop saved without its items"
                ));
            }
            (Some(_), LoopMode::Condition) => {
                return Err(format!("loop `{node}`: a condition loop saved with items"));
            }
            _ => {}
        }
        if saved.iteration > spec.max_iterations {
            return Err(format!(
                "loop `{node}`: iteration {} is past max_iterations ({})",
                saved.iteration, spec.max_iterations
            ));
        }
        Ok(Self {
            node,
            spec,
            iteration: saved.iteration,
            vars: saved.vars,
            history: saved.history,
            details: saved.details,
            items: saved.items,
            assigned: Assignments::from(saved.assigned),
        })
    }

    /// The iteration to run now, or the loop's end when no iteration is left (an array loop
    /// over no items, or restored after its last item).
    pub(crate) fn current(&mut self) -> LoopStep {
        if let Some(items) = &self.items
            && self.iteration as usize >= items.len()
        {
            return LoopStep::Finish(self.finish());
        }
        LoopStep::Start {
            index: self.iteration,
            frame: self.frame(),
        }
    }

    /// The current iteration ended: records it and says what comes next.
    pub(crate) fn iteration_done(&mut self, end: IterationEnd) -> LoopStep {
        let index = self.iteration;
        for var in &self.spec.vars {
            if let Some(v) = end.frame.get(var) {
                self.vars.insert(var.clone(), v.clone());
            }
        }
        self.assigned.extend(end.assigned);
        self.details.push_back(IterationDetail {
            index,
            nodes: end.nodes,
        });
        match end.output {
            Ok(entry) => {
                // Kept and saved: it must not nest past the limit.
                if let Err(e) = entry.check_depth() {
                    entry.dismantle();
                    return LoopStep::Fail {
                        iteration: Some(index),
                        error: NodeError::too_deep("the iteration's output", e),
                    };
                }
                self.history.push_back(entry);
            }
            Err(e) => {
                return LoopStep::Fail {
                    iteration: Some(index),
                    error: NodeError::Resolve(e),
                };
            }
        }
        let done = match end.until {
            None => false,
            Some(Ok(condition)) => match case_matches(&condition, 0) {
                Ok(hit) => hit,
                Err(error) => {
                    return LoopStep::Fail {
                        iteration: Some(index),
                        error,
                    };
                }
            },
            Some(Err(e)) => {
                return LoopStep::Fail {
                    iteration: Some(index),
                    error: NodeError::Resolve(e),
                };
            }
        };
        self.iteration += 1;
        let out_of_items = self
            .items
            .as_ref()
            .is_some_and(|items| self.iteration as usize >= items.len());
        if done || out_of_items {
            return LoopStep::Finish(self.finish());
        }
        if self.spec.mode == LoopMode::Condition && self.iteration >= self.spec.max_iterations {
            return LoopStep::Fail {
                iteration: None,
                error: NodeError::Failed(format!(
                    "loop `{}` reached max_iterations ({}) before its `until` condition held",
                    self.node, self.spec.max_iterations
                )),
            };
        }
        LoopStep::Start {
            index: self.iteration,
            frame: self.frame(),
        }
    }

    /// What the loop has done so far (cheap: persistent vectors are shared, not copied).
    pub(crate) fn progress(&self) -> LoopProgress {
        LoopProgress {
            iteration: self.iteration,
            vars: self.vars.clone(),
            history: self.history.clone(),
            details: self.details.clone(),
            items: self.items.clone(),
            assigned: self.assigned.to_vec(),
        }
    }

    /// Assignments to variables the loop does not own, made by finished iterations.
    pub(crate) fn assigned(&self) -> &[(String, Value)] {
        self.assigned.as_slice()
    }

    /// The declared loop variables.
    pub(crate) fn declared(&self) -> &[String] {
        &self.spec.vars
    }

    /// The current iteration's frame object: loop variables, `index` and `item`.
    fn frame(&self) -> Map {
        let item = self
            .items
            .as_ref()
            .and_then(|items| items.get(self.iteration as usize).cloned())
            .unwrap_or(Value::Null);
        let mut frame = self.vars.clone();
        frame.insert("index".into(), Value::from(self.iteration));
        frame.insert("item".into(), item);
        frame
    }

    /// The loop's output: `history`, `variables`, `iterations`, `details`.
    fn finish(&mut self) -> NodeOutput {
        let mut out = Map::new();
        out.insert(
            "history".into(),
            Value::Array(std::mem::take(&mut self.history).into_iter().collect()),
        );
        out.insert("variables".into(), Value::Object(self.vars.clone()));
        out.insert("iterations".into(), Value::from(self.details.len()));
        out.insert(
            "details".into(),
            Value::Array(
                std::mem::take(&mut self.details)
                    .into_iter()
                    .map(|d| {
                        let mut m = Map::new();
                        m.insert("index".into(), Value::from(d.index));
                        m.insert(
                            "nodes".into(),
                            Value::Array(d.nodes.iter().map(|n| Value::from(n.as_str())).collect()),
                        );
                        Value::Object(m)
                    })
                    .collect(),
            ),
        );
        let mut output = NodeOutput::new(Value::Object(out));
        output.variables = std::mem::take(&mut self.assigned).into_vec();
        output
    }
}

/// The `items` input of a loop or parallel node.
pub(crate) fn items_of(input: &Value) -> Result<Vec<Value>, NodeError> {
    match input.get("items") {
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(other) => Err(NodeError::invalid_input(
            "items",
            format!("expected an array, found {}", other.type_name()),
        )),
        None => Err(NodeError::invalid_input("items", "is required")),
    }
}

#[cfg(test)]
mod tests;
