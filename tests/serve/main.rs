//! `runvisor serve` end to end: the real binary on a free loopback port with the embedded
//! in-memory stores, spoken to over HTTP ([`server`]): runs started (waiting or not), listed,
//! shown, stopped, cancelled and resumed; interactions answered; workflows validated; every
//! bad request answered with its JSON error code; the token; SIGTERM; the operator page in a
//! headless Chromium.

mod compat;
mod errors;
mod http_node;
mod metrics;
mod openapi;
mod page;
mod python_client;
mod runs;
mod server;
mod shutdown;
mod stdio;

use serde_json::{Value, json};

/// `start -> a (sleep {{sys.query}}) -> b (stream_text)`: a run as long as its query says, and
/// a resume with a new instruction (`say`) sleeps as long as that says.
pub(crate) fn sleepy() -> Value {
    json!({"id": "sleepy", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "a", "kind": "sleep", "params": {"duration": "{{sys.query}}"}},
        {"id": "b", "kind": "stream_text",
         "params": {"text": "done after {{sys.query}}", "interval": "1ms"}}
    ], "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]})
}

/// `start -> ask (a form with a required email) -> reply`.
pub(crate) fn form() -> Value {
    json!({"id": "form", "nodes": [
        {"id": "start", "kind": "begin"},
        {"id": "ask", "kind": "interactive", "params": {
            "mode": "form_input", "prompt": "Your email?",
            "fields": [{"name": "email", "required": true}]}},
        {"id": "reply", "kind": "stream_text",
         "params": {"text": "thanks, {{ask.email}}", "interval": "1ms"}}
    ], "edges": [{"from": "start", "to": "ask"}, {"from": "ask", "to": "reply"}]})
}
