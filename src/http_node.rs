//! The `http` node kind: node logic written by a host in any language, behind an HTTP endpoint.
//!
//! ```json
//! {"id": "answer", "kind": "http", "params": {
//!   "url": "http://127.0.0.1:9000/answer",
//!   "input": {"question": "{{sys.query}}"},
//!   "timeout": "2m",
//!   "retry": {"attempts": 3, "backoff": "500ms"}}}
//! ```
//!
//! **Request.** `POST` (or `method`) to `url` with `Content-Type: application/json` and the body
//! `{"input": ..., "run_id": ..., "thread": ..., "node": ..., "path": ..., "attempt": n}`:
//! `input` is the node's `input` parameter with its references resolved (`null` when absent),
//! `path` the node's place through loop iterations and parallel items (`loop/#2/answer`), and
//! `attempt` counts from 1. A `GET` sends no body. `headers` are added (their values may hold
//! references too); a [`traceparent`] header is sent when the run has a trace context.
//!
//! **Response.** By its `Content-Type`:
//! - `application/x-ndjson` (one JSON value per line) or `text/event-stream` (server-sent
//!   events; an event's `data` is read as JSON, or as plain text when it is not JSON, and a
//!   `data: [DONE]` ends the stream): a stream of items. A JSON string, or an object with a
//!   string `text`, is a chunk: it is streamed as the node's output at once. An object with
//!   an `output` object gives the final fields of the output; one with `usage` (names to
//!   numbers) reports what the call consumed; one with `model` (a string) names the model the
//!   host called (the node span's `gen_ai.request.model`); one with `error` (or an SSE event named
//!   `error`) fails the node with the host's message. The node's output is the `output`
//!   fields with `text`, the chunks concatenated, added unless the host set `text` itself.
//! - `text/plain`: `{"text": body}`.
//! - anything else is read as JSON: an object is the output as is; another value is wrapped
//!   as `{"value": ...}`; an empty body is `{}`.
//!
//! A status outside 2xx fails the node, naming the method, URL, status and an excerpt of the
//! body. Redirects are followed only to allowed hosts. An answer larger than
//! `max_response_bytes` (16 MiB by default) fails the node. With `append_message`, the
//! output's `text` becomes an assistant message of the thread.
//!
//! **Timeout and retry.** `timeout` (default 60 s) bounds each attempt, streaming included.
//! `retry` `{attempts, backoff, max_backoff}` (default one attempt; backoff 200 ms, doubled
//! per retry, at most `max_backoff`, 10 s by default; a `Retry-After` in seconds is honoured up
//! to `max_backoff`) retries connection failures, timeouts, 5xx and 429 only, and never once a
//! chunk was streamed.
//!
//! **Stops.** A graceful stop lets the call in flight finish (the engine forces it when the
//! stop's timeout runs out): chunks that arrive after the stop request are still streamed and
//! kept, and an answer that completes in time is the node's output, so the node counts as
//! finished. No new attempt starts once a stop is requested. A force stop aborts the handler,
//! which drops the connection; what was streamed until then is the node's partial output.
//!
//! **Allowed hosts.** Only hosts on the [`AllowList`] may be called: loopback by default. A
//! literal URL is checked when the workflow is validated, every URL again when the node runs.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use ipnet::IpNet;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use runvisor_actors::{
    Map, Message, NodeContext, NodeError, NodeHandler, NodeOutput, ParamIssue, ParamSchema,
    ParamType, Value, async_trait, input_bool, input_duration,
};
use serde::{Deserialize, Serialize};

/// The kind name of [`HttpNode`].
pub const HTTP: &str = "http";

/// How long one attempt may take when `timeout` is not given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause before the first retry when `retry.backoff` is not given.
const DEFAULT_BACKOFF: Duration = Duration::from_millis(200);
/// The longest pause between two attempts when `retry.max_backoff` is not given.
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The most attempts `retry.attempts` may ask for.
const MAX_ATTEMPTS: i64 = 100;
/// How many redirects are followed at most.
const MAX_REDIRECTS: usize = 10;
/// How much of an error body an error message quotes.
const EXCERPT_CHARS: usize = 300;
/// The longest NDJSON line accepted.
const MAX_LINE: usize = 8 * 1024 * 1024;
/// The largest answer read when `max_response_bytes` is not given: 16 MiB.
const DEFAULT_MAX_RESPONSE: u64 = 16 * 1024 * 1024;
/// How much of an error answer is read for its excerpt.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;
/// The methods a node may use.
const METHODS: &[&str] = &["POST", "GET", "PUT", "PATCH", "DELETE"];

/// The `http` section of the config file.
///
/// ```json
/// {"http": {"allow": ["localhost", "127.0.0.0/8", "::1", "api.example.com", "*.corp.example", "10.0.0.0/8"]}}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// The hosts `http` nodes may call; loopback only by default.
    pub allow: AllowList,
}

