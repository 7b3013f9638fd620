//! Node paths: where something happens in a run, through loop iterations and parallel items.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ids::NodeId;

/// One step of a [`NodePath`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Frame {
    /// A node of the workflow (or of a body sub-graph).
    Node(NodeId),
    /// An iteration of the enclosing loop node, from 0.
    Iteration(u32),
    /// An item of the enclosing parallel node, by input index.
    Item(u32),
}

/// Where something happens in a run, through nested frames:
/// `loop_1/#3/parallel_2/@7/ask_user` reads "node `ask_user` in item 7 of `parallel_2` in
/// iteration 3 of `loop_1`". Positions are always named by path, never by list position.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodePath(Vec<Frame>);

impl Serialize for NodePath {
    /// As its text form, `loop_1/#3/ask_user`.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NodePath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for NodePath {
    type Err = String;

    /// Parses the text form: node ids, `#N` iterations and `@N` items separated by `/`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Ok(NodePath::default());
        }
        text.split('/')
            .map(|part| {
                let number = |n: &str| {
                    n.parse::<u32>()
                        .map_err(|_| format!("bad path step {part:?} in {text:?}"))
                };
                if let Some(n) = part.strip_prefix('#') {
                    number(n).map(Frame::Iteration)
                } else if let Some(n) = part.strip_prefix('@') {
                    number(n).map(Frame::Item)
                } else {
                    NodeId::new(part)
                        .map(Frame::Node)
                        .map_err(|e| format!("bad node id in path {text:?}: {e}"))
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(NodePath)
    }
}

impl NodePath {
    /// The path of a top-level node.
    pub fn node(node: NodeId) -> Self {
        Self(vec![Frame::Node(node)])
    }

    /// This path extended by a frame.
    pub fn child(&self, frame: Frame) -> Self {
        let mut frames = Vec::with_capacity(self.0.len() + 1);
        frames.extend_from_slice(&self.0);
        frames.push(frame);
        Self(frames)
    }

    /// The empty path (the prefix of the workflow's own graph).
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// The frames, outermost first.
    pub fn frames(&self) -> &[Frame] {
        &self.0
    }

    /// The innermost node of the path.
    pub fn leaf(&self) -> Option<&NodeId> {
        self.0.iter().rev().find_map(|f| match f {
            Frame::Node(n) => Some(n),
            _ => None,
        })
    }
}

impl fmt::Display for NodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, frame) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            match frame {
                Frame::Node(n) => f.write_str(n.as_str())?,
                Frame::Iteration(i) => write!(f, "#{i}")?,
                Frame::Item(i) => write!(f, "@{i}")?,
            }
        }
        Ok(())
    }
}
