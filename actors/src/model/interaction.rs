//! Human in the loop: an [`Interaction`] is a pause at an `interactive` node, named by its full
//! path through loop iterations and parallel items. The run that reaches it checkpoints and
//! ends as `AwaitingInput`; a resume with the answer continues in the exact frame.

use serde::{Deserialize, Serialize};

use super::ids::{InteractionId, NodeId};
use super::path::NodePath;
use super::value::{Map, Value};

/// A question waiting for a person's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interaction {
    /// Names this pause; the answer must quote it (a stale id is refused).
    pub id: InteractionId,
    /// Where: the interactive node through every enclosing loop iteration and parallel item.
    pub path: NodePath,
    /// The interactive node.
    pub node: NodeId,
    /// The rendered `prompt`, if the node has one.
    pub prompt: Option<String>,
    /// What is asked: a form or a choice.
    pub kind: InteractionKind,
}

/// The type of a form field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FieldType {
    /// Text.
    String,
    /// A whole number.
    Integer,
    /// Any number.
    Number,
    /// A boolean.
    Bool,
}

impl FieldType {
    pub const NAMES: &'static [&'static str] = &["string", "integer", "number", "bool"];

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "string" => FieldType::String,
            "integer" => FieldType::Integer,
            "number" => FieldType::Number,
            "bool" => FieldType::Bool,
            _ => return None,
        })
    }

    /// The name used in `fields[].type`.
    pub fn name(&self) -> &'static str {
        match self {
            FieldType::String => "string",
            FieldType::Integer => "integer",
            FieldType::Number => "number",
            FieldType::Bool => "bool",
        }
    }

    pub(crate) fn accepts(&self, value: &Value) -> bool {
        match self {
            FieldType::String => matches!(value, Value::String(_)),
            FieldType::Integer => value.as_i64().is_some(),
            FieldType::Number => value.as_f64().is_some(),
            FieldType::Bool => matches!(value, Value::Bool(_)),
        }
    }
}

/// One field of a form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormField {
    /// The key in the answer.
    pub name: String,
    /// Its type.
    pub ty: FieldType,
    /// Whether the answer must contain it (non-null).
    pub required: bool,
    /// What to show.
    pub label: Option<String>,
    /// The value used when an optional field is not answered.
    pub default: Option<Value>,
}

/// One option of a selection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectOption {
    /// The value the answer names.
    pub value: String,
    /// What to show.
    pub label: String,
}

/// What an interactive node asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum InteractionKind {
    /// A form: the answer is an object with the fields' values; the node outputs it.
    FormInput {
        /// The fields.
        fields: Vec<FormField>,
    },
    /// A choice: the answer is one option's value; the node outputs `{value, label}`.
    UserSelect {
        /// The options.
        options: Vec<SelectOption>,
    },
}

/// An answer that does not fit its interaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {problem}")]
pub struct AnswerError {
    /// The field (for forms) or `value` (for selections).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

impl InteractionKind {
    /// Checks an answer and turns it into the node's output.
    pub fn accept(&self, answer: &Value) -> Result<Value, AnswerError> {
        match self {
            InteractionKind::FormInput { fields } => {
                let Value::Object(given) = answer else {
                    return Err(AnswerError {
                        field: "answer".into(),
                        problem: format!("expected an object, found {}", answer.type_name()),
                    });
                };
                if let Some(unknown) = given.keys().find(|k| !fields.iter().any(|f| &f.name == *k))
                {
                    return Err(AnswerError {
                        field: unknown.clone(),
                        problem: "is not a field of this form".into(),
                    });
                }
                let mut out = Map::new();
                for field in fields {
                    match given.get(&field.name) {
                        Some(v) if !v.is_null() => {
                            if !field.ty.accepts(v) {
                                return Err(AnswerError {
                                    field: field.name.clone(),
                                    problem: format!(
                                        "expected {}, found {}",
                                        field.ty.name(),
                                        v.type_name()
                                    ),
                                });
                            }
                            out.insert(field.name.clone(), v.clone());
                        }
                        _ if field.required => {
                            return Err(AnswerError {
                                field: field.name.clone(),
                                problem: "is required".into(),
                            });
                        }
                        _ => {
                            out.insert(
                                field.name.clone(),
                                field.default.clone().unwrap_or(Value::Null),
                            );
                        }
                    }
                }
                Ok(Value::Object(out))
            }
            InteractionKind::UserSelect { options } => {
                let chosen = match answer {
                    Value::String(s) => s.as_str(),
                    Value::Object(m) => m.get("value").and_then(Value::as_str).unwrap_or(""),
                    other => {
                        return Err(AnswerError {
                            field: "value".into(),
                            problem: format!(
                                "expected an option's value, found {}",
                                other.type_name()
                            ),
                        });
                    }
                };
                let option =
                    options
                        .iter()
                        .find(|o| o.value == chosen)
                        .ok_or_else(|| AnswerError {
                            field: "value".into(),
                            problem: format!(
                                "{chosen:?} is not an option (options: {})",
                                options
                                    .iter()
                                    .map(|o| o.value.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        })?;
                let mut out = Map::new();
                out.insert("value".into(), Value::String(option.value.clone()));
                out.insert("label".into(), Value::String(option.label.clone()));
                Ok(Value::Object(out))
            }
        }
    }
}
