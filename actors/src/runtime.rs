//! The `Runtime` facade: one per process. It knows the node kinds, holds the stores, starts
//! runs (one supervised actor tree each) and answers ops queries about live runs.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use runvisor_actors::{Runtime, ThreadId, Map, Value};
//! let runtime = Runtime::builder().build();
//! let workflow = runtime.load_json(r#"{
//!   "id": "hello",
//!   "nodes": [
//!     {"id": "start", "kind": "begin"},
//!     {"id": "greet", "kind": "message", "params": {"template": "Hello, {{sys.query}}!"}}
//!   ],
//!   "edges": [{"from": "start", "to": "greet"}]
//! }"#)?;
//! let mut inputs = Map::new();
//! inputs.insert("query".into(), Value::from("world"));
//! let run = runtime.start(&workflow, inputs, ThreadId::new("chat-1")?).await?;
//! let outcome = run.wait().await;
//! assert_eq!(outcome.output("greet").and_then(|o| o.get("text")), Some(&Value::from("Hello, world!")));
//! # Ok(()) }
//! ```

mod adopt;
mod builder;
mod errors;
mod facade;
mod fork;
mod handle;
mod hold;
mod ops;
mod replay;
mod resume;
mod services;
mod signals;
mod start;
mod stop;
mod trace;

pub use adopt::Adoption;
pub use builder::{BuildError, RuntimeBuilder};
pub use errors::{QueryError, StartError};
pub use facade::Runtime;
pub use handle::{EventStream, RunHandle};
pub use ops::{RunQuery, RunView, is_orphaned};
pub use replay::{ReplayError, Replayed};
pub use resume::{ResumeError, ResumeFrom, ResumeInput, ResumeOptions};
pub use signals::StopRequest;
pub use trace::TraceContext;
