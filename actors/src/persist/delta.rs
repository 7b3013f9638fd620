//! Deltas: what one checkpoint changed from the one it builds on.
//!
//! A thread's checkpoints are whole snapshots (bases) and deltas. A delta names its `parent`
//! (the checkpoint it applies to) and its chain's `base` (the whole snapshot the chain starts
//! from), and holds only what changed: the scalars of the state (sequence, status, ...), the
//! variables that changed, the completed nodes appended, the frontier, each loop's and
//! parallel's frame as a delta of its own (iterations and results appended, items set, the
//! current iteration's or items' progress as nested graph deltas), the messages appended.
//! A delta's parent is usually the checkpoint its run wrote just before it; a merged delta's
//! is an older one of the same chain (the chain's last merge point), and it holds everything
//! that changed since, so the deltas after it do not make a restore longer. Restoring a delta
//! reads its parents back to the base (only those: [`CheckpointStore::chain`]) and applies
//! them in order ([`materialize`]).
//!
//! Envelope: the snapshot envelope (see [`snapshot`](super::snapshot)) with the magic bytes
//! `RVDL` and its own schema version, [`DELTA_SCHEMA_VERSION`]: 1. Checksummed, bounded and
//! checked for nesting like a snapshot. Every problem is a [`SnapshotError`]; one in a
//! checkpoint the asked one builds on names that checkpoint
//! ([`SnapshotError::InChain`], [`SnapshotError::MissingLink`]).

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use super::ports::DeltaLink;
use super::ports::{CheckpointStore, StoredCheckpoint};
pub use super::snapshot::DELTA_MAGIC;
use super::snapshot::{
    CompletedNode, FrameState, GraphState, ItemError, ItemState, IterationDetail, LoopState,
    ParallelState, SavedFrame, Snapshot, SnapshotError, Vector, decode_payload, nested_frame, open,
    plain_size, seal,
};
use crate::model::{
    CheckpointId, Interaction, Map, Message, NodeId, RunId, RunLabels, RunStatus, StopReason,
    StoreError, ThreadId, Value,
};

/// The [`SnapshotDelta`] schema version this build writes and reads.
pub const DELTA_SCHEMA_VERSION: u16 = 1;
/// The most deltas a restore applies on a base (a delta, its parent, and so on back to the
/// base): writers compact or merge by then (a `checkpoint_compact_every` above it counts as
/// this).
pub const MAX_CHAIN: usize = 4096;

/// The fields of a snapshot that rarely change within a run, sent whole when one does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// See [`Snapshot::run_id`].
    pub run_id: RunId,
    /// See [`Snapshot::parent_run_id`].
    pub parent_run_id: Option<RunId>,
    /// See [`Snapshot::thread`].
    pub thread: ThreadId,
    /// See [`Snapshot::workflow_hash`].
    pub workflow_hash: String,
    /// See [`Snapshot::workflow`].
    pub workflow: Option<Arc<str>>,
    /// See [`Snapshot::inputs`].
    pub inputs: Map,
    /// See [`Snapshot::labels`].
    pub labels: RunLabels,
}

/// A list that grew at its end, or was replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SeqDelta<T> {
    /// These entries were appended.
    Append(Vec<T>),
    /// The list is now this.
    Replace(Vec<T>),
}

/// An object's keys that changed: set to a value, or removed (`None`).
pub type MapDelta = Vec<(String, Option<Value>)>;

/// What changed in a graph's progress.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GraphDelta {
    /// Completed nodes appended (or the list replaced).
    pub completed: Option<SeqDelta<CompletedNode>>,
    /// The new frontier.
    pub frontier: Option<Vec<NodeId>>,
    /// The frames.
    pub frames: Option<FramesDelta>,
}

/// What changed in a graph's saved frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FramesDelta {
    /// Different frames: these.
    Replace(Vec<SavedFrame>),
    /// The same frames (same nodes, same kinds, in order): each one's delta.
    Each(Vec<FrameDelta>),
}

/// What changed in one frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FrameDelta {
    /// Nothing.
    Same,
    /// A loop's progress.
    Loop(#[serde(deserialize_with = "nested_frame")] Box<LoopDelta>),
    /// A parallel's progress.
    Parallel(#[serde(deserialize_with = "nested_frame")] Box<ParallelDelta>),
}

/// What changed in a loop's progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopDelta {
    /// The current iteration.
    pub iteration: u32,
    /// Loop variables that changed.
    pub vars: Option<MapDelta>,
    /// Finished iterations' outputs appended.
    pub history: Option<SeqDelta<Value>>,
    /// Finished iterations' details appended.
    pub details: Option<SeqDelta<IterationDetail>>,
    /// The items, when they changed.
    pub items: Option<Option<Arc<[Value]>>>,
    /// The current iteration's progress.
    pub body: GraphDelta,
    /// Assignments appended.
    pub assigned: Option<SeqDelta<(String, Value)>>,
}

/// What changed in a parallel's progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelDelta {
    /// The items, when they changed.
    pub items: Option<Arc<[Value]>>,
    /// Items whose result or state changed: `(index, done, result)`; or, when the number of
    /// items changed, every item.
    pub finished: Option<SeqDelta<(u32, bool, Option<Value>)>>,
    /// Errors appended.
    pub errors: Option<SeqDelta<ItemError>>,
    /// The items in progress, in order.
    pub in_progress: Option<Vec<ItemDelta>>,
    /// Assignments appended.
    pub assigned: Option<SeqDelta<ItemAssignments>>,
}

/// What one parallel item assigned to variables the node does not own, by item index.
pub type ItemAssignments = (u32, Vec<(String, Value)>);

