//! Node kinds: the registry of handlers by kind name, and the built-in kinds.
//!
//! Built-ins: `begin` (the entry; exposes the run inputs), `template` (renders text),
//! `message` (renders text and appends it to history as an assistant message), `switch`
//! (routes by conditions, see [`Switch`]) and `set_variable` (assigns workflow
//! variables). Hosts add their own kinds with [`Kinds::register`].

mod engine;
pub(crate) mod events;
mod handler;
mod probe;
mod switch;

pub(crate) use engine::EngineKind;
pub(crate) use handler::RunScope;
pub use handler::{NodeContext, NodeHandler, input_bool, input_duration, input_str};
pub use probe::{Probe, ProbeStop};

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::model::{Map, Message, NodeError, NodeOutput, Role, Value};
use crate::workflow::{
    BEGIN, INTERACTIVE, InputType, KindCatalog, LOOP, MESSAGE, PARALLEL, ParamIssue, ParamSchema,
    ParamType, SET_VARIABLE, SWITCH, TEMPLATE,
};

pub use switch::{ELSE, Switch};

/// Kind names the engine keeps for itself, so a host kind never collides with a built-in.
/// (`http` is a host kind: the runvisor crate registers it, the engine never speaks HTTP.)
const RESERVED: &[&str] = &[
    BEGIN,
    TEMPLATE,
    MESSAGE,
    SWITCH,
    SET_VARIABLE,
    LOOP,
    PARALLEL,
    INTERACTIVE,
];

/// A kind name that cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KindError {
    /// The name is built in or reserved.
    #[error("kind `{0}` is built in or reserved; choose another name")]
    Reserved(String),
    /// The name is registered already.
    #[error("kind `{0}` is registered already")]
    Duplicate(String),
    /// The name has characters other than letters, digits, `_` and `-`.
    #[error("kind `{0:?}` is not a valid name (letters, digits, `_` and `-`)")]
    InvalidName(String),
}

/// Handlers by kind name.
#[derive(Clone)]
pub struct Kinds {
    handlers: BTreeMap<String, Arc<dyn NodeHandler>>,
}

impl fmt::Debug for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

impl Default for Kinds {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Kinds {
    /// The built-in kinds only.
    pub fn builtin() -> Self {
        let mut handlers: BTreeMap<String, Arc<dyn NodeHandler>> = BTreeMap::new();
        handlers.insert(BEGIN.into(), Arc::new(Begin));
        handlers.insert(TEMPLATE.into(), Arc::new(TemplateKind { append: false }));
        handlers.insert(MESSAGE.into(), Arc::new(TemplateKind { append: true }));
        handlers.insert(SWITCH.into(), Arc::new(Switch));
        handlers.insert(SET_VARIABLE.into(), Arc::new(SetVariable));
        handlers.insert(LOOP.into(), Arc::new(EngineKind::Loop));
        handlers.insert(PARALLEL.into(), Arc::new(EngineKind::Parallel));
        handlers.insert(INTERACTIVE.into(), Arc::new(EngineKind::Interactive));
        Self { handlers }
    }

    /// Registers a host kind.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        handler: impl NodeHandler,
    ) -> Result<(), KindError> {
        self.register_arc(name, Arc::new(handler))
    }

    /// Registers a host kind from a shared handler.
    pub fn register_arc(
        &mut self,
        name: impl Into<String>,
        handler: Arc<dyn NodeHandler>,
    ) -> Result<(), KindError> {
        let name = name.into();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(KindError::InvalidName(name));
        }
        if RESERVED.contains(&name.as_str()) {
            return Err(KindError::Reserved(name));
        }
        if self.handlers.contains_key(&name) {
            return Err(KindError::Duplicate(name));
        }
        self.handlers.insert(name, handler);
        Ok(())
    }

    /// The handler of a kind.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn NodeHandler>> {
        self.handlers.get(name)
    }

    /// Every registered kind name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }
}

impl KindCatalog for Kinds {
    fn params(&self, kind: &str) -> Option<ParamSchema> {
        self.handlers.get(kind).map(|h| h.params())
    }

