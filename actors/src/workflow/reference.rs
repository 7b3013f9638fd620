//! References and templates: `{{node_id.field.path}}`, `{{sys.query}}`, `{{env.NAME}}`.
//!
//! Node parameters are compiled once, at validation, into a [`Template`] tree: literals stay
//! literals, a string that is exactly one reference resolves to the referenced value with its
//! type, and a string mixing text and references renders to text. Resolution at run time walks
//! that tree against a [`Scope`]; it never re-parses text.
//!
//! Resolution rules, the same everywhere:
//! - a value that exists is used as it is: `0`, `""`, `false`, `[]` and `null` are values;
//! - a reference to a node that did not run (its branch was not taken) resolves to `null`,
//!   which renders as empty text;
//! - a reference to a field that does not exist in the output of a node that did run, or to a
//!   `sys` value the run does not have, is an error naming the reference.

use std::fmt;

use crate::model::{Map, NodeId, ResolveError, Value};

/// Where a reference starts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Root {
    /// The output of a node.
    Node(NodeId),
    /// A run-level value: `query`, `run_id`, `thread_id`, `workflow_id`.
    Sys,
    /// A workflow variable, declared under `variables` and assigned by `set_variable`.
    Env,
}

/// The `sys` keys a reference may name.
pub(crate) const SYS_KEYS: &[&str] = &["query", "run_id", "thread_id", "workflow_id"];

/// A parsed `{{...}}` reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Reference {
    root: Root,
    /// The steps after the root, joined by `.` (`text`, `a.b`; empty for `{{node}}`): one
    /// allocation per reference, however many steps.
    path: Box<str>,
}