/// An item in progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ItemDelta {
    /// In progress before too: what changed in its progress.
    Kept {
        /// The item's input index.
        index: u32,
        /// What changed.
        #[serde(deserialize_with = "nested_frame")]
        body: GraphDelta,
    },
    /// Newly in progress.
    New(ItemState),
}

/// What one checkpoint changed from its parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotDelta {
    /// The checkpoint this applies to.
    pub parent: CheckpointId,
    /// The whole snapshot the chain starts from.
    pub base: CheckpointId,
    /// See [`Snapshot::sequence`].
    pub sequence: u64,
    /// See [`Snapshot::created_at_ms`].
    pub created_at_ms: u64,
    /// See [`Snapshot::status`].
    pub status: RunStatus,
    /// See [`Snapshot::stop_reason`].
    pub stop_reason: Option<StopReason>,
    /// See [`Snapshot::history_len`].
    pub history_len: Option<u64>,
    /// The rarely changing fields, when one changed.
    pub header: Option<Box<Header>>,
    /// The query, when it changed.
    pub query: Option<Option<Value>>,
    /// Variables that changed.
    pub variables: Option<MapDelta>,
    /// The workflow graph's progress.
    pub graph: GraphDelta,
    /// The interactions, when they changed.
    pub interactions: Option<Vec<Interaction>>,
    /// Pending messages appended (or replaced).
    pub messages: Option<SeqDelta<Message>>,
}

impl SnapshotDelta {
    /// What `new` changed from `old`, as a delta of the checkpoint `link.parent`.
    pub fn between(old: &Snapshot, new: &Snapshot, link: DeltaLink) -> Self {
        let header_same = old.run_id == new.run_id
            && old.parent_run_id == new.parent_run_id
            && old.thread == new.thread
            && old.workflow_hash == new.workflow_hash
            && opt_arc_same(&old.workflow, &new.workflow)
            && old.inputs == new.inputs
            && old.labels == new.labels;
        Self {
            parent: link.parent,
            base: link.base,
            sequence: new.sequence,
            created_at_ms: new.created_at_ms,
            status: new.status,
            stop_reason: new.stop_reason,
            history_len: new.history_len,
            header: (!header_same).then(|| {
                Box::new(Header {
                    run_id: new.run_id,
                    parent_run_id: new.parent_run_id,
                    thread: new.thread.clone(),
                    workflow_hash: new.workflow_hash.clone(),
                    workflow: new.workflow.clone(),
                    inputs: new.inputs.clone(),
                    labels: new.labels.clone(),
                })
            }),
            query: (old.query != new.query).then(|| new.query.clone()),
            variables: map_delta(&old.variables, &new.variables),
            graph: graph_delta(&old.graph, &new.graph),
            interactions: (old.interactions != new.interactions).then(|| new.interactions.clone()),
            messages: seq_delta(&old.pending_messages, &new.pending_messages, |a, b| a == b),
        }
    }

    /// Applies the delta to its parent's state.
    pub fn apply(self, to: &mut Snapshot) -> Result<(), SnapshotError> {
        to.sequence = self.sequence;
        to.created_at_ms = self.created_at_ms;
        to.status = self.status;
        to.stop_reason = self.stop_reason;
        to.history_len = self.history_len;
        if let Some(header) = self.header {
            let h = *header;
            to.run_id = h.run_id;
            to.parent_run_id = h.parent_run_id;
            to.thread = h.thread;
            to.workflow_hash = h.workflow_hash;
            to.workflow = h.workflow;
            to.inputs = h.inputs;
            to.labels = h.labels;
        }
        if let Some(query) = self.query {
            to.query = query;
        }
        if let Some(vars) = self.variables {
            apply_map(&mut to.variables, vars);
        }
        apply_graph(&mut to.graph, self.graph)?;
        if let Some(interactions) = self.interactions {
            to.interactions = interactions;
        }
        if let Some(messages) = self.messages {
            apply_vector(&mut to.pending_messages, messages);
        }
        Ok(())
    }

    /// Encodes the delta in its envelope.
    pub fn encode(&self) -> Result<Vec<u8>, SnapshotError> {
        seal(&DELTA_MAGIC, DELTA_SCHEMA_VERSION, self)
    }

    /// Decodes a delta from its envelope.
    pub fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let (_, payload) = open(bytes, &DELTA_MAGIC, DELTA_SCHEMA_VERSION)?;
        decode_payload::<Self>(&payload)
    }
}

fn opt_arc_same(a: &Option<Arc<str>>, b: &Option<Arc<str>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (None, None) => true,
        _ => false,
    }
}

fn completed_same(a: &CompletedNode, b: &CompletedNode) -> bool {
    a.node == b.node && a.route == b.route && (Arc::ptr_eq(&a.output, &b.output) || a == b)
}

/// Appended entries when `old` is a prefix of `new`; the whole list otherwise; `None` when
/// they are the same.
fn seq_delta<'a, T: Clone + 'a, L>(
    old: &'a L,
    new: &'a L,
    same: impl Fn(&T, &T) -> bool,
) -> Option<SeqDelta<T>>
where
    &'a L: IntoIterator<Item = &'a T>,
    <&'a L as IntoIterator>::IntoIter: ExactSizeIterator,
{
    let (old_iter, new_iter) = (old.into_iter(), new.into_iter());
    let (old_len, new_len) = (old_iter.len(), new_iter.len());
    let mut new_iter = new_iter;
    if new_len >= old_len {
        let prefix = old_iter.zip(new_iter.by_ref()).all(|(a, b)| same(a, b));
        if prefix {
            return (new_len > old_len).then(|| SeqDelta::Append(new_iter.cloned().collect()));
        }
    }
    Some(SeqDelta::Replace(new.into_iter().cloned().collect()))
}

