//! Ops queries on live runs: `runs()` lists a blocked run with its running node, `tree()`
//! returns the supervisor and its node actors; both forget the run once it ended.

use runvisor_actors::{NodeId, QueryError, RunEvent, RunHandle, RunId, RunStatus};
use serde_json::json;

use super::support::*;

fn node(id: &str) -> NodeId {
    NodeId::new(id).expect("node id")
}

fn path(id: &str) -> runvisor_actors::NodePath {
    runvisor_actors::NodePath::node(node(id))
}

/// Reads the run's events until every given node has started (bounded).
async fn until_started(run: &RunHandle, nodes: &[&str]) {
    let mut stream = run.events();
    let mut waiting: Vec<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
    within("NodeStarted events", async {
        while !waiting.is_empty() {
            match stream.next().await {
                Some(RunEvent::NodeStarted { path, .. }) => {
                    waiting.retain(|n| *n != path.to_string());
                }
                Some(_) => {}
                None => panic!("run ended before {waiting:?} started"),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_blocked_run_is_listed_with_its_running_node_and_tree() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "ops-wf", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "blocked", "kind": "hold", "params": {"x": 1}},
            {"id": "after", "kind": "template", "params": {"template": "done {{blocked.x}}"}}
        ], "edges": [{"from": "start", "to": "blocked"}, {"from": "blocked", "to": "after"}]}),
    );
    let run =
        h.rt.start(&wf, Default::default(), thread("ops-thread"))
            .await
            .expect("start");
    let run_id = run.run_id();
    until_started(&run, &["blocked"]).await;
    assert!(
        h.log.wait_mark("blocked:started", PATIENCE).await,
        "handler did not start"
    );

    let runs = h.rt.runs();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let summary = &runs[0];
    assert_eq!(summary.run_id, run_id);
    assert_eq!(summary.thread, thread("ops-thread"));
    assert_eq!(summary.workflow_id, "ops-wf");
    assert_eq!(summary.status, RunStatus::Running);
    assert_eq!(summary.running_nodes, [path("blocked")]);
    let record =
        h.rt.run_store()
            .get(run_id)
            .await
            .expect("run store answers")
            .expect("run recorded");
    assert_eq!(record.status, RunStatus::Running);
    assert_eq!(summary.started_at_ms, record.started_at_ms);
    assert_eq!(h.rt.registry().summary(&run_id).as_ref(), Some(summary));

    let tree = h.rt.tree(run_id).await.expect("tree of a live run");
    assert_eq!(tree.kind, "run_supervisor");
    assert_eq!(tree.node_id, None);
    assert_eq!(tree.status, "running");
    assert_eq!(tree.children.len(), 1, "{tree:#?}");
    let child = &tree.children[0];
    assert_eq!(child.kind, "node");
    assert_eq!(child.node_id, Some(node("blocked")));
    assert_eq!(child.status, "running");
    assert!(child.children.is_empty());
    assert!(!child.actor_id.is_empty() && !tree.actor_id.is_empty());
    assert_ne!(child.actor_id, tree.actor_id);

    h.log.mark("blocked:release");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(text(&outcome, "after"), "done 1");
    assert_eq!(h.rt.tree(run_id).await, Err(QueryError::UnknownRun(run_id)));
    assert!(h.rt.runs().is_empty());
    assert_eq!(h.rt.registry().summary(&run_id), None);
}