impl Reference {
    /// Parses the inside of `{{ }}` (surrounding spaces allowed), e.g. `llm.text` or `sys.query`.
    pub(crate) fn parse(text: &str) -> Result<Self, ReferenceSyntaxError> {
        let inner = text.trim();
        let err = |reason: &'static str| ReferenceSyntaxError {
            text: text.to_owned(),
            reason,
        };
        if inner.is_empty() {
            return Err(err("is empty"));
        }
        let (head, path) = match inner.split_once('.') {
            Some((head, path)) => (head, Some(path)),
            None => (inner, None),
        };
        if !is_identifier(head) || path.is_some_and(|p| !p.split('.').all(is_identifier)) {
            return Err(err(
                "each dot-separated part must be letters, digits, `_` or `-`",
            ));
        }
        let root = match head {
            "sys" => Root::Sys,
            "env" => Root::Env,
            node => Root::Node(NodeId::new(node).map_err(|_| err("invalid node id"))?),
        };
        let path = path.unwrap_or_default();
        if matches!(root, Root::Sys | Root::Env) && path.is_empty() {
            return Err(err("needs a name after `sys.` or `env.`"));
        }
        Ok(Self {
            root,
            path: path.into(),
        })
    }

    /// Where the reference starts.
    pub(crate) fn root(&self) -> &Root {
        &self.root
    }

    /// The steps after the root.
    pub(crate) fn steps(&self) -> impl Iterator<Item = &str> {
        (!self.path.is_empty())
            .then(|| self.path.split('.'))
            .into_iter()
            .flatten()
    }

    /// Resolves the reference against a scope.
    pub(crate) fn resolve(&self, scope: &dyn Scope) -> Result<Value, ResolveError> {
        let mut steps = self.steps();
        // For `sys` and `env`, the first step names the value and the walk starts after it.
        let (base, skip) = match &self.root {
            Root::Node(node) => match scope.node_output(node) {
                NodeLookup::Output(v) => (v, 0),
                NodeLookup::DidNotRun => return Ok(Value::Null),
            },
            Root::Sys => match steps.next().and_then(|key| scope.sys(key)) {
                Some(v) => (v, 1),
                None => {
                    return Err(ResolveError {
                        reference: self.to_string(),
                        reason: "this run has no such value".into(),
                    });
                }
            },
            Root::Env => match steps.next().and_then(|key| scope.env(key)) {
                Some(v) => (v, 1),
                None => {
                    return Err(ResolveError {
                        reference: self.to_string(),
                        reason: "no such variable".into(),
                    });
                }
            },
        };
        let mut current = base;
        for (depth, step) in steps.enumerate() {
            match current.pointer([step]) {
                Some(next) => current = next,
                None => {
                    let at = if depth == 0 {
                        "the value".to_owned()
                    } else {
                        let walked: Vec<&str> = self.steps().skip(skip).take(depth).collect();
                        format!("`{}`", walked.join("."))
                    };
                    return Err(ResolveError {
                        reference: self.to_string(),
                        reason: format!("{at} ({}) has no field `{step}`", current.type_name()),
                    });
                }
            }
        }
        Ok(current.clone())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{{")?;
        match &self.root {
            Root::Node(n) => f.write_str(n.as_str())?,
            Root::Sys => f.write_str("sys")?,
            Root::Env => f.write_str("env")?,
        }
        if !self.path.is_empty() {
            write!(f, ".{}", self.path)?;
        }
        f.write_str("}}")
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `{{...}}` text that is not a valid reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad reference {text:?}: {reason}")]
pub(crate) struct ReferenceSyntaxError {
    /// The text between or around the braces.
    pub text: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// What a scope knows about a node.
#[derive(Debug)]
pub(crate) enum NodeLookup<'a> {
    /// The node ran and produced this output.
    Output(&'a Value),
    /// The node has not run in this run (a branch not taken).
    DidNotRun,
}

/// The run state references resolve against.
pub(crate) trait Scope {
    /// The output of a node, if it ran.
    fn node_output(&self, node: &NodeId) -> NodeLookup<'_>;
    /// A `sys` value.
    fn sys(&self, key: &str) -> Option<&Value>;
    /// A workflow variable.
    fn env(&self, key: &str) -> Option<&Value>;
}

/// A piece of a text template.
#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Text(String),
    Ref(Reference),
}

/// A compiled parameter value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Template {
    /// A value with no references in it.
    Literal(Value),
    /// A string that is exactly one reference: resolves to the referenced value, typed.
    Ref(Reference),
    /// A string with text and references: renders to text.
    Text(Vec<TextPart>),
    /// An array with references somewhere inside.
    Array(Vec<Template>),
    /// An object with references somewhere inside.
    Object(Vec<(String, Template)>),
}

/// A piece of a text template (opaque: build templates with [`Template::compile`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TextPart(Segment);

impl Template {
    /// Compiles a JSON value. Returns the template and every reference in it; a malformed
    /// `{{...}}` is an error with the JSON path of the string that holds it.
    pub(crate) fn compile(
        json: &serde_json::Value,
    ) -> Result<Template, (String, ReferenceSyntaxError)> {
        Self::compile_at(json, &mut String::new())
    }

    fn compile_at(
        json: &serde_json::Value,
        at: &mut String,
    ) -> Result<Template, (String, ReferenceSyntaxError)> {
        Ok(match json {
            serde_json::Value::String(s) => compile_text(s).map_err(|e| (at.clone(), e))?,
            serde_json::Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let len = at.len();
                    at.push_str(&format!("[{i}]"));
                    out.push(Self::compile_at(item, at)?);
                    at.truncate(len);
                }
                Self::array(out)
            }
            serde_json::Value::Object(m) => {
                let mut out = Vec::with_capacity(m.len());
                for (k, v) in m {
                    let len = at.len();
                    if !at.is_empty() {
                        at.push('.');
                    }
                    at.push_str(k);
                    out.push((k.clone(), Self::compile_at(v, at)?));
                    at.truncate(len);
                }
                Self::object(out)
            }
            other => Template::Literal(Value::from(other)),
        })
    }

    fn array(items: Vec<Template>) -> Template {
        if items.iter().all(|t| matches!(t, Template::Literal(_))) {
            Template::Literal(Value::Array(
                items
                    .into_iter()
                    .map(|t| match t {
                        Template::Literal(v) => v,
                        _ => Value::Null,
                    })
                    .collect(),
            ))
        } else {
            Template::Array(items)
        }
    }

    fn object(fields: Vec<(String, Template)>) -> Template {
        if fields
            .iter()
            .all(|(_, t)| matches!(t, Template::Literal(_)))
        {
            Template::Literal(Value::Object(
                fields
                    .into_iter()
                    .map(|(k, t)| match t {
                        Template::Literal(v) => (k, v),
                        _ => (k, Value::Null),
                    })
                    .collect(),
            ))
        } else {
            Template::Object(fields)
        }
    }

    /// Every reference in the template, with the JSON path of the value that holds it.
    pub(crate) fn references(&self) -> Vec<(String, &Reference)> {
        let mut out = Vec::new();
        self.collect_refs(&mut String::new(), &mut out);
        out
    }

    fn collect_refs<'a>(&'a self, at: &mut String, out: &mut Vec<(String, &'a Reference)>) {
        match self {
            Template::Literal(_) => {}
            Template::Ref(r) => out.push((at.clone(), r)),
            Template::Text(parts) => {
                for TextPart(seg) in parts {
                    if let Segment::Ref(r) = seg {
                        out.push((at.clone(), r));
                    }
                }
            }
            Template::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = at.len();
                    at.push_str(&format!("[{i}]"));
                    item.collect_refs(at, out);
                    at.truncate(len);
                }
            }
            Template::Object(fields) => {
                for (k, v) in fields {
                    let len = at.len();
                    if !at.is_empty() {
                        at.push('.');
                    }
                    at.push_str(k);
                    v.collect_refs(at, out);
                    at.truncate(len);
                }
            }
        }
    }

    /// Resolves the template against a scope.
    pub(crate) fn resolve(&self, scope: &dyn Scope) -> Result<Value, ResolveError> {
        Ok(match self {
            Template::Literal(v) => v.clone(),
            Template::Ref(r) => r.resolve(scope)?,
            Template::Text(parts) => {
                let mut out = String::new();
                for TextPart(seg) in parts {
                    match seg {
                        Segment::Text(t) => out.push_str(t),
                        Segment::Ref(r) => r.resolve(scope)?.render_into(&mut out),
                    }
                }
                Value::String(out)
            }
            Template::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|t| t.resolve(scope))
                    .collect::<Result<_, _>>()?,
            ),
            Template::Object(fields) => {
                let mut m = Map::new();
                for (k, t) in fields {
                    m.insert(k.clone(), t.resolve(scope)?);
                }
                Value::Object(m)
            }
        })
    }

    /// Whether the value is known without a scope.
    #[cfg(test)]
    pub(crate) fn is_literal(&self) -> bool {
        matches!(self, Template::Literal(_))
    }
}

