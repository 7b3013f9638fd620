//! How a run ends: its final checkpoint, its history and its record are persisted once, its
//! flags cleared, and its outcome published to every caller.

use super::*;
use crate::exec::{EndParts, EndReached};
use crate::model::{Spill, Unpersisted};
use crate::persist::retry::{self, GaveUp};
use crate::persist::snapshot::SaveFailed;
use crate::persist::{EndWritten, SpilledRun};

impl RunState {
    /// Persists the run's end once: checkpoint, history, run record; publishes the outcome.
    pub(super) async fn end_run(&mut self) {
        let Some(end) = self
            .lifecycle
            .finish(self.exec.is_done(), !self.exec.interrupted.is_empty())
        else {
            return;
        };
        for timer in self.timers.drain(..) {
            timer.abort();
        }
        let (status, stop_reason) = (end.status(), end.stop_reason());
        // A stop's latency runs from its request to the run quiesced (no node running): now.
        if let Some((span, asked)) = &self.stop_span {
            let latency = u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX);
            span.record("runvisor.stop.latency_ms", latency);
            span.record(
                "runvisor.stop.interrupted_nodes",
                u64::try_from(self.exec.interrupted.len()).unwrap_or(u64::MAX),
            );
        }
        // History, checkpoint and record share one deadline: a store that fails transiently
        // is retried until then, one that refuses is not retried.
        let deadline = tokio::time::Instant::now() + self.run.config().store_deadline;
        // The final checkpoint goes first and carries every message of the run as pending, then
        // the history takes them: a crash between the two loses nothing and runs nothing again
        // (whoever takes the thread over finds the run ended and appends the messages, which is
        // idempotent by message id). The other order would rerun the last node on a takeover
        // and store its message twice.
        let mut messages = std::mem::take(&mut self.start_messages);
        messages.extend(std::mem::take(&mut self.exec.produced));
        let failure = match &end {
            Final::Failed(error) => Some(error.to_string()),
            _ => None,
        };
        let flags = self.run.signal_keys.all();
        // Where the stores write a run's whole end in one step, the final checkpoint's first
        // attempt carries the rest of it (messages, record, flags, lease); what it did not
        // store is written step by step below, as without such stores.
        let mut reached = EndReached::Checkpoint;
        let mut renewing = true;
        let mut unwritten = None;
        let (checkpoint_id, checkpoint_error) = if self.lease_lost.is_some() {
            // Another run holds the thread: its checkpoints are not this run's to write.
            (None, None)
        } else {
            let pending = messages.iter().cloned().collect();
            let mut write = self.snapshot(status, stop_reason, pending, self.history_before);
            write.mode = "final";
            let written = if self.run.services.writes_whole_end() {
                // The whole end may give the lease up: nothing renews it from here on (a
                // renewal landing after the release would take the thread again), nor watches
                // the flags it deletes.
                self.stop_renewing(&flags).await;
                renewing = false;
                self.close_record(status, stop_reason, None, failure.clone(), None);
                let end = EndParts {
                    messages: &messages,
                    record: &self.record,
                    lease: &self.run.lease,
                    flags: &flags,
                };
                let (written, done) = self.run.services.save_end(write, end, deadline).await;
                if done == EndReached::Taken {
                    // Stored, but the thread is another run's now: the rest of the end (flags,
                    // notices, lease) is not this run's to touch.
                    tracing::info!(parent: &self.span, "the run's end was stored, then another run took the thread");
                    self.lease_lost = Some(None);
                }
                reached = done;
                written
            } else {
                self.run.services.save_awaited(write, deadline).await
            };
            match written {
                Ok(id) => (Some(id), None),
                Err(SaveFailed {
                    error: CheckpointError::Refused(e @ StoreError::Fenced { .. }),
                    ..
                }) => {
                    tracing::warn!(parent: &self.span, error = %e, "final checkpoint refused: the run lost its thread's lease");
                    self.lease_lost = Some(Some(e.clone()));
                    (None, Some(CheckpointError::Refused(e)))
                }
                Err(failed) => {
                    tracing::error!(parent: &self.span, error = %failed.error, "could not write the final checkpoint");
                    unwritten = failed.unwritten;
                    (None, Some(failed.error))
                }
            }
        };
        let flushed_messages = u64::try_from(messages.len()).unwrap_or(u64::MAX);
        let history = match reached {
            EndReached::Checkpoint => self.persist_history(messages, deadline).await,
            EndReached::History | EndReached::Record(_) | EndReached::Taken => HistoryFlush {
                persisted: messages,
                ..HistoryFlush::default()
            },
        };
        if let Some((span, _)) = self.stop_span.take() {
            span.record("runvisor.stop.flushed.messages", flushed_messages);
            span.record("runvisor.stop.flushed.history", history.error.is_none());
            if let Some(id) = &checkpoint_id {
                span.record("runvisor.stop.flushed.checkpoint", id.to_string());
            }
        }
        let outputs = self.exec.shared_outputs();
        let run_id = self.run.run_id;
        let usage = self.exec.usage.clone();
        let storage_wait = self.storage_waited
            + self
                .storage_since
                .map_or(Duration::ZERO, |since| since.elapsed());
        let mut outcome = match end {
            Final::Completed => RunOutcome::Completed {
                run_id,
                outputs,
                variables: self.exec.env.clone(),
                history,
                usage,
                storage_wait,
                unpersisted: None,
            },
            Final::Failed(error) => RunOutcome::Failed {
                run_id,
                error,
                outputs,
                history,
                usage,
                storage_wait,
                unpersisted: None,
            },
            Final::Paused => RunOutcome::AwaitingInput {
                run_id,
                interactions: self.interactions.clone(),
                outputs,
                history,
                checkpoint_id,
                checkpoint_error: checkpoint_error.clone(),
                usage,
                storage_wait,
                unpersisted: None,
            },
            Final::Stopped(reason) => {
                let interrupted = std::mem::take(&mut self.exec.interrupted);
                let partial: Vec<&str> = interrupted
                    .iter()
                    .filter_map(|i| i.partial.as_deref())
                    .collect();
                let partial_response = (!partial.is_empty()).then(|| partial.join("\n"));
                RunOutcome::Stopped(StopResult {
                    run_id,
                    reason,
                    forced: interrupted
                        .iter()
                        .filter(|i| i.forced)
                        .filter_map(|i| i.path.leaf().cloned())
                        .collect(),
                    finished: self.exec.completed(),
                    frontier: self.exec.frontier(),
                    interrupted,
                    outputs,
                    partial_response,
                    messages: history,
                    checkpoint_id,
                    checkpoint_error: checkpoint_error.clone(),
                    usage,
                    storage_wait,
                    unpersisted: None,
                })
            }
        };
        let mut record_error = None;
        // Where the store does it, the record's write also clears the run's flags, announces
        // it and gives the lease up, in that order (one round trip instead of three).
        let mut end_written = EndWritten::Record;
        if let EndReached::Record(_) | EndReached::Taken = reached {
            // The whole end wrote the record as it stands, naming the final checkpoint.
            self.record.checkpoint_id = checkpoint_id.or(self.record.checkpoint_id);
            if let EndReached::Record(written) = reached {
                end_written = written;
            }
        } else {
            let mut unpersisted = outcome.history().error.as_ref().map(|e| {
                format!(
                    "{} message(s) not persisted: {e}",
                    outcome.history().not_persisted.len()
                )
            });
            if let Some(e) = &checkpoint_error {
                let note = format!("checkpoint not written: {e}");
                unpersisted = Some(match unpersisted.take() {
                    Some(prev) => format!("{prev}; {note}"),
                    None => note,
                });
            }
            self.close_record(status, stop_reason, checkpoint_id, failure, unpersisted);
            if renewing {
                self.stop_renewing(&flags).await;
            }
            if self.lease_lost.is_none() {
                let runs = self.run.services.runs();
                let (record, lease) = (&self.record, &self.run.lease);
                match retry::until(deadline, || runs.put_end(record, lease, &flags)).await {
                    Ok(done) => end_written = done,
                    Err(GaveUp {
                        error: e @ StoreError::Fenced { .. },
                        ..
                    }) => self.lease_lost = Some(Some(e)),
                    Err(gave_up) => {
                        tracing::error!(parent: &self.span, error = %gave_up.error, attempts = gave_up.attempts, "could not record the run's end");
                        record_error = Some(gave_up.error);
                    }
                }
            }
        }
        // What the stores did not take is kept elsewhere, to be replayed: unless another run
        // holds the thread now (then it is not this run's to write, and a replay would be
        // refused).
        if self.lease_lost.is_none() {
            let unpersisted = self
                .spill_end(
                    &outcome,
                    checkpoint_error.as_ref(),
                    unwritten,
                    record_error.as_ref(),
                )
                .await;
            outcome.set_unpersisted(unpersisted);
        }
        match end_written {
            EndWritten::Released { announced } => {
                if !announced {
                    self.announce_cleared(&flags).await;
                }
            }
            EndWritten::Record if self.lease_lost.is_none() => {
                // Last of the persisted state: a stop request that sees the flag cleared
                // finds the run's record and final checkpoint in place.
                let cleared = self.clear_flags(flags).await;
                // The notices that the flags were cleared and the lease's release go out at
                // once: both follow the clearing, and neither needs the other.
                tokio::join!(
                    self.announce_cleared(&cleared),
                    self.run.services.release_lease(
                        self.run.run_id,
                        &self.run.thread,
                        &self.run.lease,
                        deadline,
                    )
                );
            }
            // The lease is another run's: its flags and its lease are not this run's to touch.
            EndWritten::Record => {}
        }
        {
            let mut live = self.run.live();
            live.status = status;
            live.running.clear();
        }
        tracing::info!(parent: &self.span, %status, "run ended");
        self.span.record("runvisor.run.status", status.as_str());
        if let Some(error) = outcome.error() {
            self.span.record("otel.status_code", "ERROR");
            self.span
                .record("otel.status_description", error.to_string());
        }
        // A waiting run holds no actors; the registry keeps showing it until it resumes. The
        // outcome is kept there first, so a stop that misses the live run still gets it.
        let persisted = outcome.is_persisted();
        let outcome = Arc::new(outcome);
        let waiting = status == RunStatus::AwaitingInput;
        self.run
            .services
            .unregister(run_id, waiting, outcome.clone());
        self.outcome.send_replace(Some(outcome));
        self.run.emit(RunEvent::RunFinished {
            run_id,
            status,
            persisted,
        });
    }

    /// Hands what the stores did not take of the run's end (messages, the final checkpoint,
    /// the run record) to the spill store, and says what it was and where it went; `None`
    /// when everything was stored.
    async fn spill_end(
        &self,
        outcome: &RunOutcome,
        checkpoint_error: Option<&CheckpointError>,
        unwritten: Option<crate::persist::StoredCheckpoint>,
        record_error: Option<&StoreError>,
    ) -> Option<Unpersisted> {
        let history = outcome.history();
        let messages_error = history
            .error
            .as_ref()
            .filter(|_| !history.not_persisted.is_empty());
        if messages_error.is_none() && checkpoint_error.is_none() && record_error.is_none() {
            return None;
        }
        // The record as a successful end would have written it: the replay writes it last,
        // once the rest is in.
        let mut record = self.record.clone();
        record.unpersisted = None;
        if let Some(checkpoint) = &unwritten {
            record.checkpoint_id = Some(checkpoint.id);
        }
        let mut spilled = SpilledRun::new(record, self.run.lease.clone());
        if let Some(e) = messages_error {
            spilled.reasons.push(format!(
                "{} message(s) not in the history: {e}",
                history.not_persisted.len()
            ));
            spilled.messages = history.not_persisted.clone();
        }
        if let Some(e) = checkpoint_error {
            spilled
                .reasons
                .push(format!("final checkpoint not written: {e}"));
        }
        if let Some(e) = record_error {
            spilled.reasons.push(format!("run record not written: {e}"));
        }
        spilled.checkpoint = unwritten;
        spilled.workflow = Some((self.workflow_hash.clone(), self.plan.def_json().to_string()));
        let spill = match self.run.services.spill() {
            None => Spill::NoSpillStore,
            Some(store) => match store.spill(&spilled).await {
                Ok(location) => {
                    tracing::warn!(parent: &self.span, %location, reasons = ?spilled.reasons, "the run's end was not stored; kept in a spill file to replay");
                    Spill::Kept { location }
                }
                Err(e) => {
                    tracing::error!(parent: &self.span, error = %e, reasons = ?spilled.reasons, "the run's end was not stored and could not be spilled");
                    Spill::Failed {
                        error: e.to_string(),
                    }
                }
            },
        };
        Some(Unpersisted {
            messages: if messages_error.is_some() {
                history.not_persisted.len()
            } else {
                0
            },
            checkpoint: checkpoint_error.cloned(),
            record: record_error.cloned(),
            spill,
        })
    }

    /// Makes the run's record say how it ended: `checkpoint` (if any) is its final
    /// checkpoint, `failure` why it failed, `unpersisted` what of its end was not stored.
    fn close_record(
        &mut self,
        status: RunStatus,
        stop_reason: Option<StopReason>,
        checkpoint: Option<CheckpointId>,
        failure: Option<String>,
        unpersisted: Option<String>,
    ) {
        let record = &mut self.record;
        record.status = status;
        record.finished_at_ms = Some(now_ms());
        record.checkpoint_id = checkpoint.or(record.checkpoint_id);
        record.stop_reason = stop_reason.map(|r| r.as_str().to_owned());
        record.failure_reason = failure;
        record.unpersisted = unpersisted;
    }

    /// Stops renewing the run's lease (its end gives it up) and, unless the lease is lost,
    /// watching its `flags` (its end deletes them).
    async fn stop_renewing(&self, flags: &[String]) {
        self.run.services.stop_renewing(self.run.run_id).await;
        if self.lease_lost.is_none() && !flags.is_empty() {
            self.run.services.unwatch(self.run.run_id).await;
        }
    }

    /// Deletes the run's flags (it ended; nothing watches them any more). Returns the flags it
    /// deleted; none when the run has none or they could not be deleted (they expire by
    /// themselves, their TTL; nothing is lost).
    async fn clear_flags(&self, keys: Vec<String>) -> Vec<String> {
        if keys.is_empty() {
            return keys;
        }
        let cleared = tokio::time::timeout(
            self.flags_deadline(),
            self.run
                .services
                .signals()
                .clear(&keys, Some((&self.run.thread, self.run.lease.fence))),
        )
        .await;
        if matches!(cleared, Ok(Ok(()))) {
            keys
        } else {
            tracing::warn!(parent: &self.span, "could not clear the run's stop flags");
            Vec::new()
        }
    }

    /// Publishes that these flags were cleared, one notice per flag, all sent at once, so stop
    /// requests waiting for the run learn it at once.
    async fn announce_cleared(&self, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let signals = self.run.services.signals();
        let notices: Vec<Notice> = keys
            .iter()
            .map(|key| Notice {
                key: key.clone(),
                raised: false,
            })
            .collect();
        let sent = tokio::time::timeout(
            self.flags_deadline(),
            futures::future::try_join_all(notices.iter().map(|notice| signals.notify(notice))),
        )
        .await;
        if !matches!(sent, Ok(Ok(_))) {
            // A waiting stop request still sees the flag gone at its next poll.
            tracing::warn!(parent: &self.span, "could not announce that the run's stop flags were cleared");
        }
    }

    /// How long clearing the flags, and then announcing it, may take each.
    fn flags_deadline(&self) -> Duration {
        self.run
            .config()
            .signals
            .tick
            .max(Duration::from_millis(50))
            * 5
    }

    async fn persist_history(
        &mut self,
        messages: Vec<Message>,
        deadline: tokio::time::Instant,
    ) -> HistoryFlush {
        if messages.is_empty() {
            return HistoryFlush::default();
        }
        if let Some(refusal) = &self.lease_lost {
            // Another run holds the thread: these messages are not this run's to write (the
            // new holder continues from the thread's last checkpoint).
            return HistoryFlush {
                persisted: Vec::new(),
                not_persisted: messages,
                error: refusal.clone(),
            };
        }
        // A passing failure (a reconnect, a timeout, a failover) should not cost the
        // messages: it is retried until the deadline (appends are idempotent by message id).
        let history = self.run.services.history();
        let fence = self.run.fence();
        let thread = &self.run.thread;
        let result = retry::until(deadline, || history.append(thread, &messages, fence))
            .await
            .map_err(|gave_up| gave_up.error);
        if let Err(e @ StoreError::Fenced { .. }) = &result {
            tracing::warn!(parent: &self.span, error = %e, "history refused: the run lost its thread's lease");
            self.lease_lost = Some(Some(e.clone()));
        }
        match result {
            Ok(()) => HistoryFlush {
                persisted: messages,
                ..HistoryFlush::default()
            },
            Err(e) => {
                tracing::error!(
                    parent: &self.span,
                    error = %e,
                    count = messages.len(),
                    "history store refused the run's messages"
                );
                HistoryFlush {
                    persisted: Vec::new(),
                    not_persisted: messages,
                    error: Some(e),
                }
            }
        }
    }
}
