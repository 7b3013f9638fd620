//! Conditions: `{left, op, right}` comparisons combined by `and` / `or`, as switch cases and
//! loop `until` clauses use them.
//!
//! Operators: `eq`, `ne` (numbers compare by value, `1 == 1.0`; no other coercion), `gt`,
//! `gte`, `lt`, `lte` (numbers, or two strings), `contains`, `not_contains` (substring, or
//! array element), `starts_with`, `ends_with` (strings), `empty`, `not_empty` (`null`, `""`,
//! `[]` and `{}` are empty; `0` and `false` are values and not empty). Comparing values of
//! types an operator does not accept fails with the case and condition named.

use std::cmp::Ordering;

use crate::model::{NodeError, Value};

/// The operators a condition may use.
pub(crate) const OPS: &[&str] = &[
    "eq",
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "contains",
    "not_contains",
    "starts_with",
    "ends_with",
    "empty",
    "not_empty",
];

/// Whether a case (`{logic, conditions}`) holds; `ci` names the case in errors.
pub(crate) fn case_matches(case: &Value, ci: usize) -> Result<bool, NodeError> {
    let any = case.get("logic").and_then(Value::as_str) == Some("or");
    let conditions = case
        .get("conditions")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            NodeError::invalid_input(format!("cases[{ci}].conditions"), "expected an array")
        })?;
    for (ki, cond) in conditions.iter().enumerate() {
        let field = || format!("cases[{ci}].conditions[{ki}]");
        let op = cond.get("op").and_then(Value::as_str).ok_or_else(|| {
            NodeError::invalid_input(format!("{}.op", field()), "expected a string")
        })?;
        let left = cond.get("left").unwrap_or(&Value::Null);
        let right = cond.get("right").unwrap_or(&Value::Null);
        let hit = evaluate(op, left, right)
            .map_err(|reason| NodeError::invalid_input(field(), reason))?;
        if hit == any {
            // `or` stops at the first true, `and` at the first false.
            return Ok(hit);
        }
    }
    Ok(!any)
}

/// Evaluates one condition.
pub(crate) fn evaluate(op: &str, left: &Value, right: &Value) -> Result<bool, String> {
    let mismatch = || {
        format!(
            "`{op}` cannot compare {} with {}",
            left.type_name(),
            right.type_name()
        )
    };
    Ok(match op {
        "eq" => equal(left, right),
        "ne" => !equal(left, right),
        "gt" | "gte" | "lt" | "lte" => {
            let ord = order(left, right).ok_or_else(mismatch)?;
            match op {
                "gt" => ord == Ordering::Greater,
                "gte" => ord != Ordering::Less,
                "lt" => ord == Ordering::Less,
                _ => ord != Ordering::Greater,
            }
        }
        "contains" | "not_contains" => {
            let hit = match (left, right) {
                (Value::String(l), Value::String(r)) => l.contains(r.as_str()),
                (Value::Array(items), r) => items.iter().any(|i| equal(i, r)),
                _ => return Err(mismatch()),
            };
            hit == (op == "contains")
        }
        "starts_with" | "ends_with" => match (left, right) {
            (Value::String(l), Value::String(r)) if op == "starts_with" => {
                l.starts_with(r.as_str())
            }
            (Value::String(l), Value::String(r)) => l.ends_with(r.as_str()),
            _ => return Err(mismatch()),
        },
        "empty" | "not_empty" => {
            let empty = match left {
                Value::Null => true,
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(m) => m.is_empty(),
                Value::Bool(_) | Value::Int(_) | Value::Float(_) => false,
            };
            empty == (op == "empty")
        }
        other => return Err(format!("unknown operator `{other}`")),
    })
}

fn equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn order(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_by_data() {
        let s = |t: &str| Value::from(t);
        let i = Value::Int;
        let cases: Vec<(&str, Value, Value, Result<bool, ()>)> = vec![
            ("eq", i(1), Value::Float(1.0), Ok(true)),
            ("eq", s("1"), i(1), Ok(false)),
            ("eq", i(0), Value::Bool(false), Ok(false)),
            ("ne", s("a"), s("b"), Ok(true)),
            ("gt", i(3), i(2), Ok(true)),
            ("gte", i(2), i(2), Ok(true)),
            ("lt", s("a"), s("b"), Ok(true)),
            ("lte", i(3), i(2), Ok(false)),
            ("gt", s("3"), i(2), Err(())),
            ("contains", s("refund please"), s("refund"), Ok(true)),
            ("contains", Value::from(vec![1, 2]), i(2), Ok(true)),
            ("not_contains", s("hello"), s("x"), Ok(true)),
            ("contains", i(12), i(1), Err(())),
            ("starts_with", s("hello"), s("he"), Ok(true)),
            ("ends_with", s("hello"), s("lo"), Ok(true)),
            ("empty", Value::Null, Value::Null, Ok(true)),
            ("empty", s(""), Value::Null, Ok(true)),
            ("empty", Value::Array(vec![]), Value::Null, Ok(true)),
            ("empty", i(0), Value::Null, Ok(false)),
            ("empty", Value::Bool(false), Value::Null, Ok(false)),
            ("not_empty", i(0), Value::Null, Ok(true)),
        ];
        for (op, l, r, want) in cases {
            let got = evaluate(op, &l, &r).map_err(|_| ());
            assert_eq!(got, want, "{l} {op} {r}");
        }
    }
}