/// The hosts `http` nodes may call. Each entry is a host name (`api.example.com`, matched
/// exactly, case aside), a wildcard (`*.example.com`: any name below it), an IP address, or a
/// network in CIDR form (`10.0.0.0/8`). A name is never resolved to match an address entry
/// (so a name that resolves to loopback is not allowed by `127.0.0.0/8`), and an address is
/// matched only by address entries. The default: `localhost`, `127.0.0.0/8` and `::1`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct AllowList(Vec<HostRule>);

#[derive(Clone, PartialEq, Eq)]
enum HostRule {
    /// A host name, lowercase, without a trailing dot.
    Name(String),
    /// `*.example.com`, kept as `.example.com`.
    Below(String),
    /// An address or a network.
    Net(IpNet),
}

impl HostRule {
    fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostRule::Name(name), Host::Name(h)) => name == h,
            (HostRule::Below(suffix), Host::Name(h)) => h.ends_with(suffix.as_str()),
            (HostRule::Net(net), Host::Ip(ip)) => net.contains(ip),
            _ => false,
        }
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostRule::Name(name) => f.write_str(name),
            HostRule::Below(suffix) => write!(f, "*{suffix}"),
            HostRule::Net(net) if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "{}", net.addr())
            }
            HostRule::Net(net) => write!(f, "{net}"),
        }
    }
}

impl FromStr for HostRule {
    type Err = String;

    fn from_str(entry: &str) -> Result<Self, String> {
        let text = entry.trim().trim_end_matches('.').to_ascii_lowercase();
        if let Ok(net) = text.parse::<IpNet>() {
            return Ok(HostRule::Net(net.trunc()));
        }
        let bare = text.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(HostRule::Net(IpNet::from(ip)));
        }
        let (below, name) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err(format!(
                "{entry:?} is not a host name, a `*.` wildcard, an IP address or a CIDR network"
            ));
        }
        Ok(if below {
            HostRule::Below(format!(".{name}"))
        } else {
            HostRule::Name(name.to_owned())
        })
    }
}

impl AllowList {
    /// Parses entries (see [`AllowList`]); an entry that is none of the accepted forms is an
    /// error naming it.
    pub fn new<S: AsRef<str>>(entries: impl IntoIterator<Item = S>) -> Result<Self, String> {
        entries
            .into_iter()
            .map(|e| e.as_ref().parse())
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether a URL's host may be called.
    pub fn permits(&self, url: &Url) -> bool {
        Host::of(url).is_some_and(|host| self.0.iter().any(|rule| rule.matches(&host)))
    }
}

impl Default for AllowList {
    fn default() -> Self {
        Self(vec![
            HostRule::Name("localhost".into()),
            HostRule::Net(IpNet::V4(ipnet::Ipv4Net::new_assert(
                std::net::Ipv4Addr::new(127, 0, 0, 0),
                8,
            ))),
            HostRule::Net(IpNet::from(IpAddr::from(std::net::Ipv6Addr::LOCALHOST))),
        ])
    }
}

impl fmt::Debug for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(ToString::to_string))
            .finish()
    }
}

impl TryFrom<Vec<String>> for AllowList {
    type Error = String;

    fn try_from(entries: Vec<String>) -> Result<Self, String> {
        Self::new(entries)
    }
}

impl From<AllowList> for Vec<String> {
    fn from(list: AllowList) -> Self {
        list.0.iter().map(ToString::to_string).collect()
    }
}

/// A URL's host, as the allow-list matches it.
enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    fn of(url: &Url) -> Option<Host> {
        let host = url.host_str()?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        Some(match bare.parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(host.trim_end_matches('.').to_ascii_lowercase()),
        })
    }
}

/// The `http` node kind (see the [module](self) documentation).
pub struct HttpNode {
    allow: Arc<AllowList>,
    /// Built at the first call: building it can fail only in ways a node reports.
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl fmt::Debug for HttpNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpNode")
            .field("allow", &self.allow)
            .finish_non_exhaustive()
    }
}

impl HttpNode {
    /// An `http` kind that calls the hosts the config allows.
    pub fn new(config: &HttpConfig) -> Self {
        Self {
            allow: Arc::new(config.allow.clone()),
            client: OnceLock::new(),
        }
    }

