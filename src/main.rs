//! `runvisor`, the command line: `run` executes a workflow file and shows its progress,
//! `resume` continues a thread from its newest checkpoint or forks a new thread from an older
//! one, `stop` and `cancel` stop a run from any process, `ps` and `tree` show runs across
//! processes, `worker` serves them (and adopts orphans), `recover` writes into Redis the runs
//! whose end it did not take (kept in spill files; `run`, `resume`, `worker` and `serve` do it
//! when they start), `serve` runs the HTTP service, `checkpoints` counts and cleans up stored
//! checkpoints, `validate` checks a workflow and lists every problem.
//!
//! Stores: the embedded in-memory default, or Redis (`--redis URL` or the config file), which
//! `resume`, `stop`, `cancel` and `worker` need since they act on runs of other processes.
//!
//! Exit codes (README lists them): 0 success (or waiting for input), 1 the run failed, 2 bad
//! input (unreadable file, invalid workflow, bad `--input`, ...), 3 the store or a worker is
//! unavailable or refused (a run whose end was not stored included, whatever its status), 4
//! conflict (the thread is busy; the run asked about does not run), 130 the run was stopped
//! (Ctrl-C: graceful, twice: forced). Every error is one `error: ...` line on stderr, never a
//! panic.

/// The binary's allocator: mimalloc (feature `mimalloc`, on by default), much faster than
/// glibc's for the many small, short-lived values a run allocates.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::{Parser, Subcommand};
use runvisor::InputDecl;
use runvisor::redis::queue::Job;
use runvisor::redis::{ConnectError, RedisConfig, RedisStores};
use runvisor::{
    CheckpointId, Config, Durability, Interaction, InteractionId, InteractionKind, Map, NodePath,
    ResumeError, ResumeFrom, ResumeInput, ResumeOptions, RunError, RunEvent, RunHandle, RunId,
    RunLabels, RunOutcome, RunStatus, Runtime, RuntimeConfig, Spill, StartError, StopMode,
    StopReason, StopRequest, StopResult, StoreError, ThreadId, ValidationErrors, Value, Workflow,
    WorkflowDef, register_standard_kinds_with,
};
use tokio::task::JoinHandle;

#[path = "cli/checkpoints.rs"]
mod checkpoints_cli;
#[path = "cli/ops.rs"]
mod ops_cli;
#[path = "cli/recover.rs"]
mod recover_cli;
#[path = "cli/serve.rs"]
mod serve_cli;

/// The run failed (or ended any other way than succeeding).
const EXIT_RUN_FAILED: u8 = 1;
/// The run was stopped (Ctrl-C or SIGTERM), as shells report an interrupted command.
const EXIT_STOPPED: u8 = 130;
/// Bad input: a file that cannot be read, an invalid workflow, a bad flag value.
const EXIT_BAD_INPUT: u8 = 2;
/// The store (or a worker asked through it) is unavailable or refused.
const EXIT_STORAGE: u8 = 3;
/// Another run holds the thread: a start or resume of a busy thread, from any process; or
/// the run asked about does not run now.
const EXIT_CONFLICT: u8 = 4;

/// An error with its own exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Exit {
    code: u8,
    message: String,
}

impl Exit {
    fn error(code: u8, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Self {
            code,
            message: message.into(),
        })
    }
}

