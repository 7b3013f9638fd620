//! Run inputs a workflow's `begin` node declares, and their types.

use serde::{Deserialize, Serialize};

use crate::model::{Map, Value};

/// A run input that does not fit the inputs the `begin` node declares.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("input `{input}`: {problem}")]
pub struct InputError {
    /// The input's name.
    pub input: String,
    /// What is wrong.
    pub problem: String,
}

impl InputError {
    fn new(input: &str, problem: impl Into<String>) -> Self {
        Self {
            input: input.to_owned(),
            problem: problem.into(),
        }
    }
}

/// Checks run inputs against the declarations and applies defaults: every input must be
/// declared and of its declared type; a required input without a default must be given. With no
/// declarations, any inputs are accepted as they are.
pub(crate) fn check_inputs(declared: &[InputDecl], mut inputs: Map) -> Result<Map, InputError> {
    if declared.is_empty() {
        return Ok(inputs);
    }
    for name in inputs.keys() {
        if !declared.iter().any(|d| &d.name == name) {
            let known: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
            return Err(InputError::new(
                name,
                format!(
                    "not declared by the begin node (declared: {})",
                    known.join(", ")
                ),
            ));
        }
    }
    for decl in declared {
        match inputs.get(&decl.name) {
            Some(value) if !decl.ty.accepts(value) => {
                return Err(InputError::new(
                    &decl.name,
                    format!("expected {}, found {}", decl.ty.name(), value.type_name()),
                ));
            }
            Some(_) => {}
            None => match &decl.default {
                Some(default) => {
                    inputs.insert(decl.name.clone(), default.clone());
                }
                None if decl.required => return Err(InputError::new(&decl.name, "is required")),
                None => {}
            },
        }
    }
    Ok(inputs)
}

/// Reads run inputs given as text (`name`, `text` pairs, as a command line gives them): each
/// is typed by its declaration (strings as written, other types as JSON); with no declarations,
/// every value is a string. A name given twice is an error. The result is checked as
/// [`check_inputs`] checks any inputs.
pub(crate) fn inputs_from_text<'a>(
    declared: &[InputDecl],
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Map, InputError> {
    let mut inputs = Map::new();
    for (name, text) in pairs {
        let value = if declared.is_empty() {
            Value::from(text)
        } else {
            let decl = declared.iter().find(|d| d.name == name).ok_or_else(|| {
                let names: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
                InputError::new(
                    name,
                    format!(
                        "not declared by the begin node (declared: {})",
                        names.join(", ")
                    ),
                )
            })?;
            decl.ty
                .parse_text(text)
                .map_err(|problem| InputError::new(name, problem))?
        };
        if inputs.insert(name.to_owned(), value).is_some() {
            return Err(InputError::new(name, "is given twice"));
        }
    }
    check_inputs(declared, inputs)
}

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
