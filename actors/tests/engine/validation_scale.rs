//! Validation at scale: reports stay bounded however many problems a workflow has (each
//! distinct problem once, one problem per unknown kind, at most `ValidationErrors::LISTED`
//! listed, lists inside a problem cut short), and large workflows of every shape (long chains
//! with far references, wide fan-out/fan-in, nested bodies) validate with the same strictness
//! as small ones.

use runvisor_actors::{BodyDef, NodeDef, Runtime, ValidationErrors, WorkflowDef, WorkflowError};
use serde_json::json;

use super::support::*;

fn template(id: &str, text: &str) -> NodeDef {
    NodeDef::new(id, "template").param("template", text)
}

fn errors_of(rt: &Runtime, def: WorkflowDef) -> ValidationErrors {
    match rt.validate(def) {
        Ok(wf) => panic!("workflow should be invalid: {wf:?}"),
        Err(errors) => errors,
    }
}

/// `begin -> n1 -> ... -> n{len}`, every node of `kind`.
fn chain_of(kind: &str, len: usize) -> WorkflowDef {
    let mut def = WorkflowDef::new("chain").node(NodeDef::new("start", "begin"));
    let mut prev = "start".to_owned();
    for i in 1..=len {
        let id = format!("n{i}");
        def = def.node(NodeDef::new(&id, kind)).edge(&prev, &id);
        prev = id;
    }
    def
}

#[test]
fn an_unknown_kind_on_ten_thousand_nodes_is_one_short_problem() {
    let rt = runtime();
    let errors = errors_of(&rt, chain_of("gpt", 10_000));
    let [WorkflowError::UnknownKind { kind, nodes, known }] = errors.errors() else {
        panic!("expected one UnknownKind, got {} problems", errors.len());
    };
    assert_eq!(kind, "gpt");
    assert_eq!(nodes.len(), 10_000);
    assert_eq!((nodes[0].as_str(), nodes[9_999].as_str()), ("n1", "n10000"));
    assert!(known.contains(&"template".to_owned()), "{known:?}");

    let text = errors.to_string();
    assert!(text.len() < 2_048, "{} bytes: {text}", text.len());
    assert!(
        text.starts_with(
            "nodes `n1`, `n2`, `n3`, `n4`, `n5`, `n6`, `n7`, `n8`, `n9`, `n10` and 9990 more: \
             field `kind`: unknown kind `gpt` (known: begin, "
        ),
        "{text}"
    );
    assert_eq!(
        text.matches("template").count(),
        1,
        "known kinds once: {text}"
    );
}

