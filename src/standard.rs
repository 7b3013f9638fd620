//! Standard host kinds the CLI registers: `stream_text` (a stand-in for a streaming LLM call)
//! and `sleep` (slow work), and [`http`](crate::http_node) (node logic behind a host's HTTP
//! endpoint). The first two honour stops at once, so demos and the tests of stop, resume and
//! crash recovery can interrupt them at a chosen moment.
//!
//! ```json
//! {"id": "answer", "kind": "stream_text", "params": {
//!   "text": "You asked: {{sys.query}}", "chunk": "word", "interval": "30ms"}}
//! {"id": "wait", "kind": "sleep", "params": {"duration": "2s"}}
//! ```

use std::future::Future;
use std::num::NonZeroUsize;
use std::time::Duration;

use runvisor_actors::{
    Message, NodeContext, NodeError, NodeHandler, NodeOutput, ParamSchema, ParamType,
    RuntimeBuilder, StopRequested, Value, async_trait,
};
use runvisor_actors::{input_bool, input_duration};

use crate::http_node::{HTTP, HttpConfig, HttpNode};

/// The kind name of [`StreamText`].
pub const STREAM_TEXT: &str = "stream_text";
/// The kind name of [`Sleep`].
pub const SLEEP: &str = "sleep";

/// The pause between two chunks of `stream_text` when `interval` is not given.
const DEFAULT_INTERVAL: Duration = Duration::from_millis(30);

/// Registers the standard kinds (`stream_text`, `sleep`, and `http` allowed to call loopback
/// hosts only) on a runtime builder.
///
/// ```
/// use runvisor::{Runtime, register_standard_kinds};
/// let runtime = register_standard_kinds(Runtime::builder()).build();
/// assert!(runtime.kinds().get("stream_text").is_some());
/// assert!(runtime.kinds().get("http").is_some());
/// ```
pub fn register_standard_kinds(builder: RuntimeBuilder) -> RuntimeBuilder {
    register_standard_kinds_with(builder, &HttpConfig::default())
}

/// Registers the standard kinds, the `http` kind with its config (the hosts it may call).
pub fn register_standard_kinds_with(builder: RuntimeBuilder, http: &HttpConfig) -> RuntimeBuilder {
    builder
        .handler(STREAM_TEXT, StreamText)
        .handler(SLEEP, Sleep)
        .handler(HTTP, HttpNode::new(http))
}

/// `stream_text`: streams `text` chunk by chunk, like a model producing tokens.
///
/// Params: `text` (string, may hold references), `chunk` (`"word"`, the default, or a number of
/// characters), `interval` (humantime pause between chunks, default `"30ms"`),
/// `append_message` (default `true`: the full text becomes an assistant message).
/// Output: `{"text": ...}`. A stop cuts the stream at once with [`NodeError::Stopped`]; what was
/// streamed until then is the node's partial output, kept by the engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamText;

#[async_trait]
impl NodeHandler for StreamText {
    fn params(&self) -> ParamSchema {
        ParamSchema::new()
            .required("text", ParamType::String)
            // "word" or a positive integer: the schema has no union type, so `run` checks it.
            .optional("chunk", ParamType::Any)
            .optional("interval", ParamType::Duration)
            .optional("append_message", ParamType::Bool)
    }

    fn branches(&self, _: &serde_json::Value) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let text = match input.get("text") {
            // A `text` that is one reference may resolve to any value: render it.
            Some(value) => value.render(),
            None => return Err(NodeError::invalid_input("text", "is required")),
        };
        let chunking = Chunking::from_input(input.get("chunk"))?;
        let interval = input_duration(&input, "interval")?.unwrap_or(DEFAULT_INTERVAL);
        let append = input_bool(&input, "append_message", true)?;

        stream(&ctx, chunking.split(&text), interval).await?;

        if append && !text.is_empty() {
            ctx.append_message(Message::assistant(text.clone()));
        }
        Ok(NodeOutput::new(Value::from_iter([("text", text)])))
    }
}

