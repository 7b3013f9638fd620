//! A worker taking jobs from the queue ([`redis::queue`](crate::redis::queue)): claims up to
//! `concurrency` jobs at a time, runs each on its thread, and settles it when its run ends.
//!
//! A job may be claimed again after its worker died, so a worker first reads what the job's
//! thread already did, and the thread's lease makes the rest safe. A job runs on a thread of
//! its own (`runvisor submit` refuses a thread that has runs), so every run of the thread is
//! the job's:
//!
//! - the thread's newest run ended for good (succeeded, failed, cancelled, stopped by a person
//!   or a deadline, or waits for a person's answer): the job is settled, nothing runs;
//! - the thread has no checkpoint: the run starts from the beginning (a run that died before
//!   its first checkpoint had nothing durable to lose; its lease is taken over and its record
//!   closed);
//! - otherwise (its run was stopped by a shutdown, or its worker died): the thread is resumed
//!   from its newest checkpoint, so finished nodes do not run again;
//! - the thread is busy (another worker runs it), or the job's run lost its lease: the job
//!   waits one lease TTL and looks again.
//!
//! A job that cannot run anywhere (not a job, an invalid workflow, inputs the workflow
//! refuses) is moved to the rejected list with why.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::redis::queue::{Claimed, Job, JobQueue};
use crate::redis::{ConnectError, RedisStores};
use crate::{
    ResumeError, ResumeFrom, ResumeInput, ResumeOptions, RunHandle, RunOutcome, RunRecord,
    RunStatus, Runtime, StartError, StopReason,
};

/// How a worker takes jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// How many jobs run at once.
    pub concurrency: usize,
    /// How long one claim waits for a job.
    pub block: Duration,
    /// How often the claimed jobs of workers that stopped heartbeating go back to the queue.
    pub sweep_every: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 16,
            block: Duration::from_secs(1),
            sweep_every: Duration::from_secs(5),
        }
    }
}

impl WorkerOptions {
    /// With `n` jobs at once (at least one).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Sweeping every `every`.
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every;
        self
    }
}

/// Takes jobs until `shutdown` completes, then stops this worker's runs (reason `shutdown`,
/// so they stay resumable), puts the jobs it still held back in the queue and removes its
/// heartbeat.
pub async fn serve(
    runtime: &Runtime,
    stores: &RedisStores,
    options: WorkerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ConnectError> {
    if let Err(e) = runtime.heartbeat().await {
        tracing::warn!(error = %e, "could not write this worker's heartbeat yet");
    }
    let queue = Arc::new(
        stores
            .job_queue(runtime.worker().id.clone(), options.block)
            .await?,
    );
    let permits = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let mut sweep = tokio::time::interval(options.sweep_every);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = sweep.tick() => match queue.sweep(stores.leases.as_ref()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(jobs = n, "put the jobs of workers that died back in the queue"),
                Err(e) => tracing::warn!(error = %e, "could not sweep the job queue"),
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            Ok(permit) = permits.clone().acquire_owned() => {
                let claimed = tokio::select! {
                    () = &mut shutdown => break,
                    claimed = queue.claim() => claimed,
                };
                match claimed {
                    Ok(Some(claimed)) => {
                        let runtime = runtime.clone();
                        let queue = queue.clone();
                        tasks.spawn(async move {
                            work(&runtime, &queue, claimed).await;
                            drop(permit);
                        });
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "could not claim a job");
                        tokio::time::sleep(options.block).await;
                    }
                }
            }
        }
    }
    runtime.shutdown().await;
    // A job whose run just ended and was not settled yet is looked at again by whoever claims
    // it next, and settled then.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    match queue.release_all().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            jobs = n,
            "put this worker's unfinished jobs back in the queue"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "could not put this worker's jobs back in the queue; a sweep will")
        }
    }
    Ok(())
}