    fn client(&self) -> Result<&reqwest::Client, NodeError> {
        self.client
            .get_or_init(|| {
                let allow = self.allow.clone();
                let policy = reqwest::redirect::Policy::custom(move |attempt| {
                    if attempt.previous().len() >= MAX_REDIRECTS {
                        attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
                    } else if allow.permits(attempt.url()) {
                        attempt.follow()
                    } else {
                        // The 3xx answer is then the response, reported as a failure.
                        attempt.stop()
                    }
                });
                reqwest::Client::builder()
                    .redirect(policy)
                    .user_agent(concat!("runvisor/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|e| format!("cannot set up the HTTP client: {e}"))
            })
            .as_ref()
            .map_err(NodeError::failed)
    }

    /// The URL's problem, if it may not be called: not http, or a host off the allow-list.
    fn url_problem(&self, url: &Url) -> Option<String> {
        if url.scheme() != "http" {
            return Some(format!(
                "{url} is not an http:// URL (https is not supported by this build; put a \
                 TLS-terminating proxy on an allowed host in front of the endpoint)"
            ));
        }
        if !self.allow.permits(url) {
            return Some(format!(
                "host `{}` is not on the allow-list ({:?}); allow it with `http.allow` in the \
                 config file or --http-allow",
                url.host_str().unwrap_or_default(),
                self.allow
            ));
        }
        None
    }
}

#[async_trait]
impl NodeHandler for HttpNode {
    fn params(&self) -> ParamSchema {
        ParamSchema::new()
            .required("url", ParamType::String)
            .optional("method", ParamType::OneOf(METHODS))
            .optional("headers", ParamType::map(ParamType::String))
            .optional("input", ParamType::Any)
            .optional("timeout", ParamType::Duration)
            .optional(
                "retry",
                ParamType::Object(
                    ParamSchema::new()
                        .optional("attempts", ParamType::Integer)
                        .optional("backoff", ParamType::Duration)
                        .optional("max_backoff", ParamType::Duration),
                ),
            )
            .optional("append_message", ParamType::Bool)
            .optional("max_response_bytes", ParamType::Integer)
    }

    fn branches(&self, _: &serde_json::Value) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    fn check_params(&self, params: &serde_json::Value) -> Vec<ParamIssue> {
        let mut issues = Vec::new();
        let issue = |field: &str, problem: String| ParamIssue {
            field: field.to_owned(),
            problem,
        };
        if let Some(url) = params.get("url").and_then(|u| u.as_str()) {
            // The literal part before any reference, when it holds the whole authority.
            let literal = url.find("{{").map_or(url, |i| &url[..i]);
            let whole_host = url.len() == literal.len()
                || literal
                    .split_once("://")
                    .is_some_and(|(_, rest)| rest.contains('/'));
            if whole_host {
                match Url::parse(literal) {
                    Ok(parsed) => {
                        if let Some(problem) = self.url_problem(&parsed) {
                            issues.push(issue("url", problem));
                        }
                    }
                    Err(e) => issues.push(issue("url", format!("{url:?} is not a URL ({e})"))),
                }
            }
        }
        if let Some(serde_json::Value::Object(headers)) = params.get("headers") {
            for name in headers.keys() {
                if HeaderName::from_bytes(name.as_bytes()).is_err() {
                    issues.push(issue(
                        &format!("headers.{name}"),
                        "is not a valid header name".into(),
                    ));
                }
            }
        }
        if let Some(n) = params
            .get("retry")
            .and_then(|r| r.get("attempts"))
            .and_then(serde_json::Value::as_i64)
            && !(1..=MAX_ATTEMPTS).contains(&n)
        {
            issues.push(issue(
                "retry.attempts",
                format!("{n} is not between 1 and {MAX_ATTEMPTS}"),
            ));
        }
        if let Some(n) = params
            .get("max_response_bytes")
            .and_then(serde_json::Value::as_i64)
            && n < 1
        {
            issues.push(issue("max_response_bytes", format!("{n} is not positive")));
        }
        if let Some(t) = params.get("timeout").and_then(|t| t.as_str())
            && humantime::parse_duration(t).is_ok_and(|d| d.is_zero())
        {
            issues.push(issue("timeout", "must be longer than zero".into()));
        }
        issues
    }

    async fn run(&self, input: Value, ctx: NodeContext) -> Result<NodeOutput, NodeError> {
        let call = Call::from_input(&input, &ctx)?;
        if let Some(problem) = self.url_problem(&call.url) {
            return Err(NodeError::invalid_input("url", problem));
        }
        let client = self.client()?;
        let mut attempt = 1;
        let answer = loop {
            let mut stream = Streamed::default();
            let result = tokio::time::timeout(
                call.timeout,
                call.attempt(client, &ctx, attempt, &mut stream),
            )
            .await
            .unwrap_or(Err(Failure::TimedOut));
            let failure = match result {
                Ok(answer) => break answer,
                Err(failure) => failure,
            };
            let retryable = failure.retryable() && stream.chunks == 0;
            if retryable && ctx.stop_requested() {
                // No new attempt once a stop is requested: the node is interrupted, and a
                // resume calls again.
                return Err(NodeError::Stopped);
            }
            if !retryable || attempt >= call.retry.attempts {
                return Err(call.error(failure, attempt, &stream));
            }
            let wait = call.retry.pause(attempt, failure.retry_after());
            tracing::debug!(attempt, ?wait, error = %call.describe(&failure), "retrying");
            tokio::select! {
                biased;
                () = ctx.stopped() => return Err(NodeError::Stopped),
                () = tokio::time::sleep(wait) => {}
            }
            attempt += 1;
        };
        if call.append_message
            && let Some(Value::String(text)) = answer.value.get("text")
            && !text.is_empty()
        {
            ctx.append_message(Message::assistant(text.to_string()));
        }
        Ok(answer)
    }
}

/// The W3C `traceparent` header an `http` node sends, when the run has a trace context.
///
/// This is the one place the header is computed. When spans are exported (see
/// [`telemetry`](crate::telemetry)), it names the node's span (the handler runs within it), so
/// the host's own spans join the run's trace under the node. Otherwise, a run whose inputs
/// carry a valid `traceparent` (a host that started it within a trace of its own passes it as
/// an input) has that one passed along. A `traceparent` given in the node's `headers` takes
/// precedence over this.
pub fn traceparent(ctx: &NodeContext) -> Option<String> {
    if let Some(own) = crate::telemetry::traceparent_of(&tracing::Span::current()) {
        return Some(own);
    }
    match ctx.inputs().get("traceparent") {
        Some(Value::String(s)) if is_traceparent(s) => Some(s.to_string()),
        _ => None,
    }
}

/// Whether a text is a W3C trace context `traceparent`: `VV-TRACEID-PARENTID-FLAGS` in
/// lowercase hex (2, 32, 16 and 2 digits), version not `ff`, ids not all zeros.
fn is_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let hex = |p: &str, n: usize| {
        p.len() == n && p.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let nonzero = |p: &str| p.bytes().any(|b| b != b'0');
    match parts.as_slice() {
        [version, trace, parent, flags] => {
            hex(version, 2)
                && *version != "ff"
                && hex(trace, 32)
                && nonzero(trace)
                && hex(parent, 16)
                && nonzero(parent)
                && hex(flags, 2)
        }
        _ => false,
    }
}

/// One node's call, read from its resolved input.
struct Call {
    url: Url,
    method: Method,
    headers: HeaderMap,
    /// Whether the request has a body (all methods but `GET`).
    sends_body: bool,
    timeout: Duration,
    retry: Retry,
    append_message: bool,
    /// The largest answer read, in bytes.
    max_response: u64,
    /// The body's fields but `attempt`, to which it is added per attempt.
    request: serde_json::Map<String, serde_json::Value>,
}

/// How a call is retried.
#[derive(Debug, Clone, Copy)]
struct Retry {
    attempts: u32,
    backoff: Duration,
    max_backoff: Duration,
}

impl Retry {
    /// The pause after failed attempt `attempt` (from 1): the backoff doubled per retry, or
    /// what the host asked for, never more than `max_backoff`.
    fn pause(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let doubled = self
            .backoff
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)));
        retry_after.unwrap_or(doubled).min(self.max_backoff)
    }
}