/// `sleep`: waits `duration` (humantime), cooperatively: a stop ends it at once with
/// [`NodeError::Stopped`]. Output: `{"slept_ms": n}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sleep;

#[async_trait]
impl NodeHandler for Sleep {
    fn params(&self) -> ParamSchema {
        ParamSchema::new().required("duration", ParamType::Duration)
    }

    fn branches(&self, _: &serde_json::Value) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let duration = input_duration(&input, "duration")?
            .ok_or_else(|| NodeError::invalid_input("duration", "is required"))?;
        pause(duration, ctx.stopped()).await?;
        let ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Ok(NodeOutput::new(Value::from_iter([("slept_ms", ms)])))
    }
}

/// How `stream_text` cuts its text. Concatenating the chunks always gives the text back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunking {
    /// One word per chunk, with the whitespace before it (`"Hello"`, `" big"`, `" world"`).
    Words,
    /// This many characters per chunk.
    Chars(NonZeroUsize),
}

impl Chunking {
    fn from_input(value: Option<&Value>) -> Result<Self, NodeError> {
        let bad = |found: &Value| {
            NodeError::invalid_input(
                "chunk",
                format!("expected \"word\" or a positive number of characters, found {found}"),
            )
        };
        match value {
            None | Some(Value::Null) => Ok(Self::Words),
            Some(Value::String(s)) if s == "word" => Ok(Self::Words),
            Some(v @ (Value::Int(_) | Value::Float(_))) => v
                .as_i64()
                .and_then(|n| usize::try_from(n).ok())
                .and_then(NonZeroUsize::new)
                .map(Self::Chars)
                .ok_or_else(|| bad(v)),
            Some(other) => Err(bad(other)),
        }
    }

    fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut chunks = Vec::new();
        let mut start = 0;
        match self {
            Self::Words => {
                let mut in_word = false;
                for (i, c) in text.char_indices() {
                    if !c.is_whitespace() {
                        in_word = true;
                    } else if in_word {
                        chunks.push(&text[start..i]);
                        start = i;
                        in_word = false;
                    }
                }
            }
            Self::Chars(n) => {
                for (count, (i, _)) in text.char_indices().enumerate() {
                    if count > 0 && count % n.get() == 0 {
                        chunks.push(&text[start..i]);
                        start = i;
                    }
                }
            }
        }
        if start < text.len() {
            chunks.push(&text[start..]);
        }
        chunks
    }
}

/// Where streamed chunks go and where stops come from: the [`NodeContext`], or a test double.
trait ChunkSink {
    fn emit(&self, chunk: &str) -> Result<(), StopRequested>;
    fn stopped(&self) -> impl Future<Output = ()> + Send;
}

impl ChunkSink for NodeContext {
    fn emit(&self, chunk: &str) -> Result<(), StopRequested> {
        NodeContext::emit(self, chunk)
    }

    fn stopped(&self) -> impl Future<Output = ()> + Send {
        NodeContext::stopped(self)
    }
}

/// Emits the chunks, pausing `interval` between two of them. Returns [`NodeError::Stopped`] as
/// soon as a stop is requested, during a pause or at the next chunk.
async fn stream<S: ChunkSink + Sync>(
    sink: &S,
    chunks: Vec<&str>,
    interval: Duration,
) -> Result<(), NodeError> {
    for (i, chunk) in chunks.into_iter().enumerate() {
        if i > 0 {
            pause(interval, sink.stopped()).await?;
        }
        sink.emit(chunk)
            .map_err(|StopRequested| NodeError::Stopped)?;
    }
    Ok(())
}