fn apply_vec<T: Clone>(list: &mut Vec<T>, delta: SeqDelta<T>) {
    match delta {
        SeqDelta::Append(more) => list.extend(more),
        SeqDelta::Replace(all) => *list = all,
    }
}

fn apply_vector<T: Clone>(list: &mut Vector<T>, delta: SeqDelta<T>) {
    match delta {
        SeqDelta::Append(more) => list.extend(more),
        SeqDelta::Replace(all) => *list = all.into_iter().collect(),
    }
}

fn map_delta(old: &Map, new: &Map) -> Option<MapDelta> {
    let mut changes = Vec::new();
    let mut olds = old.iter().peekable();
    let mut news = new.iter().peekable();
    loop {
        match (olds.peek(), news.peek()) {
            (None, None) => break,
            (Some((k, _)), None) => {
                changes.push(((*k).clone(), None));
                olds.next();
            }
            (None, Some((k, v))) => {
                changes.push(((*k).clone(), Some((*v).clone())));
                news.next();
            }
            (Some((ko, vo)), Some((kn, vn))) => match ko.cmp(kn) {
                std::cmp::Ordering::Less => {
                    changes.push(((*ko).clone(), None));
                    olds.next();
                }
                std::cmp::Ordering::Greater => {
                    changes.push(((*kn).clone(), Some((*vn).clone())));
                    news.next();
                }
                std::cmp::Ordering::Equal => {
                    if vo != vn {
                        changes.push(((*kn).clone(), Some((*vn).clone())));
                    }
                    olds.next();
                    news.next();
                }
            },
        }
    }
    (!changes.is_empty()).then_some(changes)
}

fn apply_map(map: &mut Map, delta: MapDelta) {
    for (key, value) in delta {
        match value {
            Some(value) => {
                map.insert(key, value);
            }
            None => {
                map.remove(&key);
            }
        }
    }
}

/// Appended entries when `new` extends `old`, checked at the seam only: the lists given here
/// only ever grow within one execution of a graph (a run's, one loop iteration's, one
/// parallel item's), and a delta is always between two snapshots of the same run, with the
/// body of a loop whose iteration changed sent whole. Checking one entry keeps a step's cost
/// independent of the run's length.
fn grown<T: Clone>(
    old: &Vector<T>,
    new: &Vector<T>,
    same: impl Fn(&T, &T) -> bool,
) -> Option<SeqDelta<T>> {
    let (n, m) = (old.len(), new.len());
    let extends = m >= n
        && match n.checked_sub(1) {
            None => true,
            Some(last) => match (old.get(last), new.get(last)) {
                (Some(a), Some(b)) => same(a, b),
                _ => false,
            },
        };
    if !extends {
        return Some(SeqDelta::Replace(new.iter().cloned().collect()));
    }
    // A focus reads the appended tail in place: `Vector::skip` would copy the vector and
    // split it, cloning the chunk it splits (up to 64 entries) for an append of one.
    (m > n).then(|| SeqDelta::Append(new.focus().narrow(n..).into_iter().cloned().collect()))
}

/// A graph's progress sent whole.
fn whole_graph(new: &GraphState) -> GraphDelta {
    GraphDelta {
        completed: Some(SeqDelta::Replace(new.completed.iter().cloned().collect())),
        frontier: Some(new.frontier.clone()),
        frames: Some(FramesDelta::Replace(new.frames.clone())),
    }
}

fn graph_delta(old: &GraphState, new: &GraphState) -> GraphDelta {
    let same_frames = old.frames.len() == new.frames.len()
        && old.frames.iter().zip(&new.frames).all(|(a, b)| {
            a.node == b.node
                && matches!(
                    (&a.state, &b.state),
                    (FrameState::Loop(_), FrameState::Loop(_))
                        | (FrameState::Parallel(_), FrameState::Parallel(_))
                )
        });
    let frames = if same_frames {
        let each: Vec<FrameDelta> = old
            .frames
            .iter()
            .zip(&new.frames)
            .map(|(a, b)| frame_delta(&a.state, &b.state))
            .collect();
        (!each.iter().all(|d| *d == FrameDelta::Same)).then_some(FramesDelta::Each(each))
    } else {
        Some(FramesDelta::Replace(new.frames.clone()))
    };
    GraphDelta {
        completed: grown(&old.completed, &new.completed, completed_same),
        frontier: (old.frontier != new.frontier).then(|| new.frontier.clone()),
        frames,
    }
}

fn graph_is_same(delta: &GraphDelta) -> bool {
    delta.completed.is_none() && delta.frontier.is_none() && delta.frames.is_none()
}