impl Call {
    fn from_input(input: &Value, ctx: &NodeContext) -> Result<Self, NodeError> {
        let text = |field: &str| -> Result<Option<&str>, NodeError> {
            match input.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(other) => Err(NodeError::invalid_input(
                    field,
                    format!("expected a string, found {}", other.type_name()),
                )),
            }
        };
        let raw = text("url")?.ok_or_else(|| NodeError::invalid_input("url", "is required"))?;
        let url = Url::parse(raw)
            .map_err(|e| NodeError::invalid_input("url", format!("{raw:?} is not a URL ({e})")))?;
        let method = match text("method")? {
            None => Method::POST,
            Some(m) if METHODS.contains(&m) => Method::from_bytes(m.as_bytes())
                .map_err(|e| NodeError::invalid_input("method", e.to_string()))?,
            Some(m) => {
                return Err(NodeError::invalid_input(
                    "method",
                    format!("{m:?} is not one of {}", METHODS.join(", ")),
                ));
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("application/json, application/x-ndjson, text/event-stream"),
        );
        if let Some(tp) = traceparent(ctx).and_then(|tp| HeaderValue::from_str(&tp).ok()) {
            headers.insert(HeaderName::from_static("traceparent"), tp);
        }
        match input.get("headers") {
            None | Some(Value::Null) => {}
            Some(Value::Object(given)) => {
                for (name, value) in given.iter() {
                    let field = format!("headers.{name}");
                    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                        NodeError::invalid_input(&field, "is not a valid header name")
                    })?;
                    let value = HeaderValue::from_str(&value.render()).map_err(|_| {
                        NodeError::invalid_input(&field, "is not a valid header value")
                    })?;
                    headers.insert(name, value);
                }
            }
            Some(other) => {
                return Err(NodeError::invalid_input(
                    "headers",
                    format!("expected an object, found {}", other.type_name()),
                ));
            }
        }
        let timeout = input_duration(input, "timeout")?.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err(NodeError::invalid_input(
                "timeout",
                "must be longer than zero",
            ));
        }
        let retry = match input.get("retry") {
            None | Some(Value::Null) => Retry {
                attempts: 1,
                backoff: DEFAULT_BACKOFF,
                max_backoff: DEFAULT_MAX_BACKOFF,
            },
            Some(retry @ Value::Object(_)) => Retry {
                attempts: match retry.get("attempts") {
                    None | Some(Value::Null) => 1,
                    Some(n) => n
                        .as_i64()
                        .filter(|n| (1..=MAX_ATTEMPTS).contains(n))
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            NodeError::invalid_input(
                                "retry.attempts",
                                format!("{n} is not between 1 and {MAX_ATTEMPTS}"),
                            )
                        })?,
                },
                backoff: input_duration(retry, "backoff")
                    .map_err(|e| nested("retry", e))?
                    .unwrap_or(DEFAULT_BACKOFF),
                max_backoff: input_duration(retry, "max_backoff")
                    .map_err(|e| nested("retry", e))?
                    .unwrap_or(DEFAULT_MAX_BACKOFF),
            },
            Some(other) => {
                return Err(NodeError::invalid_input(
                    "retry",
                    format!("expected an object, found {}", other.type_name()),
                ));
            }
        };
        let mut request = serde_json::Map::new();
        request.insert(
            "input".into(),
            input
                .get("input")
                .map_or(serde_json::Value::Null, Value::to_json),
        );
        request.insert("run_id".into(), ctx.run_id().to_string().into());
        request.insert("thread".into(), ctx.thread().to_string().into());
        request.insert("node".into(), ctx.node_id().to_string().into());
        request.insert("path".into(), ctx.path().to_string().into());
        let sends_body = method != Method::GET;
        if sends_body {
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        Ok(Self {
            url,
            method,
            headers,
            sends_body,
            timeout,
            retry,
            append_message: input_bool(input, "append_message", false)?,
            max_response: match input.get("max_response_bytes") {
                None | Some(Value::Null) => DEFAULT_MAX_RESPONSE,
                Some(n) => n
                    .as_i64()
                    .and_then(|n| u64::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        NodeError::invalid_input(
                            "max_response_bytes",
                            format!("{n} is not a positive number of bytes"),
                        )
                    })?,
            },
            request,
        })
    }

    /// One attempt: the request, then its answer read whole or streamed into `stream`.
    async fn attempt(
        &self,
        client: &reqwest::Client,
        ctx: &NodeContext,
        attempt: u32,
        stream: &mut Streamed,
    ) -> Result<NodeOutput, Failure> {
        let mut request = client
            .request(self.method.clone(), self.url.clone())
            .headers(self.headers.clone());
        if self.sends_body {
            let mut body = self.request.clone();
            body.insert("attempt".into(), attempt.into());
            let bytes = serde_json::to_vec(&serde_json::Value::Object(body))
                .map_err(|e| Failure::Request(e.to_string()))?;
            request = request.body(bytes);
        }
        let response = request.send().await.map_err(Failure::from_send)?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = read_all(response, ERROR_BODY_LIMIT)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            return Err(Failure::Status {
                status,
                retry_after,
                location,
                excerpt: excerpt(&body),
            });
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            })
            .unwrap_or_default();
        match content_type.as_str() {
            "application/x-ndjson" | "application/jsonl" | "application/jsonlines" => {
                ndjson(limited(response, self.max_response), ctx, stream).await?;
                stream.output()
            }
            "text/event-stream" => {
                sse(limited(response, self.max_response), ctx, stream).await?;
                stream.output()
            }
            "text/plain" => {
                let bytes = read_all(response, self.max_response).await?;
                let text = String::from_utf8_lossy(&bytes).into_owned();
                Ok(NodeOutput::new(Value::from_iter([("text", text)])))
            }
            _ => {
                let bytes = read_all(response, self.max_response).await?;
                json_output(&bytes, &content_type)
            }
        }
    }

    /// What a method and URL did, for messages.
    fn describe(&self, failure: &Failure) -> String {
        format!("{} {}: {failure}", self.method, self.url)
    }

    /// The node's error for a failure after `attempts` attempts.
    fn error(&self, failure: Failure, attempts: u32, stream: &Streamed) -> NodeError {
        if let Failure::Host(message) = &failure {
            return NodeError::failed(format!(
                "{} {} reported an error: {message}",
                self.method, self.url
            ));
        }
        let mut message = self.describe(&failure);
        if attempts > 1 {
            message.push_str(&format!(" (after {attempts} attempts)"));
        }
        if stream.chunks > 0 {
            message.push_str(&format!(
                " (after {} streamed chunks: not retried)",
                stream.chunks
            ));
        }
        NodeError::failed(message)
    }
}

