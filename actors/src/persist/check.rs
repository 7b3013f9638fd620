//! Checks a decoded snapshot's progress against its workflow before a run restores it: every
//! node it names exists in its graph, completions replay on the scheduler, saved frames belong
//! to loop and parallel nodes of the matching kind, and every index and count of their
//! progress is in range (as their machines check it when they restore), at every level of
//! nesting. A snapshot that passes restores without any lookup going out of range; one that
//! does not is refused with the reason.

use super::snapshot::{FrameState, GraphState};
use crate::core::Schedule;
use crate::core::items::{ParallelMachine, ParallelProgress};
use crate::core::iteration::{LoopMachine, LoopProgress};
use crate::workflow::{GraphPlan, NodeSpec};

/// Checks a graph's saved progress (the workflow's, an iteration's or an item's) and the
/// frames nested in it. `at` names where it is, for the reason (`""` for the workflow).
pub(crate) fn check_graph(plan: &GraphPlan, state: &GraphState, at: &str) -> Result<(), String> {
    let index_of = |node: &crate::model::NodeId, what: &str| {
        plan.index
            .get(node)
            .copied()
            .ok_or_else(|| format!("{what} `{node}`{at} is not a node of its graph"))
    };
    let mut completions = Vec::with_capacity(state.completed.len());
    for done in &state.completed {
        completions.push((index_of(&done.node, "completed node")?, done.route.clone()));
    }
    Schedule::restore(plan.shape.clone(), &completions)
        .map_err(|e| format!("completions{at} do not replay: {e}"))?;
    for node in &state.frontier {
        index_of(node, "frontier node")?;
    }
    for saved in &state.frames {
        let i = index_of(&saved.node, "saved frame of")?;
        let node = &saved.node;
        let spec = plan
            .nodes
            .get(i)
            .map(|n| &n.spec)
            .ok_or_else(|| format!("node `{node}`{at} is missing from its plan"))?;
        match (spec, &saved.state) {
            (NodeSpec::Loop(spec), FrameState::Loop(l)) => {
                // The loop's own machine checks what it would restore.
                let progress = LoopProgress {
                    iteration: l.iteration,
                    vars: l.vars.clone(),
                    history: l.history.clone(),
                    details: l.details.clone(),
                    items: l.items.clone(),
                    assigned: l.assigned.clone(),
                };
                LoopMachine::restore(node.clone(), spec.clone(), progress)
                    .map_err(|e| format!("{e}{at}"))?;
                let inner = format!(" in iteration {} of `{node}`{at}", l.iteration);
                check_graph(&spec.body, &l.body, &inner)?;
            }
            (NodeSpec::Parallel(spec), FrameState::Parallel(p)) => {
                let progress = ParallelProgress {
                    items: p.items.clone(),
                    results: p.results.clone(),
                    done: p.done.clone(),
                    errors: p.errors.clone(),
                    assigned: p.assigned.clone(),
                };
                let in_progress: Vec<u32> = p.in_progress.iter().map(|i| i.index).collect();
                ParallelMachine::restore(node, spec.clone(), progress, &in_progress, false)
                    .map_err(|e| format!("{e}{at}"))?;
                for item in &p.in_progress {
                    let inner = format!(" in item {} of `{node}`{at}", item.index);
                    check_graph(&spec.body, &item.body, &inner)?;
                }
            }
            (_, FrameState::Loop(_)) => {
                return Err(format!(
                    "loop progress saved for node `{node}`{at}, not a loop"
                ));
            }
            (_, FrameState::Parallel(_)) => {
                return Err(format!(
                    "parallel progress saved for node `{node}`{at}, not a parallel"
                ));
            }
        }
    }
    Ok(())
}