#[test]
fn several_unknown_kinds_are_one_problem_each_in_the_order_found() {
    let rt = runtime();
    let def = WorkflowDef::new("w")
        .node(NodeDef::new("start", "begin"))
        .node(NodeDef::new("a", "gpt"))
        .node(NodeDef::new("b", "claude"))
        .node(NodeDef::new("c", "gpt"))
        .edge("start", "a")
        .edge("a", "b")
        .edge("b", "c");
    let errors = errors_of(&rt, def);
    let found: Vec<(&str, Vec<&str>)> = errors
        .errors()
        .iter()
        .map(|e| match e {
            WorkflowError::UnknownKind { kind, nodes, .. } => {
                (kind.as_str(), nodes.iter().map(String::as_str).collect())
            }
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(found, [("gpt", vec!["a", "c"]), ("claude", vec!["b"])]);
    assert!(
        errors.errors()[0]
            .to_string()
            .starts_with("nodes `a`, `c`: field `kind`: unknown kind `gpt` (known: "),
        "{errors}"
    );
}

#[test]
fn a_hundred_and_fifty_problems_list_a_hundred_then_the_count() {
    let rt = runtime();
    let mut def = WorkflowDef::new("w").node(NodeDef::new("start", "begin"));
    for i in 0..150 {
        let id = format!("t{i}");
        def = def
            .node(NodeDef::new(&id, "template").param("template", i))
            .edge("start", &id);
    }
    let errors = errors_of(&rt, def);
    assert_eq!(errors.len(), 150);
    assert_eq!(errors.listed().len(), ValidationErrors::LISTED);
    assert_eq!(errors.unlisted(), 50);
    assert!(
        matches!(&errors.listed()[99], WorkflowError::InvalidParam { node, .. } if node == "t99")
    );

    let text = errors.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + 100 + 1, "{text}");
    assert_eq!(lines[0], "150 problems in workflow:");
    assert!(lines[1].starts_with("  - node `t0`: "), "{text}");
    assert!(lines[100].starts_with("  - node `t99`: "), "{text}");
    assert_eq!(lines[101], "  and 50 more");
}

#[test]
fn identical_problems_are_reported_once() {
    let rt = runtime();
    let def = WorkflowDef::new("w")
        .node(NodeDef::new("start", "begin"))
        .node(template("a", "{{ghost.text}} {{ghost.text}}"))
        .node(template("b", "x"))
        .node(template("b", "y"))
        .node(template("b", "z"))
        .edge("start", "a")
        .edge("start", "b");
    let errors = errors_of(&rt, def);
    assert_eq!(
        errors.errors(),
        [WorkflowError::DuplicateId { node: "b".into() }]
    );
    let def = WorkflowDef::new("w")
        .node(NodeDef::new("start", "begin"))
        .node(template("a", "{{ghost.text}} and {{ghost.text}}"))
        .edge("start", "a");
    assert_eq!(
        errors_of(&rt, def).errors(),
        [WorkflowError::UnknownReference {
            node: "a".into(),
            field: "template".into(),
            reference: "{{ghost.text}}".into(),
            problem: "no node `ghost`".into(),
        }]
    );
}

#[test]
fn long_lists_inside_one_problem_are_cut_short() {
    let rt = runtime();
    // A cycle of 500 nodes.
    let mut def = WorkflowDef::new("w")
        .node(NodeDef::new("start", "begin"))
        .edge("start", "c0");
    for i in 0..500 {
        def = def
            .node(template(&format!("c{i}"), "x"))
            .edge(format!("c{i}"), format!("c{}", (i + 1) % 500));
    }
    let text = errors_of(&rt, def).to_string();
    assert_eq!(
        text,
        "node `c0`: field `edges`: cycle c0 -> c1 -> c2 -> c3 -> c4 -> c5 -> c6 -> c7 -> c8 -> c9 \
         -> ... (490 more) -> c0"
    );

    // 300 `begin` nodes.
    let mut def = WorkflowDef::new("w");
    for i in 0..300 {
        def = def.node(NodeDef::new(format!("s{i}"), "begin"));
    }
    let errors = errors_of(&rt, def);
    let [WorkflowError::MultipleEntries { nodes }] = errors.errors() else {
        panic!("{errors}");
    };
    assert_eq!(nodes.len(), 300);
    assert!(
        errors
            .to_string()
            .starts_with("workflow: field `nodes`: 300 entries (s0, s1, "),
        "{errors}"
    );
    assert!(
        errors.to_string().contains("s9 and 290 more); exactly one"),
        "{errors}"
    );

    // A switch with 1,000 cases, and an edge naming none of them.
    let cases: Vec<serde_json::Value> = (0..1000)
        .map(
            |i| json!({"id": format!("k{i}"), "conditions": [{"left": 1, "op": "eq", "right": 1}]}),
        )
        .collect();
    let def = WorkflowDef::new("w")
        .node(NodeDef::new("start", "begin"))
        .node(NodeDef::new("route", "switch").param("cases", cases))
        .node(template("t", "x"))
        .edge("start", "route")
        .branch("route", "nope", "t");
    let text = errors_of(&rt, def).to_string();
    assert!(text.len() < 1_024, "{} bytes: {text}", text.len());
    assert!(text.contains("k18, k19 and 981 more"), "{text}");
}

/// `start -> n1 -> ... -> n{len}`: each node references its predecessor, the node halfway
/// back, and the entry; the last node also references a node that is not upstream when
/// `break_it` is set.
fn far_chain(len: usize, break_it: bool) -> WorkflowDef {
    let mut def = WorkflowDef::new("chain").node(NodeDef::new("start", "begin"));
    let mut prev = "start".to_owned();
    for i in 1..=len {
        let id = format!("n{i}");
        let far = if i >= 2 {
            format!("n{}", i / 2)
        } else {
            "start".into()
        };
        let text = format!("{{{{{prev}.text}}}} {{{{{far}.text}}}} {{{{sys.query}}}}");
        def = def.node(template(&id, &text)).edge(&prev, &id);
        prev = id;
    }
    if break_it {
        def = def
            .node(template("side", "{{n1.text}}"))
            .edge("start", "side")
            .node(template("late", "{{side.text}}"))
            .edge(&prev, "late");
    }
    def
}

#[test]
fn a_long_chain_with_far_references_validates_and_stays_strict() {
    let rt = runtime();
    let len = 20_000;
    match rt.validate(far_chain(len, false)) {
        Ok(wf) => assert_eq!(wf.node_ids().count(), len + 1),
        Err(errors) => panic!("{errors}"),
    }
    // `side` hangs off the entry: `late` (at the end of the chain) does not follow it, and
    // `side` does not follow `n1`.
    let errors = errors_of(&rt, far_chain(len, true));
    let targets: Vec<(&str, &str)> = errors
        .errors()
        .iter()
        .map(|e| match e {
            WorkflowError::NotUpstream { node, target, .. } => (node.as_str(), target.as_str()),
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(targets, [("side", "n1"), ("late", "side")]);
}

#[test]
fn a_wide_fan_out_and_fan_in_validates_and_stays_strict() {
    let rt = runtime();
    let width = 20_000;
    let mut def = WorkflowDef::new("fan").node(NodeDef::new("start", "begin"));
    let mut join = String::new();
    for i in 0..width {
        let id = format!("w{i}");
        // Each branch reads its left neighbour, which is not upstream of it.
        let text = if i == width - 1 {
            format!("{{{{w{}.text}}}}", i - 1)
        } else {
            "{{start.query}}".to_owned()
        };
        def = def
            .node(template(&id, &text))
            .edge("start", &id)
            .edge(&id, "join");
        if i % 97 == 0 {
            join.push_str(&format!("{{{{{id}.text}}}} "));
        }
    }
    def = def.node(template("join", &join));
    let errors = errors_of(&rt, def);
    assert_eq!(
        errors.errors(),
        [WorkflowError::NotUpstream {
            node: format!("w{}", width - 1),
            field: "template".into(),
            reference: format!("{{{{w{}.text}}}}", width - 2),
            target: format!("w{}", width - 2),
        }]
    );
}

/// `count` loops in a chain; each body is a chain of `len` nodes reading the loop's frame, the
/// loop before and a node upstream in the body, with a nested parallel at its end whose body
/// reads all three levels.
fn nested(count: usize, len: usize, bad: bool) -> WorkflowDef {
    let mut def = WorkflowDef::new("nested").node(NodeDef::new("start", "begin"));
    let mut prev = "start".to_owned();
    for l in 0..count {
        let lp = format!("l{l}");
        let mut body = BodyDef {
            nodes: Vec::new(),
            edges: Vec::new(),
        };
        let mut before = String::new();
        for i in 0..len {
            let id = format!("l{l}b{i}");
            let mut text = format!("{{{{{lp}.index}}}} {{{{{prev}.text}}}}");
            if !before.is_empty() {
                text.push_str(&format!(" {{{{{before}.text}}}}"));
                body.edges.push(runvisor_actors::EdgeDef {
                    from: before.clone(),
                    to: id.clone(),
                    branch: None,
                });
            }
            body.nodes.push(template(&id, &text));
            before = id;
        }
        let inner_ref = if bad && l == count - 1 {
            // A later loop's body node: not upstream of anything here.
            "l0b0".to_owned()
        } else {
            before.clone()
        };
        let par = format!("l{l}p");
        let mut inner = NodeDef::new(&par, "parallel").param("items", json!([1, 2]));
        inner.body = Some(BodyDef {
            nodes: vec![template(
                &format!("l{l}i"),
                &format!(
                    "{{{{{par}.item}}}} {{{{{lp}.index}}}} {{{{{inner_ref}.text}}}} {{{{start.query}}}}"
                ),
            )],
            edges: Vec::new(),
        });
        body.nodes.push(inner);
        body.edges.push(runvisor_actors::EdgeDef {
            from: before.clone(),
            to: par,
            branch: None,
        });
        let mut node = NodeDef::new(&lp, "loop").params(json!({
            "mode": "array",
            "items": [1, 2, 3],
            "output": format!("{{{{{before}.text}}}}")
        }));
        node.body = Some(body);
        def = def.node(node).edge(&prev, &lp);
        prev = lp;
    }
    def
}

#[test]
fn many_nested_bodies_validate_and_stay_strict() {
    let rt = runtime();
    let (count, len) = (200, 50);
    match rt.validate(nested(count, len, false)) {
        Ok(wf) => assert_eq!(wf.node_ids().count(), count + 1),
        Err(errors) => panic!("{errors}"),
    }
    let errors = errors_of(&rt, nested(count, len, true));
    let last = count - 1;
    assert_eq!(
        errors.errors(),
        [WorkflowError::NotUpstream {
            node: format!("l{last}i"),
            field: "template".into(),
            reference: "{{l0b0.text}}".into(),
            target: "l0b0".into(),
        }]
    );
}
