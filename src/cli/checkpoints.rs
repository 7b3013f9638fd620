//! `runvisor checkpoints stats` and `runvisor checkpoints cleanup`: how many checkpoints each
//! thread and user holds, and keeping each thread's newest N, on runvisor's own layout (through
//! its indexes) or on the `checkpoint:<user>:<timestamp>:<id>` layout (by `SCAN`).

use std::io::{self, Write};

use runvisor::redis::retention::{
    CleanupReport, Layout, RetentionError, Scope, Stats, UserSummary,
};
use runvisor::redis::{ConnectError, RedisConfig, RedisStores};

/// `runvisor checkpoints` subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckpointsArgs {
    #[command(subcommand)]
    command: CheckpointsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CheckpointsCommand {
    /// Count checkpoints per thread, for every user or one.
    Stats {
        /// Only this user's threads.
        #[arg(long, value_name = "ID")]
        user: Option<String>,
        /// Which keys: runvisor's own (`native`), or `checkpoint:<user>:<timestamp>:<id>`
        /// keys written by other systems (`compat`, found by SCAN).
        #[arg(long, value_enum, default_value = "native")]
        layout: LayoutArg,
        /// Print the stats as JSON (the checkpoint-ops API's `data` fields).
        #[arg(long)]
        json: bool,
    },
    /// Delete all but the newest N checkpoints of each thread: one thread, one user's, or all.
    #[command(group(clap::ArgGroup::new("scope").required(true).args(["thread", "user", "all"])))]
    Cleanup {
        /// How many checkpoints each thread keeps (its newest).
        #[arg(long, value_name = "N")]
        keep: usize,
        /// Only this thread.
        #[arg(long, value_name = "ID")]
        thread: Option<String>,
        /// Every thread of this user.
        #[arg(long, value_name = "ID")]
        user: Option<String>,
        /// Every thread.
        #[arg(long)]
        all: bool,
        /// Which keys: runvisor's own (`native`), or `checkpoint:<user>:<timestamp>:<id>`
        /// keys written by other systems (`compat`, found by SCAN).
        #[arg(long, value_enum, default_value = "native")]
        layout: LayoutArg,
        /// Print what was done as JSON (the checkpoint-ops API's `data` fields).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LayoutArg {
    Native,
    Compat,
}

impl From<LayoutArg> for Layout {
    fn from(arg: LayoutArg) -> Self {
        match arg {
            LayoutArg::Native => Layout::Native,
            LayoutArg::Compat => Layout::Compat,
        }
    }
}

/// Why `checkpoints` failed: bad input (exit 2) or the store (exit 3).
#[derive(Debug)]
pub(crate) enum Failure {
    /// A flag or config that cannot work.
    BadInput(String),
    /// Redis failed, refused or could not be reached.
    Storage(String),
    /// Writing the output failed.
    Io(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// `runvisor checkpoints ...` on the configured Redis.
pub(crate) async fn run(redis: Option<RedisConfig>, args: CheckpointsArgs) -> Result<(), Failure> {
    let Some(config) = redis else {
        return Err(Failure::BadInput(
            "checkpoints are kept in Redis: pass --redis URL (or set `redis` in the config file)"
                .to_owned(),
        ));
    };
    let shown = config.redacted_url();
    let stores = RedisStores::connect(config).await.map_err(|e| match e {
        ConnectError::InvalidConfig(_) => {
            Failure::BadInput(format!("cannot use Redis at {shown}: {e}"))
        }
        // The other errors name the server themselves.
        other => Failure::Storage(other.to_string()),
    })?;
    let ops = stores.checkpoint_ops();
    let failed = |e: RetentionError| match e {
        RetentionError::InvalidUser { .. } | RetentionError::InvalidThread { .. } => {
            Failure::BadInput(e.to_string())
        }
        other => Failure::Storage(other.to_string()),
    };
    let mut out = io::stdout().lock();
    match args.command {
        CheckpointsCommand::Stats { user, layout, json } => {
            let stats = ops
                .stats(layout.into(), user.as_deref())
                .await
                .map_err(failed)?;
            if json {
                serde_json::to_writer_pretty(&mut out, &stats).map_err(io::Error::from)?;
                writeln!(out)?;
            } else {
                print_stats(&mut out, &stats)?;
            }
        }
        CheckpointsCommand::Cleanup {
            keep,
            thread,
            user,
            all: _,
            layout,
            json,
        } => {
            let scope = match (thread, user) {
                (Some(thread), _) => Scope::Thread(thread),
                (None, Some(user)) => Scope::User(user),
                (None, None) => Scope::All,
            };
            let report = ops
                .cleanup(layout.into(), &scope, keep)
                .await
                .map_err(failed)?;
            if json {
                serde_json::to_writer_pretty(&mut out, &report).map_err(io::Error::from)?;
                writeln!(out)?;
            } else {
                print_cleanup(&mut out, &report)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn print_user(out: &mut impl Write, user: &UserSummary) -> io::Result<()> {
    let name = match &user.user_id {
        Some(id) => format!("user {id}"),
        None => "no user".to_owned(),
    };
    writeln!(
        out,
        "{name}: {}, {}",
        plural(user.thread_count, "thread", "threads"),
        plural(user.total_checkpoints, "checkpoint", "checkpoints")
    )?;
    for thread in &user.threads {
        writeln!(out, "  {}  {}", thread.thread_id, thread.checkpoint_count)?;
    }
    Ok(())
}

/// `user wang1: 3 threads, 116 checkpoints`, then a line per thread.
fn print_stats(out: &mut impl Write, stats: &Stats) -> io::Result<()> {
    match stats {
        Stats::System(system) => {
            writeln!(
                out,
                "{} layout: {}, {}, {}",
                system.layout,
                plural(system.total_users, "user", "users"),
                plural(system.total_threads, "thread", "threads"),
                plural(system.total_checkpoints, "checkpoint", "checkpoints")
            )?;
            for user in &system.users {
                print_user(out, user)?;
            }
        }
        Stats::User(user) => {
            writeln!(out, "{} layout:", user.layout)?;
            print_user(
                out,
                &UserSummary {
                    user_id: Some(user.user_id.clone()),
                    thread_count: user.thread_count,
                    total_checkpoints: user.total_checkpoints,
                    threads: user.threads.clone(),
                },
            )?;
        }
    }
    Ok(())
}

/// A line per thread that lost checkpoints, then the totals.
fn print_cleanup(out: &mut impl Write, report: &CleanupReport) -> io::Result<()> {
    for (thread, detail) in &report.details {
        if detail.deleted_count > 0 {
            writeln!(
                out,
                "thread {thread}: {} -> {} ({} deleted)",
                detail.original_count, detail.remaining_count, detail.deleted_count
            )?;
        }
    }
    writeln!(
        out,
        "{} layout, {}: {} looked at, {} deleted; each keeps at most {}",
        report.layout,
        report.target,
        plural(report.total_processed, "thread", "threads"),
        plural(report.total_deleted, "checkpoint", "checkpoints"),
        report.keep_count
    )
}
