//! What validation produces: the plan of a workflow, everything a run needs precomputed.

use std::collections::HashMap;
use std::sync::Arc;

use super::def::WorkflowDef;
use super::graph::Graph;
use super::inputs::InputDecl;
use super::reference::Template;
use crate::model::{InteractionKind, Map, NodeId};

/// What validation produces: everything a run needs, precomputed.
pub(crate) struct Plan {
    pub(crate) def: WorkflowDef,
    pub(crate) variables: Map,
    pub(crate) inputs: Vec<InputDecl>,
    pub(crate) graph: Arc<GraphPlan>,
    /// The definition as compact JSON, made once for the snapshots that carry it.
    pub(crate) def_json: std::sync::OnceLock<Arc<str>>,
    /// The definition's content hash, made once: every start stores the definition by it.
    pub(crate) def_hash: std::sync::OnceLock<Arc<str>>,
}

impl Plan {
    pub(crate) fn def_json(&self) -> Arc<str> {
        self.def_json
            .get_or_init(|| Arc::from(serde_json::to_string(&self.def).unwrap_or_default()))
            .clone()
    }

    /// The content hash of the definition's JSON: 128-bit xxh3, as hex.
    pub(crate) fn def_hash(&self) -> String {
        self.def_hash
            .get_or_init(|| {
                let hash = xxhash_rust::xxh3::xxh3_128(self.def_json().as_bytes());
                Arc::from(format!("{hash:032x}"))
            })
            .to_string()
    }
}

/// A validated graph (the workflow's, or a body's).
pub(crate) struct GraphPlan {
    pub(crate) nodes: Vec<PlannedNode>,
    pub(crate) index: HashMap<NodeId, usize>,
    pub(crate) shape: Arc<Graph>,
}

/// A validated node.
pub(crate) struct PlannedNode {
    pub(crate) id: NodeId,
    pub(crate) kind: Arc<str>,
    /// The GenAI operation its kind performs (`invoke_agent`, `execute_tool`), if any.
    pub(crate) operation: Option<&'static str>,
    /// The name of its spans: `<operation or "node"> <id>`, made once here rather than per
    /// execution.
    pub(crate) span_name: Box<str>,
    /// Parameters resolved when the node starts (for loops and parallels: all but `until`
    /// and `output`, which belong to the body's scope).
    pub(crate) params: Template,
    pub(crate) spec: NodeSpec,
}

/// The operation the OpenTelemetry GenAI conventions name for a node kind, when one fits: an
/// agent or model call is `invoke_agent`, a tool or a call out is `execute_tool`.
pub(crate) fn operation_of(kind: &str) -> Option<&'static str> {
    match kind {
        "agent" | "llm" | "chat" | "ai_chat" => Some("invoke_agent"),
        "tool" | "http" | "code" | "mcp" => Some("execute_tool"),
        _ => None,
    }
}

/// How a node runs.
#[derive(Clone)]
pub(crate) enum NodeSpec {
    /// Its handler runs in a `NodeActor`.
    Task,
    /// A `LoopActor` runs its body.
    Loop(Arc<LoopSpec>),
    /// A `ParallelActor` runs its body per item.
    Parallel(Arc<ParallelSpec>),
    /// Pauses the run for an answer.
    Interactive(Arc<InteractionKind>),
}

/// Loop modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoopMode {
    /// Do-while with a termination condition.
    Condition,
    /// One iteration per item.
    Array,
}

pub(crate) struct LoopSpec {
    pub(crate) mode: LoopMode,
    pub(crate) max_iterations: u32,
    /// Declared loop variables, in declaration order.
    pub(crate) vars: Vec<String>,
    pub(crate) until: Option<Template>,
    pub(crate) output: Option<Template>,
    pub(crate) body: Arc<GraphPlan>,
}

pub(crate) struct ParallelSpec {
    pub(crate) max_concurrency: usize,
    pub(crate) fail_fast: bool,
    pub(crate) output: Option<Template>,
    pub(crate) body: Arc<GraphPlan>,
}