/// Supervised, stoppable, resumable agent workflows.
#[derive(Debug, Parser)]
#[command(name = "runvisor", version)]
struct Cli {
    /// Config file (JSON); every setting has a default.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Keep runs, history and checkpoints in this Redis (overrides the config file's URL):
    /// `redis://host:port/db`, or a Redis Cluster as `redis+cluster://h1:p1,h2:p2`.
    #[arg(long, global = true, value_name = "URL", env = "RUNVISOR_REDIS_URL")]
    redis: Option<String>,
    /// Where runs whose end Redis did not take are kept until `recover` (overrides the config
    /// file's `redis.spill_dir`; default: the platform data directory, see the README).
    #[arg(long, global = true, value_name = "DIR", env = "RUNVISOR_SPILL_DIR")]
    spill_dir: Option<PathBuf>,
    /// A host `http` nodes may call: a name, `*.domain`, an IP address or a CIDR network.
    /// Repeat it (or separate with commas) for several; given, it replaces the config file's
    /// `http.allow` (default: localhost, 127.0.0.0/8 and ::1).
    #[arg(
        long,
        global = true,
        value_name = "HOST",
        env = "RUNVISOR_HTTP_ALLOW",
        value_delimiter = ','
    )]
    http_allow: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a workflow and print its progress, then its outputs.
    Run(RunArgs),
    /// Continue a thread from its newest checkpoint, or fork a new thread from a named one.
    Resume(ResumeArgs),
    /// Ask the run of a FastGPT app and chat to stop; waits (5 s at most) for it to end. With
    /// no live run of them, sets nothing and exits 4.
    Stop {
        /// The app id.
        #[arg(long)]
        app: String,
        /// The chat id.
        #[arg(long)]
        chat: String,
    },
    /// Ask the run of a RAGFlow task to cancel; waits (5 s at most) for it to end. With no
    /// live run of it, sets nothing and exits 4.
    Cancel {
        /// The task id.
        #[arg(long)]
        task: String,
    },
    /// List runs across every process sharing the Redis: open ones (running, orphaned,
    /// awaiting input), or all with `--all`, with the nodes each runs now.
    Ps(ops_cli::PsArgs),
    /// Show the actor tree of a live run, whichever process runs it.
    Tree(ops_cli::TreeArgs),
    /// Run a worker: serve `ps` and `tree` requests for its runs and, with `--adopt-orphans`,
    /// take orphaned runs over; until Ctrl-C or SIGTERM.
    Worker(ops_cli::WorkerArgs),
    /// Serve the HTTP API (runs, threads, workflow validation, health) and the operator page
    /// at `/` until Ctrl-C or SIGTERM, which stop every run with reason `shutdown`.
    Serve(serve_cli::ServeArgs),
    /// Queue a run of a workflow on a new thread for the workers (`runvisor worker`): the
    /// first free worker starts it; prints the job and its thread.
    Submit(SubmitArgs),
    /// Write the runs that Redis did not take when they ended (kept in spill files) into
    /// Redis, once each; every worker does it when it starts.
    Recover(recover_cli::RecoverArgs),
    /// Count stored checkpoints per thread and user, or delete all but each thread's newest.
    Checkpoints(checkpoints_cli::CheckpointsArgs),
    /// Check a workflow and print every problem found.
    Validate {
        /// The workflow file (JSON).
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct ResumeArgs {
    /// The thread to continue.
    #[arg(long, value_name = "ID")]
    thread: String,
    /// Fork from this checkpoint of the thread: a new thread gets the history as it stood at
    /// the checkpoint and the run goes on there; the thread itself is left as it is.
    #[arg(long, value_name = "ID")]
    checkpoint: Option<String>,
    /// The fork's new thread (with `--checkpoint`); a fresh id by default. It must have no
    /// history or checkpoints yet.
    #[arg(long, value_name = "ID", requires = "checkpoint")]
    fork_into: Option<String>,
    /// A new instruction from the user: added to history, it becomes `{{sys.query}}`.
    #[arg(long, value_name = "TEXT", conflicts_with = "answer")]
    say: Option<String>,
    /// The answer to the interaction the run waits for: the form's values as a JSON object,
    /// or the chosen option's value.
    #[arg(long, value_name = "JSON")]
    answer: Option<String>,
    /// The interaction answered; by default the one the checkpoint waits for.
    #[arg(long, value_name = "ID", requires = "answer")]
    interaction: Option<String>,
    /// Print only a JSON document with the outcome.
    #[arg(long)]
    json: bool,
    /// The user the resumed run is for, in place of the checkpoint's (checkpoint stats and
    /// cleanup find a user's threads by it).
    #[arg(long, value_name = "ID")]
    user: Option<String>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The workflow file (JSON).
    file: PathBuf,
    /// A run input, typed by the begin node's declaration: strings as written, other types as
    /// JSON (`tier=3`, `tags=["a","b"]`). Repeat for several inputs.
    #[arg(short, long = "input", value_name = "KEY=VALUE")]
    inputs: Vec<String>,
    /// The thread (conversation) to run on; a new one by default.
    #[arg(long, value_name = "ID")]
    thread: Option<String>,
    /// Print only a JSON document with the outcome.
    #[arg(long)]
    json: bool,
    /// The FastGPT app id this run belongs to (names its stop flag).
    #[arg(long, requires = "chat")]
    app: Option<String>,
    /// The FastGPT chat id this run belongs to (names its stop flag).
    #[arg(long, requires = "app")]
    chat: Option<String>,
    /// The RAGFlow task id this run belongs to (names its cancel flag).
    #[arg(long)]
    task: Option<String>,
    /// The user this run is for (checkpoint stats and cleanup find a user's threads by it).
    #[arg(long, value_name = "ID")]
    user: Option<String>,
    /// When progress is saved: after every node and awaited (`sync`), after every node in the
    /// background (`async`), or only at the end (`exit`).
    #[arg(long, value_enum)]
    durability: Option<DurabilityArg>,
}

#[derive(Debug, clap::Args)]
struct SubmitArgs {
    /// The workflow file (JSON).
    file: PathBuf,
    /// A run input, typed by the begin node's declaration (as for `run`). Repeat for several.
    #[arg(short, long = "input", value_name = "KEY=VALUE")]
    inputs: Vec<String>,
    /// The thread (conversation) to run on; a new one by default.
    #[arg(long, value_name = "ID")]
    thread: Option<String>,
    /// The FastGPT app id the run belongs to (names its stop flag).
    #[arg(long, requires = "chat")]
    app: Option<String>,
    /// The FastGPT chat id the run belongs to (names its stop flag).
    #[arg(long, requires = "app")]
    chat: Option<String>,
    /// The RAGFlow task id the run belongs to (names its cancel flag).
    #[arg(long)]
    task: Option<String>,
    /// The user the run is for (checkpoint stats and cleanup find a user's threads by it).
    #[arg(long, value_name = "ID")]
    user: Option<String>,
    /// Print a JSON document (`{"job": ..., "thread": ...}`).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DurabilityArg {
    Sync,
    Async,
    Exit,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// A command line clap could not read: help and version are printed as clap prints them;
/// anything else is one `error:` line (clap's first line, which names the flag or value) with
/// a pointer to `--help`, and exit code 2.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.use_stderr() {
            ExitCode::from(EXIT_BAD_INPUT)
        } else {
            ExitCode::SUCCESS
        };
    }
    // Clap's first paragraph, on one line: `unexpected argument '--x' found`, or `the
    // following required arguments were not provided: --chat <CHAT>`.
    let rendered = e.render().to_string();
    let paragraph: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|line| line.is_empty())
        .take_while(|line| !line.is_empty())
        .collect();
    let first = paragraph.join(" ");
    let message = first
        .strip_prefix("error:")
        .map_or(first.as_str(), str::trim);
    let message = if message.is_empty() {
        "cannot read the command line"
    } else {
        message
    };
    eprintln!("error: {message} (see runvisor --help)");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// The exit code for an error: its own for a conflict or a store that failed or refused,