    fn branches(&self, kind: &str, params: &serde_json::Value) -> Option<Vec<String>> {
        self.handlers.get(kind).and_then(|h| h.branches(params))
    }

    fn kind_names(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    fn check_params(&self, kind: &str, params: &serde_json::Value) -> Vec<ParamIssue> {
        self.handlers
            .get(kind)
            .map_or_else(Vec::new, |h| h.check_params(params))
    }
}

/// `begin`: outputs the run inputs (with declared defaults applied).
struct Begin;

#[async_trait]
impl NodeHandler for Begin {
    fn never_blocks(&self) -> bool {
        true
    }

    fn params(&self) -> ParamSchema {
        ParamSchema::new().optional(
            "inputs",
            ParamType::array(ParamType::Object(
                ParamSchema::new()
                    .required("name", ParamType::String)
                    .optional("type", ParamType::OneOf(InputType::NAMES))
                    .optional("required", ParamType::Bool)
                    .optional("default", ParamType::Any)
                    .optional("description", ParamType::String),
            )),
        )
    }

    fn branches(&self, _: &serde_json::Value) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    async fn run(&self, _input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        Ok(NodeOutput::new(Value::Object(ctx.inputs().clone())))
    }
}

/// `template` and `message`: render `template`; `message` (or `append_message: true`) also
/// appends the text to history with `role` (default assistant).
struct TemplateKind {
    append: bool,
}

#[async_trait]
impl NodeHandler for TemplateKind {
    fn never_blocks(&self) -> bool {
        true
    }

    fn params(&self) -> ParamSchema {
        ParamSchema::new()
            .required("template", ParamType::String)
            .optional("append_message", ParamType::Bool)
            .optional(
                "role",
                ParamType::OneOf(&["assistant", "user", "system", "tool"]),
            )
    }

    fn branches(&self, _: &serde_json::Value) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let text = match input.get("template") {
            // A template that is a single reference may resolve to any value: render it.
            Some(v) => v.render(),
            None => input_str(&input, "template")?.to_owned(),
        };
        if input_bool(&input, "append_message", self.append)? {
            let role = match input.get("role").and_then(Value::as_str) {
                None | Some("assistant") => Role::Assistant,
                Some("user") => Role::User,
                Some("system") => Role::System,
                Some("tool") => Role::Tool,
                Some(other) => {
                    return Err(NodeError::invalid_input(
                        "role",
                        format!("unknown role {other:?}"),
                    ));
                }
            };
            ctx.append_message(Message::new(role, text.clone()));
        }
        let mut out = Map::new();
        out.insert("text".into(), Value::String(text));
        Ok(NodeOutput::new(Value::Object(out)))
    }
}

/// `set_variable`: `assignments: [{variable, value}]`; outputs the assigned values.
struct SetVariable;

#[async_trait]
impl NodeHandler for SetVariable {
    fn never_blocks(&self) -> bool {
        true
    }

    fn params(&self) -> ParamSchema {
        ParamSchema::new().required(
            "assignments",
            ParamType::array(ParamType::Object(
                ParamSchema::new()
                    .required("variable", ParamType::String)
                    .required("value", ParamType::Any),
            )),
        )
    }

    fn branches(&self, _: &serde_json::Value) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    async fn run(&self, input: Value, _ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let items = input
            .get("assignments")
            .and_then(Value::as_array)
            .ok_or_else(|| NodeError::invalid_input("assignments", "expected an array"))?;
        let mut out = NodeOutput::new(Value::Null);
        let mut assigned = Map::new();
        for (i, item) in items.iter().enumerate() {
            let name = input_str(item, "variable").map_err(|_| {
                NodeError::invalid_input(format!("assignments[{i}].variable"), "expected a string")
            })?;
            let value = item.get("value").cloned().unwrap_or_default();
            assigned.insert(name.to_owned(), value.clone());
            out = out.with_variable(name, value);
        }
        out.value = Value::Object(assigned);
        Ok(out)
    }
}
