//! `runvisor ps`, `runvisor tree` and `runvisor worker`: runs as operators see them, across
//! every process sharing the Redis, and a long-running worker.

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use runvisor::ops::{RunRow, TreeError};
use runvisor::redis::RedisStores;
use runvisor::worker::WorkerOptions;
use runvisor::{ActorTree, RunId, RunQuery, RunStatus, Runtime, ThreadId, WorkerId};

/// `runvisor ps` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct PsArgs {
    /// Also runs that ended (the newest `--limit` runs, whatever their status).
    #[arg(short, long)]
    all: bool,
    /// Only runs with this status (repeat for several): running, awaiting_input, orphaned,
    /// answered, stopped, succeeded, failed, cancelled. A status of ended runs looks among
    /// the newest runs, as `--all` does.
    #[arg(long, value_name = "STATUS", value_parser = parse_status)]
    status: Vec<RunStatus>,
    /// Only runs of this thread.
    #[arg(long, value_name = "ID")]
    thread: Option<String>,
    /// Only runs with this app id.
    #[arg(long, value_name = "ID")]
    app: Option<String>,
    /// Only runs with this chat id.
    #[arg(long, value_name = "ID")]
    chat: Option<String>,
    /// Only runs with this task id.
    #[arg(long, value_name = "ID")]
    task: Option<String>,
    /// Only runs of this user (their `--user` label).
    #[arg(long, value_name = "ID")]
    user: Option<String>,
    /// Only runs of this worker.
    #[arg(long, value_name = "ID")]
    worker: Option<String>,
    /// At most this many runs, newest first.
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: usize,
    /// How long to wait for the workers to say what they run now.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// `runvisor tree` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct TreeArgs {
    /// The run.
    run: String,
    /// How long to wait for the worker that runs it to answer.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Print the tree as JSON.
    #[arg(long)]
    json: bool,
}

/// `runvisor worker` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// Take orphaned runs over (runs whose worker stopped heartbeating), as the config's
    /// `runtime.adopt_orphans` does.
    #[arg(long)]
    adopt_orphans: bool,
    /// How many queued jobs (`runvisor submit`) this worker runs at once.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// When progress is saved (as for `run`); the config's `runtime.durability` otherwise.
    #[arg(long, value_enum)]
    durability: Option<super::DurabilityArg>,
}

/// The durability `runvisor worker` was given.
pub(crate) fn durability(args: &WorkerArgs) -> Option<super::DurabilityArg> {
    args.durability
}

fn parse_status(text: &str) -> Result<RunStatus, String> {
    RunStatus::parse(text).map_err(|e| e.to_string())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `3m12s`, `4h5m`, `2d3h`: an age to the second, its two largest units.
fn age(since_ms: u64) -> String {
    let secs = now_ms().saturating_sub(since_ms) / 1000;
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, ..) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

/// `runvisor ps`.
pub(crate) async fn ps(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    args: PsArgs,
) -> anyhow::Result<()> {
    let query = RunQuery {
        include_ended: args.all,
        limit: args.limit,
        statuses: args.status,
        thread: args
            .thread
            .as_deref()
            .map(ThreadId::new)
            .transpose()
            .context("bad --thread")?,
        app_id: args.app,
        chat_id: args.chat,
        task_id: args.task,
        user_id: args.user,
        worker: args
            .worker
            .as_deref()
            .map(WorkerId::new)
            .transpose()
            .context("bad --worker")?,
    };
    let rows = runvisor::ops::list_runs(runtime, redis, &query, args.wait)
        .await
        .context("cannot list the runs")?;
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &rows).map_err(io::Error::from)?;
        writeln!(out)?;
    } else {
        print_table(&mut out, &rows)?;
    }
    out.flush()?;
    Ok(())
}