/// Sleeps `duration`, or returns [`NodeError::Stopped`] as soon as `stopped` resolves (at once
/// if it already has).
async fn pause(duration: Duration, stopped: impl Future<Output = ()>) -> Result<(), NodeError> {
    tokio::select! {
        biased;
        () = stopped => Err(NodeError::Stopped),
        () = tokio::time::sleep(duration) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use runvisor_actors::testkit::{Interrupt, Script};
    use runvisor_actors::{Map, Role, RunEvent, RunOutcome, Runtime, ThreadId};
    use tokio::sync::watch;
    use tokio::time::Instant;

    use super::*;

    #[test]
    fn words_keep_their_leading_whitespace_and_rejoin_to_the_text() {
        let cases: &[(&str, &[&str])] = &[
            ("Hello big  world", &["Hello", " big", "  world"]),
            ("  lead", &["  lead"]),
            ("trail \n", &["trail", " \n"]),
            ("one", &["one"]),
            ("", &[]),
            ("héllo wörld", &["héllo", " wörld"]),
        ];
        for (text, want) in cases {
            let got = Chunking::Words.split(text);
            assert_eq!(&got, want, "{text:?}");
            assert_eq!(got.concat(), *text);
        }
    }

    #[test]
    fn chars_count_characters_not_bytes() {
        let three = Chunking::Chars(NonZeroUsize::new(3).expect("3 is not zero"));
        assert_eq!(three.split("abcdefg"), vec!["abc", "def", "g"]);
        assert_eq!(three.split("éèêëa"), vec!["éèê", "ëa"]);
        assert_eq!(three.split("abc"), vec!["abc"]);
        assert!(three.split("").is_empty());
    }

    #[test]
    fn chunk_param_is_word_or_a_positive_number() {
        let parse = |v: Option<Value>| Chunking::from_input(v.as_ref());
        assert_eq!(parse(None), Ok(Chunking::Words));
        assert_eq!(parse(Some(Value::from("word"))), Ok(Chunking::Words));
        assert_eq!(
            parse(Some(Value::Int(4))),
            Ok(Chunking::Chars(
                NonZeroUsize::new(4).expect("4 is not zero")
            ))
        );
        for bad in [
            Value::Int(0),
            Value::Int(-2),
            Value::Float(1.5),
            Value::from("words"),
            Value::Bool(true),
        ] {
            let err = parse(Some(bad.clone())).expect_err("should be refused");
            assert!(
                matches!(&err, NodeError::InvalidInput { field, .. } if field == "chunk"),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn durations_are_humantime_text() {
        let input = |v: Value| Value::from_iter([("d", v)]);
        assert_eq!(
            input_duration(&input(Value::from("1s 250ms")), "d"),
            Ok(Some(Duration::from_millis(1250)))
        );
        assert_eq!(input_duration(&Value::Object(Map::new()), "d"), Ok(None));
        assert!(input_duration(&input(Value::from("soon")), "d").is_err());
        assert!(input_duration(&input(Value::Int(5)), "d").is_err());
    }

    /// A sink that records chunks and is stopped through a watch channel.
    struct TestSink {
        chunks: Mutex<Vec<String>>,
        stop: watch::Receiver<bool>,
    }

    impl TestSink {
        fn new() -> (Self, watch::Sender<bool>) {
            let (tx, rx) = watch::channel(false);
            let sink = Self {
                chunks: Mutex::default(),
                stop: rx,
            };
            (sink, tx)
        }

        fn chunks(&self) -> Vec<String> {
            self.chunks.lock().expect("not poisoned").clone()
        }
    }

    impl ChunkSink for TestSink {
        fn emit(&self, chunk: &str) -> Result<(), StopRequested> {
            if *self.stop.borrow() {
                return Err(StopRequested);
            }
            self.chunks.lock().expect("not poisoned").push(chunk.into());
            Ok(())
        }

        fn stopped(&self) -> impl Future<Output = ()> + Send {
            let mut rx = self.stop.clone();
            async move {
                let _ = rx.wait_for(|stopped| *stopped).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stream_pauses_between_chunks_only() {
        let (sink, _stop) = TestSink::new();
        let start = Instant::now();
        stream(&sink, vec!["a", " b", " c"], Duration::from_millis(30))
            .await
            .expect("not stopped");
        assert_eq!(sink.chunks(), vec!["a", " b", " c"]);
        assert_eq!(start.elapsed(), Duration::from_millis(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_during_a_pause_ends_the_stream_at_once() {
        let (sink, stop) = TestSink::new();
        let stopper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(45)).await;
            let _ = stop.send(true);
        });
        let start = Instant::now();
        let result = stream(&sink, vec!["a", "b", "c", "d"], Duration::from_millis(30)).await;
        assert_eq!(result, Err(NodeError::Stopped));
        assert_eq!(sink.chunks(), vec!["a", "b"], "the chunks before the stop");
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(45),
            "no wait after it"
        );
        stopper.await.expect("stopper ran");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_already_requested_emits_nothing() {
        let (sink, stop) = TestSink::new();
        stop.send(true).expect("receiver alive");
        let result = stream(&sink, vec!["a", "b"], Duration::ZERO).await;
        assert_eq!(result, Err(NodeError::Stopped));
        assert!(sink.chunks().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn pause_returns_stopped_at_once() {
        let (sink, stop) = TestSink::new();
        let start = Instant::now();
        let pausing = pause(Duration::from_secs(3600), sink.stopped());
        let stopping = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = stop.send(true);
        };
        let (result, ()) = tokio::join!(pausing, stopping);
        assert_eq!(result, Err(NodeError::Stopped));
        assert_eq!(start.elapsed(), Duration::from_millis(10));
        assert_eq!(
            pause(Duration::from_millis(5), std::future::pending()).await,
            Ok(())
        );
    }

    fn runtime() -> Runtime {
        register_standard_kinds(Runtime::builder()).build()
    }

    async fn run_one(node: serde_json::Value) -> (RunOutcome, Vec<RunEvent>) {
        run_on(&runtime(), node).await
    }

    /// Runs `start -> node` on a runtime.
    async fn run_on(runtime: &Runtime, node: serde_json::Value) -> (RunOutcome, Vec<RunEvent>) {
        let workflow = runtime
            .load_json(
                &serde_json::json!({
                    "id": "standard-kinds",
                    "nodes": [{"id": "start", "kind": "begin"}, node],
                    "edges": [{"from": "start", "to": "node"}]
                })
                .to_string(),
            )
            .expect("valid workflow");
        let mut inputs = Map::new();
        inputs.insert("query".into(), Value::from("hi there"));
        let run = runtime
            .start(&workflow, inputs, ThreadId::generate())
            .await
            .expect("run starts");
        let mut events = run.events();
        let mut seen = Vec::new();
        while let Some(event) = events.next().await {
            seen.push(event);
        }
        (run.wait().await, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn stream_text_streams_appends_and_outputs_the_text() {
        let (outcome, events) = run_one(serde_json::json!({
            "id": "node", "kind": "stream_text",
            "params": {"text": "You said: {{sys.query}}", "interval": "1ms"}
        }))
        .await;
        assert_eq!(
            outcome.output("node"),
            Some(&Value::from_iter([("text", "You said: hi there")]))
        );
        let chunks: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                RunEvent::NodeChunk { text, .. } => Some(&**text),
                _ => None,
            })
            .collect();
        assert_eq!(chunks, vec!["You", " said:", " hi", " there"]);
        let persisted = &outcome.history().persisted;
        let assistant: Vec<&str> = persisted
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .map(|m| m.content.as_str())
            .collect();
        assert_eq!(assistant, vec!["You said: hi there"]);
    }

    #[tokio::test]
    async fn stream_text_by_characters_without_a_message() {
        let (outcome, events) = run_one(serde_json::json!({
            "id": "node", "kind": "stream_text",
            "params": {"text": "abcde", "chunk": 2, "interval": "0s", "append_message": false}
        }))
        .await;
        let chunks = events
            .iter()
            .filter(|e| matches!(e, RunEvent::NodeChunk { .. }))
            .count();
        assert_eq!(chunks, 3);
        assert!(
            outcome
                .history()
                .persisted
                .iter()
                .all(|m| m.role != Role::Assistant)
        );
    }

    #[tokio::test]
    async fn a_bad_chunk_fails_the_node_with_the_field_named() {
        let (outcome, _) = run_one(serde_json::json!({
            "id": "node", "kind": "stream_text",
            "params": {"text": "abc", "chunk": "sentence"}
        }))
        .await;
        let error = outcome.error().expect("the run failed").to_string();
        assert!(error.contains("`chunk`"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_outputs_the_time_slept() {
        let (outcome, _) = run_one(serde_json::json!({
            "id": "node", "kind": "sleep", "params": {"duration": "20ms"}
        }))
        .await;
        assert_eq!(
            outcome.output("node"),
            Some(&Value::from_iter([("slept_ms", 20)]))
        );
    }

    /// A runtime whose stop requests come from a script, graceful with a long timeout: a
    /// handler that ignored the stop would be aborted (`forced`) only after it. The tests
    /// using it run on the paused clock, where that timeout and the handlers' pauses are
    /// timers: whichever comes first decides the outcome, however fast the machine.
    fn scripted(interrupt: Interrupt) -> Runtime {
        let script = Script::new().interrupt(interrupt.graceful(Duration::from_secs(20)));
        script
            .install(register_standard_kinds(Runtime::builder()))
            .build()
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_cuts_stream_text_in_its_pause_and_keeps_what_it_streamed() {
        // Stopped after the first chunk, while pausing an hour before the second: ignoring
        // the stop, it would be forced when the graceful timeout (20 s) runs out.
        let runtime = scripted(Interrupt::after_chunks("node", 1));
        let (outcome, _) = run_on(
            &runtime,
            serde_json::json!({
                "id": "node", "kind": "stream_text",
                "params": {"text": "one two three four", "interval": "1h"}
            }),
        )
        .await;
        let stop = outcome.stop_result().expect("stopped by the script");
        assert_eq!(stop.partial_response.as_deref(), Some("one"));
        assert_eq!(stop.interrupted.len(), 1, "{stop:?}");
        assert!(!stop.interrupted[0].forced, "returned by itself: {stop:?}");
        assert!(outcome.output("node").is_none());
        let assistant: Vec<(&str, bool)> = outcome
            .history()
            .persisted
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .map(|m| (m.content.as_str(), m.truncated))
            .collect();
        assert_eq!(assistant, vec![("one", true)], "only the truncated text");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_sleep_at_once() {
        let runtime = scripted(Interrupt::during("node"));
        let (outcome, _) = run_on(
            &runtime,
            serde_json::json!({"id": "node", "kind": "sleep", "params": {"duration": "1h"}}),
        )
        .await;
        let stop = outcome.stop_result().expect("stopped by the script");
        assert_eq!(stop.interrupted.len(), 1, "{stop:?}");
        assert!(!stop.interrupted[0].forced, "returned by itself: {stop:?}");
        assert!(stop.forced.is_empty(), "{stop:?}");
    }

    #[test]
    fn params_are_checked_at_validation() {
        let runtime = runtime();
        let errors = runtime
            .load_json(
                &serde_json::json!({
                    "id": "bad",
                    "nodes": [
                        {"id": "start", "kind": "begin"},
                        {"id": "a", "kind": "stream_text", "params": {"interval": "soon"}},
                        {"id": "b", "kind": "sleep", "params": {"duration": 5}}
                    ],
                    "edges": [{"from": "start", "to": "a"}, {"from": "a", "to": "b"}]
                })
                .to_string(),
            )
            .expect_err("invalid");
        let text: Vec<String> = errors.errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(text.len(), 3, "{text:#?}");
        assert!(
            text[0].contains("node `a`: field `params.text`"),
            "{text:#?}"
        );
        assert!(text[1].contains("params.interval"), "{text:#?}");
        assert!(
            text[2].contains("node `b`: field `params.duration`"),
            "{text:#?}"
        );
    }
}
