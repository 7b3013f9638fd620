//! The scheduler: the pure state machine that decides which nodes of a workflow DAG become
//! ready, which are skipped (dead-path elimination) and when a run is done. No IO, no async.
//!
//! A [`Graph`] is built once from the node count, the entry node and the edges, and shared via
//! [`Arc`] across runs. A [`Schedule`] holds the per-run state of every node. The caller starts
//! the run ([`Schedule::start`]), marks ready nodes as running when it dispatches them
//! ([`Schedule::mark_running`]) and reports completions with the [`Route`] the node took
//! ([`Schedule::complete`]); each call returns the [`Step`] of newly ready and newly skipped
//! nodes.
//!
//! Semantics: a node becomes ready when all its incoming edges are resolved and at least one
//! is active; it is skipped when all are resolved and all are dead. Outgoing edges of a skipped
//! node are dead, so skips propagate transitively within the same call. Parallel edges between
//! the same pair of nodes count as separate edges.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use crate::model::Route;
#[cfg(test)]
use crate::workflow::{Edge, GraphError};
pub(crate) use crate::workflow::{Graph, NodeIndex};

/// Scheduling state of a node within one run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub(crate) enum NodeState {
    /// Not yet decided: some incoming edge is unresolved (or the run is not started).
    #[default]
    Pending,
    /// All incoming edges resolved, at least one active: may be started.
    Ready,
    /// Dispatched by the caller.
    Running,
    /// Finished; its route has been applied to its outgoing edges.
    Completed,
    /// All incoming edges are dead: will never run.
    Skipped,
}

impl NodeState {
    fn as_str(self) -> &'static str {
        match self {
            NodeState::Pending => "pending",
            NodeState::Ready => "ready",
            NodeState::Running => "running",
            NodeState::Completed => "completed",
            NodeState::Skipped => "skipped",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the scheduling state machine.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ScheduleError {
    /// The node index is not in the graph.
    #[error("node {node} does not exist (graph has {node_count} nodes)")]
    UnknownNode {
        /// The offending index.
        node: NodeIndex,
        /// Number of nodes of the graph.
        node_count: usize,
    },
    /// The operation needs a ready (or, for completion, running) node.
    #[error("node {node} is not ready (state: {state})")]
    NotReady {
        /// The node.
        node: NodeIndex,
        /// Its current state.
        state: NodeState,
    },
    /// The operation needs a running node.
    #[error("node {node} is not running (state: {state})")]
    NotRunning {
        /// The node.
        node: NodeIndex,
        /// Its current state.
        state: NodeState,
    },
}

/// What a scheduling call changed: nodes that became ready and nodes that were skipped,
/// each list in ascending index order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Step {
    /// Nodes that just became ready.
    pub ready: Vec<NodeIndex>,
    /// Nodes that were just skipped (transitively).
    pub skipped: Vec<NodeIndex>,
}

impl Step {
    /// Whether nothing changed.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.skipped.is_empty()
    }
}

/// Per-run scheduling state over a shared [`Graph`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Schedule {
    graph: Arc<Graph>,
    state: Vec<NodeState>,
    /// Incoming edges not yet resolved, per node.
    unresolved: Vec<u32>,
    /// Incoming edges resolved as active, per node.
    active: Vec<u32>,
    /// Nodes pending, ready or running.
    outstanding: usize,
    completions: Vec<(NodeIndex, Route)>,
    /// The nodes in state Ready, and those Running, kept as the states change: a snapshot
    /// lists them at every durable step, which must not cost a scan of every node.
    ready: BTreeSet<NodeIndex>,
    running: BTreeSet<NodeIndex>,
}

impl Schedule {
    /// A fresh schedule: every node pending. Call [`Schedule::start`] to make the entry ready.
    pub(crate) fn new(graph: Arc<Graph>) -> Self {
        let n = graph.node_count();
        Self {
            state: vec![NodeState::Pending; n],
            unresolved: graph.in_degrees().to_vec(),
            active: vec![0; n],
            outstanding: n,
            completions: Vec::with_capacity(n),
            ready: BTreeSet::new(),
            running: BTreeSet::new(),
            graph,
        }
    }

