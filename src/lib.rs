//! runvisor: supervised, stoppable, resumable agent workflows.
//!
//! Workflows (LLM calls, tools, branches, as in FastGPT, RAGFlow or LangGraph) run as supervised
//! actor trees on [ractor](https://docs.rs/ractor), so a stop never loses work. This crate is the
//! product surface: it re-exports the engine ([`runvisor_actors`]) and adds what a process
//! around it needs: the [standard kinds](standard) (the [`http`](http_node) kind among them,
//! for node logic served by hosts in any language), the [config file](config), [logging and
//! trace export](telemetry) and the `runvisor` command line.
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> anyhow::Result<()> {
//! use runvisor::{Map, RunEvent, Runtime, ThreadId, Value, register_standard_kinds};
//!
//! let runtime = register_standard_kinds(Runtime::builder()).try_build()?;
//! let workflow = runtime.load_json(r#"{
//!   "id": "hello",
//!   "nodes": [
//!     {"id": "start", "kind": "begin"},
//!     {"id": "say", "kind": "stream_text", "params": {"text": "Hello, {{sys.query}}!"}}
//!   ],
//!   "edges": [{"from": "start", "to": "say"}]
//! }"#)?;
//! let inputs = Map::from([("query".to_owned(), Value::from("world"))]);
//! let run = runtime.start(&workflow, inputs, ThreadId::new("chat-1")?).await?;
//! let mut events = run.events();
//! while let Some(event) = events.next().await {
//!     if let RunEvent::NodeChunk { text, .. } = event {
//!         print!("{text}");
//!     }
//! }
//! let outcome = run.wait().await;
//! assert_eq!(outcome.output("say").and_then(|o| o.get("text")), Some(&Value::from("Hello, world!")));
//! # Ok(()) }
//! ```

pub mod config;
pub mod http_node;
pub mod ops;
pub mod redis;
pub mod report;
pub mod serve;
pub mod spill;
pub mod standard;
pub mod telemetry;
pub mod worker;

pub use config::{Config, ConfigError};
pub use runvisor_actors::*;
pub use standard::{register_standard_kinds, register_standard_kinds_with};

/// The README's Rust snippets, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