/// bad input otherwise.
fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(exit) = e.chain().find_map(|cause| cause.downcast_ref::<Exit>()) {
        return exit.code;
    }
    let busy = e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<StartError>(),
            Some(StartError::ThreadBusy { .. })
        ) || matches!(
            cause.downcast_ref::<ResumeError>(),
            Some(ResumeError::ThreadBusy { .. })
        )
    });
    if busy {
        return EXIT_CONFLICT;
    }
    let storage = e.chain().any(|cause| {
        cause.is::<StoreError>()
            || cause
                .downcast_ref::<ConnectError>()
                .is_some_and(|e| !matches!(e, ConnectError::InvalidConfig(_)))
            || cause
                .downcast_ref::<StartError>()
                .is_some_and(|e| e.store_error().is_some())
            || cause
                .downcast_ref::<ResumeError>()
                .is_some_and(|e| e.store_error().is_some())
    });
    if storage {
        EXIT_STORAGE
    } else {
        EXIT_BAD_INPUT
    }
}

/// An error and its causes on one line (a cause's own line breaks become spaces).
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Output cut by a closed pipe (`runvisor run ... | head`) is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<io::Error>()
        .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut config = Config::load_or_default(cli.config.as_deref())?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // Declared after the async runtime, so dropped before it: the last spans are flushed while
    // a gRPC exporter can still send them.
    let installed = {
        let _enter = tokio.enter();
        runvisor::telemetry::init(config.log.as_deref().unwrap_or("warn"))
    };
    for warning in &installed.warnings {
        eprintln!("warning: {warning}");
    }
    let _telemetry = installed.telemetry;
    if let Some(url) = cli.redis {
        let mut redis = config.redis.take().unwrap_or_else(|| RedisConfig::new(""));
        redis.url = url;
        config.redis = Some(redis);
    }
    if let (Some(dir), Some(redis)) = (cli.spill_dir, config.redis.as_mut()) {
        redis.spill_dir = Some(dir);
    }
    if !cli.http_allow.is_empty() {
        config.http.allow = runvisor::http_node::AllowList::new(&cli.http_allow)
            .map_err(|e| Exit::error(EXIT_BAD_INPUT, format!("--http-allow: {e}")))?;
    }
    let durability = match &cli.command {
        Command::Run(RunArgs { durability, .. }) => *durability,
        Command::Worker(args) => ops_cli::durability(args),
        _ => None,
    };
    if let Some(d) = durability {
        config.runtime.durability = match d {
            DurabilityArg::Sync => Durability::Sync,
            DurabilityArg::Async => Durability::Async,
            DurabilityArg::Exit => Durability::Exit,
        };
    }
    if let Command::Worker(args) = &cli.command
        && ops_cli::adopts(args)
    {
        config.runtime.adopt_orphans = true;
    }
    if let Command::Checkpoints(args) = cli.command {
        return checkpoints(&tokio, config.redis, args);
    }
    if let Command::Validate { file } = &cli.command {
        // Validation starts nothing, and adopts no orphans either (a config that makes every
        // worker adopt them is fine here).
        config.runtime.adopt_orphans = false;
        let runtime =
            register_standard_kinds_with(Runtime::builder().config(config.runtime), &config.http)
                .try_build()?;
        return validate(&runtime, file);
    }
    tokio.block_on(async move {
        // A worker (`run`, `resume`, `worker` and `serve` are workers) first writes what earlier
        // runs could not store when they ended.
        let replay = matches!(
            cli.command,
            Command::Run(_) | Command::Resume(_) | Command::Worker(_) | Command::Serve(_)
        );
        let serve_config = config.serve.clone();
        let (runtime, redis) = build_runtime(config, replay).await?;
        let durable = redis.is_some();
        // Other processes may ask what this one runs (`ps`, `tree`).
        let _control = match (&cli.command, &redis) {
            (Command::Run(_) | Command::Resume(_), Some(stores)) => {
                Some(stores.serve_control(&runtime).await?)
            }
            _ => None,
        };
        match cli.command {
            Command::Run(args) => run(&runtime, args).await,
            Command::Resume(args) if durable => resume(&runtime, args).await,
            Command::Ps(args) => {
                ops_cli::ps(&runtime, redis.as_ref(), args)
                    .await
                    .map_err(|e| Exit::error(EXIT_STORAGE, format!("{e:#}")))?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Tree(args) => tree(&runtime, redis.as_ref(), args).await,
            Command::Worker(args) => match &redis {
                Some(stores) => {
                    ops_cli::worker(&runtime, stores, args).await?;
                    Ok(ExitCode::SUCCESS)
                }
                None => bail!(
                    "a worker shares runs with other processes: pass --redis URL (or set \
                         `redis` in the config file)"
                ),
            },
            Command::Recover(args) => match &redis {
                Some(stores) => Ok(ExitCode::from(
                    recover_cli::recover(&runtime, stores, args).await?,
                )),
                None => bail!(
                    "recover writes spilled runs into Redis: pass --redis URL (or set \
                         `redis` in the config file)"
                ),
            },
            Command::Serve(args) => {
                serve_cli::serve(&runtime, redis.as_ref(), serve_config, args).await?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Submit(args) => match &redis {
                Some(stores) => submit(&runtime, stores, args).await,
                None => bail!(
                    "jobs are queued for workers in Redis: pass --redis URL (or set `redis` \
                         in the config file)"
                ),
            },
            Command::Stop { app, chat } if durable => report_request(
                runtime.request_stop(&app, &chat).await,
                &format!("app {app} chat {chat}"),
            ),
            Command::Cancel { task } if durable => {
                report_request(runtime.request_cancel(&task).await, &format!("task {task}"))
            }
            Command::Resume(_) | Command::Stop { .. } | Command::Cancel { .. } => bail!(
                "this command acts on runs of other processes: pass --redis URL (or set \
                     `redis` in the config file); the embedded in-memory stores end with the \
                     process that used them"
            ),
            Command::Validate { .. } | Command::Checkpoints(_) => Ok(ExitCode::SUCCESS),
        }
    })
}

/// `checkpoints stats|cleanup`: straight on Redis, no runtime.
fn checkpoints(
    tokio: &tokio::runtime::Runtime,
    redis: Option<RedisConfig>,
    args: checkpoints_cli::CheckpointsArgs,
) -> anyhow::Result<ExitCode> {
    use checkpoints_cli::Failure;
    let done = tokio.block_on(checkpoints_cli::run(redis, args));
    match done {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(Failure::BadInput(message)) => Err(Exit::error(EXIT_BAD_INPUT, message)),
        Err(Failure::Storage(message)) => Err(Exit::error(EXIT_STORAGE, message)),
        Err(Failure::Io(e)) => Err(e.into()),
    }
}

/// The runtime with the standard kinds, on Redis when configured (with the stores), else on
/// the embedded in-memory stores. With `replay`, the spill files of that Redis are replayed
/// into it first, before the runtime starts anything, adopting orphans included (an orphan
/// taken over first would make its spilled end moot).
async fn build_runtime(
    config: Config,
    replay: bool,
) -> anyhow::Result<(Runtime, Option<RedisStores>)> {
    let builder = || {
        register_standard_kinds_with(
            Runtime::builder()
                .config(config.runtime.clone())
                .trace_context(runvisor::telemetry::trace_context())
                .checkpoint_observer(runvisor::telemetry::checkpoint_observer()),
            &config.http,
        )
    };
    let Some(redis) = config.redis.clone() else {
        return Ok((builder().try_build()?, None));
    };
    let shown = redis.redacted_url();
    let stores = RedisStores::connect(redis).await.map_err(|e| match e {
        // The other errors name the server themselves.
        ConnectError::InvalidConfig(_) => {
            anyhow::Error::new(e).context(format!("cannot use Redis at {shown}"))
        }
        e => anyhow::Error::new(e),
    })?;
    if replay {
        if config.runtime.adopt_orphans {
            // Adoption starts with the runtime: replay through one that does not adopt.
            let quiet = RuntimeConfig {
                adopt_orphans: false,
                ..config.runtime.clone()
            };
            let replayer = stores
                .install(register_standard_kinds_with(
                    Runtime::builder().config(quiet),
                    &config.http,
                ))
                .try_build()?;
            recover_cli::at_start(&replayer, &stores).await;
            replayer.shutdown().await;
        } else {
            let runtime = stores.install(builder()).try_build()?;
            recover_cli::at_start(&runtime, &stores).await;
            return Ok((runtime, Some(stores)));
        }
    }
    let runtime = stores.install(builder()).try_build()?;
    Ok((runtime, Some(stores)))
}

/// `tree`, with an exit code per reason there is none.
async fn tree(
    runtime: &Runtime,
    redis: Option<&RedisStores>,
    args: ops_cli::TreeArgs,
) -> anyhow::Result<ExitCode> {
    use ops_cli::TreeFailure;
    use runvisor::ops::TreeError;
    match ops_cli::tree(runtime, redis, args).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(TreeFailure::BadInput(message)) => Err(Exit::error(EXIT_BAD_INPUT, message)),
        Err(TreeFailure::Io(e)) => Err(e),
        Err(TreeFailure::Tree(e)) => {
            let code = match &e {
                TreeError::UnknownRun(_) => EXIT_BAD_INPUT,
                TreeError::NotLive { .. } | TreeError::Orphaned { .. } => EXIT_CONFLICT,
                TreeError::Query(_) => EXIT_RUN_FAILED,
                _ => EXIT_STORAGE,
            };
            Err(Exit::error(code, e.to_string()))
        }
    }
}

