//! The job queue: runs submitted by any process (`runvisor submit`) and started by whichever
//! worker claims them first (`runvisor worker`).
//!
//! A job waits in the LIST `<p>:jobs:{jobs}`. A worker claims one with `BLMOVE` into its own
//! LIST `<p>:claimed:{jobs}:<worker>`, in one command, so a job is always in exactly one list,
//! and records itself in the SET `<p>:claimers:{jobs}`. It removes the job from its claimed
//! list only when the job is settled (its run ended here, or the thread turned out to be
//! finished or run by someone else). A worker that dies leaves its claimed jobs behind; any
//! worker's sweep ([`JobQueue::sweep`]) moves the claimed jobs of workers without a heartbeat
//! back to the queue, one atomic `LMOVE` each. Every key carries the hash tag `{jobs}`, so all
//! of this works on one Cluster slot.
//!
//! Claiming is at-least-once: a job can be looked at again after its worker died. What makes
//! that safe is the thread: a worker starts or resumes a job's thread under the thread's lease,
//! and first reads what the thread already did (see `runvisor::worker`).

use std::time::Duration;

use runvisor_actors::store::LeaseStore;
use runvisor_actors::{Map, RunLabels, StoreError, ThreadId, WorkerId};
use serde::{Deserialize, Serialize};

use super::conn::Conn;
use super::keys::Keys;
use super::reply;
use super::{ConnectError, RedisStores};

/// A run to start: a workflow (its JSON text, validated by the submitter and again by the
/// worker), its inputs, the thread it runs on and its labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The job's id (a UUID v7).
    pub id: String,
    /// The thread the run goes on.
    pub thread: ThreadId,
    /// The workflow definition, as JSON text.
    pub workflow: String,
    /// The inputs, typed already.
    #[serde(default)]
    pub inputs: Map,
    /// The run's labels (app, chat, task, user).
    #[serde(default)]
    pub labels: RunLabels,
    /// When it was submitted (ms since the Unix epoch).
    pub submitted_at_ms: u64,
}

impl Job {
    /// A job with a fresh id, submitted now.
    pub fn new(thread: ThreadId, workflow: String, inputs: Map, labels: RunLabels) -> Self {
        let submitted_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Job {
            id: uuid::Uuid::now_v7().to_string(),
            thread,
            workflow,
            inputs,
            labels,
            submitted_at_ms,
        }
    }
}

/// A job a worker claimed: the text as queued (what removing it names) and the job, or why the
/// text is not one.
#[derive(Debug, Clone)]
pub struct Claimed {
    raw: String,
    /// The job, or why the queued text could not be read as one.
    pub job: Result<Job, String>,
}

impl RedisStores {
    /// Queues a job for the workers.
    pub async fn submit(&self, job: &Job) -> Result<(), StoreError> {
        let key = self.keys.job_queue();
        let text = serde_json::to_string(job)
            .map_err(|e| StoreError::Unavailable(format!("cannot encode job {}: {e}", job.id)))?;
        let mut cmd = ::redis::cmd("LPUSH");
        cmd.arg(&key).arg(text);
        let reply = self.conn.query(&key, &cmd).await?;
        reply::int(&reply, &key).map(drop)
    }

    /// How many jobs wait for a worker.
    pub async fn queued_jobs(&self) -> Result<u64, StoreError> {
        let key = self.keys.job_queue();
        let mut cmd = ::redis::cmd("LLEN");
        cmd.arg(&key);
        let reply = self.conn.query(&key, &cmd).await?;
        Ok(u64::try_from(reply::int(&reply, &key)?).unwrap_or(0))
    }

    /// This worker's side of the queue, with a connection of its own for blocking claims of
    /// up to `block` each.
    pub async fn job_queue(
        &self,
        worker: WorkerId,
        block: Duration,
    ) -> Result<JobQueue, ConnectError> {
        let blocking = super::control::blocking_conn(&self.config, &self.endpoint, block).await?;
        Ok(JobQueue {
            blocking,
            conn: self.conn.clone(),
            keys: self.keys.clone(),
            claimed: self.keys.claimed_jobs(&worker),
            worker,
            block,
        })
    }
}