/// What to do with a job now.
enum Next {
    /// Nothing more: the job is settled.
    Settled(&'static str),
    /// Its run started (or resumed) here.
    Running(RunHandle),
    /// Look again after a while.
    Later(String),
    /// No worker can run it.
    Reject(String),
}

/// Runs one claimed job until it is settled (or this worker shuts down).
async fn work(runtime: &Runtime, queue: &JobQueue, claimed: Claimed) {
    let job = match &claimed.job {
        Ok(job) => job,
        Err(e) => {
            reject(queue, &claimed, &format!("not a job: {e}")).await;
            return;
        }
    };
    let again = runtime.config().lease.ttl;
    loop {
        match next(runtime, job).await {
            Next::Settled(why) => {
                tracing::debug!(job = %job.id, thread = %job.thread, why, "job settled");
                settle(queue, &claimed).await;
                return;
            }
            Next::Reject(why) => {
                reject(queue, &claimed, &why).await;
                return;
            }
            Next::Later(why) => {
                tracing::debug!(job = %job.id, thread = %job.thread, why, "job waits");
                tokio::time::sleep(again).await;
            }
            Next::Running(run) => {
                let outcome = run.wait().await;
                if let RunOutcome::Stopped(stop) = &outcome
                    && stop.reason == StopReason::Shutdown
                {
                    // Left claimed: this worker puts it back in the queue as it shuts down.
                    return;
                }
                if let RunOutcome::Stopped(stop) = &outcome
                    && stop.reason == StopReason::LeaseLost
                {
                    // Another worker took the thread over, or this one could not confirm its
                    // lease and stopped: look again (the thread's newest run says which).
                    tracing::info!(job = %job.id, thread = %job.thread, run = %outcome.run_id(), "job's run lost its lease; looking again");
                    tokio::time::sleep(again).await;
                    continue;
                }
                match outcome.unpersisted() {
                    None => {
                        tracing::info!(job = %job.id, thread = %job.thread, run = %outcome.run_id(), status = %outcome.status(), "job ran")
                    }
                    // Kept in a spill file, replayed once Redis takes it again.
                    Some(unpersisted) => {
                        tracing::error!(job = %job.id, thread = %job.thread, run = %outcome.run_id(), status = %outcome.status(), %unpersisted, "job ran, but its end was not stored")
                    }
                }
                settle(queue, &claimed).await;
                return;
            }
        }
    }
}

async fn settle(queue: &JobQueue, claimed: &Claimed) {
    if let Err(e) = queue.settle(claimed).await {
        tracing::warn!(error = %e, "could not settle a job; it will be looked at again");
    }
}

async fn reject(queue: &JobQueue, claimed: &Claimed, why: &str) {
    tracing::warn!(error = why, "rejected a job");
    if let Err(e) = queue.reject(claimed, why).await {
        tracing::warn!(error = %e, "could not move a rejected job to the rejected list");
    }
}

/// Whether the thread's newest run ended for good: nothing is left for the job to do.
fn ended_for_good(record: &RunRecord) -> bool {
    match record.status {
        RunStatus::Succeeded
        | RunStatus::Failed
        | RunStatus::Cancelled
        | RunStatus::AwaitingInput
        | RunStatus::Answered => true,
        RunStatus::Stopped => !matches!(
            record.stop_reason.as_deref(),
            Some(reason) if reason == StopReason::Shutdown.as_str()
                || reason == StopReason::LeaseLost.as_str()
        ),
        _ => false,
    }
}

/// Reads what the job's thread did and starts, resumes or settles it.
async fn next(runtime: &Runtime, job: &Job) -> Next {
    let workflow = match runtime.load_json(&job.workflow) {
        Ok(workflow) => workflow,
        Err(errors) => return Next::Reject(format!("invalid workflow: {errors}")),
    };
    let records = match runtime.run_store().list_thread(&job.thread).await {
        Ok(records) => records,
        Err(e) => return Next::Later(format!("cannot read the thread's runs: {e}")),
    };
    if let Some(newest) = records.iter().max_by_key(|r| (r.started_at_ms, r.run_id))
        && ended_for_good(newest)
    {
        return Next::Settled("the thread's run ended");
    }
    let checkpoints = match runtime.checkpoint_store().list(&job.thread).await {
        Ok(ids) => ids,
        Err(e) => return Next::Later(format!("cannot read the thread's checkpoints: {e}")),
    };
    if checkpoints.is_empty() {
        return match runtime
            .start_with(
                &workflow,
                job.inputs.clone(),
                job.thread.clone(),
                job.labels.clone(),
            )
            .await
        {
            Ok(run) => Next::Running(run),
            Err(e @ StartError::ThreadBusy { .. }) => Next::Later(e.to_string()),
            Err(
                e @ (StartError::InvalidInput { .. }
                | StartError::InputTooDeep { .. }
                | StartError::UnknownKind(_)),
            ) => Next::Reject(e.to_string()),
            Err(e) => Next::Later(e.to_string()),
        };
    }
    match runtime
        .resume_with(
            ResumeFrom::Thread(job.thread.clone()),
            ResumeInput::Continue,
            ResumeOptions::default(),
        )
        .await
    {
        Ok(run) => Next::Running(run),
        // Its final checkpoint was stored, its record not (its worker died in between): the
        // resume completed the record and the history.
        Err(ResumeError::NothingToResume { .. }) => Next::Settled("the thread's run had ended"),
        Err(e @ (ResumeError::Corrupt { .. } | ResumeError::AnswerTooDeep { .. })) => {
            Next::Reject(e.to_string())
        }
        Err(e) => Next::Later(e.to_string()),
    }
}
