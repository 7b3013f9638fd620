//! A run's events as server-sent events (`"stream": true` on a start or resume): one event per
//! node start, chunk, finish, skip, failure and interruption, the stop request, and last the
//! outcome document, named `finished`, `paused` (it waits for input: the interactions are in
//! it) or `stopped` (with the stop result). A client that goes away stops nothing.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use runvisor_actors::{RunEvent, RunHandle, RunOutcome};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::report::OutcomeDocument;

/// Where the stream is.
enum State {
    Events(RunHandle, mpsc::Receiver<RunEvent>),
    Done,
}

/// The run's events from its start (as the service's observer of the run forwards them to
/// `events`), then its outcome.
pub(super) fn events(
    run: RunHandle,
    events: mpsc::Receiver<RunEvent>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures::stream::unfold(State::Events(run, events), |state| async move {
        match state {
            State::Events(run, mut events) => loop {
                match events.recv().await {
                    Some(event) => {
                        if let Some(sse) = render(&event) {
                            return Some((Ok(sse), State::Events(run, events)));
                        }
                    }
                    None => return Some((Ok(outcome(&run).await), State::Done)),
                }
            },
            State::Done => None,
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The last event: the outcome document.
async fn outcome(run: &RunHandle) -> Event {
    let outcome = run.wait().await;
    let name = match &outcome {
        RunOutcome::Stopped(_) => "stopped",
        RunOutcome::AwaitingInput { .. } => "paused",
        _ => "finished",
    };
    let document = OutcomeDocument::new(run.workflow_id(), run.thread(), &outcome);
    let data = serde_json::to_value(&document)
        .unwrap_or_else(|e| json!({"error": format!("cannot render the outcome: {e}")}));
    event(name, &data)
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// One run event as an SSE event; `None` for events clients need not see.
fn render(e: &RunEvent) -> Option<Event> {
    let (name, data) = match e {
        RunEvent::RunStarted { run_id, thread } => (
            "run_started",
            json!({"run_id": run_id.to_string(), "thread": thread.as_str()}),
        ),
        RunEvent::NodeStarted { path, kind } => (
            "node_started",
            json!({"path": path.to_string(), "kind": &**kind}),
        ),
        RunEvent::NodeChunk { path, text } => (
            "node_chunk",
            json!({"path": path.to_string(), "text": &**text}),
        ),
        RunEvent::NodeFinished { path, output } => (
            "node_finished",
            json!({"path": path.to_string(), "output": &**output}),
        ),
        RunEvent::NodeSkipped { path } => ("node_skipped", json!({"path": path.to_string()})),
        RunEvent::NodeFailed { path, error } => (
            "node_failed",
            json!({"path": path.to_string(), "error": error.to_string()}),
        ),
        RunEvent::NodeInterrupted { path, forced } => (
            "node_interrupted",
            json!({"path": path.to_string(), "forced": forced}),
        ),
        RunEvent::Paused { path } => ("node_paused", json!({"path": path.to_string()})),
        RunEvent::Stopping { reason } => ("stopping", json!({"reason": reason.as_str()})),
        RunEvent::StorageWait { waiting, error } => (
            "storage_wait",
            json!({"waiting": waiting, "error": error.as_ref().map(ToString::to_string)}),
        ),
        RunEvent::EventsMissed { count } => ("events_missed", json!({"count": count})),
        // The outcome follows as the last event.
        RunEvent::RunFinished { .. } => return None,
        _ => return None,
    };
    Some(event(name, &data))
}
