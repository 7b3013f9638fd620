//! The kinds the engine runs itself (`loop`, `parallel`, `interactive`): registered like any
//! kind so validation checks their parameters, but executed by their own actors (or, for
//! `interactive`, by pausing the run), never through `NodeHandler::run`.

use async_trait::async_trait;

use super::handler::{NodeContext, NodeHandler};
use crate::model::{FieldType, NodeError, NodeOutput, Value};
use crate::workflow::{OPS, ParamSchema, ParamType};

/// Which engine-run kind.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EngineKind {
    Loop,
    Parallel,
    Interactive,
}

fn condition_schema() -> ParamType {
    let condition = ParamSchema::new()
        .required("left", ParamType::Any)
        .required("op", ParamType::OneOf(OPS))
        .optional("right", ParamType::Any);
    ParamType::Object(
        ParamSchema::new()
            .optional("logic", ParamType::OneOf(&["and", "or"]))
            .required("conditions", ParamType::array(ParamType::Object(condition))),
    )
}

#[async_trait]
impl NodeHandler for EngineKind {
    fn params(&self) -> ParamSchema {
        match self {
            EngineKind::Loop => ParamSchema::new()
                .required("mode", ParamType::OneOf(&["condition", "array"]))
                .optional("items", ParamType::Any)
                .optional("variables", ParamType::map(ParamType::Any))
                .optional("until", condition_schema())
                .optional("max_iterations", ParamType::Integer)
                .optional("output", ParamType::Any),
            EngineKind::Parallel => ParamSchema::new()
                .required("items", ParamType::Any)
                .optional("max_concurrency", ParamType::Integer)
                .optional("on_error", ParamType::OneOf(&["fail_fast", "collect"]))
                .optional("output", ParamType::Any),
            EngineKind::Interactive => ParamSchema::new()
                .required("mode", ParamType::OneOf(&["form_input", "user_select"]))
                .optional("prompt", ParamType::String)
                .optional(
                    "fields",
                    ParamType::array(ParamType::Object(
                        ParamSchema::new()
                            .required("name", ParamType::String)
                            .optional("type", ParamType::OneOf(FieldType::NAMES))
                            .optional("required", ParamType::Bool)
                            .optional("label", ParamType::String)
                            .optional("description", ParamType::String)
                            .optional("default", ParamType::Any),
                    )),
                )
                .optional("options", ParamType::array(ParamType::Any)),
        }
    }

    fn branches(&self, _: &serde_json::Value) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    async fn run(&self, _input: Value, _ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        // The supervisor never hands these kinds to a NodeActor.
        Err(NodeError::failed(format!(
            "{self:?} nodes are run by the engine, not by a handler"
        )))
    }
}
