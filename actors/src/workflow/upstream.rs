//! Which nodes of a graph are upstream of which: a reachability index that answers "does a
//! path lead from `a` to `b`?" for the (referenced node, referencing node) pairs validation
//! meets, in memory linear in the graph, without a set of ancestors per node.
//!
//! The approach is interval labelling in the manner of GRAIL (Yıldırım, Chaoji and Zaki,
//! 2010), with a spanning-tree shortcut. Two depth-first traversals from the entry, one taking
//! each node's out-edges in order and one in reverse, give every node its pre-order and
//! post-order numbers in that traversal's spanning tree and `low`, the smallest post-order
//! number among the nodes it reaches. In an acyclic graph a path from `a` to `b` implies
//! `post[a] > post[b]` and `low[a] <= low[b]` in both traversals, so a pair that fails either
//! test is answered "no" at once; a pair where `b` lies in `a`'s spanning subtree is answered
//! "yes" at once. Chains, fan-outs and fan-ins, and series-parallel shapes (what workflows are
//! made of) are answered almost entirely by these O(1) tests. The pairs left are settled
//! exactly by a depth-first search from `a` that enters only nodes whose labels still allow
//! reaching `b`, and stops at the first node whose spanning subtree holds `b`; answers found by
//! search are kept per pair. Building costs O(nodes + edges) time and a few words per node;
//! a query is O(1) when the labels decide it, and at worst a search of the part of the graph
//! that may lie between the two nodes.
//!
//! Alternatives considered: per-node ancestor bitsets (exact but O(n²) memory: 1.4 GB for a
//! 100,000-node chain), and bitsets propagated per batch of 64 referenced nodes (linear memory
//! but O((n + e) · targets / 64) time on every workflow, not only adversarial ones).

use std::cell::RefCell;
use std::collections::HashMap;

use super::graph::{Graph, NodeIndex};

/// The reachability index of one acyclic graph.
#[derive(Debug)]
pub(super) struct Upstream<'g> {
    graph: &'g Graph,
    /// One labelling per traversal order.
    labels: [Labels; 2],
    /// Scratch for the searches and the answers they found.
    search: RefCell<Search>,
}

/// The numbers one depth-first traversal gives each node.
#[derive(Debug)]
struct Labels {
    pre: Vec<usize>,
    post: Vec<usize>,
    /// The smallest post-order number among the nodes reachable from a node (itself included).
    low: Vec<usize>,
}

#[derive(Debug, Default)]
struct Search {
    /// `mark[n] == epoch` when `n` was entered by the current search.
    mark: Vec<u32>,
    epoch: u32,
    stack: Vec<NodeIndex>,
    answers: HashMap<(NodeIndex, NodeIndex), bool>,
    /// How many searches ran (the tests check the search itself is exercised).
    #[cfg(test)]
    searches: usize,
}

impl<'g> Upstream<'g> {
    /// Labels `graph`, which must be acyclic (validation checks that first; on a graph with a
    /// cycle the answers are meaningless, but nothing panics).
    pub(super) fn new(graph: &'g Graph) -> Self {
        Self {
            graph,
            labels: [Labels::new(graph, false), Labels::new(graph, true)],
            search: RefCell::new(Search {
                mark: vec![0; graph.node_count()],
                ..Search::default()
            }),
        }
    }

    /// Whether a path of at least one edge leads from `a` to `b`: whether `a` is upstream of
    /// `b` (a node is never upstream of itself). Out-of-range indices are upstream of nothing.
    pub(super) fn reaches(&self, a: NodeIndex, b: NodeIndex) -> bool {
        let n = self.graph.node_count();
        if a == b || a >= n || b >= n {
            return false;
        }
        if !self.may_reach(a, b) {
            return false;
        }
        if self.spans(a, b) {
            return true;
        }
        let mut search = self.search.borrow_mut();
        if let Some(&known) = search.answers.get(&(a, b)) {
            return known;
        }
        let found = self.search_from(&mut search, a, b);
        search.answers.insert((a, b), found);
        found
    }

    /// Whether both labellings allow a path from `a` to `b`.
    fn may_reach(&self, a: NodeIndex, b: NodeIndex) -> bool {
        self.labels
            .iter()
            .all(|l| l.post[a] > l.post[b] && l.low[a] <= l.low[b])
    }

    /// Whether `b` lies in `a`'s subtree of either spanning tree (so a path leads there).
    fn spans(&self, a: NodeIndex, b: NodeIndex) -> bool {
        self.labels
            .iter()
            .any(|l| l.pre[a] <= l.pre[b] && l.post[b] <= l.post[a])
    }

    /// Depth-first search from `a` for `b`, entering only nodes that may still reach `b`.
    fn search_from(&self, search: &mut Search, a: NodeIndex, b: NodeIndex) -> bool {
        #[cfg(test)]
        {
            search.searches += 1;
        }
        search.epoch = match search.epoch.checked_add(1) {
            Some(epoch) => epoch,
            None => {
                search.mark.fill(0);
                1
            }
        };
        let epoch = search.epoch;
        search.stack.clear();
        search.stack.push(a);
        while let Some(node) = search.stack.pop() {
            for next in self.graph.out_edges(node).iter().map(|e| e.to) {
                if next == b {
                    return true;
                }
                let Some(mark) = search.mark.get_mut(next) else {
                    continue;
                };
                if *mark == epoch {
                    continue;
                }
                *mark = epoch;
                if !self.may_reach(next, b) {
                    continue;
                }
                if self.spans(next, b) {
                    return true;
                }
                search.stack.push(next);
            }
        }
        false
    }
}