/// Prints what a stop or cancel request did; a request for labels no live run carries is a
/// conflict (no flag was set), and a flag that could not be set (or a request that named no
/// flag) is an error, never an answer.
fn report_request(request: StopRequest, target: &str) -> anyhow::Result<ExitCode> {
    if request.no_live_run {
        return Err(Exit::error(
            EXIT_CONFLICT,
            format!("no live run of {target}: no flag was set"),
        ));
    }
    if let Some(e) = &request.flag_error {
        return Err(Exit::error(
            EXIT_STORAGE,
            format!("could not set the flag {}: {e}", request.key),
        ));
    }
    if let (true, Some(e)) = (request.key.is_empty(), &request.error) {
        return Err(Exit::error(EXIT_BAD_INPUT, e.clone()));
    }
    let document = serde_json::json!({
        "success": true,
        "key": request.key,
        "ended": request.ended,
        "waited_ms": u64::try_from(request.waited.as_millis()).unwrap_or(u64::MAX),
        "error": request.error,
    });
    writeln!(
        io::stdout().lock(),
        "{}",
        serde_json::to_string_pretty(&document)?
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Reads and validates a workflow file; prints its validation errors, one per line: each
/// distinct problem once, at most `ValidationErrors::LISTED` of them, then how many more.
fn load(runtime: &Runtime, file: &Path) -> anyhow::Result<Option<Workflow>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read workflow {}", file.display()))?;
    // The text is dropped before validation: a large workflow is not held twice.
    let loaded = WorkflowDef::from_json(&text)
        .map_err(|e| ValidationErrors::from(vec![e]))
        .and_then(|def| {
            drop(text);
            runtime.validate(def)
        });
    match loaded {
        Ok(workflow) => Ok(Some(workflow)),
        Err(errors) => {
            let mut err = io::stderr().lock();
            for e in errors.listed() {
                writeln!(err, "error: {}: {e}", file.display())?;
            }
            if errors.unlisted() > 0 {
                writeln!(err, "and {} more", errors.unlisted())?;
            }
            let count = errors.len();
            let s = if count == 1 { "" } else { "s" };
            writeln!(err, "invalid: {count} problem{s} in {}", file.display())?;
            Ok(None)
        }
    }
}

fn validate(runtime: &Runtime, file: &Path) -> anyhow::Result<ExitCode> {
    let Some(workflow) = load(runtime, file)? else {
        return Ok(ExitCode::from(EXIT_BAD_INPUT));
    };
    let mut out = io::stdout().lock();
    writeln!(out, "ok: {} nodes", workflow.node_ids().count())?;
    if !workflow.inputs().is_empty() {
        let inputs: Vec<String> = workflow.inputs().iter().map(describe_input).collect();
        writeln!(out, "inputs: {}", inputs.join(", "))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `query (string, required)`, `tier (integer, default 0)`.
fn describe_input(decl: &InputDecl) -> String {
    let ty = decl.ty.name();
    match (&decl.default, decl.required) {
        (Some(default), _) => format!("{} ({ty}, default {default})", decl.name),
        (None, true) => format!("{} ({ty}, required)", decl.name),
        (None, false) => format!("{} ({ty}, optional)", decl.name),
    }
}

/// Reads `--input KEY=VALUE` flags; the workflow types and checks them.
fn parse_inputs(workflow: &Workflow, args: &[String]) -> anyhow::Result<Map> {
    let mut pairs = Vec::with_capacity(args.len());
    for arg in args {
        let (name, text) = arg
            .split_once('=')
            .filter(|(name, _)| !name.trim().is_empty())
            .ok_or_else(|| anyhow!("bad --input {arg:?}: expected KEY=VALUE"))?;
        pairs.push((name.trim(), text));
    }
    workflow.inputs_from_text(pairs).map_err(|e| {
        match workflow.inputs().iter().find(|d| d.name == e.input) {
            Some(decl) if e.problem == "is required" => anyhow!(
                "missing input {}: pass --input {}=VALUE",
                describe_input(decl),
                decl.name
            ),
            _ => anyhow!(e),
        }
    })
}

async fn run(runtime: &Runtime, args: RunArgs) -> anyhow::Result<ExitCode> {
    let signals = StopSignals::listen()?;
    let Some(workflow) = load(runtime, &args.file)? else {
        return Ok(ExitCode::from(EXIT_BAD_INPUT));
    };
    let inputs = parse_inputs(&workflow, &args.inputs)?;
    let thread = match &args.thread {
        Some(id) => ThreadId::new(id).context("bad --thread")?,
        None => ThreadId::generate(),
    };
    let mut labels =
        RunLabels::new(args.app, args.chat, args.task).context("bad --app, --chat or --task")?;
    if let Some(user) = args.user {
        labels = labels.with_user(user).context("bad --user")?;
    }
    let run = runtime
        .start_with(&workflow, inputs, thread, labels)
        .await
        .context("the run could not start")?;
    follow(runtime, run, signals, workflow.id(), args.json).await
}

/// `submit`: validates the workflow and its inputs here, then queues the job.
async fn submit(
    runtime: &Runtime,
    stores: &RedisStores,
    args: SubmitArgs,
) -> anyhow::Result<ExitCode> {
    let Some(workflow) = load(runtime, &args.file)? else {
        return Ok(ExitCode::from(EXIT_BAD_INPUT));
    };
    let inputs = parse_inputs(&workflow, &args.inputs)?;
    let thread = match &args.thread {
        Some(id) => ThreadId::new(id).context("bad --thread")?,
        None => ThreadId::generate(),
    };
    // A job's runs are all the runs of its thread: workers tell what a job did by them.
    let runs = runtime
        .run_store()
        .list_thread(&thread)
        .await
        .map_err(|e| Exit::error(EXIT_STORAGE, format!("cannot read thread {thread}: {e}")))?;
    if !runs.is_empty() {
        return Err(Exit::error(
            EXIT_CONFLICT,
            format!(
                "thread {thread} has runs already: a job starts a new thread (continue this one \
                 with `resume --thread {thread}`)"
            ),
        ));
    }
    let mut labels =
        RunLabels::new(args.app, args.chat, args.task).context("bad --app, --chat or --task")?;
    if let Some(user) = args.user {
        labels = labels.with_user(user).context("bad --user")?;
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read workflow {}", args.file.display()))?;
    let job = Job::new(thread, text, inputs, labels);
    stores
        .submit(&job)
        .await
        .map_err(|e| Exit::error(EXIT_STORAGE, format!("cannot queue the job: {e}")))?;
    let mut out = io::stdout().lock();
    if args.json {
        let document = serde_json::json!({"job": job.id, "thread": job.thread.as_str()});
        writeln!(out, "{document}")?;
    } else {
        writeln!(out, "submitted job {} on thread {}", job.id, job.thread)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `resume`: the newest checkpoint of the thread, or a fork from a named one into a new
/// thread; a new instruction or the answer to the pending interaction.
async fn resume(runtime: &Runtime, args: ResumeArgs) -> anyhow::Result<ExitCode> {
    let signals = StopSignals::listen()?;
    let thread = ThreadId::new(&args.thread).context("bad --thread")?;
    let from = match &args.checkpoint {
        Some(id) => ResumeFrom::Fork {
            thread: thread.clone(),
            checkpoint: id.parse::<CheckpointId>().context("bad --checkpoint")?,
            into: args
                .fork_into
                .as_deref()
                .map(ThreadId::new)
                .transpose()
                .context("bad --fork-into")?,
        },
        None => ResumeFrom::Thread(thread.clone()),
    };
    let input = match (args.say, args.answer) {
        (Some(text), _) => ResumeInput::Instruction(text),
        (None, Some(answer)) => {
            // A JSON answer, or plain text for a choice.
            let value = serde_json::from_str::<serde_json::Value>(&answer)
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(answer.as_str()));
            let interaction_id = match &args.interaction {
                Some(id) => id.parse::<InteractionId>().context("bad --interaction")?,
                None => runtime
                    .pending_interactions(from.clone())
                    .await?
                    .first()
                    .map(|i| i.id)
                    .context("the checkpoint waits for no answer; resume without --answer")?,
            };
            ResumeInput::Answer {
                interaction_id,
                value,
            }
        }
        (None, None) => ResumeInput::Continue,
    };
    let mut options = ResumeOptions::default();
    if let Some(user) = args.user {
        options = options.user(user).context("bad --user")?;
    }
    let run = runtime.resume_with(from.clone(), input, options).await?;
    if let (ResumeFrom::Fork { checkpoint, .. }, false) = (&from, args.json) {
        println!(
            "forked thread {thread} at checkpoint {checkpoint} into thread {}",
            run.thread()
        );
    }
    let workflow_id = run.workflow_id().to_owned();
    follow(runtime, run, signals, &workflow_id, args.json).await
}

/// Shows a run's progress until it ends (stopping it on Ctrl-C), then its outcome.
async fn follow(
    runtime: &Runtime,
    run: RunHandle,
    signals: StopSignals,
    workflow_id: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let signals = signals.stop_run(runtime, run.run_id());
    let mut progress = (!json).then(|| Progress::new(io::stdout()));
    let mut events = run.events();
    while let Some(event) = events.next().await {
        if let Some(progress) = &mut progress {
            progress.event(&event)?;
        }
    }
    let outcome = run.wait().await;
    signals.abort();

    let mut out = io::stdout().lock();
    if json {
        let document = runvisor::report::OutcomeDocument::new(workflow_id, run.thread(), &outcome);
        // Streamed: a large outcome is never held twice as text.
        serde_json::to_writer_pretty(&mut out, &document).map_err(io::Error::from)?;
        writeln!(out)?;
    } else {
        match &outcome {
            RunOutcome::Stopped(stop) => print_stop(&mut out, stop)?,
            RunOutcome::AwaitingInput { interactions, .. } => {
                print_waiting(&mut out, run.thread(), interactions)?;
            }
            _ => {}
        }
        writeln!(out, "outputs:")?;
        serde_json::to_writer_pretty(&mut out, outcome.outputs()).map_err(io::Error::from)?;
        writeln!(out)?;
    }
    out.flush()?;
    if let Some(unpersisted) = outcome.unpersisted() {
        // Whatever the run did, it is not done while its end is not stored.
        let hint = match &unpersisted.spill {
            Spill::Kept { .. } => "; `runvisor recover` writes it into the store once it is back",
            _ => "",
        };
        let ended = match outcome.error() {
            Some(error) => format!("failed ({error})"),
            None => outcome.status().to_string(),
        };
        eprintln!(
            "error: run {} {ended}, but its end was not stored: {unpersisted}{hint}",
            outcome.run_id()
        );
        return Ok(ExitCode::from(EXIT_STORAGE));
    }
    if let (Some(error), false) = (outcome.error(), json) {
        eprintln!("error: run failed: {error}");
    }
    if let Some(RunError::Storage(_)) = outcome.error() {
        return Ok(ExitCode::from(EXIT_STORAGE));
    }
    Ok(match &outcome {
        RunOutcome::Stopped(_) => ExitCode::from(EXIT_STOPPED),
        _ if matches!(
            outcome.status(),
            RunStatus::Succeeded | RunStatus::AwaitingInput
        ) =>
        {
            ExitCode::SUCCESS
        }
        _ => ExitCode::from(EXIT_RUN_FAILED),
    })
}

/// Ctrl-C and SIGTERM, listened for from the start of `run`: a signal that arrives before the
/// run has started is kept and stops it as soon as it has.
#[derive(Debug)]
struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    #[cfg(unix)]
    fn listen() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
        })
    }

    #[cfg(not(unix))]
    fn listen() -> anyhow::Result<Self> {
        Ok(Self {})
    }

    /// The next stop request: Ctrl-C is the user's, SIGTERM a shutdown.
    async fn next(&mut self) -> StopReason {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => StopReason::UserInterrupted,
            _ = self.terminate.recv() => StopReason::Shutdown,
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            StopReason::UserInterrupted
        }
    }

    /// Stops the run on the first signal, gracefully (running nodes may finish within the stop
    /// timeout; streams are cut at the next chunk), and by force on the second. Either way the
    /// run persists what it holds and its outcome comes through the run handle.
    fn stop_run(mut self, runtime: &Runtime, run_id: RunId) -> JoinHandle<()> {
        let runtime = runtime.clone();
        tokio::spawn(async move {
            let reason = self.next().await;
            eprintln!("stopping ({reason}); Ctrl-C again to force");
            let graceful = StopMode::Graceful {
                timeout: runtime.config().stop_timeout,
            };
            tokio::select! {
                _ = runtime.stop_for(run_id, graceful, reason) => {}
                _ = self.next() => {
                    let _ = runtime.stop_for(run_id, StopMode::Force, reason).await;
                }
            }
        })
    }
}

