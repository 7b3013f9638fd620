//! Quickstart: an agent-like workflow on the embedded runtime (in-memory stores, no Redis).
//!
//! ```text
//! start (begin) -> llm (a host kind defined below) -> route (switch on llm.intent)
//!     route -refund->  refund_ticket (message)
//!     route -pricing-> pricing_link  (message)
//!     route -else->    handoff       (message)
//! ```
//!
//! Run it with `cargo run --release --example quickstart`.

use std::io::Write;
use std::time::Duration;

use runvisor::input_str;
use runvisor::{
    Map, Message, NodeContext, NodeError, NodeHandler, NodeOutput, ParamSchema, ParamType,
    RunEvent, Runtime, ThreadId, Value, async_trait,
};

/// A stand-in for an LLM call: picks an intent from the prompt and streams an answer token by
/// token. A real one would call a model here; the contract is the same.
struct FakeLlm;

#[async_trait]
impl NodeHandler for FakeLlm {
    fn params(&self) -> ParamSchema {
        ParamSchema::new().required("prompt", ParamType::String)
    }

    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let prompt = input_str(&input, "prompt")?.to_lowercase();
        let (intent, answer) = if prompt.contains("refund") {
            (
                "refund",
                "Sorry to hear that! I can refund your order right away.",
            )
        } else if prompt.contains("price") || prompt.contains("cost") {
            (
                "pricing",
                "The Pro plan costs 20 EUR a month, billed yearly.",
            )
        } else {
            (
                "other",
                "Let me find the right person to help you with that.",
            )
        };
        for token in answer.split_inclusive(' ') {
            // Stream each token; stop at once if the run is being stopped.
            tokio::select! {
                () = ctx.stopped() => return Err(NodeError::Stopped),
                () = tokio::time::sleep(Duration::from_millis(40)) => {}
            }
            ctx.emit(token).map_err(|_| NodeError::Stopped)?;
        }
        ctx.append_message(Message::assistant(answer));
        Ok(NodeOutput::new(Value::from_iter([
            ("text", answer),
            ("intent", intent),
        ])))
    }
}

const WORKFLOW: &str = r#"{
  "id": "quickstart",
  "nodes": [
    {"id": "start", "kind": "begin",
     "params": {"inputs": [{"name": "query", "type": "string", "required": true}]}},
    {"id": "llm", "kind": "llm", "params": {"prompt": "{{sys.query}}"}},
    {"id": "route", "kind": "switch", "params": {"cases": [
      {"id": "refund", "conditions": [{"left": "{{llm.intent}}", "op": "eq", "right": "refund"}]},
      {"id": "pricing", "conditions": [{"left": "{{llm.intent}}", "op": "eq", "right": "pricing"}]}
    ]}},
    {"id": "refund_ticket", "kind": "message",
     "params": {"template": "Refund ticket opened for: {{sys.query}}"}},
    {"id": "pricing_link", "kind": "message",
     "params": {"template": "All plans: https://example.com/pricing"}},
    {"id": "handoff", "kind": "message",
     "params": {"template": "A colleague will follow up on: {{sys.query}}"}}
  ],
  "edges": [
    {"from": "start", "to": "llm"},
    {"from": "llm", "to": "route"},
    {"from": "route", "to": "refund_ticket", "branch": "refund"},
    {"from": "route", "to": "pricing_link", "branch": "pricing"},
    {"from": "route", "to": "handoff", "branch": "else"}
  ]
}"#;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One runtime per process: node kinds + stores (in memory unless told otherwise).
    let runtime = Runtime::builder().handler("llm", FakeLlm).try_build()?;
    // Validation checks kinds, edges, params and references before anything runs.
    let workflow = runtime.load_json(WORKFLOW)?;
    // Two runs on one thread: the second sees the history of the first.
    let thread = ThreadId::new("quickstart-chat")?;

    for query in [
        "I want a refund for order 42",
        "How much does the Pro plan cost?",
    ] {
        println!("\n> {query}");
        let inputs = Map::from([("query".to_owned(), Value::from(query))]);
        let run = runtime.start(&workflow, inputs, thread.clone()).await?;

        let mut events = run.events();
        let mut streaming = false;
        while let Some(event) = events.next().await {
            match event {
                RunEvent::NodeStarted { path, kind } => println!("▶ {path} ({kind})"),
                RunEvent::NodeChunk { text, .. } => {
                    if !std::mem::replace(&mut streaming, true) {
                        print!("  ");
                    }
                    print!("{text}");
                    std::io::stdout().flush()?;
                }
                RunEvent::NodeFinished { path, output } => {
                    if std::mem::take(&mut streaming) {
                        println!();
                    }
                    println!("✓ {path} -> {output}");
                }
                RunEvent::NodeSkipped { path } => println!("↷ {path} skipped"),
                RunEvent::NodeFailed { path, error } => println!("✗ {path}: {error}"),
                _ => {}
            }
        }
        let outcome = run.wait().await;
        println!("run {}: {}", outcome.run_id(), outcome.status());
    }

    println!("\nhistory of thread {thread}:");
    for message in runtime.history_store().load(&thread).await? {
        println!("  {:?}: {}", message.role, message.content);
    }
    Ok(())
}