/// A field of a nested object named with its parent (`retry.backoff`).
fn nested(parent: &str, error: NodeError) -> NodeError {
    match error {
        NodeError::InvalidInput { field, reason } => {
            NodeError::invalid_input(format!("{parent}.{field}"), reason)
        }
        other => other,
    }
}

/// The start of a body, for an error message.
fn excerpt(body: &str) -> String {
    let body = body.trim();
    match body.char_indices().nth(EXCERPT_CHARS) {
        Some((i, _)) => format!("{}...", &body[..i]),
        None => body.to_owned(),
    }
}

/// Why an attempt failed.
#[derive(Debug)]
enum Failure {
    /// The request could not be built.
    Request(String),
    /// No connection could be made.
    Connect(reqwest::Error),
    /// The request failed otherwise (redirects included).
    Send(reqwest::Error),
    /// The attempt took longer than the timeout.
    TimedOut,
    /// A status outside 2xx.
    Status {
        status: StatusCode,
        retry_after: Option<Duration>,
        location: Option<String>,
        excerpt: String,
    },
    /// The body broke off, could not be read or was too large.
    Body(BodyError),
    /// The body is not what the content type says.
    Malformed(String),
    /// The host reported an error in its stream.
    Host(String),
}

impl Failure {
    fn from_send(e: reqwest::Error) -> Self {
        if e.is_connect() {
            Failure::Connect(e)
        } else if e.is_timeout() {
            Failure::TimedOut
        } else {
            Failure::Send(e)
        }
    }