#[tokio::test]
async fn tree_lists_every_running_branch_with_distinct_actors() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "ops-fan", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "b", "kind": "hold"},
            {"id": "a", "kind": "hold"}
        ], "edges": [{"from": "start", "to": "a"}, {"from": "start", "to": "b"}]}),
    );
    let run =
        h.rt.start(&wf, Default::default(), thread("ops-fan"))
            .await
            .expect("start");
    let run_id = run.run_id();
    until_started(&run, &["a", "b"]).await;

    let summary = h.rt.registry().summary(&run_id).expect("listed");
    assert_eq!(summary.running_nodes, [path("a"), path("b")]);
    let tree = h.rt.tree(run_id).await.expect("tree");
    let nodes: Vec<(Option<NodeId>, &str, &str)> = tree
        .children
        .iter()
        .map(|c| (c.node_id.clone(), c.kind.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        nodes,
        [
            (Some(node("a")), "node", "running"),
            (Some(node("b")), "node", "running")
        ]
    );
    let mut ids: Vec<&str> = tree.children.iter().map(|c| c.actor_id.as_str()).collect();
    ids.push(&tree.actor_id);
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "actor ids must differ: {tree:#?}");

    // Releasing one branch leaves the other listed.
    h.log.mark("a:release");
    within("a to finish", async {
        loop {
            let running = h.rt.registry().summary(&run_id).map(|s| s.running_nodes);
            if running.as_deref() == Some(&[path("b")][..]) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    let tree = h.rt.tree(run_id).await.expect("tree");
    assert_eq!(
        tree.children
            .iter()
            .map(|c| c.node_id.clone())
            .collect::<Vec<_>>(),
        [Some(node("b"))]
    );

    h.log.mark("b:release");
    let outcome = finish(&run).await;
    assert_eq!(outcome.status(), RunStatus::Succeeded, "{outcome:#?}");
    assert_eq!(h.rt.tree(run_id).await, Err(QueryError::UnknownRun(run_id)));
}

#[tokio::test]
async fn tree_of_an_unknown_run() {
    let rt = runtime();
    let id = RunId::new();
    assert_eq!(rt.tree(id).await, Err(QueryError::UnknownRun(id)));
    assert!(rt.runs().is_empty());
}

#[tokio::test]
async fn a_tree_shows_each_actor_by_path_with_the_loop_iteration_and_the_items_in_flight() {
    let h = host();
    let wf = load(
        &h.rt,
        json!({"id": "tree-bodies", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "l", "kind": "loop", "params": {"mode": "array", "items": [1, 2]},
             "body": {"nodes": [
                {"id": "p", "kind": "parallel", "params": {
                    "items": [10, 20, 30], "max_concurrency": 2
                }, "body": {"nodes": [
                    {"id": "w", "kind": "hold", "params": {"x": "{{p.item}}"}}
                ]}}
            ]}}
        ], "edges": [{"from": "start", "to": "l"}]}),
    );
    let run =
        h.rt.start(&wf, Default::default(), thread("tree-bodies"))
            .await
            .expect("start");
    let tree = within("two items in flight", async {
        loop {
            if let Ok(tree) = h.rt.tree(run.run_id()).await
                && tree
                    .children
                    .first()
                    .and_then(|l| l.children.first())
                    .is_some_and(|p| p.children.len() == 2)
            {
                return tree;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let l = &tree.children[0];
    assert_eq!((l.kind.as_str(), l.iteration), ("loop", Some(0)));
    assert_eq!(
        l.path.as_ref().map(ToString::to_string).as_deref(),
        Some("l")
    );
    let p = &l.children[0];
    assert_eq!(p.kind, "parallel");
    assert_eq!(p.items, [0, 1]);
    assert_eq!(
        p.path.as_ref().map(ToString::to_string).as_deref(),
        Some("l/#0/p")
    );
    let ws: Vec<String> = p
        .children
        .iter()
        .map(|w| w.path.as_ref().map(ToString::to_string).unwrap_or_default())
        .collect();
    assert_eq!(ws, ["l/#0/p/@0/w", "l/#0/p/@1/w"]);
    // The tree travels as JSON (for other processes) and reads back the same.
    let json = serde_json::to_string(&tree).expect("serializes");
    let back: runvisor_actors::ActorTree = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back, tree);
    h.log.mark("w:release");
    assert_eq!(finish(&run).await.status(), RunStatus::Succeeded);
}
