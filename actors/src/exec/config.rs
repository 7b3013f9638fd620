//! Runtime settings: stop timeouts, durability, checkpoint buffering, signal keys. Every run
//! of a runtime reads them; config files give durations as humantime strings.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::persist::{Durability, SignalConfig};

/// Runtime settings. Durations are humantime strings in config files (`"30s"`, `"250ms"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// How long a graceful stop waits for running nodes before forcing them.
    #[serde(with = "humantime_serde")]
    pub stop_timeout: Duration,
    /// A deadline for every run: past it the run is stopped gracefully with reason `timeout`
    /// (and stays resumable). None by default.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub run_timeout: Option<Duration>,
    /// How long an ops query (actor tree) waits for each actor's answer.
    #[serde(with = "humantime_serde")]
    pub query_timeout: Duration,
    /// Events buffered per run for slow subscribers; past that a subscriber misses events
    /// (and is told how many).
    pub event_buffer: usize,
    /// When snapshots are written: `sync`, `async` (default) or `exit`.
    pub durability: Durability,
    /// Bytes of background snapshots allowed to wait for the store (during an outage); past
    /// that, runs wait for their snapshot to be stored before going on.
    pub checkpoint_buffer: usize,
    /// Incremental checkpoints: the most deltas a restore applies on a whole snapshot (a
    /// base), a bound on what it reads (in one round trip on Redis). 0 writes every
    /// checkpoint whole. A chain that reaches it while its deltas still weigh less than its
    /// base (see `checkpoint_compact_percent`), a large state, gets a merged delta instead of
    /// a new base: everything that changed since the chain's last merge point, when that is
    /// at most half as large as the base and the merge point at most half this many deltas
    /// deep. A state is then written whole again only once the deltas outweigh it, or after
    /// about `3 * n * n / 8` steps (n this value). At most
    /// [`MAX_CHAIN`](crate::delta::MAX_CHAIN) counts.
    pub checkpoint_compact_every: u32,
    /// Incremental checkpoints: a run writes a new base once the deltas a restore of its
    /// last checkpoint applies add up to more than this percent of that base's bytes (both
    /// counted as encoded, before the compression of large bases). The bytes encoded for bases
    /// then stay within about `100 / percent` times the delta bytes (a long run does not
    /// rewrite its growing state every few steps), and restoring decodes a base and at most
    /// this percent of it in deltas. 0 writes every checkpoint whole.
    pub checkpoint_compact_percent: u32,
    /// In `async` mode, the window over which a run's completions share one snapshot.
    #[serde(with = "humantime_serde")]
    pub checkpoint_coalesce: Duration,
    /// How long a write keeps retrying a store that fails transiently (out of reach, slow,
    /// loading, failing over) before it is given up: an awaited progress snapshot (`sync`),
    /// and a run's end, whose history, final checkpoint and run record share one deadline
    /// (what is not stored by then is reported, and spilled where a spill store is set).
    /// Permanent errors (refused, fenced, corrupt) are never retried. Formerly
    /// `checkpoint_flush_timeout`, still accepted.
    #[serde(with = "humantime_serde", alias = "checkpoint_flush_timeout")]
    pub store_deadline: Duration,
    /// How many of the thread's newest messages a run reads at its start: what its nodes see
    /// of the thread's history before the run's own messages (`ctx.history()`). `None` (the
    /// default) reads the whole history; a window keeps a start's cost flat on a long thread
    /// (on Redis only the window is read). What is stored is never cut: runs append to the
    /// whole history, and a fork copies it up to its checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_window: Option<usize>,
    /// Stop and cancel flags: key formats and timings.
    pub signals: SignalConfig,
    /// How many finished runs keep their outcome in memory, so a stop that arrives after a run
    /// ended still gets its outcome (past that, it gets the run's record). Each kept outcome
    /// holds the run's outputs; 0 keeps none.
    pub finished_outcomes: usize,
    /// How many bytes the kept outcomes of finished runs may weigh together (their outputs,
    /// variables, messages and streamed text, as estimated in memory): the oldest go first,
    /// and an outcome heavier than this is not kept. With `finished_outcomes` it bounds what
    /// a long-lived worker keeps of the runs it finished, whatever their size.
    pub finished_outcomes_bytes: usize,
    /// This runtime's worker id, as run records, leases and logs name it. By default one is
    /// made from the host name, the process id and a random part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// Worker heartbeats and thread leases.
    pub lease: LeaseConfig,
    /// Whether this worker takes orphaned runs over by itself: every `adopt_every` it looks
    /// for runs recorded as running whose worker stopped heartbeating and resumes their
    /// threads from their newest checkpoints (finished nodes do not run again; a node that was
    /// in flight when its worker died runs again from its start).
    pub adopt_orphans: bool,
    /// How often a worker adopting orphans looks for them.
    #[serde(with = "humantime_serde")]
    pub adopt_every: Duration,
}

/// How long a worker's heartbeat and a run's thread lease live, and how often they are
/// renewed. A run whose worker stops heartbeating is orphaned after `ttl`, and another worker
/// may then take its thread over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseConfig {
    /// How long a heartbeat or a lease lives unless renewed.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How often they are renewed (well below `ttl`, so a slow round trip does not lose them).
    #[serde(with = "humantime_serde")]
    pub renew: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            stop_timeout: Duration::from_secs(30),
            run_timeout: None,
            query_timeout: Duration::from_secs(1),
            event_buffer: 1024,
            durability: Durability::Async,
            checkpoint_buffer: 64 * 1024 * 1024,
            checkpoint_compact_every: 1024,
            checkpoint_compact_percent: 100,
            checkpoint_coalesce: Duration::from_millis(20),
            store_deadline: Duration::from_secs(10),
            history_window: None,
            signals: SignalConfig::default(),
            finished_outcomes: 1024,
            finished_outcomes_bytes: 64 * 1024 * 1024,
            worker_id: None,
            lease: LeaseConfig::default(),
            adopt_orphans: false,
            adopt_every: Duration::from_secs(5),
        }
    }
}
