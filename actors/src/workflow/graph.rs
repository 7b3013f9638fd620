//! The shape of a validated graph: nodes by index, edges grouped by source, in-degrees.
//! Built once per graph at validation and shared by every run (the scheduler in `core`
//! walks it).

/// Index of a node in a [`Graph`], in `0..graph.node_count()`.
pub(crate) type NodeIndex = usize;

/// A directed edge of the workflow graph, optionally labelled with a branch name.
///
/// An unlabelled edge is active whenever its source completes; a labelled edge is active only
/// if its source completes with [`Route::All`] or with a [`Route::Branches`] containing the label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Edge {
    /// Source node.
    pub from: NodeIndex,
    /// Target node.
    pub to: NodeIndex,
    /// Branch label (for edges leaving a `switch`-like node), `None` for plain edges.
    pub branch: Option<String>,
}

impl Edge {
    /// A plain (unlabelled) edge.
    #[cfg(test)]
    pub(crate) fn new(from: NodeIndex, to: NodeIndex) -> Self {
        Self {
            from,
            to,
            branch: None,
        }
    }

    /// An edge labelled with a branch name.
    #[cfg(test)]
    pub(crate) fn branch(from: NodeIndex, to: NodeIndex, label: impl Into<String>) -> Self {
        Self {
            from,
            to,
            branch: Some(label.into()),
        }
    }
}

/// Why a [`Graph`] could not be built.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub(crate) enum GraphError {
    /// The entry node is not a node of the graph.
    #[error("entry node {entry} is out of range (graph has {node_count} nodes)")]
    EntryOutOfRange {
        /// The offending entry index.
        entry: NodeIndex,
        /// Number of nodes of the graph.
        node_count: usize,
    },
    /// An edge references a node that is not in the graph.
    #[error(
        "edge #{index} ({from} -> {to}) references a node out of range (graph has {node_count} nodes)"
    )]
    EdgeOutOfRange {
        /// Position of the edge in the list given to [`Graph::new`].
        index: usize,
        /// Source of the edge.
        from: NodeIndex,
        /// Target of the edge.
        to: NodeIndex,
        /// Number of nodes of the graph.
        node_count: usize,
    },
    /// More edges than the scheduler's counters can hold.
    #[error(
        "graph has {edge_count} edges, more than the supported maximum of {}",
        u32::MAX
    )]
    TooManyEdges {
        /// Number of edges given.
        edge_count: usize,
    },
}

/// Immutable adjacency of a workflow DAG: out-edges grouped by source and in-degree per node,
/// precomputed once. Validation (acyclicity, reachability from the entry) is the caller's job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Graph {
    entry: NodeIndex,
    /// Edges sorted by source (stable: original order within a source).
    edges: Vec<Edge>,
    /// `edges[out_start[n]..out_start[n + 1]]` are the out-edges of node `n`.
    out_start: Vec<usize>,
    in_degree: Vec<u32>,
}

/// Orders `edges` by source, keeping their original order among the out-edges of one node
/// (a stable counting sort, in place: each edge's place is known from `out_start`, and each
/// swap puts one edge in its place, so O(edges) time and one index per edge).
fn group_by_source(edges: &mut [Edge], out_start: &[usize]) {
    let mut next = out_start.to_vec();
    let mut place: Vec<usize> = edges
        .iter()
        .map(|e| {
            let at = next[e.from];
            next[e.from] += 1;
            at
        })
        .collect();
    for i in 0..edges.len() {
        while place[i] != i {
            let to = place[i];
            edges.swap(i, to);
            place.swap(i, to);
        }
    }
}

impl Graph {
    /// Builds the adjacency. Fails (without panicking) if the entry or an edge endpoint is out
    /// of range.
    pub(crate) fn new(
        node_count: usize,
        entry: NodeIndex,
        edges: Vec<Edge>,
    ) -> Result<Self, GraphError> {
        if entry >= node_count {
            return Err(GraphError::EntryOutOfRange { entry, node_count });
        }
        if u32::try_from(edges.len()).is_err() {
            return Err(GraphError::TooManyEdges {
                edge_count: edges.len(),
            });
        }
        let mut out_count = vec![0usize; node_count];
        let mut in_degree = vec![0u32; node_count];
        for (index, edge) in edges.iter().enumerate() {
            match (out_count.get_mut(edge.from), in_degree.get_mut(edge.to)) {
                (Some(out), Some(deg)) => {
                    *out += 1;
                    // Cannot overflow: the edge count fits in u32.
                    *deg += 1;
                }
                _ => {
                    return Err(GraphError::EdgeOutOfRange {
                        index,
                        from: edge.from,
                        to: edge.to,
                        node_count,
                    });
                }
            }
        }
        let mut out_start = Vec::with_capacity(node_count + 1);
        let mut acc = 0usize;
        out_start.push(0);
        for count in &out_count {
            acc += count;
            out_start.push(acc);
        }
        let mut edges = edges;
        group_by_source(&mut edges, &out_start);
        Ok(Self {
            entry,
            edges,
            out_start,
            in_degree,
        })
    }

    /// Number of nodes.
    pub(crate) fn node_count(&self) -> usize {
        self.in_degree.len()
    }

    /// The entry node, ready at start.
    pub(crate) fn entry(&self) -> NodeIndex {
        self.entry
    }

    /// Outgoing edges of `node` (empty if `node` is out of range).
    pub(crate) fn out_edges(&self, node: NodeIndex) -> &[Edge] {
        match (self.out_start.get(node), self.out_start.get(node + 1)) {
            (Some(&start), Some(&end)) => self.edges.get(start..end).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// The in-degree of every node, by index.
    pub(crate) fn in_degrees(&self) -> &[u32] {
        &self.in_degree
    }

    /// Number of incoming edges of `node` (parallel edges counted separately; 0 if out of range).
    #[cfg(test)]
    pub(crate) fn in_degree(&self, node: NodeIndex) -> usize {
        self.in_degree.get(node).map_or(0, |&d| d as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_edges_keep_their_order_within_each_source() {
        // Sources in a scrambled order, several edges per source, labels to tell them apart.
        let edges: Vec<Edge> = (0..60)
            .map(|i| Edge::branch((i * 7) % 5, (i * 3) % 6, i.to_string()))
            .collect();
        let graph = match Graph::new(6, 0, edges.clone()) {
            Ok(graph) => graph,
            Err(e) => panic!("{e}"),
        };
        let mut expected = edges;
        expected.sort_by_key(|e| e.from);
        let grouped: Vec<Edge> = (0..6).flat_map(|n| graph.out_edges(n).to_vec()).collect();
        assert_eq!(grouped, expected);
        assert_eq!(graph.out_edges(5), &[]);
    }
}
