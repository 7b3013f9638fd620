//! [`Workflow`]: a definition that passed validation, the only thing a run starts from.

use std::sync::Arc;

use super::catalog::KindCatalog;
use super::def::WorkflowDef;
use super::error::ValidationErrors;
use super::inputs::{InputDecl, InputError, check_inputs, inputs_from_text};
use super::plan::Plan;
use super::validate;
use crate::model::Map;
use crate::model::NodeId;

/// A validated workflow, ready to run. Cheap to clone.
#[derive(Clone)]
pub struct Workflow(Arc<Plan>);

impl std::fmt::Debug for Workflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workflow")
            .field("id", &self.0.def.id)
            .field("nodes", &self.0.graph.nodes.len())
            .finish_non_exhaustive()
    }
}

impl Workflow {
    /// Validates a definition against the kinds a runtime knows. Returns every problem found.
    pub fn validate(def: WorkflowDef, kinds: &dyn KindCatalog) -> Result<Self, ValidationErrors> {
        validate::validate(def, kinds).map(|plan| Self(Arc::new(plan)))
    }

    /// Parses and validates JSON.
    pub fn from_json(text: &str, kinds: &dyn KindCatalog) -> Result<Self, ValidationErrors> {
        let def = WorkflowDef::from_json(text).map_err(|e| ValidationErrors::from(vec![e]))?;
        Self::validate(def, kinds)
    }

    /// The workflow's id.
    pub fn id(&self) -> &str {
        &self.0.def.id
    }

    /// The definition it was validated from.
    pub fn def(&self) -> &WorkflowDef {
        &self.0.def
    }

    /// The run inputs its `begin` node declares.
    pub fn inputs(&self) -> &[InputDecl] {
        &self.0.inputs
    }

    /// The ids of its top-level nodes, in definition order.
    pub fn node_ids(&self) -> impl Iterator<Item = &NodeId> {
        self.0.graph.nodes.iter().map(|n| &n.id)
    }

    pub(crate) fn plan(&self) -> &Arc<Plan> {
        &self.0
    }

    /// Checks run inputs against what the `begin` node declares and applies the defaults (what
    /// `start` does before a run begins).
    pub fn check_inputs(&self, inputs: Map) -> Result<Map, InputError> {
        check_inputs(self.inputs(), inputs)
    }

    /// Reads run inputs given as `name`, `text` pairs (as a command line gives them), each typed
    /// by its declaration: strings as written, other types as JSON. Checked like
    /// [`check_inputs`](Self::check_inputs).
    pub fn inputs_from_text<'a>(
        &self,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Map, InputError> {
        inputs_from_text(self.inputs(), pairs)
    }
}
