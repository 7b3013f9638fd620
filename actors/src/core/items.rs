//! A parallel's progress and its next step: the pure machine behind a `parallel` node.
//!
//! The machine knows every item's state (pending, running, finished, failed), starts items up
//! to `max_concurrency` (items saved in progress first, then new ones in input order), keeps
//! results by input index and failures by index, and says when the node is done or has failed.
//! The body actor runs each item's graph and reports back.
//!
//! Cost per item is constant: results and flags are persistent vectors and the finished count
//! is kept, so neither a step nor saving progress ([`ParallelMachine::progress`]) walks the
//! items.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use imbl::Vector;
use serde::{Deserialize, Serialize};

use super::iteration::items_of;
use crate::model::{Map, NodeError, NodeId, NodeOutput, Value};
use crate::workflow::ParallelSpec;

/// A parallel item that failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemError {
    /// The item's input index.
    pub index: u32,
    /// What failed.
    pub error: String,
}

/// What a parallel has done so far: the saved part of its state. Cloning it is cheap.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParallelProgress {
    /// The items.
    pub(crate) items: Arc<[Value]>,
    /// The output of each finished item, by input index.
    pub(crate) results: Vector<Option<Value>>,
    /// Whether each item has finished (succeeded or failed).
    pub(crate) done: Vector<bool>,
    /// The failed items, by index.
    pub(crate) errors: Vector<ItemError>,
    /// Assignments each finished item made to variables the node does not own.
    pub(crate) assigned: Vector<(u32, Vec<(String, Value)>)>,
}

/// What the parallel does after an item's end.
#[derive(Debug, PartialEq)]
pub(crate) enum ItemStep {
    /// Carry on: start what [`ParallelMachine::starts`] gives, finish when
    /// [`ParallelMachine::is_finished`].
    Continue,
    /// The node fails (`fail_fast`): the item and its error.
    Fail {
        /// The item.
        index: u32,
        /// Its error.
        error: NodeError,
    },
}

/// A parallel's state machine.
pub(crate) struct ParallelMachine {
    spec: Arc<ParallelSpec>,
    items: Arc<[Value]>,
    results: Vector<Option<Value>>,
    done: Vector<bool>,
    finished: usize,
    errors: Vector<ItemError>,
    assigned: Vector<(u32, Vec<(String, Value)>)>,
    running: BTreeSet<u32>,
    /// Items saved in progress, continued before new ones start.
    resume: VecDeque<u32>,
    /// The next item never started.
    next: u32,
}

impl ParallelMachine {
    /// A parallel about to run, from its node's resolved input (`items`).
    pub(crate) fn begin(spec: Arc<ParallelSpec>, input: &Value) -> Result<Self, NodeError> {
        let items: Arc<[Value]> = Arc::from(items_of(input)?);
        if u32::try_from(items.len()).is_err() {
            return Err(NodeError::invalid_input(
                "items",
                format!("{} items; at most {} are supported", items.len(), u32::MAX),
            ));
        }
        let n = items.len();
        Ok(Self {
            spec,
            items,
            results: std::iter::repeat_n(None, n).collect(),
            done: std::iter::repeat_n(false, n).collect(),
            finished: 0,
            errors: Vector::new(),
            assigned: Vector::new(),
            running: BTreeSet::new(),
            resume: VecDeque::new(),
            next: 0,
        })
    }

    /// A parallel continued from saved progress: `in_progress` are the items that were running
    /// (they continue first). Failed items stay failed unless `retry_failed`, which makes them
    /// pending again. Every count and index is checked.
    pub(crate) fn restore(
        node: &NodeId,
        spec: Arc<ParallelSpec>,
        saved: ParallelProgress,
        in_progress: &[u32],
        retry_failed: bool,
    ) -> Result<Self, String> {
        let n = saved.items.len();
        if saved.results.len() != n || saved.done.len() != n {
            return Err(format!(
                "parallel `{node}`: {n} items, but {} results and {} flags",
                saved.results.len(),
                saved.done.len()
            ));
        }
        let in_range = |i: u32| (i as usize) < n;
        let mut done = saved.done;
        let mut results = saved.results;
        let mut errors = saved.errors;
        let mut assigned = saved.assigned;
        for e in &errors {
            if !in_range(e.index) || !done[e.index as usize] {
                return Err(format!(
                    "parallel `{node}`: error recorded for item {} that is not a finished item",
                    e.index
                ));
            }
        }
        for (i, _) in &assigned {
            if !in_range(*i) {
                return Err(format!(
                    "parallel `{node}`: assignments recorded for item {i} of {n}"
                ));
            }
        }
        let mut resume = VecDeque::new();
        for &i in in_progress {
            if !in_range(i) || done[i as usize] || resume.contains(&i) {
                return Err(format!(
                    "parallel `{node}`: item {i} saved in progress is not a pending item"
                ));
            }
            resume.push_back(i);
        }
        if retry_failed && !errors.is_empty() {
            let failed: BTreeSet<u32> = errors.iter().map(|e| e.index).collect();
            for &i in &failed {
                done.set(i as usize, false);
                results.set(i as usize, None);
            }
            errors = Vector::new();
            assigned.retain(|(i, _)| !failed.contains(i));
        }
        let finished = done.iter().filter(|d| **d).count();
        Ok(Self {
            spec,
            items: saved.items,
            results,
            done,
            finished,
            errors,
            assigned,
            running: BTreeSet::new(),
            resume,
            next: 0,
        })
    }

