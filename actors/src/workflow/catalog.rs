//! What validation needs to know about node kinds: their parameter schemas and the branches
//! they may route to. The kinds layer's registry implements it; validation never sees a
//! handler.

use super::schema::{ParamIssue, ParamSchema};

/// The entry kind.
pub(crate) const BEGIN: &str = "begin";
/// Renders text.
pub(crate) const TEMPLATE: &str = "template";
/// Renders text and appends it to history.
pub(crate) const MESSAGE: &str = "message";
/// Routes by conditions.
pub(crate) const SWITCH: &str = "switch";
/// Assigns workflow variables.
pub(crate) const SET_VARIABLE: &str = "set_variable";
/// Runs a body sub-graph repeatedly.
pub(crate) const LOOP: &str = "loop";
/// Runs a body sub-graph per item, concurrently.
pub(crate) const PARALLEL: &str = "parallel";
/// Pauses the run for a person's answer.
pub(crate) const INTERACTIVE: &str = "interactive";

/// The node kinds a workflow is validated against.
pub trait KindCatalog {
    /// The parameter schema of a kind; `None` when the kind is not known.
    fn params(&self, kind: &str) -> Option<ParamSchema>;
    /// The branch labels a node of this kind may activate, given its raw parameters; `None`
    /// means any label is allowed (or the kind is not known).
    fn branches(&self, kind: &str, params: &serde_json::Value) -> Option<Vec<String>>;
    /// Every known kind, sorted (for error messages).
    fn kind_names(&self) -> Vec<String>;
    /// Checks beyond the schema's types that a kind makes on its raw parameters (a URL's
    /// host, a range of numbers); none by default.
    fn check_params(&self, kind: &str, params: &serde_json::Value) -> Vec<ParamIssue> {
        let _ = (kind, params);
        Vec::new()
    }
}
