//! Parameter schemas: what each node kind accepts in `params`, checked before any run.
//!
//! A kind declares its fields and their types; validation walks the raw JSON against it and
//! reports every mismatch with the node id and the field's path (`cases[0].conditions[1].op`).
//! A string that is exactly one reference (`"{{llm.count}}"`) is accepted for any type: its
//! value is only known at run time, where the handler checks it. A string mixing text and
//! references is text, so it is accepted where text is.

use super::reference::Reference;

/// The type of a parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamType {
    /// Anything.
    Any,
    /// Text; may contain references.
    String,
    /// A whole number.
    Integer,
    /// Any number.
    Number,
    /// `true` or `false`.
    Bool,
    /// A duration in humantime form: `"250ms"`, `"30s"`, `"1h 5m"`.
    Duration,
    /// One of a fixed set of strings.
    OneOf(&'static [&'static str]),
    /// A list whose items all have the given type.
    Array(Box<ParamType>),
    /// An object with declared fields.
    Object(ParamSchema),
    /// An object with arbitrary keys whose values have the given type.
    Map(Box<ParamType>),
}

impl ParamType {
    /// A list of items of type `item`.
    pub fn array(item: ParamType) -> Self {
        ParamType::Array(Box::new(item))
    }

    /// A map from text to values of type `value`.
    pub fn map(value: ParamType) -> Self {
        ParamType::Map(Box::new(value))
    }

    fn describe(&self) -> String {
        match self {
            ParamType::Any => "any value".into(),
            ParamType::String => "a string".into(),
            ParamType::Integer => "an integer".into(),
            ParamType::Number => "a number".into(),
            ParamType::Bool => "a boolean".into(),
            ParamType::Duration => "a duration such as \"250ms\" or \"30s\"".into(),
            ParamType::OneOf(options) => format!("one of {}", options.join(", ")),
            ParamType::Array(item) => format!("an array of {}", item.describe()),
            ParamType::Object(_) => "an object".into(),
            ParamType::Map(v) => format!("an object of {}", v.describe()),
        }
    }
}

/// One declared field.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The key in the JSON object.
    pub name: &'static str,
    /// Its type.
    pub ty: ParamType,
    /// Whether it must be present.
    pub required: bool,
}

/// The fields of an object.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParamSchema {
    fields: Vec<Field>,
    open: bool,
}

impl ParamSchema {
    /// Accepts any object (the default for host kinds that declare nothing).
    pub fn any() -> Self {
        Self {
            fields: Vec::new(),
            open: true,
        }
    }

    /// An object with exactly the fields added with [`required`](Self::required) and
    /// [`optional`](Self::optional); any other key is an error.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a required field.
    pub fn required(mut self, name: &'static str, ty: ParamType) -> Self {
        self.fields.push(Field {
            name,
            ty,
            required: true,
        });
        self
    }

    /// Adds an optional field.
    pub fn optional(mut self, name: &'static str, ty: ParamType) -> Self {
        self.fields.push(Field {
            name,
            ty,
            required: false,
        });
        self
    }

    /// Also accept keys that are not declared.
    pub fn allow_other_fields(mut self) -> Self {
        self.open = true;
        self
    }

    /// The declared fields.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Checks a JSON object against the schema; returns every problem found.
    pub fn check(&self, params: &serde_json::Value) -> Vec<ParamIssue> {
        let mut issues = Vec::new();
        check_object(self, params, "", &mut issues);
        issues
    }
}

/// A parameter that does not match its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamIssue {
    /// Path of the field within `params`, e.g. `cases[0].id`.
    pub field: String,
    /// What is wrong, e.g. `expected an integer, found a string`.
    pub problem: String,
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn check_object(
    schema: &ParamSchema,
    value: &serde_json::Value,
    at: &str,
    issues: &mut Vec<ParamIssue>,
) {
    let Some(object) = value.as_object() else {
        issues.push(ParamIssue {
            field: if at.is_empty() {
                "params".into()
            } else {
                at.into()
            },
            problem: format!("expected an object, found {}", json_type(value)),
        });
        return;
    };
    for field in &schema.fields {
        match object.get(field.name) {
            Some(v) => check_value(&field.ty, v, &join(at, field.name), issues),
            None if field.required => issues.push(ParamIssue {
                field: join(at, field.name),
                problem: format!("is required ({})", field.ty.describe()),
            }),
            None => {}
        }
    }
    if !schema.open {
        for key in object.keys() {
            if !schema.fields.iter().any(|f| f.name == key) {
                let known: Vec<&str> = schema.fields.iter().map(|f| f.name).collect();
                issues.push(ParamIssue {
                    field: join(at, key),
                    problem: if known.is_empty() {
                        "is not a known field (this kind takes no parameters)".into()
                    } else {
                        format!("is not a known field (known: {})", known.join(", "))
                    },
                });
            }
        }
    }
}