    /// The items to start now, up to the concurrency bound: items saved in progress first,
    /// then pending items in input order. They count as running from now.
    pub(crate) fn starts(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        while self.running.len() < self.spec.max_concurrency {
            let next = match self.resume.pop_front() {
                Some(i) => i,
                None => match self.next_pending() {
                    Some(i) => i,
                    None => break,
                },
            };
            self.running.insert(next);
            out.push(next);
        }
        out
    }

    fn next_pending(&mut self) -> Option<u32> {
        while (self.next as usize) < self.items.len() {
            let i = self.next;
            self.next += 1;
            if !self.done[i as usize] && !self.running.contains(&i) && !self.resume.contains(&i) {
                return Some(i);
            }
        }
        None
    }

    /// The item at `index`.
    pub(crate) fn item(&self, index: u32) -> Value {
        self.items.get(index as usize).cloned().unwrap_or_default()
    }

    /// An item's graph finished; `output` is its resolved `output` (or its sinks' outputs).
    pub(crate) fn item_finished(
        &mut self,
        index: u32,
        output: Result<Value, crate::model::ResolveError>,
        assigned: Vec<(String, Value)>,
    ) -> ItemStep {
        if !self.running.remove(&index) {
            return ItemStep::Continue;
        }
        let output = output.map_err(NodeError::Resolve).and_then(|v| {
            // Kept and saved: it must not nest past the limit.
            match v.check_depth() {
                Ok(()) => Ok(v),
                Err(e) => {
                    v.dismantle();
                    Err(NodeError::too_deep("the item's output", e))
                }
            }
        });
        match output {
            Ok(v) => {
                self.results.set(index as usize, Some(v));
                self.assigned.push_back((index, assigned));
                self.mark_done(index);
                ItemStep::Continue
            }
            Err(error) if self.spec.fail_fast => {
                self.record_failure(index, error.to_string(), assigned);
                ItemStep::Fail { index, error }
            }
            Err(e) => {
                self.record_failure(index, e.to_string(), assigned);
                ItemStep::Continue
            }
        }
    }

    /// A node of an item failed: the item is failed (kept as failed in saved progress). With
    /// `fail_fast` the node fails; otherwise the error is collected and the others go on.
    pub(crate) fn item_failed(
        &mut self,
        index: u32,
        error: String,
        assigned: Vec<(String, Value)>,
    ) -> ItemStep {
        if !self.running.remove(&index) {
            return ItemStep::Continue;
        }
        self.record_failure(index, error.clone(), assigned);
        if self.spec.fail_fast {
            ItemStep::Fail {
                index,
                error: NodeError::Failed(error),
            }
        } else {
            ItemStep::Continue
        }
    }

    fn record_failure(&mut self, index: u32, error: String, assigned: Vec<(String, Value)>) {
        self.errors.push_back(ItemError { index, error });
        self.assigned.push_back((index, assigned));
        self.mark_done(index);
    }

    fn mark_done(&mut self, index: u32) {
        if let Some(false) = self.done.get(index as usize).copied() {
            self.done.set(index as usize, true);
            self.finished += 1;
        }
    }

    /// Whether every item has finished and none runs.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished == self.items.len() && self.running.is_empty()
    }

    /// The first failed item, by index.
    pub(crate) fn first_error(&self) -> Option<&ItemError> {
        self.errors.iter().min_by_key(|e| e.index)
    }

    /// What the parallel has done so far (cheap: persistent vectors are shared).
    pub(crate) fn progress(&self) -> ParallelProgress {
        ParallelProgress {
            items: self.items.clone(),
            results: self.results.clone(),
            done: self.done.clone(),
            errors: self.errors.clone(),
            assigned: self.assigned.clone(),
        }
    }

    /// The node's output once every item finished: `results` in input order (`null` for failed
    /// items), `errors` by index, `count`; the items' assignments in input order.
    pub(crate) fn finish(&mut self) -> NodeOutput {
        let mut assigned: Vec<(u32, Vec<(String, Value)>)> =
            std::mem::take(&mut self.assigned).into_iter().collect();
        assigned.sort_by_key(|(i, _)| *i);
        let mut errors: Vec<ItemError> = std::mem::take(&mut self.errors).into_iter().collect();
        errors.sort_by_key(|e| e.index);
        let mut out = Map::new();
        out.insert(
            "results".into(),
            Value::Array(
                std::mem::take(&mut self.results)
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect(),
            ),
        );
        out.insert(
            "errors".into(),
            Value::Array(
                errors
                    .into_iter()
                    .map(|e| {
                        let mut m = Map::new();
                        m.insert("index".into(), Value::from(e.index));
                        m.insert("error".into(), Value::String(e.error));
                        Value::Object(m)
                    })
                    .collect(),
            ),
        );
        out.insert("count".into(), Value::from(self.items.len()));
        let mut output = NodeOutput::new(Value::Object(out));
        output.variables = assigned.into_iter().flat_map(|(_, list)| list).collect();
        output
    }
}

#[cfg(test)]
mod tests;