fn frame_delta(old: &FrameState, new: &FrameState) -> FrameDelta {
    match (old, new) {
        (FrameState::Loop(a), FrameState::Loop(b)) => {
            let delta = LoopDelta {
                iteration: b.iteration,
                vars: map_delta(&a.vars, &b.vars),
                history: grown(&a.history, &b.history, |x, y| x == y),
                details: grown(&a.details, &b.details, |x, y| x == y),
                items: match (&a.items, &b.items) {
                    (Some(x), Some(y)) if Arc::ptr_eq(x, y) || x == y => None,
                    (None, None) => None,
                    _ => Some(b.items.clone()),
                },
                body: if a.iteration == b.iteration {
                    graph_delta(&a.body, &b.body)
                } else {
                    whole_graph(&b.body)
                },
                assigned: seq_delta(&a.assigned, &b.assigned, |x, y| x == y),
            };
            let same = a.iteration == b.iteration
                && delta.vars.is_none()
                && delta.history.is_none()
                && delta.details.is_none()
                && delta.items.is_none()
                && graph_is_same(&delta.body)
                && delta.assigned.is_none();
            if same {
                FrameDelta::Same
            } else {
                FrameDelta::Loop(Box::new(delta))
            }
        }
        (FrameState::Parallel(a), FrameState::Parallel(b)) => {
            let items =
                (!(Arc::ptr_eq(&a.items, &b.items) || a.items == b.items)).then(|| b.items.clone());
            // Every item that finishes (or fails) appends its entry to `assigned`, so what
            // was appended names the items whose result or state changed: a step costs what
            // those items hold, not the number of items.
            let assigned = grown(&a.assigned, &b.assigned, |x, y| x == y);
            let finished = if a.done.len() != b.done.len() || a.results.len() != b.results.len() {
                Some(SeqDelta::Replace(
                    b.done
                        .iter()
                        .zip(b.results.iter().chain(std::iter::repeat(&None)))
                        .enumerate()
                        .map(|(i, (d, r))| (u32::try_from(i).unwrap_or(u32::MAX), *d, r.clone()))
                        .collect(),
                ))
            } else {
                match &assigned {
                    None => None,
                    Some(SeqDelta::Append(more)) => {
                        let mut seen = std::collections::BTreeSet::new();
                        let changed: Vec<(u32, bool, Option<Value>)> = more
                            .iter()
                            .filter(|(index, _)| seen.insert(*index))
                            .filter_map(|(index, _)| {
                                let i = *index as usize;
                                Some((*index, *b.done.get(i)?, b.results.get(i)?.clone()))
                            })
                            .collect();
                        (!changed.is_empty()).then_some(SeqDelta::Append(changed))
                    }
                    // Not one run's progress: every item whose result or state changed.
                    Some(SeqDelta::Replace(_)) => {
                        let changed: Vec<(u32, bool, Option<Value>)> = a
                            .done
                            .iter()
                            .zip(&b.done)
                            .zip(a.results.iter().zip(&b.results))
                            .enumerate()
                            .filter(|(_, ((da, db), (ra, rb)))| da != db || ra != rb)
                            .map(|(i, ((_, db), (_, rb)))| {
                                (u32::try_from(i).unwrap_or(u32::MAX), *db, rb.clone())
                            })
                            .collect();
                        (!changed.is_empty()).then_some(SeqDelta::Append(changed))
                    }
                }
            };
            // Each item in progress as a delta of its own (never compared whole: an item's
            // progress holds its nested loops' and parallels' progress).
            let before: HashMap<u32, &ItemState> = a
                .in_progress
                .iter()
                .map(|item| (item.index, item))
                .collect();
            let items_now: Vec<ItemDelta> = b
                .in_progress
                .iter()
                .map(|item| match before.get(&item.index) {
                    Some(old) => ItemDelta::Kept {
                        index: item.index,
                        body: graph_delta(&old.body, &item.body),
                    },
                    None => ItemDelta::New(item.clone()),
                })
                .collect();
            let unchanged = a.in_progress.len() == b.in_progress.len()
                && a.in_progress.iter().zip(&items_now).all(|(old, now)| {
                    matches!(now, ItemDelta::Kept { index, body }
                        if *index == old.index && graph_is_same(body))
                });
            let in_progress = (!unchanged).then_some(items_now);
            let delta = ParallelDelta {
                items,
                finished,
                errors: grown(&a.errors, &b.errors, |x, y| x == y),
                in_progress,
                assigned,
            };
            let same = delta.items.is_none()
                && delta.finished.is_none()
                && delta.errors.is_none()
                && delta.in_progress.is_none()
                && delta.assigned.is_none();
            if same {
                FrameDelta::Same
            } else {
                FrameDelta::Parallel(Box::new(delta))
            }
        }
        // Unreachable from `graph_delta`, which replaces frames of another kind.
        _ => FrameDelta::Same,
    }
}

fn apply_graph(graph: &mut GraphState, delta: GraphDelta) -> Result<(), SnapshotError> {
    if let Some(completed) = delta.completed {
        apply_vector(&mut graph.completed, completed);
    }
    if let Some(frontier) = delta.frontier {
        graph.frontier = frontier;
    }
    match delta.frames {
        None => {}
        Some(FramesDelta::Replace(frames)) => graph.frames = frames,
        Some(FramesDelta::Each(each)) => {
            if each.len() != graph.frames.len() {
                return Err(SnapshotError::Mismatch(format!(
                    "{} frame deltas for {} frames",
                    each.len(),
                    graph.frames.len()
                )));
            }
            for (frame, delta) in graph.frames.iter_mut().zip(each) {
                apply_frame(frame, delta)?;
            }
        }
    }
    Ok(())
}

fn apply_frame(frame: &mut SavedFrame, delta: FrameDelta) -> Result<(), SnapshotError> {
    let node = &frame.node;
    match (&mut frame.state, delta) {
        (_, FrameDelta::Same) => Ok(()),
        (FrameState::Loop(state), FrameDelta::Loop(delta)) => apply_loop(state, *delta),
        (FrameState::Parallel(state), FrameDelta::Parallel(delta)) => apply_parallel(state, *delta),
        _ => Err(SnapshotError::Mismatch(format!(
            "the delta of node `{node}`'s frame is of another kind"
        ))),
    }
}