/// Whether a string is exactly one reference, whose type is only known at run time: what
/// `Template::compile` makes a `Template::Ref` of (`{{` at the start, the first `}}` at the
/// end, a valid reference between), decided without compiling the text.
fn is_single_reference(s: &str) -> bool {
    s.strip_prefix("{{")
        .and_then(|rest| Some((rest, rest.find("}}")?)))
        .is_some_and(|(rest, close)| {
            close + 2 == rest.len() && Reference::parse(&rest[..close]).is_ok()
        })
}

fn check_value(ty: &ParamType, value: &serde_json::Value, at: &str, issues: &mut Vec<ParamIssue>) {
    use serde_json::Value as J;
    if let J::String(s) = value
        && is_single_reference(s)
    {
        return;
    }
    let ok = match (ty, value) {
        (ParamType::Any, _) => true,
        (ParamType::String, J::String(_)) => true,
        (ParamType::Integer, J::Number(n)) => n.is_i64() || n.is_u64(),
        (ParamType::Number, J::Number(_)) => true,
        (ParamType::Bool, J::Bool(_)) => true,
        (ParamType::Duration, J::String(s)) => {
            if let Err(e) = humantime::parse_duration(s) {
                issues.push(ParamIssue {
                    field: at.into(),
                    problem: format!("is not a duration ({e}); write e.g. \"250ms\" or \"30s\""),
                });
            }
            true
        }
        (ParamType::OneOf(options), J::String(s)) => {
            if !options.contains(&s.as_str()) {
                issues.push(ParamIssue {
                    field: at.into(),
                    problem: format!("{s:?} is not one of {}", options.join(", ")),
                });
            }
            true
        }
        (ParamType::Array(item), J::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                check_value(item, v, &format!("{at}[{i}]"), issues);
            }
            true
        }
        (ParamType::Object(schema), J::Object(_)) => {
            check_object(schema, value, at, issues);
            true
        }
        (ParamType::Map(v_ty), J::Object(m)) => {
            for (k, v) in m {
                check_value(v_ty, v, &join(at, k), issues);
            }
            true
        }
        _ => false,
    };
    if !ok {
        issues.push(ParamIssue {
            field: at.into(),
            problem: format!("expected {}, found {}", ty.describe(), json_type(value)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::reference::Template;

    #[test]
    fn single_references_are_told_apart_as_compiling_would() {
        for text in [
            "{{a.text}}",
            "{{ a.text }}",
            "{{sys.query}}",
            "{{a}}",
            " {{a.text}}",
            "{{a.text}} ",
            "{{a.text}}{{b.text}}",
            "{{a.text}} and {{b.text}}",
            "{{a..b}}",
            "{{}}",
            "{{a.text",
            "{{a.text}}}}",
            "plain",
            "",
        ] {
            let compiled = matches!(
                Template::compile(&serde_json::Value::String(text.to_owned())),
                Ok(Template::Ref(_))
            );
            assert_eq!(is_single_reference(text), compiled, "{text:?}");
        }
    }
    use serde_json::json;

    fn schema() -> ParamSchema {
        ParamSchema::new()
            .required("text", ParamType::String)
            .optional("count", ParamType::Integer)
            .optional("wait", ParamType::Duration)
            .optional("mode", ParamType::OneOf(&["first", "all"]))
            .optional(
                "cases",
                ParamType::array(ParamType::Object(
                    ParamSchema::new()
                        .required("id", ParamType::String)
                        .optional("flag", ParamType::Bool),
                )),
            )
    }

    fn issues(v: serde_json::Value) -> Vec<(String, String)> {
        schema()
            .check(&v)
            .into_iter()
            .map(|i| (i.field, i.problem))
            .collect()
    }

    #[test]
    fn accepts_valid_params_and_references_for_any_type() {
        assert!(
            issues(json!({"text": "a {{x.y}}", "count": 0, "wait": "1s", "mode": "all"}))
                .is_empty()
        );
        assert!(
            issues(json!({"text": "{{x.n}}", "count": "{{x.n}}", "cases": "{{x.list}}"}))
                .is_empty()
        );
    }

    #[test]
    fn names_every_bad_field() {
        let got = issues(json!({
            "count": "three",
            "wait": "soon",
            "mode": "some",
            "cases": [{"id": "a"}, {"flag": 1}],
            "extra": true
        }));
        let fields: Vec<&str> = got.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "text",
                "count",
                "wait",
                "mode",
                "cases[1].id",
                "cases[1].flag",
                "extra"
            ]
        );
        assert!(
            got[1].1.contains("expected an integer, found a string"),
            "{got:?}"
        );
    }

    #[test]
    fn text_with_references_is_not_a_number() {
        let got = issues(json!({"text": "x", "count": "n={{x.n}}"}));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "count");
    }

    #[test]
    fn params_must_be_an_object() {
        let got = issues(json!([1]));
        assert_eq!(got[0].0, "params");
    }
}
