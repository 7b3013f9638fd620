//! `runvisor serve`: the HTTP service ([`runvisor::serve`]), or JSON-RPC 2.0 on stdio with
//! `--stdio` ([`runvisor::serve::serve_stdio`]), until Ctrl-C or SIGTERM (or, on stdio, the end
//! of input), which stop every run with reason `shutdown` (each stays resumable) before the
//! process exits 0. On
//! Redis it is a worker like `runvisor worker`: it answers control requests and replays its
//! spill files (at start, and while it runs).

use std::net::SocketAddr;

use anyhow::Context;
use runvisor::Runtime;
use runvisor::redis::RedisStores;
use runvisor::serve::{ServeConfig, Service, serve_stdio};

/// `runvisor serve` flags; each overrides the config file's `serve` section.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on (the config's `serve.listen`; 127.0.0.1:8080 by default).
    #[arg(long, value_name = "ADDR", conflicts_with = "stdio")]
    listen: Option<SocketAddr>,
    /// Require `Authorization: Bearer <TOKEN>` on every endpoint but /healthz, /readyz and
    /// the operator page (/, /page.js, /page.css: they hold no data).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "RUNVISOR_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// The largest request body accepted, in bytes (4 MiB by default).
    #[arg(long, value_name = "BYTES")]
    body_limit: Option<usize>,
    /// Speak JSON-RPC 2.0 on stdin and stdout (one JSON value per line) instead of HTTP:
    /// `agent.stop`, `run.start`, `run.resume`. End of input shuts down.
    #[arg(long)]
    stdio: bool,
}

/// Serves until Ctrl-C or SIGTERM; with Redis stores, also answers other processes' control
/// requests (`ps`, `tree`, stops of its runs).
pub(crate) async fn serve(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    mut config: ServeConfig,
    args: ServeArgs,
) -> anyhow::Result<()> {
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(token) = args.token {
        config.token = Some(token);
    }
    if let Some(limit) = args.body_limit {
        config.body_limit = limit;
    }
    let _control = match redis {
        Some(stores) => Some(
            stores
                .serve_control(runtime)
                .await
                .context("cannot serve control requests")?,
        ),
        None => None,
    };
    // What this process's runs spill while Redis is away is replayed once Redis is back, as
    // a worker does.
    let replaying = redis.map(|stores| {
        super::recover_cli::keep_replaying(
            runtime.clone(),
            stores.clone(),
            runtime.config().lease.ttl,
        )
    });
    if args.stdio {
        let signals = super::ops_cli::shutdown_signals()?;
        let service = Service::new(runtime.clone(), redis.cloned(), &config);
        eprintln!(
            "runvisor serve on stdio: JSON-RPC 2.0, one message per line (worker {}, {} stores)",
            runtime.worker().id,
            if redis.is_some() {
                "redis"
            } else {
                "in-memory"
            }
        );
        let served = serve_stdio(service, std::io::stdin(), std::io::stdout(), async move {
            signals.await;
            eprintln!("shutting down: stopping every run (reason shutdown)");
        })
        .await
        .context("the stdio server failed");
        if let Some(replaying) = replaying {
            replaying.abort();
        }
        served?;
        eprintln!("stopped");
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let signals = super::ops_cli::shutdown_signals()?;
    let service = Service::new(runtime.clone(), redis.cloned(), &config);
    if !address.ip().is_loopback() && config.token.is_none() {
        eprintln!(
            "warning: listening on {address} without a token: anyone who reaches it can start \
             and stop runs (pass --token)"
        );
    }
    // Tests and scripts read the address from this line (port 0 picks a free one).
    eprintln!(
        "runvisor serve listening on http://{address} (worker {}, {} stores)",
        runtime.worker().id,
        if redis.is_some() {
            "redis"
        } else {
            "in-memory"
        }
    );
    let served = runvisor::serve::serve(service, listener, async move {
        signals.await;
        eprintln!("shutting down: stopping every run (reason shutdown)");
    })
    .await
    .context("the server failed");
    if let Some(replaying) = replaying {
        replaying.abort();
    }
    served?;
    eprintln!("stopped");
    Ok(())
}