/// What a stop kept: where it stopped, the partial response, what was persisted.
fn print_stop(out: &mut impl Write, stop: &StopResult) -> io::Result<()> {
    let at: Vec<String> = stop.stopped_at().iter().map(ToString::to_string).collect();
    writeln!(out, "stopped ({}) at {}", stop.reason, at.join(", "))?;
    if let Some(partial) = &stop.partial_response {
        writeln!(out, "partial response: {partial:?}")?;
    }
    let persisted = stop.messages.persisted.len();
    match (&stop.checkpoint_id, &stop.checkpoint_error) {
        (Some(id), _) => writeln!(out, "persisted: {persisted} messages, checkpoint {id}"),
        (None, Some(error)) => writeln!(
            out,
            "persisted: {persisted} messages; checkpoint failed: {error}"
        ),
        (None, None) => writeln!(out, "persisted: {persisted} messages"),
    }
}

/// What the run waits for, and how to answer.
fn print_waiting(
    out: &mut impl Write,
    thread: &ThreadId,
    interactions: &[Interaction],
) -> io::Result<()> {
    for interaction in interactions {
        writeln!(
            out,
            "waiting for input at {} (interaction {})",
            interaction.path, interaction.id
        )?;
        if let Some(prompt) = &interaction.prompt {
            writeln!(out, "  {prompt}")?;
        }
        match &interaction.kind {
            InteractionKind::FormInput { fields } => {
                for field in fields {
                    let required = if field.required { ", required" } else { "" };
                    writeln!(
                        out,
                        "  field {} ({}{required})",
                        field.name,
                        field.ty.name()
                    )?;
                }
            }
            InteractionKind::UserSelect { options } => {
                for option in options {
                    writeln!(out, "  option {:?}: {}", option.value, option.label)?;
                }
            }
            other => writeln!(out, "  {other:?}")?,
        }
    }
    writeln!(
        out,
        "answer with: runvisor resume --thread {thread} --answer '<JSON>'"
    )
}

