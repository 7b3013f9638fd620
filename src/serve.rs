//! `runvisor serve`: the runtime as an HTTP service, for hosts and operators that are not Rust.
//!
//! The native API lives under `/v1` (runs: start, waiting for the outcome or streaming the
//! events as server-sent events, list, get, tree, stop, cancel; threads: resume, checkpoints;
//! workflow validation; the runs and their changes as server-sent events for operators,
//! `/v1/events`; its OpenAPI document at `/openapi.json`), beside `/healthz`, `/readyz`,
//! `/metrics` (OpenMetrics text), the operator page at `/` (embedded HTML, CSS and
//! JavaScript that call the native API), and
//! the seeds' endpoints with their own JSON: the stops (FastGPT's `/api/v2/chat/stop`, NexAU's
//! `/stop`) and the checkpoint-ops seed's cleanup and stats (`/api/v0/checkpoint/direct/...`,
//! on Redis). Every other answer is JSON; every error is
//! `{"error": {"code": ..., "message": ..., ...details}}` with a stable code ([`ApiError`], the
//! one place that maps errors to HTTP statuses), except those NexAU's `/stop` answers in its
//! `StopResponse` and those the checkpoint-ops endpoints answer in the seed's error shape.
//!
//! `serve --stdio` ([`serve_stdio`]) answers NexAU's `agent.stop`, `run.start` and
//! `run.resume` as JSON-RPC 2.0 over stdin and stdout, through the same handlers.
//!
//! Safe by default: the default address is loopback; with a token every endpoint but the
//! health checks and the operator page's files (which hold no data) requires `Authorization: Bearer <token>` (compared in constant time); request
//! bodies are size-limited and must say they are JSON (so a web page cannot post a form to a
//! loopback server: without CORS, which is not served, a browser asks first and is refused);
//! ids are checked before they reach a store.
//!
//! On shutdown ([`serve`]'s `shutdown` future) the service takes no new runs, stops every run
//! with reason `shutdown` (each stays resumable), answers the requests in flight (a request
//! waiting for a run gets its stop result), then returns.

mod api;
mod checkpoint_ops;
mod compat;
mod error;
mod events;
mod extract;
mod metrics;
mod openapi;
mod page;
mod runs;
mod stdio;
mod stream;
mod threads;

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use runvisor_actors::Runtime;
use serde::{Deserialize, Serialize};

pub use error::ApiError;
pub use stdio::serve_stdio;

use crate::redis::RedisStores;
use crate::redis::retention::Layout;

/// The `serve` section of the config file.
///
/// ```json
/// {"serve": {"listen": "127.0.0.1:8080", "token": "...", "body_limit": 4194304,
///            "checkpoint_layout": "native", "checkpoint_keep_count": 10}}
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// The address to listen on; loopback by default.
    pub listen: SocketAddr,
    /// When set, every endpoint but `/healthz`, `/readyz` and the operator page's files
    /// (`/`, `/page.js`, `/page.css`) requires `Authorization: Bearer <token>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The largest request body accepted, in bytes; larger ones are refused with 413.
    pub body_limit: usize,
    /// The layout the checkpoint-ops endpoints work on when a request names none (`native`
    /// by default; `compat` for `checkpoint:{user}:{timestamp}:{id}` keys).
    pub checkpoint_layout: Layout,
    /// How many checkpoints a checkpoint-ops cleanup keeps per thread when the request gives
    /// no `keep_count` (the seed's `CHECKPOINT_KEEP_COUNT`, 10 by default; at least 1).
    pub checkpoint_keep_count: NonZeroUsize,
}

impl ServeConfig {
    /// The default address: loopback, port 8080.
    pub const DEFAULT_LISTEN: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
    /// The default body limit: 4 MiB.
    pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;
    /// The default `keep_count` of a checkpoint-ops cleanup: 10, as the seed's.
    pub const DEFAULT_CHECKPOINT_KEEP_COUNT: NonZeroUsize = NonZeroUsize::new(10).unwrap();
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: Self::DEFAULT_LISTEN,
            token: None,
            body_limit: Self::DEFAULT_BODY_LIMIT,
            checkpoint_layout: Layout::Native,
            checkpoint_keep_count: Self::DEFAULT_CHECKPOINT_KEEP_COUNT,
        }
    }
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("body_limit", &self.body_limit)
            .field("checkpoint_layout", &self.checkpoint_layout)
            .field("checkpoint_keep_count", &self.checkpoint_keep_count)
            .finish()
    }
}