    /// Rebuilds the state of a run from recorded completions (for resume after stop): replays
    /// [`Schedule::complete`] for each `(node, route)` in order, starting from
    /// [`Schedule::start`]. A completion of a node that was not ready at that point is an
    /// error naming the node. The remaining frontier is left in state Ready (no node Running).
    pub(crate) fn restore(
        graph: Arc<Graph>,
        completions: &[(NodeIndex, Route)],
    ) -> Result<Self, ScheduleError> {
        let mut schedule = Self::new(graph);
        schedule.start();
        for (node, route) in completions {
            schedule.complete(*node, route)?;
        }
        Ok(schedule)
    }

    /// Makes the entry node ready. Calling it again (or after the entry was decided) is a
    /// no-op returning an empty step.
    pub(crate) fn start(&mut self) -> Step {
        let entry = self.graph.entry();
        match self.state.get_mut(entry) {
            Some(s) if *s == NodeState::Pending => {
                *s = NodeState::Ready;
                self.ready.insert(entry);
                Step {
                    ready: vec![entry],
                    skipped: Vec::new(),
                }
            }
            _ => Step::default(),
        }
    }

    /// Ready -> Running: the caller dispatched the node.
    pub(crate) fn mark_running(&mut self, node: NodeIndex) -> Result<(), ScheduleError> {
        let state = self.state_mut(node)?;
        match *state {
            NodeState::Ready => {
                *state = NodeState::Running;
                self.ready.remove(&node);
                self.running.insert(node);
                Ok(())
            }
            other => Err(ScheduleError::NotReady { node, state: other }),
        }
    }

    /// Running -> Ready: a node interrupted by a stop that must run again on resume.
    pub(crate) fn requeue(&mut self, node: NodeIndex) -> Result<(), ScheduleError> {
        let state = self.state_mut(node)?;
        match *state {
            NodeState::Running => {
                *state = NodeState::Ready;
                self.running.remove(&node);
                self.ready.insert(node);
                Ok(())
            }
            other => Err(ScheduleError::NotRunning { node, state: other }),
        }
    }

    /// Running (or Ready) -> Completed. Resolves the node's outgoing edges according to
    /// `route` and returns the nodes that became ready and those skipped (transitively), each
    /// list in ascending index order.
    pub(crate) fn complete(
        &mut self,
        node: NodeIndex,
        route: &Route,
    ) -> Result<Step, ScheduleError> {
        let state = self.state_mut(node)?;
        match *state {
            NodeState::Ready | NodeState::Running => *state = NodeState::Completed,
            other => return Err(ScheduleError::NotReady { node, state: other }),
        }
        self.ready.remove(&node);
        self.running.remove(&node);
        self.outstanding = self.outstanding.saturating_sub(1);
        self.completions.push((node, route.clone()));

        let graph = Arc::clone(&self.graph);
        let mut step = Step::default();
        for edge in graph.out_edges(node) {
            let active = route.activates(edge.branch.as_deref());
            self.resolve_edge(edge.to, active, &mut step);
        }
        // `step.skipped` doubles as the worklist of skipped nodes whose out-edges are dead.
        let mut i = 0;
        while let Some(&skipped) = step.skipped.get(i) {
            i += 1;
            for edge in graph.out_edges(skipped) {
                self.resolve_edge(edge.to, false, &mut step);
            }
        }
        step.ready.sort_unstable();
        step.skipped.sort_unstable();
        Ok(step)
    }

    /// State of `node` (`Pending` for an index out of range, which is never scheduled).
    pub(crate) fn state(&self, node: NodeIndex) -> NodeState {
        self.state.get(node).copied().unwrap_or_default()
    }

    /// Whether no node is pending, ready or running.
    pub(crate) fn is_done(&self) -> bool {
        self.outstanding == 0
    }

    /// Recorded completions `(node, route)` in completion order: what a snapshot stores so that
    /// [`Schedule::restore`] can rebuild the run.
    pub(crate) fn completions(&self) -> &[(NodeIndex, Route)] {
        &self.completions
    }

    /// Completed nodes, ascending.
    #[cfg(test)]
    pub(crate) fn completed(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.in_state(NodeState::Completed)
    }

    /// Ready nodes not yet running (the frontier not yet started), ascending.
    pub(crate) fn ready(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.ready.iter().copied()
    }

    /// Running nodes, ascending.
    pub(crate) fn running(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.running.iter().copied()
    }