    /// Connection failures, timeouts, 5xx and 429 may be tried again.
    fn retryable(&self) -> bool {
        match self {
            Failure::Connect(_) | Failure::TimedOut => true,
            Failure::Status { status, .. } => {
                status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS
            }
            _ => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// reqwest's error and its causes on one line.
        fn chain(e: &dyn std::error::Error) -> String {
            let mut text = e.to_string();
            let mut source = e.source();
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
        match self {
            Failure::Request(e) => write!(f, "cannot build the request: {e}"),
            Failure::Connect(e) => write!(f, "cannot connect: {}", chain(e)),
            Failure::Send(e) => write!(f, "request failed: {}", chain(e)),
            Failure::TimedOut => f.write_str("timed out"),
            Failure::Status {
                status,
                location: Some(location),
                ..
            } if status.is_redirection() => write!(
                f,
                "answered {status}, a redirect to {location} (not followed: its host is not on \
                 the allow-list)"
            ),
            Failure::Status {
                status, excerpt, ..
            } if excerpt.is_empty() => write!(f, "answered {status}"),
            Failure::Status {
                status, excerpt, ..
            } => write!(f, "answered {status}: {excerpt}"),
            Failure::Body(BodyError::Read(e)) => {
                write!(f, "the answer broke off: {}", chain(e))
            }
            Failure::Body(e @ BodyError::TooLarge(_)) => write!(f, "{e}"),
            Failure::Malformed(e) => f.write_str(e),
            Failure::Host(e) => f.write_str(e),
        }
    }
}

/// What a streamed answer gave so far.
#[derive(Debug, Default)]
struct Streamed {
    text: String,
    chunks: u64,
    output: Option<serde_json::Map<String, serde_json::Value>>,
    usage: Vec<(String, f64)>,
    model: Option<String>,
}

impl Streamed {
    /// Takes one item of the stream: a chunk (streamed at once, even during a graceful stop:
    /// the call may finish within its timeout), the final output, usage, or the host's error.
    fn take(&mut self, item: serde_json::Value, ctx: &NodeContext) -> Result<(), Failure> {
        use serde_json::Value as J;
        match item {
            J::String(chunk) => {
                self.chunk(chunk, ctx);
                Ok(())
            }
            J::Object(mut object) => {
                if let Some(error) = object.remove("error") {
                    return Err(Failure::Host(match error {
                        J::String(s) => s,
                        other => other.to_string(),
                    }));
                }
                let mut known = false;
                if let Some(text) = object.remove("text") {
                    let J::String(chunk) = text else {
                        return Err(Failure::Malformed(
                            "a stream item's `text` is not a string".into(),
                        ));
                    };
                    self.chunk(chunk, ctx);
                    known = true;
                }
                if let Some(output) = object.remove("output") {
                    let J::Object(output) = output else {
                        return Err(Failure::Malformed(
                            "a stream item's `output` is not an object".into(),
                        ));
                    };
                    self.output = Some(output);
                    known = true;
                }
                if let Some(usage) = object.remove("usage") {
                    let J::Object(usage) = usage else {
                        return Err(Failure::Malformed(
                            "a stream item's `usage` is not an object".into(),
                        ));
                    };
                    for (name, amount) in usage {
                        let amount = amount.as_f64().ok_or_else(|| {
                            Failure::Malformed(format!("usage `{name}` is not a number"))
                        })?;
                        self.usage.push((name, amount));
                    }
                    known = true;
                }
                if let Some(model) = object.remove("model") {
                    let J::String(model) = model else {
                        return Err(Failure::Malformed(
                            "a stream item's `model` is not a string".into(),
                        ));
                    };
                    self.model = Some(model);
                    known = true;
                }
                if known {
                    Ok(())
                } else {
                    Err(Failure::Malformed(format!(
                        "a stream item has none of `text`, `output`, `usage`, `model` or `error` \
                         (keys: {})",
                        object.keys().cloned().collect::<Vec<_>>().join(", ")
                    )))
                }
            }
            other => Err(Failure::Malformed(format!(
                "a stream item is neither a string nor an object: {}",
                excerpt(&other.to_string())
            ))),
        }
    }

    fn chunk(&mut self, chunk: String, ctx: &NodeContext) {
        if chunk.is_empty() {
            return;
        }
        self.text.push_str(&chunk);
        self.chunks += 1;
        ctx.emit_while_stopping(chunk);
    }

    /// The output at the end of the stream: the host's `output` fields, with `text` (the
    /// chunks concatenated) unless the host set it.
    fn output(&mut self) -> Result<NodeOutput, Failure> {
        let mut fields = self.output.take().unwrap_or_default();
        fields
            .entry("text")
            .or_insert_with(|| std::mem::take(&mut self.text).into());
        let mut output = NodeOutput::new(Value::from(serde_json::Value::Object(fields)));
        for (name, amount) in self.usage.drain(..) {
            output = output.with_usage(name, amount);
        }
        output.model = self.model.take();
        Ok(output)
    }
}

/// Why an answer's body could not be read.
#[derive(Debug)]
enum BodyError {
    /// It broke off.
    Read(reqwest::Error),
    /// It is larger than the limit.
    TooLarge(u64),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Read(e) => write!(f, "{e}"),
            BodyError::TooLarge(limit) => write!(
                f,
                "the answer is larger than {limit} bytes (raise `max_response_bytes`)"
            ),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Read(e) => Some(e),
            BodyError::TooLarge(_) => None,
        }
    }
}

