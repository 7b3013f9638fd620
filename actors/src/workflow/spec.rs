//! What validation makes of the kinds the engine runs itself: `loop` and `parallel` (a body
//! sub-graph run by their own actor) and `interactive` (pauses the run for a person's answer).
//!
//! `loop` params: `mode` (`condition` or `array`), `items` (array mode), `variables` (loop
//! variables and their initial values, read as `{{loop_id.NAME}}` and assigned by
//! `set_variable` with `variable: "loop_id.NAME"`), `until` (condition mode: `{logic,
//! conditions}` as in a switch case, checked after each iteration), `max_iterations` (default
//! 100, always enforced), `output` (evaluated at the end of each iteration; collected into the
//! loop's `history`). Inside the body `{{loop_id.index}}` and `{{loop_id.item}}` are the
//! iteration's index (from 0) and item.
//!
//! `parallel` params: `items`, `max_concurrency` (default 4), `on_error` (`fail_fast`, the
//! default, or `collect`), `output` (evaluated at the end of each item; collected into
//! `results` in input order). Inside the body `{{parallel_id.index}}` and
//! `{{parallel_id.item}}`.
//!
//! `interactive` params: `mode` (`form_input` with `fields`, or `user_select` with `options`)
//! and `prompt`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::GraphPlan;
use crate::reference::Template;
use crate::value::{Map, Value};

/// The default bound of loop iterations.
pub const DEFAULT_MAX_ITERATIONS: u32 = 100;
/// The default number of parallel items in flight.
pub const DEFAULT_MAX_CONCURRENCY: usize = 4;
/// Names a loop variable cannot take (they name the iteration's index and item).
pub(crate) const FRAME_FIELDS: &[&str] = &["index", "item"];

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

/// The type of a form field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    pub(crate) const NAMES: &'static [&'static str] = &["string", "integer", "number", "bool"];

    fn from_name(name: &str) -> Option<Self> {
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

    fn accepts(&self, value: &Value) -> bool {
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

/// A problem found while reading a spec: the field (within `params`) and what is wrong.
pub(crate) type SpecIssue = (String, String);

/// Reads an `interactive` node's params (already checked against its schema).
pub(crate) fn interaction(params: &serde_json::Value) -> Result<InteractionKind, Vec<SpecIssue>> {
    let mut issues = Vec::new();
    let kind = match params.get("mode").and_then(|m| m.as_str()) {
        Some("form_input") => {
            let mut fields = Vec::new();
            let list = params.get("fields").and_then(|f| f.as_array());
            if list.is_none_or(|l| l.is_empty()) {
                issues.push((
                    "fields".into(),
                    "a form_input needs at least one field".into(),
                ));
            }
            for (i, f) in list.into_iter().flatten().enumerate() {
                let name = f
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_owned();
                if fields.iter().any(|x: &FormField| x.name == name) {
                    issues.push((
                        format!("fields[{i}].name"),
                        format!("field `{name}` is declared twice"),
                    ));
                }
                let ty = f
                    .get("type")
                    .and_then(|t| t.as_str())
                    .and_then(FieldType::from_name)
                    .unwrap_or(FieldType::String);
                let default = f.get("default").map(Value::from);
                if let Some(d) = &default
                    && !d.is_null()
                    && !ty.accepts(d)
                {
                    issues.push((
                        format!("fields[{i}].default"),
                        format!("expected {}, found {}", ty.name(), d.type_name()),
                    ));
                }
                fields.push(FormField {
                    label: f.get("label").and_then(|l| l.as_str()).map(str::to_owned),
                    required: f.get("required").and_then(|r| r.as_bool()).unwrap_or(false),
                    name,
                    ty,
                    default,
                });
            }
            InteractionKind::FormInput { fields }
        }
        Some("user_select") => {
            let mut options = Vec::new();
            let list = params.get("options").and_then(|f| f.as_array());
            if list.is_none_or(|l| l.is_empty()) {
                issues.push((
                    "options".into(),
                    "a user_select needs at least one option".into(),
                ));
            }
            for (i, o) in list.into_iter().flatten().enumerate() {
                let (value, label) = match o {
                    serde_json::Value::String(s) => (s.clone(), s.clone()),
                    serde_json::Value::Object(m) => {
                        let value = m.get("value").and_then(|v| v.as_str()).map(str::to_owned);
                        let Some(value) = value else {
                            issues.push((
                                format!("options[{i}].value"),
                                "is required (a string)".into(),
                            ));
                            continue;
                        };
                        let label = m
                            .get("label")
                            .and_then(|v| v.as_str())
                            .map_or(value.clone(), str::to_owned);
                        (value, label)
                    }
                    _ => {
                        issues.push((
                            format!("options[{i}]"),
                            "expected a string or {value, label}".into(),
                        ));
                        continue;
                    }
                };
                if options.iter().any(|x: &SelectOption| x.value == value) {
                    issues.push((
                        format!("options[{i}].value"),
                        format!("option {value:?} is declared twice"),
                    ));
                }
                options.push(SelectOption { value, label });
            }
            InteractionKind::UserSelect { options }
        }
        _ => {
            return Err(vec![(
                "mode".into(),
                "expected form_input or user_select".into(),
            )]);
        }
    };
    if issues.is_empty() {
        Ok(kind)
    } else {
        Err(issues)
    }
}

/// A literal positive integer parameter, or `default` when absent. A reference is not allowed:
/// bounds must be known before the run.
pub(crate) fn positive(
    params: &serde_json::Value,
    field: &str,
    default: u64,
) -> Result<u64, SpecIssue> {
    match params.get(field) {
        None => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(n),
            _ => Err((
                field.into(),
                format!("expected a whole number of at least 1, found {v}"),
            )),
        },
    }
}