    /// Skipped nodes, ascending.
    #[cfg(test)]
    pub(crate) fn skipped(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.in_state(NodeState::Skipped)
    }

    #[cfg(test)]
    fn in_state(&self, wanted: NodeState) -> impl Iterator<Item = NodeIndex> + '_ {
        self.state
            .iter()
            .enumerate()
            .filter_map(move |(i, &s)| (s == wanted).then_some(i))
    }

    fn state_mut(&mut self, node: NodeIndex) -> Result<&mut NodeState, ScheduleError> {
        let node_count = self.state.len();
        self.state
            .get_mut(node)
            .ok_or(ScheduleError::UnknownNode { node, node_count })
    }

    /// Resolves one incoming edge of `to`; decides `to` once all its in-edges are resolved.
    fn resolve_edge(&mut self, to: NodeIndex, active: bool, step: &mut Step) {
        let (Some(unresolved), Some(active_count), Some(state)) = (
            self.unresolved.get_mut(to),
            self.active.get_mut(to),
            self.state.get_mut(to),
        ) else {
            return;
        };
        if *unresolved == 0 {
            return;
        }
        *unresolved -= 1;
        if active {
            *active_count += 1;
        }
        if *unresolved > 0 || *state != NodeState::Pending {
            return;
        }
        if *active_count > 0 {
            *state = NodeState::Ready;
            self.ready.insert(to);
            step.ready.push(to);
        } else {
            *state = NodeState::Skipped;
            self.outstanding = self.outstanding.saturating_sub(1);
            step.skipped.push(to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn graph(n: usize, edges: Vec<Edge>) -> Result<Arc<Graph>, GraphError> {
        Graph::new(n, 0, edges).map(Arc::new)
    }

    fn e(from: NodeIndex, to: NodeIndex) -> Edge {
        Edge::new(from, to)
    }

    fn b(from: NodeIndex, to: NodeIndex, label: &str) -> Edge {
        Edge::branch(from, to, label)
    }

    fn step(ready: &[NodeIndex], skipped: &[NodeIndex]) -> Step {
        Step {
            ready: ready.to_vec(),
            skipped: skipped.to_vec(),
        }
    }

    /// Runs each completion (mark_running then complete) and checks the step it yields.
    fn run_script(
        schedule: &mut Schedule,
        script: &[(NodeIndex, Route, Step)],
    ) -> Result<(), ScheduleError> {
        for (node, route, expected) in script {
            schedule.mark_running(*node)?;
            let got = schedule.complete(*node, route)?;
            assert_eq!(&got, expected, "completing node {node} with {route:?}");
        }
        Ok(())
    }

    /// Diamond with a switch: 0 -> 1 (switch); 1 -a-> 2, 1 -b-> 3, 1 -else-> 4;
    /// 2, 3, 4 -> 5 (join).
    fn switch_graph() -> Result<Arc<Graph>, GraphError> {
        graph(
            6,
            vec![
                e(0, 1),
                b(1, 2, "a"),
                b(1, 3, "b"),
                b(1, 4, "else"),
                e(2, 5),
                e(3, 5),
                e(4, 5),
            ],
        )
    }

    #[test]
    fn scenarios() -> TestResult {
        struct Case {
            name: &'static str,
            graph: Arc<Graph>,
            script: Vec<(NodeIndex, Route, Step)>,
            completed: Vec<NodeIndex>,
            skipped: Vec<NodeIndex>,
        }
        let all = || Route::All;
        let cases = vec![
            Case {
                name: "linear chain",
                graph: graph(3, vec![e(0, 1), e(1, 2)])?,
                script: vec![
                    (0, all(), step(&[1], &[])),
                    (1, all(), step(&[2], &[])),
                    (2, all(), step(&[], &[])),
                ],
                completed: vec![0, 1, 2],
                skipped: vec![],
            },
            Case {
                name: "fan-out and join waits for all branches",
                graph: graph(
                    5,
                    vec![e(0, 1), e(0, 2), e(0, 3), e(1, 4), e(2, 4), e(3, 4)],
                )?,
                script: vec![
                    (0, all(), step(&[1, 2, 3], &[])),
                    (2, all(), step(&[], &[])),
                    (1, all(), step(&[], &[])),
                    (3, all(), step(&[4], &[])),
                    (4, all(), step(&[], &[])),
                ],
                completed: vec![0, 1, 2, 3, 4],
                skipped: vec![],
            },
            Case {
                name: "switch takes one branch, join runs after it",
                graph: switch_graph()?,
                script: vec![
                    (0, all(), step(&[1], &[])),
                    (1, Route::branches(["b"]), step(&[3], &[2, 4])),
                    (3, all(), step(&[5], &[])),
                    (5, all(), step(&[], &[])),
                ],
                completed: vec![0, 1, 3, 5],
                skipped: vec![2, 4],
            },
            Case {
                name: "switch takes several branches",
                graph: switch_graph()?,
                script: vec![
                    (0, all(), step(&[1], &[])),
                    (1, Route::branches(["a", "b"]), step(&[2, 3], &[4])),
                    (3, all(), step(&[], &[])),
                    (2, all(), step(&[5], &[])),
                    (5, all(), step(&[], &[])),
                ],
                completed: vec![0, 1, 2, 3, 5],
                skipped: vec![4],
            },
            Case {
                name: "switch whose only active branch is else",
                graph: switch_graph()?,
                script: vec![
                    (0, all(), step(&[1], &[])),
                    (1, Route::branches(["else"]), step(&[4], &[2, 3])),
                    (4, all(), step(&[5], &[])),
                    (5, all(), step(&[], &[])),
                ],
                completed: vec![0, 1, 4, 5],
                skipped: vec![2, 3],
            },
            Case {
                name: "skip propagates through a chain",
                // 0 switch: -a-> 1 -> 2 -> 3 -> 4 ; -b-> 5
                graph: graph(
                    6,
                    vec![b(0, 1, "a"), e(1, 2), e(2, 3), e(3, 4), b(0, 5, "b")],
                )?,
                script: vec![
                    (0, Route::branches(["b"]), step(&[5], &[1, 2, 3, 4])),
                    (5, all(), step(&[], &[])),
                ],
                completed: vec![0, 5],
                skipped: vec![1, 2, 3, 4],
            },
            Case {
                name: "join whose inputs are all dead is skipped, its successors too",
                // 0 switch: -a-> 1 -> 3 (join) ; -b-> 2 -> 3 ; 3 -> 4 ; -c-> 5
                graph: graph(
                    6,
                    vec![
                        b(0, 1, "a"),
                        b(0, 2, "b"),
                        e(1, 3),
                        e(2, 3),
                        e(3, 4),
                        b(0, 5, "c"),
                    ],
                )?,
                script: vec![
                    (0, Route::branches(["c"]), step(&[5], &[1, 2, 3, 4])),
                    (5, all(), step(&[], &[])),
                ],
                completed: vec![0, 5],
                skipped: vec![1, 2, 3, 4],
            },
            Case {
                name: "parallel edges from a switch, one label active",
                graph: graph(3, vec![b(0, 1, "x"), b(0, 1, "y"), b(0, 2, "z")])?,
                script: vec![
                    (0, Route::branches(["y"]), step(&[1], &[2])),
                    (1, all(), step(&[], &[])),
                ],
                completed: vec![0, 1],
                skipped: vec![2],
            },
            Case {
                name: "unlabelled edge stays active under Branches",
                graph: graph(3, vec![e(0, 1), b(0, 2, "z")])?,
                script: vec![
                    (0, Route::branches(["nope"]), step(&[1], &[2])),
                    (1, all(), step(&[], &[])),
                ],
                completed: vec![0, 1],
                skipped: vec![2],
            },
            Case {
                name: "Route::All activates labelled edges",
                graph: switch_graph()?,
                script: vec![
                    (0, all(), step(&[1], &[])),
                    (1, all(), step(&[2, 3, 4], &[])),
                    (4, all(), step(&[], &[])),
                    (2, all(), step(&[], &[])),
                    (3, all(), step(&[5], &[])),
                    (5, all(), step(&[], &[])),
                ],
                completed: vec![0, 1, 2, 3, 4, 5],
                skipped: vec![],
            },
        ];
        for case in cases {
            let mut s = Schedule::new(Arc::clone(&case.graph));
            assert_eq!(s.start(), step(&[0], &[]), "{}", case.name);
            run_script(&mut s, &case.script)?;
            assert!(s.is_done(), "{}: not done", case.name);
            assert_eq!(
                s.completed().collect::<Vec<_>>(),
                case.completed,
                "{}",
                case.name
            );
            assert_eq!(
                s.skipped().collect::<Vec<_>>(),
                case.skipped,
                "{}",
                case.name
            );
            assert_eq!(s.ready().count(), 0, "{}", case.name);
            assert_eq!(s.running().count(), 0, "{}", case.name);
            let order: Vec<_> = s.completions().iter().map(|(n, _)| *n).collect();
            let script_order: Vec<_> = case.script.iter().map(|(n, _, _)| *n).collect();
            assert_eq!(order, script_order, "{}", case.name);
        }
        Ok(())
    }

    #[test]
    fn is_done_transitions() -> TestResult {
        let mut s = Schedule::new(graph(2, vec![e(0, 1)])?);
        assert!(!s.is_done());
        s.start();
        assert!(!s.is_done());
        s.mark_running(0)?;
        assert!(!s.is_done());
        s.complete(0, &Route::All)?;
        assert!(!s.is_done());
        s.mark_running(1)?;
        assert!(!s.is_done());
        s.complete(1, &Route::All)?;
        assert!(s.is_done());

        // Single-node graph.
        let mut s = Schedule::new(graph(1, vec![])?);
        assert!(!s.is_done());
        assert_eq!(s.start(), step(&[0], &[]));
        assert_eq!(s.complete(0, &Route::All)?, Step::default());
        assert!(s.is_done());
        Ok(())
    }

    #[test]
    fn start_is_idempotent() -> TestResult {
        let mut s = Schedule::new(graph(2, vec![e(0, 1)])?);
        assert_eq!(s.start(), step(&[0], &[]));
        assert!(s.start().is_empty());
        assert_eq!(s.ready().collect::<Vec<_>>(), vec![0]);
        Ok(())
    }

    #[test]
    fn complete_from_ready_without_running() -> TestResult {
        let mut s = Schedule::new(graph(2, vec![e(0, 1)])?);
        s.start();
        assert_eq!(s.complete(0, &Route::All)?, step(&[1], &[]));
        assert_eq!(s.state(0), NodeState::Completed);
        assert_eq!(s.state(1), NodeState::Ready);
        Ok(())
    }

    #[test]
    fn errors() -> TestResult {
        let mut s = Schedule::new(graph(3, vec![e(0, 1), e(1, 2)])?);
        // Before start, the entry is pending.
        assert_eq!(
            s.complete(0, &Route::All),
            Err(ScheduleError::NotReady {
                node: 0,
                state: NodeState::Pending
            })
        );
        s.start();
        assert_eq!(
            s.complete(2, &Route::All),
            Err(ScheduleError::NotReady {
                node: 2,
                state: NodeState::Pending
            })
        );
        assert_eq!(
            s.mark_running(1),
            Err(ScheduleError::NotReady {
                node: 1,
                state: NodeState::Pending
            })
        );
        assert_eq!(
            s.complete(7, &Route::All),
            Err(ScheduleError::UnknownNode {
                node: 7,
                node_count: 3
            })
        );
        assert_eq!(
            s.mark_running(7),
            Err(ScheduleError::UnknownNode {
                node: 7,
                node_count: 3
            })
        );
        s.mark_running(0)?;
        assert_eq!(
            s.mark_running(0),
            Err(ScheduleError::NotReady {
                node: 0,
                state: NodeState::Running
            })
        );
        s.complete(0, &Route::All)?;
        let err = s.complete(0, &Route::All);
        assert_eq!(
            err,
            Err(ScheduleError::NotReady {
                node: 0,
                state: NodeState::Completed
            })
        );
        let message = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(message, "node 0 is not ready (state: completed)");
        // A failed call leaves the state untouched.
        assert_eq!(s.completions().len(), 1);
        assert_eq!(s.ready().collect::<Vec<_>>(), vec![1]);
        Ok(())
    }

    #[test]
    fn skipped_node_cannot_complete() -> TestResult {
        let mut s = Schedule::new(switch_graph()?);
        s.start();
        s.complete(0, &Route::All)?;
        s.complete(1, &Route::branches(["a"]))?;
        assert_eq!(
            s.complete(3, &Route::All),
            Err(ScheduleError::NotReady {
                node: 3,
                state: NodeState::Skipped
            })
        );
        Ok(())
    }

    #[test]
    fn graph_errors() {
        assert_eq!(
            Graph::new(2, 0, vec![e(0, 1), e(1, 5)]),
            Err(GraphError::EdgeOutOfRange {
                index: 1,
                from: 1,
                to: 5,
                node_count: 2
            })
        );
        assert_eq!(
            Graph::new(2, 0, vec![e(9, 1)]),
            Err(GraphError::EdgeOutOfRange {
                index: 0,
                from: 9,
                to: 1,
                node_count: 2
            })
        );
        assert_eq!(
            Graph::new(2, 2, vec![]),
            Err(GraphError::EntryOutOfRange {
                entry: 2,
                node_count: 2
            })
        );
        assert_eq!(
            Graph::new(0, 0, vec![]),
            Err(GraphError::EntryOutOfRange {
                entry: 0,
                node_count: 0
            })
        );
    }

    #[test]
    fn graph_adjacency() -> TestResult {
        let g = Graph::new(3, 0, vec![e(1, 2), b(0, 1, "x"), e(0, 2), b(0, 1, "y")])?;
        assert_eq!(g.node_count(), 3);
        assert_eq!(g.entry(), 0);
        assert_eq!(g.out_edges(0), &[b(0, 1, "x"), e(0, 2), b(0, 1, "y")]);
        assert_eq!(g.out_edges(1), &[e(1, 2)]);
        assert!(g.out_edges(2).is_empty());
        assert!(g.out_edges(99).is_empty());
        assert_eq!((g.in_degree(0), g.in_degree(1), g.in_degree(2)), (0, 2, 2));
        assert_eq!(g.in_degree(99), 0);
        Ok(())
    }

    #[test]
    fn restore_reproduces_state() -> TestResult {
        let g = switch_graph()?;
        let sequences: Vec<Vec<(NodeIndex, Route)>> = vec![
            vec![],
            vec![(0, Route::All)],
            vec![(0, Route::All), (1, Route::branches(["a", "else"]))],
            vec![
                (0, Route::All),
                (1, Route::branches(["a", "else"])),
                (4, Route::All),
            ],
            vec![
                (0, Route::All),
                (1, Route::branches(["b"])),
                (3, Route::All),
                (5, Route::All),
            ],
        ];
        for seq in sequences {
            let mut live = Schedule::new(Arc::clone(&g));
            live.start();
            for (node, route) in &seq {
                live.mark_running(*node)?;
                live.complete(*node, route)?;
            }
            let restored = Schedule::restore(Arc::clone(&g), live.completions())?;
            assert_eq!(
                restored.ready().collect::<Vec<_>>(),
                live.ready().collect::<Vec<_>>()
            );
            assert_eq!(
                restored.completed().collect::<Vec<_>>(),
                live.completed().collect::<Vec<_>>()
            );
            assert_eq!(
                restored.skipped().collect::<Vec<_>>(),
                live.skipped().collect::<Vec<_>>()
            );
            assert_eq!(restored.running().count(), 0);
            assert_eq!(restored.is_done(), live.is_done());
            assert_eq!(restored.completions(), seq.as_slice());
            // Nothing was running in `live`, so the whole state matches.
            assert_eq!(restored, live);
        }
        Ok(())
    }

    #[test]
    fn restore_then_continue() -> TestResult {
        let g = switch_graph()?;
        let mut s = Schedule::restore(
            Arc::clone(&g),
            &[(0, Route::All), (1, Route::branches(["a", "b"]))],
        )?;
        assert_eq!(s.ready().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(s.skipped().collect::<Vec<_>>(), vec![4]);
        s.mark_running(2)?;
        s.complete(2, &Route::All)?;
        s.mark_running(3)?;
        assert_eq!(s.complete(3, &Route::All)?, step(&[5], &[]));
        Ok(())
    }

    #[test]
    fn restore_rejects_impossible_sequences() -> TestResult {
        let g = switch_graph()?;
        let cases: Vec<(Vec<(NodeIndex, Route)>, ScheduleError)> = vec![
            (
                vec![(1, Route::All)],
                ScheduleError::NotReady {
                    node: 1,
                    state: NodeState::Pending,
                },
            ),
            (
                vec![(0, Route::All), (0, Route::All)],
                ScheduleError::NotReady {
                    node: 0,
                    state: NodeState::Completed,
                },
            ),
            (
                vec![
                    (0, Route::All),
                    (1, Route::branches(["a"])),
                    (3, Route::All),
                ],
                ScheduleError::NotReady {
                    node: 3,
                    state: NodeState::Skipped,
                },
            ),
            (
                vec![
                    (0, Route::All),
                    (1, Route::branches(["a", "b"])),
                    (2, Route::All),
                    (5, Route::All),
                ],
                ScheduleError::NotReady {
                    node: 5,
                    state: NodeState::Pending,
                },
            ),
            (
                vec![(42, Route::All)],
                ScheduleError::UnknownNode {
                    node: 42,
                    node_count: 6,
                },
            ),
        ];
        for (seq, expected) in cases {
            assert_eq!(Schedule::restore(Arc::clone(&g), &seq), Err(expected));
        }
        Ok(())
    }

    #[test]
    fn requeue() -> TestResult {
        let mut s = Schedule::new(graph(3, vec![e(0, 1), e(0, 2)])?);
        s.start();
        s.complete(0, &Route::All)?;
        s.mark_running(1)?;
        s.mark_running(2)?;
        assert_eq!(s.running().collect::<Vec<_>>(), vec![1, 2]);
        s.requeue(2)?;
        assert_eq!(s.state(2), NodeState::Ready);
        assert_eq!(s.ready().collect::<Vec<_>>(), vec![2]);
        assert_eq!(s.running().collect::<Vec<_>>(), vec![1]);
        assert_eq!(
            s.requeue(2),
            Err(ScheduleError::NotRunning {
                node: 2,
                state: NodeState::Ready
            })
        );
        assert_eq!(
            s.requeue(0),
            Err(ScheduleError::NotRunning {
                node: 0,
                state: NodeState::Completed
            })
        );
        assert_eq!(
            s.requeue(9),
            Err(ScheduleError::UnknownNode {
                node: 9,
                node_count: 3
            })
        );
        assert!(!s.is_done());
        s.mark_running(2)?;
        s.complete(2, &Route::All)?;
        s.complete(1, &Route::All)?;
        assert!(s.is_done());
        Ok(())
    }

    #[test]
    fn route_serde_roundtrip() -> TestResult {
        for route in [Route::All, Route::branches(["a", "else"])] {
            let json = serde_json::to_string(&route)?;
            let back: Route = serde_json::from_str(&json)?;
            assert_eq!(back, route);
        }
        Ok(())
    }

    proptest::proptest! {
        /// The ready and running nodes the schedule keeps as states change are exactly those
        /// a scan of every node finds, whatever the graph, the routes and the order of
        /// dispatches, requeues and completions.
        #[test]
        fn kept_ready_and_running_sets_match_the_states(
            n in 2usize..12,
            edge_bits in proptest::collection::vec(0u8..4, 66),
            ops in proptest::collection::vec((0u8..3, 0usize..12, proptest::bool::ANY), 0..60),
        ) {
            // Edges go forward only (i < j), so the graph is acyclic; some are branches.
            let mut edges = Vec::new();
            let mut k = 0;
            for i in 0..n {
                for j in i + 1..n {
                    match edge_bits.get(k) {
                        Some(1) => edges.push(e(i, j)),
                        Some(2) => edges.push(b(i, j, "a")),
                        _ => {}
                    }
                    k += 1;
                }
            }
            let Ok(graph) = graph(n, edges) else {
                return Ok(());
            };
            let mut s = Schedule::new(graph);
            s.start();
            for (op, node, branch) in ops {
                let node = node % n;
                let route = if branch { Route::branches(["a"]) } else { Route::branches(["b"]) };
                // Refused operations change nothing; the sets must agree either way.
                let _ = match op {
                    0 => s.mark_running(node),
                    1 => s.requeue(node),
                    _ => s.complete(node, &route).map(|_| ()),
                };
                let ready: Vec<_> = s.in_state(NodeState::Ready).collect();
                let running: Vec<_> = s.in_state(NodeState::Running).collect();
                proptest::prop_assert_eq!(s.ready().collect::<Vec<_>>(), ready);
                proptest::prop_assert_eq!(s.running().collect::<Vec<_>>(), running);
            }
        }
    }
}