/// The answer's body as a stream of bytes that fails once more than `limit` came.
fn limited(
    response: reqwest::Response,
    limit: u64,
) -> impl Stream<Item = Result<Bytes, BodyError>> + Send + Unpin {
    let mut total: u64 = 0;
    response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(BodyError::Read)?;
        total = total.saturating_add(chunk.len() as u64);
        if total > limit {
            return Err(BodyError::TooLarge(limit));
        }
        Ok(chunk)
    })
}

/// The whole body, at most `limit` bytes.
async fn read_all(response: reqwest::Response, limit: u64) -> Result<Vec<u8>, Failure> {
    if response.content_length().is_some_and(|n| n > limit) {
        return Err(Failure::Body(BodyError::TooLarge(limit)));
    }
    let mut body = Vec::new();
    let mut chunks = limited(response, limit);
    while let Some(chunk) = chunks.next().await {
        body.extend_from_slice(&chunk.map_err(Failure::Body)?);
    }
    Ok(body)
}

/// Reads an NDJSON answer into `stream`, one JSON value per line (blank lines skipped).
async fn ndjson(
    body: impl Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    ctx: &NodeContext,
    stream: &mut Streamed,
) -> Result<(), Failure> {
    let reader = tokio_util::io::StreamReader::new(body.map_err(std::io::Error::other));
    let mut lines = tokio_util::codec::FramedRead::new(
        reader,
        tokio_util::codec::LinesCodec::new_with_max_length(MAX_LINE),
    );
    while let Some(line) = lines.next().await {
        let line = line.map_err(|e| Failure::Malformed(format!("the answer broke off: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let item = serde_json::from_str(&line).map_err(|e| {
            Failure::Malformed(format!(
                "an NDJSON line is not JSON ({e}): {}",
                excerpt(&line)
            ))
        })?;
        stream.take(item, ctx)?;
    }
    Ok(())
}

/// Reads a server-sent events answer into `stream`.
async fn sse(
    body: impl Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    ctx: &NodeContext,
    stream: &mut Streamed,
) -> Result<(), Failure> {
    use eventsource_stream::Eventsource;
    let mut events = body.eventsource();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| Failure::Malformed(format!("the answer broke off: {e}")))?;
        if event.data == "[DONE]" {
            break;
        }
        if event.event == "error" {
            return Err(Failure::Host(event.data));
        }
        let item = match serde_json::from_str::<serde_json::Value>(&event.data) {
            Ok(item @ (serde_json::Value::String(_) | serde_json::Value::Object(_))) => item,
            _ => serde_json::Value::String(event.data),
        };
        stream.take(item, ctx)?;
    }
    Ok(())
}