/// One worker's side of the job queue.
pub struct JobQueue {
    blocking: Conn,
    conn: Conn,
    keys: Keys,
    worker: WorkerId,
    claimed: String,
    block: Duration,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue")
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

impl JobQueue {
    /// Claims the oldest queued job, waiting up to the block time for one; `None` when none
    /// came.
    pub async fn claim(&self) -> Result<Option<Claimed>, StoreError> {
        let queue = self.keys.job_queue();
        let mut cmd = ::redis::cmd("BLMOVE");
        cmd.arg(&queue)
            .arg(&self.claimed)
            .arg("RIGHT")
            .arg("LEFT")
            .arg(self.block.as_secs_f64());
        let reply = self.blocking.query(&queue, &cmd).await?;
        if matches!(reply, ::redis::Value::Nil) {
            return Ok(None);
        }
        let raw = reply::text(&reply, &queue)?.to_owned();
        // Sweeps look at the claimed lists of the workers in this set.
        let claimers = self.keys.job_claimers();
        let mut cmd = ::redis::cmd("SADD");
        cmd.arg(&claimers).arg(self.worker.as_str());
        self.conn.query(&claimers, &cmd).await?;
        let job = serde_json::from_str(&raw).map_err(|e| e.to_string());
        Ok(Some(Claimed { raw, job }))
    }

    /// Removes a settled job from this worker's claimed list.
    pub async fn settle(&self, claimed: &Claimed) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd("LREM");
        cmd.arg(&self.claimed).arg(1).arg(&claimed.raw);
        self.conn.query(&self.claimed, &cmd).await.map(drop)
    }

    /// Moves a job no worker can run from this worker's claimed list to the rejected list,
    /// with why, in one transaction.
    pub async fn reject(&self, claimed: &Claimed, why: &str) -> Result<(), StoreError> {
        let rejected = self.keys.rejected_jobs();
        let entry =
            serde_json::json!({"job": claimed.raw, "worker": self.worker.as_str(), "error": why});
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("LREM")
            .arg(&self.claimed)
            .arg(1)
            .arg(&claimed.raw)
            .ignore()
            .cmd("LPUSH")
            .arg(&rejected)
            .arg(entry.to_string())
            .ignore();
        self.conn.pipeline(&rejected, &pipe).await.map(drop)
    }

    /// Puts every job this worker claimed back in the queue (at its head, so they are claimed
    /// next): what a worker that shuts down leaves for the others.
    pub async fn release_all(&self) -> Result<usize, StoreError> {
        self.drain(&self.claimed).await
    }

    /// Puts back in the queue the claimed jobs of every worker that no longer heartbeats, and
    /// forgets those workers. Returns how many jobs went back.
    pub async fn sweep(&self, leases: &dyn LeaseStore) -> Result<usize, StoreError> {
        let claimers = self.keys.job_claimers();
        let mut cmd = ::redis::cmd("SMEMBERS");
        cmd.arg(&claimers);
        let reply = self.conn.query(&claimers, &cmd).await?;
        let mut workers = Vec::new();
        for member in reply::array(&reply, &claimers)? {
            // A member that is not a worker id was not written by a worker: left alone.
            if let Ok(id) = WorkerId::new(reply::text(member, &claimers)?) {
                workers.push(id);
            }
        }
        let heartbeats = leases.workers(&workers).await?;
        let mut moved = 0;
        for (worker, heartbeat) in workers.iter().zip(heartbeats) {
            if heartbeat.is_some() || *worker == self.worker {
                continue;
            }
            moved += self.drain(&self.keys.claimed_jobs(worker)).await?;
            // Forgotten only once its list is empty: a worker that is slow rather than dead
            // adds itself again when it next claims.
            let mut cmd = ::redis::cmd("SREM");
            cmd.arg(&claimers).arg(worker.as_str());
            self.conn.query(&claimers, &cmd).await?;
        }
        Ok(moved)
    }

    /// Moves every job of a claimed list back to the queue, one atomic `LMOVE` each.
    async fn drain(&self, list: &str) -> Result<usize, StoreError> {
        let queue = self.keys.job_queue();
        let mut moved = 0;
        loop {
            let mut cmd = ::redis::cmd("LMOVE");
            cmd.arg(list).arg(&queue).arg("RIGHT").arg("RIGHT");
            let reply = self.conn.query(&queue, &cmd).await?;
            if matches!(reply, ::redis::Value::Nil) {
                return Ok(moved);
            }
            moved += 1;
        }
    }
}