/// The service: a runtime (with its Redis stores, when it has them) behind the HTTP API.
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Service {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("runtime", &self.shared.runtime)
            .field("redis", &self.shared.redis.is_some())
            .field("draining", &self.shared.draining.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What every handler shares.
struct Shared {
    runtime: Runtime,
    redis: Option<RedisStores>,
    /// Set once shutdown began: no run starts any more.
    draining: AtomicBool,
    token: Option<String>,
    body_limit: usize,
    checkpoint_layout: Layout,
    checkpoint_keep_count: NonZeroUsize,
    metrics: metrics::Metrics,
    /// The changes of its runs, for `/v1/events`.
    changes: events::Changes,
}

impl Service {
    /// A service for `runtime`; `redis` when its stores are on Redis (runs of other workers
    /// are then listed, shown and stopped through their control mailboxes).
    pub fn new(runtime: Runtime, redis: Option<RedisStores>, config: &ServeConfig) -> Self {
        let service = Self {
            shared: Arc::new(Shared {
                runtime,
                redis,
                draining: AtomicBool::new(false),
                token: config.token.clone().filter(|t| !t.is_empty()),
                body_limit: config.body_limit,
                checkpoint_layout: config.checkpoint_layout,
                checkpoint_keep_count: config.checkpoint_keep_count,
                metrics: metrics::Metrics::new(),
                changes: events::Changes::new(),
            }),
        };
        metrics::keep_fresh(&service);
        service
    }

    /// A handle that does not keep the service alive.
    fn downgrade(&self) -> std::sync::Weak<Shared> {
        Arc::downgrade(&self.shared)
    }

    /// The service, if it still lives.
    fn upgrade(weak: &std::sync::Weak<Shared>) -> Option<Self> {
        weak.upgrade().map(|shared| Self { shared })
    }

    /// The HTTP routes, with authentication, the body limit and JSON errors.
    pub fn router(&self) -> Router {
        api::router(self.clone())
    }

    /// The runtime served.
    pub fn runtime(&self) -> &Runtime {
        &self.shared.runtime
    }

    fn metrics(&self) -> &metrics::Metrics {
        &self.shared.metrics
    }

    fn redis(&self) -> Option<&RedisStores> {
        self.shared.redis.as_ref()
    }

    fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::SeqCst)
    }

    /// Takes no new runs from now on, and stops every run of this process with reason
    /// `shutdown` (gracefully, within the runtime's stop timeout): each stays resumable.
    /// Requests waiting for those runs get their stop results.
    pub async fn drain(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
        self.shared.changes.shutting_down();
        for (run, reply) in self.shared.runtime.shutdown().await {
            if let Err(e) = reply {
                tracing::warn!(%run, error = %e, "a run did not stop cleanly at shutdown");
            }
        }
    }
}

/// How long requests still in flight after the runs stopped may take to be answered.
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// Serves `service` on `listener` until `shutdown` completes; then drains it
/// ([`Service::drain`]: every run stopped with reason `shutdown`, each resumable), answers the
/// requests in flight (for ten seconds at most) and returns.
pub async fn serve(
    service: Service,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, service.router()).with_graceful_shutdown(async move {
        let _ = stop_rx.await;
    });
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        done = &mut server => return done,
        () = shutdown => {}
    }
    // The runs stop while the server still answers: requests waiting for them get their
    // stop results; new runs are refused.
    service.drain().await;
    let _ = stop_tx.send(());
    match tokio::time::timeout(ANSWER_GRACE, server).await {
        Ok(done) => done,
        Err(_) => {
            tracing::warn!("requests still open {ANSWER_GRACE:?} after shutdown; closing them");
            Ok(())
        }
    }
}