fn print_table(out: &mut impl Write, rows: &[RunRow]) -> io::Result<()> {
    let header = [
        "RUN", "THREAD", "LABELS", "STATUS", "WORKER", "AGE", "NODES",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|row| {
            let labels = match (&row.app_id, &row.chat_id, &row.task_id) {
                (_, _, Some(task)) => format!("task={task}"),
                (Some(app), Some(chat), None) => format!("app={app} chat={chat}"),
                (Some(app), None, None) => format!("app={app}"),
                (None, Some(chat), None) => format!("chat={chat}"),
                (None, None, None) => "-".to_owned(),
            };
            let status = match (&row.stop_reason, row.status) {
                (Some(reason), RunStatus::Stopped | RunStatus::Cancelled) => {
                    format!("{} ({reason})", row.status)
                }
                _ => row.status.to_string(),
            };
            let worker = match &row.worker {
                Some(w) if row.worker_alive || !row.status.is_open() => w.to_string(),
                Some(w) => format!("{w} (gone)"),
                None => "-".to_owned(),
            };
            let nodes = match &row.nodes {
                Some(nodes) if nodes.is_empty() => "-".to_owned(),
                Some(nodes) => nodes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                None if row.status == RunStatus::Running => "?".to_owned(),
                None => "-".to_owned(),
            };
            [
                row.run_id.to_string(),
                row.thread.to_string(),
                labels,
                status,
                worker,
                age(row.started_at_ms),
                nodes,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut dyn Write, row: &[&str]| -> io::Result<()> {
        let mut text = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  "));
            }
        }
        writeln!(out, "{}", text.trim_end())
    };
    line(out, &header)?;
    for row in &cells {
        let row: Vec<&str> = row.iter().map(String::as_str).collect();
        line(out, &row)?;
    }
    Ok(())
}

/// `runvisor tree`: the error says why there is no tree.
pub(crate) async fn tree(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    args: TreeArgs,
) -> Result<(), TreeFailure> {
    let run: RunId = args
        .run
        .parse()
        .map_err(|_| TreeFailure::BadInput(format!("bad run id {:?}", args.run)))?;
    let tree = runvisor::ops::tree(runtime, redis, run, args.wait)
        .await
        .map_err(TreeFailure::Tree)?;
    let mut out = io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &tree)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        print_tree(&mut out, &tree, "", true, true)
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| TreeFailure::Io(e.into()))
}

/// Why `tree` printed no tree.
#[derive(Debug)]
pub(crate) enum TreeFailure {
    BadInput(String),
    Tree(TreeError),
    Io(anyhow::Error),
}

/// One line per actor: `run_supervisor running`, `├─ loop l running (iteration 2)`, ...
fn print_tree(
    out: &mut impl Write,
    tree: &ActorTree,
    indent: &str,
    last: bool,
    root: bool,
) -> io::Result<()> {
    let mut line = String::new();
    if !root {
        line.push_str(indent);
        line.push_str(if last { "└─ " } else { "├─ " });
    }
    line.push_str(&tree.kind);
    if let Some(path) = &tree.path {
        line.push(' ');
        line.push_str(&path.to_string());
    } else if let Some(node) = &tree.node_id {
        line.push(' ');
        line.push_str(node.as_str());
    }
    line.push(' ');
    line.push_str(&tree.status);
    if let Some(i) = tree.iteration {
        line.push_str(&format!(" (iteration {i})"));
    }
    if !tree.items.is_empty() {
        let items: Vec<String> = tree.items.iter().map(ToString::to_string).collect();
        line.push_str(&format!(" (items in flight: {})", items.join(", ")));
    }
    line.push_str(&format!(" [{}]", tree.actor_id));
    writeln!(out, "{line}")?;
    let child_indent = if root {
        String::new()
    } else {
        format!("{indent}{}", if last { "   " } else { "│  " })
    };
    for (i, child) in tree.children.iter().enumerate() {
        print_tree(
            out,
            child,
            &child_indent,
            i + 1 == tree.children.len(),
            false,
        )?;
    }
    Ok(())
}

/// Whether `runvisor worker` should adopt orphans.
pub(crate) fn adopts(args: &WorkerArgs) -> bool {
    args.adopt_orphans
}

/// `runvisor worker`: serves control requests (and adopts orphans when configured) until
/// Ctrl-C or SIGTERM, then stops its runs gracefully (they stay resumable) and removes its
/// heartbeat.
pub(crate) async fn worker(
    runtime: &Runtime,
    stores: &RedisStores,
    args: WorkerArgs,
) -> anyhow::Result<()> {
    let _control = stores
        .serve_control(runtime)
        .await
        .context("cannot serve control requests")?;
    let signals = shutdown_signals()?;
    eprintln!(
        "worker {} ready: up to {} jobs at once{}",
        runtime.worker().id,
        args.concurrency,
        if runtime.config().adopt_orphans {
            ", adopting orphaned runs"
        } else {
            ""
        }
    );
    // What this worker's runs spill while Redis is away is replayed once Redis is back.
    let replaying = super::recover_cli::keep_replaying(
        runtime.clone(),
        stores.clone(),
        runtime.config().lease.ttl,
    );
    let options = WorkerOptions::default()
        .concurrency(usize::from(args.concurrency))
        .sweep_every(runtime.config().lease.renew);
    let id = runtime.worker().id.clone();
    let served = runvisor::worker::serve(runtime, stores, options, async move {
        signals.await;
        eprintln!("worker {id} shutting down");
    })
    .await
    .context("cannot take jobs from the queue");
    replaying.abort();
    served?;
    Ok(())
}

/// Completes at the first Ctrl-C or SIGTERM.
pub(crate) fn shutdown_signals() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?;
        let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