/// Prints run events as they come: a line per node start and end, streamed chunks inline.
struct Progress<W: Write> {
    out: W,
    /// When each running node started.
    running: HashMap<NodePath, Instant>,
    /// The node whose chunks the current (unfinished) line shows.
    streaming: Option<NodePath>,
}

impl<W: Write> Progress<W> {
    fn new(out: W) -> Self {
        Self {
            out,
            running: HashMap::new(),
            streaming: None,
        }
    }

    fn event(&mut self, event: &RunEvent) -> io::Result<()> {
        if !matches!(event, RunEvent::NodeChunk { .. }) {
            self.end_stream_line()?;
        }
        match event {
            RunEvent::RunStarted { run_id, thread } => {
                writeln!(self.out, "run {run_id} on thread {thread}")?;
            }
            RunEvent::NodeStarted { path, kind } => {
                self.running.insert(path.clone(), Instant::now());
                writeln!(self.out, "▶ node {path} ({kind})")?;
            }
            RunEvent::NodeChunk { path, text } => {
                let mut text: &str = text;
                if self.streaming.as_ref() != Some(path) {
                    self.end_stream_line()?;
                    write!(self.out, "  ")?;
                    if self.running.len() > 1 {
                        // Several nodes stream at once: say whose text this is.
                        write!(self.out, "[{path}] ")?;
                    }
                    self.streaming = Some(path.clone());
                    // On a fresh line, leading spaces would only misalign the text.
                    text = text.trim_start_matches(' ');
                }
                write!(self.out, "{}", text.replace('\n', "\n  "))?;
            }
            RunEvent::NodeFinished { path, .. } => {
                let took = self.running.remove(path).map(|t| t.elapsed());
                writeln!(self.out, "✓ node {path} {}", elapsed(took))?;
            }
            RunEvent::NodeSkipped { path } => writeln!(self.out, "↷ node {path} skipped")?,
            RunEvent::NodeFailed { path, error } => {
                self.running.remove(path);
                writeln!(self.out, "✗ node {path} failed: {error}")?;
            }
            RunEvent::NodeInterrupted { path, forced } => {
                self.running.remove(path);
                let how = if *forced { " (aborted)" } else { "" };
                writeln!(self.out, "⏸ node {path} interrupted{how}")?;
            }
            RunEvent::Stopping { reason } => writeln!(self.out, "■ stopping ({reason})")?,
            RunEvent::EventsMissed { count } => {
                writeln!(self.out, "… {count} events missed (output too slow)")?;
            }
            RunEvent::RunFinished {
                status, persisted, ..
            } => {
                let unstored = if *persisted {
                    ""
                } else {
                    ", but its end was not stored"
                };
                writeln!(self.out, "■ run {status}{unstored}")?;
            }
            _ => {}
        }
        self.out.flush()
    }