fn apply_loop(state: &mut LoopState, delta: LoopDelta) -> Result<(), SnapshotError> {
    state.iteration = delta.iteration;
    if let Some(vars) = delta.vars {
        apply_map(&mut state.vars, vars);
    }
    if let Some(history) = delta.history {
        apply_vector(&mut state.history, history);
    }
    if let Some(details) = delta.details {
        apply_vector(&mut state.details, details);
    }
    if let Some(items) = delta.items {
        state.items = items;
    }
    apply_graph(&mut state.body, delta.body)?;
    if let Some(assigned) = delta.assigned {
        apply_vec(&mut state.assigned, assigned);
    }
    Ok(())
}

fn apply_parallel(state: &mut ParallelState, delta: ParallelDelta) -> Result<(), SnapshotError> {
    if let Some(items) = delta.items {
        state.items = items;
    }
    match delta.finished {
        None => {}
        Some(SeqDelta::Append(changed)) => {
            for (index, done, result) in changed {
                let i = index as usize;
                if i >= state.done.len() || i >= state.results.len() {
                    return Err(SnapshotError::Mismatch(format!(
                        "item {index} of a parallel of {} items",
                        state.done.len()
                    )));
                }
                state.done.set(i, done);
                state.results.set(i, result);
            }
        }
        Some(SeqDelta::Replace(all)) => {
            state.done = all.iter().map(|(_, d, _)| *d).collect();
            state.results = all.into_iter().map(|(_, _, r)| r).collect();
        }
    }
    if let Some(errors) = delta.errors {
        apply_vector(&mut state.errors, errors);
    }
    if let Some(items) = delta.in_progress {
        let mut old = std::mem::take(&mut state.in_progress);
        for item in items {
            match item {
                ItemDelta::New(item) => state.in_progress.push(item),
                ItemDelta::Kept { index, body } => {
                    let at = old.iter().position(|o| o.index == index).ok_or_else(|| {
                        SnapshotError::Mismatch(format!("item {index} was not in progress"))
                    })?;
                    let mut item = old.swap_remove(at);
                    apply_graph(&mut item.body, body)?;
                    state.in_progress.push(item);
                }
            }
        }
    }
    if let Some(assigned) = delta.assigned {
        apply_vector(&mut state.assigned, assigned);
    }
    Ok(())
}

/// A stored checkpoint read back whole: a base as it is, a delta on top of the checkpoints it
/// builds on (read from `store`, back to its base, in one [`chain`](CheckpointStore::chain)
/// read). Errors name the checkpoint at fault: a
/// missing one ([`SnapshotError::MissingLink`]) or one that does not decode
/// ([`SnapshotError::InChain`] when it is not `stored` itself).
pub async fn materialize(
    store: &dyn CheckpointStore,
    thread: &ThreadId,
    stored: &StoredCheckpoint,
) -> Result<Snapshot, MaterializeError> {
    materialize_chain(store, thread, stored)
        .await
        .map(|(snapshot, _)| snapshot)
}

/// The chain a stored checkpoint ends: its base, how many deltas a restore of it applies on
/// the base (the checkpoint itself included: its parents back to the base), and their bytes.
/// A run that continues from the checkpoint continues its chain, compacting it by the same
/// measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainInfo {
    /// The chain's whole snapshot (the checkpoint itself when it is whole).
    pub base: CheckpointId,
    /// The checkpoint the chain ends with.
    pub last: CheckpointId,
    /// Deltas a restore of `last` applies on the base.
    pub deltas: u32,
    /// Their bytes of postcard (before any compression).
    pub delta_bytes: usize,
    /// The base's bytes of postcard (before any compression).
    pub base_bytes: usize,
}

/// [`materialize`], also telling the chain it read.
pub async fn materialize_chain(
    store: &dyn CheckpointStore,
    thread: &ThreadId,
    stored: &StoredCheckpoint,
) -> Result<(Snapshot, ChainInfo), MaterializeError> {
    let Some(link) = stored.link else {
        let snapshot = Snapshot::decode(&stored.bytes).map_err(MaterializeError::Snapshot)?;
        let chain = ChainInfo {
            base: stored.id,
            last: stored.id,
            deltas: 0,
            delta_bytes: 0,
            base_bytes: plain_size(&stored.bytes),
        };
        return Ok((snapshot, chain));
    };
    let mut delta_bytes = plain_size(&stored.bytes);
    let mut deltas = vec![(
        stored.id,
        decode_delta(stored.id, &stored.bytes, stored.id)?,
    )];
    // What the delta builds on is read at once, newest first, by the parents the links name
    // (a merged delta's parent is older than the checkpoint written before it). The first
    // link the store did not answer for is the one missing.
    let mut read = store
        .chain(thread, link.parent, MAX_CHAIN + 1)
        .await
        .map_err(MaterializeError::Store)?
        .into_iter();
    let mut next = link.parent;
    let base = loop {
        if deltas.len() > MAX_CHAIN {
            return Err(MaterializeError::Snapshot(SnapshotError::Mismatch(
                format!("a chain of more than {MAX_CHAIN} deltas"),
            )));
        }
        let parent = match read.next() {
            Some(parent) if parent.id == next => parent,
            Some(other) => {
                return Err(MaterializeError::Store(StoreError::Unavailable(format!(
                    "the store answered checkpoint {} for checkpoint {next} of thread {thread}",
                    other.id
                ))));
            }
            None => {
                return Err(MaterializeError::Snapshot(SnapshotError::MissingLink {
                    checkpoint: next,
                }));
            }
        };
        match parent.link {
            None => break parent,
            Some(link) => {
                delta_bytes += plain_size(&parent.bytes);
                deltas.push((
                    parent.id,
                    decode_delta(parent.id, &parent.bytes, stored.id)?,
                ));
                next = link.parent;
            }
        }
    };
    if base.id != link.base {
        return Err(MaterializeError::Snapshot(SnapshotError::Mismatch(
            format!(
                "the chain ends at checkpoint {}, not at its base {}",
                base.id, link.base
            ),
        )));
    }
    let mut snapshot = Snapshot::decode(&base.bytes).map_err(|error| {
        MaterializeError::Snapshot(SnapshotError::InChain {
            checkpoint: base.id,
            error: Box::new(error),
        })
    })?;
    let chain = ChainInfo {
        base: base.id,
        last: stored.id,
        deltas: u32::try_from(deltas.len()).unwrap_or(u32::MAX),
        delta_bytes,
        base_bytes: plain_size(&base.bytes),
    };
    let mut at = base.id;
    for (id, delta) in deltas.into_iter().rev() {
        if delta.parent != at {
            return Err(in_chain(
                id,
                stored.id,
                SnapshotError::Mismatch(format!(
                    "it builds on checkpoint {}, not {at}",
                    delta.parent
                )),
            ));
        }
        delta
            .apply(&mut snapshot)
            .map_err(|e| in_chain(id, stored.id, e))?;
        at = id;
    }
    Ok((snapshot, chain))
}

