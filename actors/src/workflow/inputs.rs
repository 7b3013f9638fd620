//! Run inputs a workflow's `begin` node declares, and their types.

use serde::{Deserialize, Serialize};

use crate::model::Value;

/// A run input declared by the `begin` node.
#[derive(Debug, Clone, PartialEq)]
pub struct InputDecl {
    /// The input's name.
    pub name: String,
    /// Its type.
    pub ty: InputType,
    /// Whether a run must provide it (unless it has a default).
    pub required: bool,
    /// The value used when a run does not provide it.
    pub default: Option<Value>,
}

/// The type of a run input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputType {
    /// Text.
    String,
    /// A whole number.
    Integer,
    /// Any number.
    Number,
    /// A boolean.
    Bool,
    /// A list.
    Array,
    /// An object.
    Object,
    /// Anything.
    Any,
}

impl InputType {
    /// The names accepted in a `begin` node's `inputs[].type`.
    pub const NAMES: &'static [&'static str] = &[
        "string", "integer", "number", "bool", "array", "object", "any",
    ];

    /// The name used in `inputs[].type`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::Bool => "bool",
            Self::Array => "array",
            Self::Object => "object",
            Self::Any => "any",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "string" => Self::String,
            "integer" => Self::Integer,
            "number" => Self::Number,
            "bool" => Self::Bool,
            "array" => Self::Array,
            "object" => Self::Object,
            "any" => Self::Any,
            _ => return None,
        })
    }

    /// Whether a value has this type.
    pub fn accepts(&self, value: &Value) -> bool {
        match self {
            Self::Any => true,
            Self::String => matches!(value, Value::String(_)),
            Self::Integer => value.as_i64().is_some(),
            Self::Number => value.as_f64().is_some(),
            Self::Bool => matches!(value, Value::Bool(_)),
            Self::Array => matches!(value, Value::Array(_)),
            Self::Object => matches!(value, Value::Object(_)),
        }
    }

    /// Reads a value of this type from command-line text: strings as they are, other types
    /// as JSON.
    pub fn parse_text(&self, text: &str) -> Result<Value, String> {
        if *self == Self::String {
            return Ok(Value::from(text));
        }
        let value: Value = serde_json::from_str::<serde_json::Value>(text)
            .map(Value::from)
            .or_else(|e| {
                if *self == Self::Any {
                    Ok(Value::from(text))
                } else {
                    Err(format!("not valid JSON: {e}"))
                }
            })?;
        if self.accepts(&value) {
            Ok(value)
        } else {
            Err(format!(
                "expected {}, found {}",
                self.name(),
                value.type_name()
            ))
        }
    }
}