    /// Ends a line of streamed chunks, if one is open.
    fn end_stream_line(&mut self) -> io::Result<()> {
        if self.streaming.take().is_some() {
            writeln!(self.out)?;
        }
        Ok(())
    }
}

/// `12ms`, `1.25s`, or `?` when the start was not seen.
fn elapsed(took: Option<Duration>) -> String {
    match took {
        None => "?".into(),
        Some(d) if d < Duration::from_secs(1) => format!("{}ms", d.as_millis()),
        Some(d) => format!("{:.2}s", d.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use runvisor::NodeId;

    use super::*;

    fn workflow(inputs: serde_json::Value) -> Workflow {
        let runtime = Runtime::builder().build();
        let def = serde_json::json!({
            "id": "w",
            "nodes": [{"id": "start", "kind": "begin", "params": {"inputs": inputs}}]
        });
        runtime.load_json(&def.to_string()).expect("valid workflow")
    }

    fn declared() -> Workflow {
        workflow(serde_json::json!([
            {"name": "query", "type": "string", "required": true},
            {"name": "tier", "type": "integer", "default": 0},
            {"name": "tags", "type": "array"}
        ]))
    }

    fn args(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn inputs_are_typed_by_their_declaration() {
        let inputs = parse_inputs(
            &declared(),
            &args(&["query=refund = now", "tier=3", "tags=[\"a\"]"]),
        )
        .expect("valid");
        assert_eq!(inputs["query"], Value::from("refund = now"));
        assert_eq!(inputs["tier"], Value::Int(3));
        assert_eq!(inputs["tags"], Value::from(vec!["a"]));
    }

    #[test]
    fn undeclared_workflows_take_any_name_as_text() {
        let inputs = parse_inputs(&workflow(serde_json::json!([])), &args(&["query=42", "x="]))
            .expect("valid");
        assert_eq!(inputs["query"], Value::from("42"));
        assert_eq!(inputs["x"], Value::from(""));
    }

    #[test]
    fn bad_inputs_are_one_line_errors() {
        let cases: &[(&[&str], &str)] = &[
            (&["query"], "bad --input \"query\": expected KEY=VALUE"),
            (&["=x"], "expected KEY=VALUE"),
            (
                &["query=a", "colour=red"],
                "input `colour`: not declared by the begin node (declared: query, tier, tags)",
            ),
            (&["query=a", "tier=high"], "input `tier`: not valid JSON"),
            (&["query=a", "tier=1.5"], "input `tier`: expected integer"),
            (&["query=a", "query=b"], "input `query`: is given twice"),
            (
                &["tier=1"],
                "missing input query (string, required): pass --input query=VALUE",
            ),
        ];
        for (given, want) in cases {
            let err = parse_inputs(&declared(), &args(given))
                .expect_err("refused")
                .to_string();
            assert!(err.contains(want), "{given:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn progress_shows_nodes_and_streams_chunks_inline() {
        let node = |id: &str| NodePath::node(NodeId::new(id).expect("valid id"));
        let mut progress = Progress::new(Vec::new());
        let events = [
            RunEvent::NodeStarted {
                path: node("llm"),
                kind: Arc::from("stream_text"),
            },
            RunEvent::NodeChunk {
                path: node("llm"),
                text: Arc::from("Hello"),
            },
            RunEvent::NodeChunk {
                path: node("llm"),
                text: Arc::from(" world"),
            },
            RunEvent::NodeFinished {
                path: node("llm"),
                output: Arc::new(Value::Null),
            },
            RunEvent::NodeSkipped {
                path: node("other"),
            },
            RunEvent::NodeFailed {
                path: node("last"),
                error: runvisor::NodeError::failed("boom"),
            },
            RunEvent::RunFinished {
                run_id: RunId::new(),
                status: RunStatus::Failed,
                persisted: true,
            },
            RunEvent::RunFinished {
                run_id: RunId::new(),
                status: RunStatus::Succeeded,
                persisted: false,
            },
        ];
        for event in &events {
            progress.event(event).expect("writes to a vec");
        }
        let text = String::from_utf8(progress.out).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "▶ node llm (stream_text)");
        assert_eq!(lines[1], "  Hello world");
        assert!(lines[2].starts_with("✓ node llm ") && lines[2].ends_with("ms"));
        assert_eq!(
            &lines[3..],
            [
                "↷ node other skipped",
                "✗ node last failed: boom",
                "■ run failed",
                "■ run succeeded, but its end was not stored"
            ]
        );
    }

    #[test]
    fn concurrent_streams_are_labelled() {
        let node = |id: &str| NodePath::node(NodeId::new(id).expect("valid id"));
        let mut progress = Progress::new(Vec::new());
        for id in ["a", "b"] {
            let event = RunEvent::NodeStarted {
                path: node(id),
                kind: Arc::from("stream_text"),
            };
            progress.event(&event).expect("writes");
        }
        for (id, text) in [("a", "one"), ("a", " two"), ("b", " three")] {
            let event = RunEvent::NodeChunk {
                path: node(id),
                text: Arc::from(text),
            };
            progress.event(&event).expect("writes");
        }
        let text = String::from_utf8(progress.out).expect("utf-8");
        assert!(text.ends_with("  [a] one two\n  [b] three"), "{text}");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(elapsed(None), "?");
        assert_eq!(elapsed(Some(Duration::from_millis(12))), "12ms");
        assert_eq!(elapsed(Some(Duration::from_millis(1250))), "1.25s");
    }
}