/// Splits text into literal pieces and references.
fn compile_text(s: &str) -> Result<Template, ReferenceSyntaxError> {
    if !s.contains("{{") {
        return Ok(Template::Literal(Value::String(s.to_owned())));
    }
    let mut parts = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            return Err(ReferenceSyntaxError {
                text: rest[open..].chars().take(40).collect(),
                reason: "`{{` is never closed by `}}`",
            });
        };
        if open > 0 {
            parts.push(TextPart(Segment::Text(rest[..open].to_owned())));
        }
        parts.push(TextPart(Segment::Ref(Reference::parse(&after[..close])?)));
        rest = &after[close + 2..];
    }
    if !rest.is_empty() {
        parts.push(TextPart(Segment::Text(rest.to_owned())));
    }
    if let [TextPart(Segment::Ref(r))] = parts.as_slice() {
        return Ok(Template::Ref(r.clone()));
    }
    parts.shrink_to_fit();
    Ok(Template::Text(parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct TestScope {
        nodes: HashMap<NodeId, Value>,
        skipped: Vec<NodeId>,
        sys: Map,
        env: Map,
    }

    impl Scope for TestScope {
        fn node_output(&self, node: &NodeId) -> NodeLookup<'_> {
            match self.nodes.get(node) {
                Some(v) => NodeLookup::Output(v),
                None => {
                    assert!(self.skipped.contains(node), "unexpected lookup of {node}");
                    NodeLookup::DidNotRun
                }
            }
        }
        fn sys(&self, key: &str) -> Option<&Value> {
            self.sys.get(key)
        }
        fn env(&self, key: &str) -> Option<&Value> {
            self.env.get(key)
        }
    }

    fn id(s: &str) -> NodeId {
        NodeId::new(s).expect("id")
    }

    fn scope() -> TestScope {
        let out: Value = serde_json::json!({
            "zero": 0, "empty": "", "no": false, "none": [], "null": null,
            "items": [{"name": "a"}, {"name": "b"}], "text": "hello"
        })
        .into();
        TestScope {
            nodes: [(id("llm"), out)].into_iter().collect(),
            skipped: vec![id("other")],
            sys: [("query".to_owned(), Value::from("hi"))]
                .into_iter()
                .collect(),
            env: [("count".to_owned(), Value::Int(0))].into_iter().collect(),
        }
    }

    fn resolve(json: serde_json::Value) -> Result<Value, ResolveError> {
        Template::compile(&json)
            .expect("compiles")
            .resolve(&scope())
    }

    #[test]
    fn single_reference_keeps_type_including_falsy_values() {
        for (field, want) in [
            ("zero", Value::Int(0)),
            ("empty", Value::from("")),
            ("no", Value::Bool(false)),
            ("none", Value::Array(vec![])),
            ("null", Value::Null),
        ] {
            let got = resolve(serde_json::json!(format!("{{{{ llm.{field} }}}}")));
            assert_eq!(got, Ok(want), "field {field}");
        }
        assert_eq!(
            resolve(serde_json::json!("{{env.count}}")),
            Ok(Value::Int(0))
        );
    }

    #[test]
    fn text_renders_falsy_values_as_themselves() {
        let got = resolve(serde_json::json!(
            "[{{llm.zero}}|{{llm.empty}}|{{llm.no}}|{{llm.none}}|{{llm.items.1.name}}|{{sys.query}}]"
        ));
        assert_eq!(got, Ok(Value::from("[0||false|[]|b|hi]")));
    }

    #[test]
    fn node_that_did_not_run_is_null_and_renders_empty() {
        assert_eq!(
            resolve(serde_json::json!("{{other.text}}")),
            Ok(Value::Null)
        );
        assert_eq!(
            resolve(serde_json::json!("x{{other.text}}y")),
            Ok(Value::from("xy"))
        );
    }

    #[test]
    fn missing_field_and_sys_are_errors() {
        let e = resolve(serde_json::json!("{{llm.nope}}")).unwrap_err();
        assert_eq!(e.reference, "{{llm.nope}}");
        let e = resolve(serde_json::json!("{{llm.zero.deeper}}")).unwrap_err();
        assert!(e.reason.contains("integer"), "{e}");
        assert!(resolve(serde_json::json!("{{sys.run_id}}")).is_err());
        assert!(resolve(serde_json::json!("{{env.missing}}")).is_err());
    }

    #[test]
    fn nested_structures_resolve() {
        let got =
            resolve(serde_json::json!({"a": ["{{llm.zero}}", 1], "b": {"c": "t={{llm.text}}"}}));
        assert_eq!(
            got,
            Ok(serde_json::json!({"a": [0, 1], "b": {"c": "t=hello"}}).into())
        );
        let t = Template::compile(&serde_json::json!({"a": [1, "x"]})).expect("compiles");
        assert!(t.is_literal());
    }

    #[test]
    fn syntax_errors_name_the_path() {
        let (at, e) =
            Template::compile(&serde_json::json!({"cases": [{"left": "{{llm.text"}]})).unwrap_err();
        assert_eq!(at, "cases[0].left");
        assert!(e.reason.contains("never closed"));
        for bad in [
            "{{}}",
            "{{a..b}}",
            "{{a.}}",
            "{{.a}}",
            "{{sys}}",
            "{{env.}}",
            "{{a b}}",
            "{{llm.x y}}",
        ] {
            assert!(
                Template::compile(&serde_json::json!(bad)).is_err(),
                "{bad} should not compile"
            );
        }
    }

    #[test]
    fn references_are_listed_with_paths() {
        let t = Template::compile(
            &serde_json::json!({"p": "{{a.x}} and {{sys.query}}", "q": ["{{b}}"]}),
        )
        .expect("compiles");
        let refs: Vec<(String, String)> = t
            .references()
            .into_iter()
            .map(|(at, r)| (at, r.to_string()))
            .collect();
        assert_eq!(
            refs,
            vec![
                ("p".to_owned(), "{{a.x}}".to_owned()),
                ("p".to_owned(), "{{sys.query}}".to_owned()),
                ("q[0]".to_owned(), "{{b}}".to_owned()),
            ]
        );
    }
}
