//! `runvisor recover`: replays the spill files of the configured Redis (runs whose end Redis
//! did not take) into it, exactly once; and the same replay, quietly, when a worker starts
//! and, for `runvisor worker`, while it runs.

use std::io::{self, Write};

use runvisor::redis::RedisStores;
use runvisor::spill::{RecoverOutcome, RecoverReport, Recovered};
use runvisor::{ReplayError, Runtime};

/// `runvisor recover` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct RecoverArgs {
    /// Print a JSON array, one object per spill file, instead of lines.
    #[arg(long)]
    json: bool,
}

/// What went wrong with a file, as the exit code says it: the store failed (3), the file
/// cannot be read or removed (2), another process or run holds it (4).
fn severity(outcome: &RecoverOutcome) -> Option<u8> {
    match outcome {
        RecoverOutcome::Failed(_) => Some(super::EXIT_STORAGE),
        RecoverOutcome::Unreadable(_) | RecoverOutcome::NotRemoved(..) => {
            Some(super::EXIT_BAD_INPUT)
        }
        RecoverOutcome::Busy(_) => Some(super::EXIT_CONFLICT),
        _ => None,
    }
}

/// The exit code for a report: the store's if it failed for a file, then a file's, then a
/// conflict's; 0 when every file was replayed, set aside, or meant for another store.
fn exit_code(report: &RecoverReport) -> u8 {
    let codes: Vec<u8> = report
        .files
        .iter()
        .filter_map(|f| severity(&f.outcome))
        .collect();
    for code in [
        super::EXIT_STORAGE,
        super::EXIT_BAD_INPUT,
        super::EXIT_CONFLICT,
    ] {
        if codes.contains(&code) {
            return code;
        }
    }
    0
}

/// `run R of thread T`, or the file when it could not be read.
fn subject(file: &Recovered) -> String {
    match &file.run {
        Some((run, thread)) => format!("run {run} of thread {thread}"),
        None => file.path.display().to_string(),
    }
}

/// One line per file: on stdout what was done, on stderr (as `error:`) what went wrong.
fn describe(file: &Recovered) -> Result<String, String> {
    let who = subject(file);
    match &file.outcome {
        RecoverOutcome::Replayed(replayed) => {
            let mut parts = Vec::new();
            if replayed.messages > 0 {
                parts.push(format!("{} message(s)", replayed.messages));
            }
            if let Some(id) = replayed.checkpoint {
                let again = if replayed.checkpoint_was_stored {
                    " (already there)"
                } else {
                    ""
                };
                parts.push(format!("checkpoint {id}{again}"));
            }
            if replayed.record {
                parts.push("run record".to_owned());
            }
            Ok(format!("replayed {who}: {}", parts.join(", ")))
        }
        RecoverOutcome::Skipped { why, kept } => Ok(format!(
            "set aside {who}: the thread moved on ({why}); kept in {}",
            kept.display()
        )),
        RecoverOutcome::OtherStore(store) => {
            Ok(format!("left {who}: it is for another store ({store})"))
        }
        RecoverOutcome::Busy(why) => Err(format!("left {who}: {why}; try again later")),
        RecoverOutcome::Unreadable(e) => Err(e.to_string()),
        RecoverOutcome::Failed(e) => Err(e.to_string()),
        RecoverOutcome::NotRemoved(_, e) => Err(format!(
            "replayed {who}, but its spill file stays (a later replay writes nothing): {e}"
        )),
        _ => Ok(format!("{who}: {:?}", file.outcome)),
    }
}

/// `runvisor recover`.
pub(crate) async fn recover(
    runtime: &Runtime,
    stores: &RedisStores,
    args: RecoverArgs,
) -> anyhow::Result<u8> {
    let report = stores.recover_spilled(runtime).await;
    let mut out = io::stdout().lock();
    if args.json {
        let files: Vec<serde_json::Value> = report.files.iter().map(document).collect();
        serde_json::to_writer_pretty(&mut out, &files).map_err(io::Error::from)?;
        writeln!(out)?;
    } else if report.files.is_empty() {
        writeln!(
            out,
            "nothing to recover in {}",
            stores.spill().dir().display()
        )?;
    } else {
        for file in &report.files {
            match describe(file) {
                Ok(line) => writeln!(out, "{line}")?,
                Err(line) => eprintln!("error: {}", one_line(&line)),
            }
        }
    }
    out.flush()?;
    Ok(exit_code(&report))
}

/// What a worker does when it starts: replays what earlier runs spilled, logging each file.
pub(crate) async fn at_start(runtime: &Runtime, stores: &RedisStores) {
    let report = stores.recover_spilled(runtime).await;
    for file in &report.files {
        match describe(file) {
            Ok(line) => tracing::info!(path = %file.path.display(), "{line}"),
            Err(line) => tracing::warn!(path = %file.path.display(), "{line}"),
        }
    }
}

/// While a worker runs: replays the spill files that its own runs (or others') left while
/// Redis was away, every `every`, once Redis takes them. Ends with the returned handle.
pub(crate) fn keep_replaying(
    runtime: Runtime,
    stores: RedisStores,
    every: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if stores
                .spill()
                .pending()
                .is_ok_and(|files| !files.is_empty())
            {
                at_start(&runtime, &stores).await;
            }
        }
    })
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A file's entry in `--json`.
fn document(file: &Recovered) -> serde_json::Value {
    let (outcome, detail) = match &file.outcome {
        RecoverOutcome::Replayed(_) => ("replayed", None),
        RecoverOutcome::Skipped { .. } => ("set_aside", None),
        RecoverOutcome::OtherStore(_) => ("other_store", None),
        RecoverOutcome::Busy(_) => ("busy", None),
        RecoverOutcome::Unreadable(_) => ("unreadable", None),
        RecoverOutcome::Failed(ReplayError::ThreadBusy { .. }) => ("busy", None),
        RecoverOutcome::Failed(_) => ("failed", None),
        RecoverOutcome::NotRemoved(..) => ("not_removed", None),
        _ => ("unknown", Some(format!("{:?}", file.outcome))),
    };
    let line = match describe(file) {
        Ok(line) | Err(line) => one_line(&line),
    };
    serde_json::json!({
        "path": file.path.display().to_string(),
        "run": file.run.as_ref().map(|(run, _)| run.to_string()),
        "thread": file.run.as_ref().map(|(_, thread)| thread.to_string()),
        "outcome": outcome,
        "detail": detail.unwrap_or(line),
    })
}