impl Labels {
    /// One iterative depth-first traversal: from the entry, then from every node not yet
    /// reached (none, on a validated graph), taking out-edges in order or in reverse.
    fn new(graph: &Graph, reverse: bool) -> Self {
        let n = graph.node_count();
        let mut labels = Labels {
            pre: vec![usize::MAX; n],
            post: vec![0; n],
            low: vec![usize::MAX; n],
        };
        let (mut pre_count, mut post_count) = (0, 0);
        // (node, how many of its out-edges were taken)
        let mut stack: Vec<(NodeIndex, usize)> = Vec::new();
        let roots = std::iter::once(graph.entry()).chain(0..n);
        for root in roots {
            if labels.pre.get(root) != Some(&usize::MAX) {
                continue;
            }
            labels.pre[root] = pre_count;
            pre_count += 1;
            stack.push((root, 0));
            while let Some((node, taken)) = stack.last_mut() {
                let node = *node;
                let edges = graph.out_edges(node);
                if *taken < edges.len() {
                    let k = if reverse {
                        edges.len() - 1 - *taken
                    } else {
                        *taken
                    };
                    *taken += 1;
                    let next = edges[k].to;
                    if labels.pre[next] == usize::MAX {
                        labels.pre[next] = pre_count;
                        pre_count += 1;
                        stack.push((next, 0));
                    }
                } else {
                    stack.pop();
                    labels.post[node] = post_count;
                    // Every successor is finished here (the graph is acyclic), its `low` known.
                    let low = edges
                        .iter()
                        .map(|e| labels.low[e.to])
                        .fold(post_count, usize::min);
                    labels.low[node] = low;
                    post_count += 1;
                }
            }
        }
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::graph::Edge;

    /// A small deterministic generator (xorshift), so the random graphs are the same each run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// Every pair's answer, by plain search.
    fn closure(graph: &Graph) -> Vec<Vec<bool>> {
        let n = graph.node_count();
        (0..n)
            .map(|a| {
                let mut seen = vec![false; n];
                let mut stack = vec![a];
                while let Some(x) = stack.pop() {
                    for e in graph.out_edges(x) {
                        if !seen[e.to] {
                            seen[e.to] = true;
                            stack.push(e.to);
                        }
                    }
                }
                seen
            })
            .collect()
    }

    /// Checks every pair against plain search; returns (pairs that reach, searches run).
    fn assert_exact(graph: &Graph) -> (usize, usize) {
        let index = Upstream::new(graph);
        let truth = closure(graph);
        let mut reaching = 0;
        for (a, row) in truth.iter().enumerate() {
            for (b, &reaches) in row.iter().enumerate() {
                assert_eq!(index.reaches(a, b), reaches, "{a} -> {b} in {graph:?}");
                reaching += usize::from(reaches);
            }
        }
        (reaching, index.search.borrow().searches)
    }

    #[test]
    fn answers_every_pair_of_random_dags_exactly() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut reaching, mut searches) = (0, 0);
        for round in 0..300 {
            let n = 2 + rng.below(40);
            let density = 1 + rng.below(4);
            // Node 0 is the entry; every other node gets an edge from an earlier node, plus
            // random forward edges, so the graph is acyclic and reachable. Indices are then
            // shuffled so the topological order is not the index order.
            let mut perm: Vec<usize> = (0..n).collect();
            for i in (2..n).rev() {
                let j = 1 + rng.below(i);
                perm.swap(i, j);
            }
            let mut edges = Vec::new();
            for to in 1..n {
                edges.push(Edge::new(perm[rng.below(to)], perm[to]));
                for _ in 0..rng.below(density + 1) {
                    let from = rng.below(to);
                    edges.push(Edge::new(perm[from], perm[to]));
                }
            }
            let graph = match Graph::new(n, perm[0], edges) {
                Ok(graph) => graph,
                Err(e) => panic!("round {round}: {e}"),
            };
            let (r, s) = assert_exact(&graph);
            reaching += r;
            searches += s;
        }
        // Both answers occur, and the labels leave some pairs to the search.
        assert!(reaching > 0 && searches > 0, "{reaching} {searches}");
    }

    #[test]
    fn answers_chains_diamonds_and_fans() {
        let chain = (0..50).map(|i| Edge::new(i, i + 1)).collect();
        let mut fan: Vec<Edge> = (1..30).map(|i| Edge::new(0, i)).collect();
        fan.extend((1..30).map(|i| Edge::new(i, 30)));
        let diamond = vec![
            Edge::new(0, 1),
            Edge::new(0, 2),
            Edge::new(1, 3),
            Edge::new(2, 3),
            Edge::new(3, 4),
            Edge::new(0, 5),
            Edge::new(5, 4),
        ];
        for (n, edges) in [(51, chain), (31, fan), (6, diamond)] {
            match Graph::new(n, 0, edges) {
                Ok(graph) => {
                    assert_exact(&graph);
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn out_of_range_is_upstream_of_nothing() {
        let graph = Graph::new(2, 0, vec![Edge::new(0, 1)]).unwrap_or_else(|e| panic!("{e}"));
        let index = Upstream::new(&graph);
        assert!(index.reaches(0, 1));
        assert!(!index.reaches(0, 2));
        assert!(!index.reaches(7, 1));
    }
}
