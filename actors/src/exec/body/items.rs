//! A parallel's items: starting them under the bound, and recording the ones that are done.

use super::*;

impl BodyState {
    /// Starts the items the machine says to start (saved ones continue where they were).
    pub(super) async fn start_items(&mut self, cell: &ActorCell) -> Vec<(Option<u32>, ExecEvent)> {
        let Work::Parallel(p) = &mut self.work else {
            return Vec::new();
        };
        let Some(machine) = p.machine.as_mut() else {
            return Vec::new();
        };
        let starts = machine.starts();
        let mut events = Vec::new();
        for index in starts {
            let Work::Parallel(p) = &mut self.work else {
                break;
            };
            let Some(machine) = p.machine.as_ref() else {
                break;
            };
            let mut frame = Map::new();
            frame.insert("index".into(), Value::from(index));
            frame.insert("item".into(), machine.item(index));
            // As in a live run, items see the variables as they were when the parallel
            // started, plus what they assigned themselves before a stop.
            let mut env = self.env.clone();
            for (name, value) in p.partial.get(&index).into_iter().flatten() {
                if !name.contains('.') {
                    env.insert(name.clone(), value.clone());
                }
            }
            let path = self.path.child(Frame::Item(index));
            let span = tracing::info_span!(
                parent: &self.span,
                "item",
                otel.name = format!("item {}", self.id),
                runvisor.node.id = %self.id,
                runvisor.node.path = %path,
                runvisor.item.index = index,
            );
            let exec = GraphExec::new(
                p.spec.body.clone(),
                path,
                self.outer.clone(),
                Some((self.id.clone(), Value::Object(frame))),
                env,
                self.history.clone(),
            )
            .within(span);
            let saved = p.saved.remove(&index);
            let restored = saved.is_some();
            let mut exec = match saved {
                Some(body) => match exec.restore(body) {
                    Ok(exec) => exec,
                    Err(e) => {
                        self.fail(
                            Some(self.path.child(Frame::Item(index))),
                            NodeError::Failed(format!("saved progress does not fit: {e}")),
                        );
                        return events;
                    }
                },
                None => exec,
            };
            let run = self.run.clone();
            let host = Host {
                cell,
                run: &run,
                inline_until: self.slice,
            };
            let ready = exec.first_ready(restored);
            let launched = exec.launch(&host, ready).await;
            if let Work::Parallel(p) = &mut self.work {
                p.in_flight.insert(index, exec);
            }
            events.extend(launched.into_iter().map(|e| (Some(index), e)));
        }
        events
    }

    /// Records items whose graphs are done, starts new ones up to the bound, and finishes when
    /// every item is done. `None` when there is nothing to do yet.
    pub(super) async fn parallel_advance(
        &mut self,
        cell: &ActorCell,
    ) -> Option<Vec<(Option<u32>, ExecEvent)>> {
        let Work::Parallel(p) = &mut self.work else {
            return None;
        };
        // Failed items whose other nodes have stopped are gone.
        p.draining.retain(|_, e| !e.is_idle());
        let finished: Vec<u32> = p
            .in_flight
            .iter()
            .filter(|(_, e)| e.is_done())
            .map(|(i, _)| *i)
            .collect();
        let mut progressed = false;
        for index in finished {
            let Work::Parallel(p) = &mut self.work else {
                return None;
            };
            let Some(mut exec) = p.in_flight.remove(&index) else {
                continue;
            };
            let output = match &p.spec.output {
                Some(t) => t.resolve(&exec),
                None => Ok(exec.sink_outputs()),
            };
            let mut assigned = p.partial.remove(&index).unwrap_or_default();
            assigned.append(&mut exec.up);
            let step = match p.machine.as_mut() {
                Some(machine) => machine.item_finished(index, output, assigned),
                None => ItemStep::Continue,
            };
            for message in std::mem::take(&mut exec.produced) {
                self.history.push_back(message.clone());
                self.produced.push_back(message);
            }
            add_usage(&mut self.usage, &exec.usage);
            progressed = true;
            if let ItemStep::Fail { index, error } = step {
                self.fail(Some(self.path.child(Frame::Item(index))), error);
                return None;
            }
        }
        let Work::Parallel(p) = &mut self.work else {
            return None;
        };
        let machine = p.machine.as_ref()?;
        if machine.is_finished() {
            if p.draining.is_empty()
                && let Some(machine) = p.machine.as_mut()
            {
                self.end = Some(NodeEnd::checked(machine.finish()));
            }
            return None;
        }
        if progressed {
            self.report_progress(cell, true);
        }
        if self.unsaved > 0 {
            // `sync`: new items begin once the finished ones are stored.
            return None;
        }
        let events = self.start_items(cell).await;
        // Items whose nodes all finished on this actor as they started are done already: no
        // child's end will come to record them, so the caller goes round again.
        let done_at_start = matches!(&self.work, Work::Parallel(p)
            if p.in_flight.values().any(GraphExec::is_done));
        if events.is_empty() && !progressed && !done_at_start {
            return None;
        }
        Some(events)
    }
}
