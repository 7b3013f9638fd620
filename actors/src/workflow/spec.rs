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

use crate::model::{FieldType, FormField, InteractionKind, SelectOption, Value};

/// The default bound of loop iterations.
pub const DEFAULT_MAX_ITERATIONS: u32 = 100;
/// The default number of parallel items in flight.
pub const DEFAULT_MAX_CONCURRENCY: usize = 4;
/// Names a loop variable cannot take (they name the iteration's index and item).
pub(crate) const FRAME_FIELDS: &[&str] = &["index", "item"];

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