/// A whole JSON answer as the node's output.
fn json_output(bytes: &[u8], content_type: &str) -> Result<NodeOutput, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(NodeOutput::new(Value::Object(Map::new())));
    }
    let json: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        let shown = if content_type.is_empty() {
            "no content type".to_owned()
        } else {
            format!("content type {content_type}")
        };
        Failure::Malformed(format!(
            "the answer ({shown}) is not JSON ({e}): {}",
            excerpt(&String::from_utf8_lossy(bytes))
        ))
    })?;
    Ok(NodeOutput::new(match json {
        object @ serde_json::Value::Object(_) => Value::from(object),
        other => Value::from_iter([("value", Value::from(other))]),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> AllowList {
        AllowList::new(entries).expect("valid entries")
    }

    fn url(s: &str) -> Url {
        Url::parse(s).expect("a URL")
    }

    #[test]
    fn the_default_allows_loopback_only() {
        let list = AllowList::default();
        for ok in [
            "http://127.0.0.1:8080/x",
            "http://127.9.9.9/",
            "http://[::1]:9000/",
            "http://localhost/",
            "http://LOCALHOST./",
        ] {
            assert!(list.permits(&url(ok)), "{ok}");
        }
        for no in [
            "http://10.0.0.1/",
            "http://[::2]/",
            "http://example.com/",
            "http://localhost.example.com/",
            "http://128.0.0.1/",
        ] {
            assert!(!list.permits(&url(no)), "{no}");
        }
        assert_eq!(
            Vec::<String>::from(list),
            vec!["localhost", "127.0.0.0/8", "::1"]
        );
    }

    #[test]
    fn entries_are_names_wildcards_addresses_or_networks() {
        let list = allow(&["api.example.com", "*.corp.example", "10.0.0.0/8", "fd00::1"]);
        assert!(list.permits(&url("http://API.example.com/")));
        assert!(!list.permits(&url("http://other.example.com/")));
        assert!(list.permits(&url("http://a.b.corp.example/")));
        assert!(!list.permits(&url("http://corp.example/")));
        assert!(list.permits(&url("http://10.2.3.4/")));
        assert!(list.permits(&url("http://[fd00::1]/")));
        assert!(
            !list.permits(&url("http://127.0.0.1/")),
            "the list replaces the default"
        );
        for bad in ["", "a b", "*.", "http://x", "10.0.0.0/40"] {
            assert!(AllowList::new([bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_config_section_reads_and_names_bad_entries() {
        let config: HttpConfig =
            serde_json::from_str(r#"{"allow": ["10.0.0.0/8"]}"#).expect("valid");
        assert!(config.allow.permits(&url("http://10.1.1.1/")));
        let bad = serde_json::from_str::<HttpConfig>(r#"{"allow": ["no way"]}"#)
            .expect_err("refused")
            .to_string();
        assert!(bad.contains("\"no way\" is not a host name"), "{bad}");
    }

    #[test]
    fn traceparents_are_checked() {
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert!(!is_traceparent(bad), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let retry = Retry {
            attempts: 5,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
        };
        assert_eq!(retry.pause(1, None), Duration::from_millis(100));
        assert_eq!(retry.pause(2, None), Duration::from_millis(200));
        assert_eq!(retry.pause(3, None), Duration::from_millis(350));
        assert_eq!(
            retry.pause(1, Some(Duration::from_secs(1))),
            Duration::from_millis(350)
        );
        assert_eq!(retry.pause(40, None), Duration::from_millis(350));
    }

    #[test]
    fn whole_answers_become_objects() {
        let out = |body: &str| json_output(body.as_bytes(), "application/json").map(|o| o.value);
        assert_eq!(
            out(r#"{"a": 1}"#).expect("json"),
            Value::from_iter([("a", 1)])
        );
        assert_eq!(
            out("[1, 2]").expect("json"),
            Value::from_iter([("value", Value::from(vec![1, 2]))])
        );
        assert_eq!(out("  ").expect("empty"), Value::Object(Map::new()));
        let err = out("<html>").expect_err("not json").to_string();
        assert!(err.contains("content type application/json"), "{err}");
    }
}
