//! The `switch` kind: routes to downstream nodes by conditions, with an `else` branch.
//!
//! ```json
//! {"id": "route", "kind": "switch", "params": {
//!   "mode": "first",
//!   "cases": [
//!     {"id": "refund", "logic": "and", "conditions": [
//!       {"left": "{{classify.label}}", "op": "eq", "right": "refund"}]},
//!     {"id": "vip", "conditions": [{"left": "{{begin.tier}}", "op": "gte", "right": 3}]}
//!   ]}}
//! ```
//!
//! Each case has an id; an edge leaving the switch names the case it belongs to in `branch`
//! (or `else`). `mode: "first"` (default) takes the first matching case; `mode: "all"` takes
//! every matching case, so several downstream nodes may run. When no case matches, `else` is
//! taken. Several edges may share a branch. The output is `{"matched": [ids], "branch": id}`.
//!
//! Operators: `eq`, `ne` (numbers compare by value, `1 == 1.0`; no other coercion), `gt`,
//! `gte`, `lt`, `lte` (numbers, or two strings), `contains`, `not_contains` (substring, or
//! array element), `starts_with`, `ends_with` (strings), `empty`, `not_empty` (`null`, `""`,
//! `[]` and `{}` are empty; `0` and `false` are values and not empty). Comparing values of
//! types an operator does not accept fails the node with the case and condition named.

use async_trait::async_trait;

use super::handler::{NodeContext, NodeHandler};
use crate::model::{Map, NodeError, NodeOutput, Value};
use crate::workflow::{OPS, ParamSchema, ParamType, case_matches};

/// The branch taken when no case matches.
pub const ELSE: &str = "else";

/// The `switch` handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct Switch;

#[async_trait]
impl NodeHandler for Switch {
    fn never_blocks(&self) -> bool {
        true
    }

    fn params(&self) -> ParamSchema {
        let condition = ParamSchema::new()
            .required("left", ParamType::Any)
            .required("op", ParamType::OneOf(OPS))
            .optional("right", ParamType::Any);
        let case = ParamSchema::new()
            .required("id", ParamType::String)
            .optional("logic", ParamType::OneOf(&["and", "or"]))
            .required("conditions", ParamType::array(ParamType::Object(condition)));
        ParamSchema::new()
            .optional("mode", ParamType::OneOf(&["first", "all"]))
            .required("cases", ParamType::array(ParamType::Object(case)))
    }

    fn branches(&self, params: &serde_json::Value) -> Option<Vec<String>> {
        let mut branches: Vec<String> = params
            .get("cases")
            .and_then(|c| c.as_array())
            .map(|cases| {
                cases
                    .iter()
                    .filter_map(|c| c.get("id")?.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        branches.push(ELSE.to_owned());
        Some(branches)
    }

    async fn run(&self, input: Value, _ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let all = input.get("mode").and_then(Value::as_str) == Some("all");
        let cases = input
            .get("cases")
            .and_then(Value::as_array)
            .ok_or_else(|| NodeError::invalid_input("cases", "expected an array"))?;
        let mut matched = Vec::new();
        for (ci, case) in cases.iter().enumerate() {
            let id = case.get("id").and_then(Value::as_str).ok_or_else(|| {
                NodeError::invalid_input(format!("cases[{ci}].id"), "expected a string")
            })?;
            if case_matches(case, ci)? {
                matched.push(id.to_owned());
                if !all {
                    break;
                }
            }
        }
        let branch = matched.first().cloned().unwrap_or_else(|| ELSE.to_owned());
        let branches = if matched.is_empty() {
            vec![ELSE.to_owned()]
        } else {
            matched.clone()
        };
        let mut out = Map::new();
        out.insert("matched".into(), Value::from(matched));
        out.insert("branch".into(), Value::String(branch));
        Ok(NodeOutput::new(Value::Object(out)).with_branches(branches))
    }
}