fn in_chain(id: CheckpointId, asked: CheckpointId, error: SnapshotError) -> MaterializeError {
    MaterializeError::Snapshot(if id == asked {
        error
    } else {
        SnapshotError::InChain {
            checkpoint: id,
            error: Box::new(error),
        }
    })
}

fn decode_delta(
    id: CheckpointId,
    bytes: &[u8],
    asked: CheckpointId,
) -> Result<SnapshotDelta, MaterializeError> {
    SnapshotDelta::decode(bytes).map_err(|e| in_chain(id, asked, e))
}

/// Why a stored checkpoint could not be read back whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MaterializeError {
    /// The store failed reading a checkpoint the delta builds on.
    #[error(transparent)]
    Store(StoreError),
    /// A checkpoint of the chain is missing or does not decode.
    #[error(transparent)]
    Snapshot(SnapshotError),
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::Route;

    fn node(i: u8) -> NodeId {
        NodeId::new(format!("n{i}")).expect("id")
    }

    fn start() -> Snapshot {
        Snapshot {
            run_id: RunId::new(),
            parent_run_id: None,
            thread: ThreadId::new("t").expect("id"),
            sequence: 1,
            created_at_ms: 1,
            status: RunStatus::Running,
            stop_reason: None,
            workflow_hash: "00".into(),
            workflow: None,
            inputs: Map::new(),
            query: None,
            variables: Map::new(),
            graph: GraphState::default(),
            interactions: Vec::new(),
            pending_messages: Vector::new(),
            labels: RunLabels::default(),
            history_len: Some(0),
        }
    }

    /// One change a run makes between two checkpoints.
    #[derive(Debug, Clone)]
    enum Op {
        Complete(u8, i64),
        Var(u8, Option<i64>),
        Frontier(Vec<u8>),
        Message(String),
        Status(bool),
        Truncate(usize),
        LoopFrame(u8),
        Iterate(i64),
        LoopBody(u8, i64),
        NestedLoop(u8, i64),
        ParallelFrame(u8),
        Finish(u8, i64),
        ItemStep(u8, u8, i64),
        DropFrames,
        Header(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..20, any::<i64>()).prop_map(|(n, v)| Op::Complete(n, v)),
            2 => (0u8..5, proptest::option::of(0i64..3)).prop_map(|(k, v)| Op::Var(k, v)),
            1 => proptest::collection::vec(0u8..20, 0..3).prop_map(Op::Frontier),
            1 => "[a-z]{0,5}".prop_map(Op::Message),
            1 => any::<bool>().prop_map(Op::Status),
            1 => (0usize..4).prop_map(Op::Truncate),
            1 => (0u8..3).prop_map(Op::LoopFrame),
            3 => (0i64..3).prop_map(Op::Iterate),
            3 => (0u8..20, 0i64..3).prop_map(|(n, v)| Op::LoopBody(n, v)),
            2 => (0u8..20, 0i64..3).prop_map(|(n, v)| Op::NestedLoop(n, v)),
            1 => (1u8..6).prop_map(Op::ParallelFrame),
            3 => (0u8..6, 0i64..3).prop_map(|(i, v)| Op::Finish(i, v)),
            3 => (0u8..6, 0u8..20, 0i64..3).prop_map(|(i, n, v)| Op::ItemStep(i, n, v)),
            1 => Just(Op::DropFrames),
            1 => (0u8..3).prop_map(Op::Header),
        ]
    }

    fn loop_state() -> LoopState {
        LoopState {
            iteration: 0,
            vars: Map::new(),
            history: Vector::new(),
            details: Vector::new(),
            items: None,
            body: GraphState::default(),
            assigned: Vec::new(),
        }
    }

    fn completed(n: u8, v: i64) -> CompletedNode {
        CompletedNode {
            node: node(n),
            route: Route::All,
            output: Arc::new(Value::Int(v)),
        }
    }

    fn apply_op(s: &mut Snapshot, op: &Op) {
        s.sequence += 1;
        s.created_at_ms += 1;
        match op.clone() {
            Op::Complete(n, v) => s.graph.completed.push_back(completed(n, v)),
            Op::Var(k, v) => {
                let key = format!("v{k}");
                match v {
                    Some(v) => {
                        s.variables.insert(key, Value::Int(v));
                    }
                    None => {
                        s.variables.remove(&key);
                    }
                }
            }
            Op::Frontier(nodes) => s.graph.frontier = nodes.into_iter().map(node).collect(),
            Op::Message(text) => s.pending_messages.push_back(Message::assistant(text)),
            Op::Status(running) => {
                s.status = if running {
                    RunStatus::Running
                } else {
                    RunStatus::Stopped
                }
            }
            Op::Truncate(n) => {
                let keep = s.graph.completed.len().saturating_sub(n);
                s.graph.completed.truncate(keep);
            }
            Op::LoopFrame(n) => s.graph.frames.push(SavedFrame {
                node: node(100 + n),
                state: FrameState::Loop(loop_state()),
            }),
            Op::Iterate(v) => {
                if let Some(FrameState::Loop(l)) = s.graph.frames.last_mut().map(|f| &mut f.state) {
                    l.history.push_back(Value::Int(v));
                    l.details.push_back(IterationDetail {
                        index: l.iteration,
                        nodes: l.body.completed.iter().map(|c| c.node.clone()).collect(),
                    });
                    l.iteration += 1;
                    l.body = GraphState::default();
                    l.vars
                        .insert("i".into(), Value::Int(i64::from(l.iteration)));
                }
            }
            Op::LoopBody(n, v) => {
                if let Some(FrameState::Loop(l)) = s.graph.frames.last_mut().map(|f| &mut f.state) {
                    l.body.completed.push_back(completed(n, v));
                    l.assigned.push(("x".into(), Value::Int(v)));
                }
            }
            Op::NestedLoop(n, v) => {
                if let Some(FrameState::Loop(l)) = s.graph.frames.last_mut().map(|f| &mut f.state) {
                    match l.body.frames.first_mut().map(|f| &mut f.state) {
                        Some(FrameState::Loop(inner)) => {
                            inner.history.push_back(Value::Int(v));
                            inner.body.completed.push_back(completed(n, v));
                        }
                        _ => l.body.frames.push(SavedFrame {
                            node: node(n),
                            state: FrameState::Loop(loop_state()),
                        }),
                    }
                }
            }
            Op::ParallelFrame(n) => {
                let items: Arc<[Value]> = (0..n).map(|i| Value::Int(i64::from(i))).collect();
                s.graph.frames.push(SavedFrame {
                    node: node(120 + n),
                    state: FrameState::Parallel(ParallelState {
                        items,
                        results: (0..n).map(|_| None).collect(),
                        done: (0..n).map(|_| false).collect(),
                        errors: Vector::new(),
                        in_progress: Vec::new(),
                        assigned: Vector::new(),
                    }),
                });
            }
            Op::Finish(i, v) => {
                if let Some(FrameState::Parallel(p)) =
                    s.graph.frames.last_mut().map(|f| &mut f.state)
                {
                    let i = usize::from(i) % p.done.len();
                    p.done.set(i, true);
                    p.results.set(i, Some(Value::Int(v)));
                    p.in_progress.retain(|item| item.index as usize != i);
                    if v == 0 {
                        p.errors.push_back(ItemError {
                            index: i as u32,
                            error: "failed".into(),
                        });
                    }
                    p.assigned
                        .push_back((i as u32, vec![("y".into(), Value::Int(v))]));
                }
            }
            Op::ItemStep(i, n, v) => {
                if let Some(FrameState::Parallel(p)) =
                    s.graph.frames.last_mut().map(|f| &mut f.state)
                {
                    let index = u32::from(i) % p.done.len() as u32;
                    match p.in_progress.iter_mut().find(|item| item.index == index) {
                        Some(item) => item.body.completed.push_back(completed(n, v)),
                        None => {
                            p.in_progress.push(ItemState {
                                index,
                                body: GraphState::default(),
                            });
                            p.in_progress.sort_by_key(|item| item.index);
                        }
                    }
                }
            }
            Op::DropFrames => s.graph.frames.clear(),
            Op::Header(k) => match k {
                0 => s.workflow = Some(Arc::from(format!("{{\"v\":{}}}", s.sequence))),
                1 => {
                    s.inputs.insert("in".into(), Value::Int(s.sequence as i64));
                }
                _ => s.query = Some(Value::from("q")),
            },
        }
    }

    proptest! {
        /// A base plus the deltas up to any checkpoint restores exactly that checkpoint's
        /// state, through the envelope.
        #[test]
        fn base_and_deltas_restore_every_checkpoint(ops in proptest::collection::vec(op(), 1..60)) {
            let base = start();
            let (base_id, mut parent) = (CheckpointId::new(), CheckpointId::new());
            let mut restored = Snapshot::decode(&base.encode().expect("encodes")).expect("decodes");
            let mut state = base;
            for op in &ops {
                let mut next = state.clone();
                apply_op(&mut next, op);
                let link = DeltaLink { base: base_id, parent };
                let bytes = SnapshotDelta::between(&state, &next, link).encode().expect("encodes");
                let delta = SnapshotDelta::decode(&bytes).expect("decodes");
                prop_assert_eq!(delta.parent, parent);
                delta.apply(&mut restored).expect("applies");
                prop_assert_eq!(&restored, &next);
                parent = CheckpointId::new();
                state = next;
            }
        }
    }

    /// The changes one run makes while its lists only grow within one execution of a graph
    /// (no graph runs a node twice: workflows are acyclic, and a loop's body starts over
    /// with each iteration), which merged deltas rely on, as coalesced ones do.
    fn growing_op() -> impl Strategy<Value = Op> {
        op().prop_filter("keeps lists growing", |op| {
            !matches!(
                op,
                Op::Truncate(_) | Op::DropFrames | Op::Finish(..) | Op::ItemStep(..)
            )
        })
    }

    proptest! {
        /// A merged delta, of any earlier checkpoint of the run, restores the later one
        /// exactly, through the envelope.
        #[test]
        fn a_delta_of_any_earlier_checkpoint_restores(
            ops in proptest::collection::vec(growing_op(), 1..40),
        ) {
            let mut states = vec![start()];
            for op in &ops {
                let mut next = states[states.len() - 1].clone();
                apply_op(&mut next, op);
                states.push(next);
            }
            let link = DeltaLink { base: CheckpointId::new(), parent: CheckpointId::new() };
            for (i, old) in states.iter().enumerate() {
                for new in &states[i + 1..] {
                    let bytes = SnapshotDelta::between(old, new, link).encode().expect("encodes");
                    let mut restored = old.clone();
                    SnapshotDelta::decode(&bytes)
                        .expect("decodes")
                        .apply(&mut restored)
                        .expect("applies");
                    prop_assert_eq!(&restored, new);
                }
            }
        }
    }

    #[test]
    fn a_delta_is_not_a_whole_snapshot_and_damage_is_an_error() {
        let old = start();
        let mut new = old.clone();
        apply_op(&mut new, &Op::Complete(1, 7));
        let link = DeltaLink {
            base: CheckpointId::new(),
            parent: CheckpointId::new(),
        };
        let bytes = SnapshotDelta::between(&old, &new, link)
            .encode()
            .expect("encodes");
        assert_eq!(Snapshot::decode(&bytes), Err(SnapshotError::NotWhole));
        for i in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[i / 8] ^= 1 << (i % 8);
            assert!(
                SnapshotDelta::decode(&flipped).is_err(),
                "bit {i} went unnoticed"
            );
        }
    }

    /// A parallel of `n` items whose item 0 is in progress with a nested loop of `n`
    /// iterations, the items before `n / 2` finished; then one more item finished and the
    /// nested loop one more iteration.
    fn parallel_step(n: u32) -> (Snapshot, Snapshot) {
        let mut inner = loop_state();
        for i in 0..n {
            inner.history.push_back(Value::Int(i64::from(i)));
            inner.iteration += 1;
        }
        let half = n / 2;
        let mut old = start();
        old.graph.frames.push(SavedFrame {
            node: node(1),
            state: FrameState::Parallel(ParallelState {
                items: (0..n).map(|i| Value::Int(i64::from(i))).collect(),
                results: (0..n)
                    .map(|i| (i < half).then_some(Value::Int(1)))
                    .collect(),
                done: (0..n).map(|i| i < half).collect(),
                errors: Vector::new(),
                in_progress: vec![
                    ItemState {
                        index: 0,
                        body: GraphState {
                            frames: vec![SavedFrame {
                                node: node(2),
                                state: FrameState::Loop(inner),
                            }],
                            ..GraphState::default()
                        },
                    },
                    ItemState {
                        index: half,
                        body: GraphState::default(),
                    },
                ],
                assigned: (1..half).map(|i| (i, Vec::new())).collect(),
            }),
        });
        let mut new = old.clone();
        if let Some(FrameState::Parallel(p)) = new.graph.frames.last_mut().map(|f| &mut f.state) {
            p.done.set(half as usize, true);
            p.results.set(half as usize, Some(Value::Int(2)));
            p.assigned.push_back((half, Vec::new()));
            p.in_progress.retain(|i| i.index != half);
            if let Some(FrameState::Loop(l)) = p.in_progress[0]
                .body
                .frames
                .last_mut()
                .map(|f| &mut f.state)
            {
                l.history.push_back(Value::Int(-1));
                l.iteration += 1;
            }
        }
        (old, new)
    }

    #[test]
    fn a_parallel_step_writes_the_same_at_a_thousand_and_a_hundred_thousand_items() {
        let link = DeltaLink {
            base: CheckpointId::new(),
            parent: CheckpointId::new(),
        };
        let mut sizes = Vec::new();
        for n in [1000, 100_000] {
            let (old, new) = parallel_step(n);
            let delta = SnapshotDelta::between(&old, &new, link);
            let bytes = delta.encode().expect("encodes");
            let mut restored = old.clone();
            SnapshotDelta::decode(&bytes)
                .expect("decodes")
                .apply(&mut restored)
                .expect("applies");
            assert_eq!(restored, new, "{n} items");
            sizes.push(bytes.len());
        }
        // Only the finished item and the nested loop's new iteration travel (but for a few
        // bytes of longer varints).
        assert!(sizes[1] <= sizes[0] + 8, "{sizes:?}");
        assert!(sizes[1] < 200, "{sizes:?}");
    }

    #[test]
    fn a_long_chain_writes_little_per_step() {
        let mut state = start();
        let mut sizes = Vec::new();
        for i in 0..1000u32 {
            let mut next = state.clone();
            apply_op(&mut next, &Op::Complete((i % 200) as u8, i64::from(i)));
            let link = DeltaLink {
                base: CheckpointId::new(),
                parent: CheckpointId::new(),
            };
            sizes.push(
                SnapshotDelta::between(&state, &next, link)
                    .encode()
                    .expect("encodes")
                    .len(),
            );
            state = next;
        }
        // The 1000th delta is no larger than the 100th (but for a few bytes of longer varints
        // and node names): bytes per step do not grow with the run.
        assert!(
            sizes[999] <= sizes[99] + 8,
            "{} then {}",
            sizes[99],
            sizes[999]
        );
    }
}
