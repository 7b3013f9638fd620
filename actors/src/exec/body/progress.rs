//! What a body hands over of its progress: to the run while it runs (for progress snapshots),
//! and in its report when it is cut short or fails.

use super::*;

impl BodyState {
    /// Hands whoever hosts this body (the run, or the body it is nested in) what it has
    /// finished (iterations, items) and the messages they produced, so the run's progress
    /// snapshots hold them at any depth: a crash then reruns only the iterations or items in
    /// flight. Cheap: the progress shares its vectors with the machine. In `async` mode at
    /// most one report goes per coalescing window (a shared vector is copied on its next
    /// change, so fewer reports also mean fewer copies); `sync` reports every step, and with
    /// `wait` the body goes on only once the run says a snapshot holding it is stored
    /// ([`BodyMsg::Saved`]). Returns whether the body now waits for that.
    pub(super) fn report_progress(&mut self, cell: &ActorCell, wait: bool) -> bool {
        let config = self.run.config();
        let me: ActorRef<BodyMsg> = cell.clone().into();
        match config.durability {
            Durability::Exit => return false,
            Durability::Sync => {
                let mut waiters = std::mem::take(&mut self.pass_on);
                if wait {
                    waiters.push(me.clone());
                }
                let sent = self.send_progress(&me, waiters);
                if sent && wait {
                    self.unsaved += 1;
                }
                return sent && wait;
            }
            Durability::Async => {
                let window = config.checkpoint_coalesce;
                let now = tokio::time::Instant::now();
                if self.reported_at.is_some_and(|at| now < at + window) {
                    if !self.report_waiting {
                        self.report_waiting = true;
                        let at = self.reported_at.map_or(now, |at| at + window);
                        tokio::spawn(async move {
                            tokio::time::sleep_until(at).await;
                            let _ = me.send_message(BodyMsg::ReportProgress);
                        });
                    }
                    return false;
                }
            }
        }
        self.send_progress(&me, Vec::new());
        false
    }

    /// Hands this body's progress to whoever hosts it now: everything finished so far, in
    /// finished iterations and items and in the current ones (down to nested loops and
    /// parallels), with the messages they produced, so that a worker dying now costs only
    /// what was running. `waiters`: the bodies to tell once it is stored (`sync`). Returns
    /// whether it was sent.
    pub(super) fn send_progress(
        &mut self,
        myself: &ActorRef<BodyMsg>,
        waiters: Vec<ActorRef<BodyMsg>>,
    ) -> bool {
        self.reported_at = Some(tokio::time::Instant::now());
        let Some(frame) = self.progress_frame() else {
            return false;
        };
        let mut messages = self.produced.clone();
        for exec in self.execs_mut() {
            messages.append(exec.progress_messages());
        }
        match &self.parent {
            Some(parent) => parent
                .send_message(BodyMsg::ChildProgress {
                    child: myself.get_id(),
                    node: self.node,
                    frame: Box::new(frame),
                    messages,
                    waiters,
                })
                .is_ok(),
            None => self.run.supervisor.get().is_some_and(|supervisor| {
                supervisor
                    .send_message(RunMsg::Progress {
                        node: self.node,
                        frame: Box::new(frame),
                        messages,
                        waiters,
                    })
                    .is_ok()
            }),
        }
    }

    /// The body's progress as a frame: the machine's, the current iteration's or the in-flight
    /// items' own progress, and what they assigned so far. `None` before the body began (its
    /// input did not fit): a resume begins it again.
    pub(super) fn progress_frame(&self) -> Option<FrameState> {
        Some(match &self.work {
            Work::Loop(l) => {
                let machine = l.machine.as_ref()?;
                let mut progress = machine.progress();
                let body = match &l.exec {
                    Some(exec) => {
                        // The current iteration continues with its loop variables as it left
                        // them, and what it assigned so far.
                        if let Some(Value::Object(frame)) = exec.frame() {
                            for var in machine.declared() {
                                if let Some(v) = frame.get(var) {
                                    progress.vars.insert(var.clone(), v.clone());
                                }
                            }
                        }
                        progress.assigned.extend(exec.up.iter().cloned());
                        exec.state()
                    }
                    // Not started again since the resume: keep its saved progress.
                    None => l.saved_body.clone().unwrap_or_default(),
                };
                loop_state(progress, body)
            }
            Work::Parallel(p) => {
                let machine = p.machine.as_ref()?;
                let mut in_progress = Vec::new();
                let mut partial = Vec::new();
                for (&index, exec) in &p.in_flight {
                    in_progress.push(ItemState {
                        index,
                        body: exec.state(),
                    });
                    let mut assigned = p.partial.get(&index).cloned().unwrap_or_default();
                    assigned.extend(exec.up.iter().cloned());
                    if !assigned.is_empty() {
                        partial.push((index, assigned));
                    }
                }
                // Items saved in progress that did not start again before this stop.
                for (&index, body) in &p.saved {
                    in_progress.push(ItemState {
                        index,
                        body: body.clone(),
                    });
                    if let Some(assigned) = p.partial.get(&index)
                        && !assigned.is_empty()
                    {
                        partial.push((index, assigned.clone()));
                    }
                }
                in_progress.sort_by_key(|i| i.index);
                parallel_state(machine.progress(), in_progress, partial)
            }
        })
    }

    /// The report of a body cut short: its progress, to continue on resume.
    pub(super) fn interrupted_end(&mut self, forced: bool) -> NodeEnd {
        let frame = self.progress_frame();
        let inner = match &self.work {
            Work::Loop(l) => l.exec.iter().flat_map(|e| e.interrupted.clone()).collect(),
            Work::Parallel(p) => p
                .in_flight
                .values()
                .flat_map(|e| e.interrupted.clone())
                .collect(),
        };
        NodeEnd::Interrupted {
            forced,
            frame,
            interactions: self.interactions.clone(),
            inner,
        }
    }
}

pub(super) fn loop_state(progress: LoopProgress, body: GraphState) -> FrameState {
    FrameState::Loop(LoopState {
        iteration: progress.iteration,
        vars: progress.vars,
        history: progress.history,
        details: progress.details,
        items: progress.items,
        body,
        assigned: progress.assigned,
    })
}

pub(super) fn parallel_state(
    progress: ParallelProgress,
    in_progress: Vec<ItemState>,
    partial: Vec<(u32, Vec<(String, Value)>)>,
) -> FrameState {
    let mut assigned = progress.assigned;
    assigned.extend(partial);
    FrameState::Parallel(ParallelState {
        items: progress.items,
        results: progress.results,
        done: progress.done,
        errors: progress.errors,
        in_progress,
        assigned,
    })
}
