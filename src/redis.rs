//! Redis adapters for the engine's ports: checkpoints, run records and thread histories kept in
//! one Redis server or a Redis Cluster, so a run stopped in one process resumes in another; and
//! the stop and cancel flags every process shares, so any of them can stop a run
//! ([`RedisSignalSource`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use runvisor::Runtime;
//! use runvisor::redis::{RedisConfig, RedisStores};
//!
//! let stores = RedisStores::connect(RedisConfig::new("redis://127.0.0.1:6379/")).await?;
//! let runtime = stores.install(Runtime::builder()).try_build()?;
//! # let _ = runtime; Ok(()) }
//! ```
//!
//! # Redis Cluster
//!
//! A URL `redis+cluster://h1:p1,h2:p2[,...]` (with `user:password@` before the hosts when
//! needed) connects to a Redis Cluster through those seed nodes; `rediss+cluster://` is the
//! same over TLS, where this build supports `rediss://`. Everything works there as on one
//! server:
//!
//! - every key of one thread (run records, lease and fencing counter included) carries the
//!   thread's hash tag, so it lives in the thread's slot ([`hash_slot`]) and every script
//!   touches that one slot;
//! - the flags of many runs (in any slots: compat keys such as
//!   `agent_runtime_stopping:<app>:<chat>` have no tag) are read per slot, one pipeline per
//!   node, all nodes at once; a run's fenced clear of its flags checks its token in a script
//!   on the thread's slot, then unlinks the flags that live in other slots;
//! - stop notices use sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`) on the same channel
//!   `<p>:signals`, which lives on the node that owns that name's slot.
//!
//! Connecting to one node of a cluster with a plain `redis://` URL is refused: most keys would
//! be answered `MOVED`.
//!
//! # Key layout
//!
//! Every key starts with the configured prefix `<p>` (default `runvisor`). Placeholders are in
//! angle brackets; curly braces are literal: `{<thread>}` is a Redis Cluster hash tag, so all
//! the keys of one thread live in one slot and every script below touches a single slot.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<p>:cp:{<thread>}:<checkpoint_id>` | STRING | one checkpoint: a text header (`rvc1`, `w` or `d` for a whole snapshot or a delta, the run id, the sequence as 20 digits, and a delta's base and parent ids), then the snapshot or delta envelope, raw. Earlier releases wrote a HASH (`bytes`, `run`, `sequence`, `base`, `parent`), still read |
//! | `<p>:wf:{<thread>}:<hash>` | STRING | a workflow definition (JSON) the thread's snapshots name by content hash (xxh3-128) |
//! | `<p>:cpidx:{<thread>}` | ZSET | the thread's checkpoint ids, all with score 0 |
//! | `<p>:cpseq:{<thread>}:<run_id>` | STRING | the newest checkpoint sequence stored for a run (decimal) |
//! | `<p>:cpfresh:{<thread>}` | STRING | the id of the base of the thread's chain of checkpoints, while every checkpoint of that chain is known to live more than half the data TTL longer and the thread's index holds nothing older than that base; expires when the first stops being true (a write then reads the base's TTL, and renews the chain's when it is under half) |
//! | `<p>:run:{<thread>}:<run_id>` | HASH | a run record, field by field (see below) |
//! | `<p>:runthread:<run_id>` | STRING | the thread of a run (how a run is found by id) |
//! | `<p>:runs:{<thread>}` | ZSET | the thread's run ids, all with score 0 |
//! | `<p>:open` | ZSET | open runs (running, awaiting input) of every thread: members `<run_id> <thread>`, score the start (ms) |
//! | `<p>:recent` | ZSET | every run of the last data TTL, as in `<p>:open` |
//! | `<p>:threads` | SET | every thread a run was recorded on (for checkpoint stats and cleanup, see [`retention`]) |
//! | `<p>:threads:<user_id>` | SET | the threads of a user's runs (the user id is the rest of the key) |
//! | `<p>:users` | SET | the user ids runs were recorded with |
//! | `<p>:lease:{<thread>}` | HASH | the thread's lease: `worker`, `run`, `token`, `expires` (ms, moved on by each renewal; an expired lease is free); deleted when released |
//! | `<p>:fence:{<thread>}` | STRING | the thread's newest fencing token (a counter) |
//! | `<p>:ctl:<worker_id>` | LIST | a worker's control mailbox (see [`control`]) |
//! | `<p>:ctlreply:{<request_id>}:<worker_id>` | LIST | a worker's answer to a control request |
//! | `<p>:worker:<worker_id>` | HASH | a worker's heartbeat: `host`, `pid`, `started_at`, `version`; lives for the lease TTL |
//! | `<p>:jobs:{jobs}` | LIST | submitted jobs waiting for a worker, JSON (see [`queue`]) |
//! | `<p>:claimed:{jobs}:<worker_id>` | LIST | the jobs a worker claimed and has not settled |
//! | `<p>:claimers:{jobs}` | SET | the workers that claimed jobs (whose lists a sweep looks at) |
//! | `<p>:rejected:{jobs}` | LIST | jobs no worker can run, each `{"job", "worker", "error"}` |
//! | `<p>:hist:{<thread>}` | LIST | the thread's history, one message per entry, oldest first: a format byte (`1`) and the message in postcard (entries of earlier releases: JSON) |
//! | `<p>:histids:{<thread>}` | SET | the ids of the messages in that list, 16 bytes each (text ids from earlier releases still count) |
//! | stop and cancel flags, named by the runtime's [`SignalConfig`](crate::SignalConfig) templates | STRING | a flag: any non-empty value, with a TTL |
//! | `<p>:signals` (pub/sub channel) | | notices `{"key": ..., "raised": ...}` (see [`signal`]) |
//!
//! Ordering: checkpoint, run and message ids are UUIDv7, whose text order is their time order
//! (and the order of the ids themselves). The two ZSETs give every member the score 0, so
//! Redis orders them by their bytes: `ZRANGE` lists them oldest first, exactly as the ids
//! compare, with no tie broken by a clock.
//!
//! Run record fields: `status` (`running`, `stopped`, ...), `thread`, `workflow_id`,
//! `started_at` (ms since the epoch), and when set `checkpoint_id`, `parent_run_id`,
//! `finished_at`, `stop_reason`, `failure_reason`, `unpersisted`, `app_id`, `chat_id`,
//! `task_id`, `user_id`, `not_resumable`, `worker` (the worker id) and `fence` (the token it ran
//! with).
//! An absent option is an absent field; other fields (written by other tools) are left alone.
//! Records written before they moved into their thread's slot (`<p>:run:<run_id>`) are still
//! read.
//!
//! Every key written gets the configured TTL ([`RedisConfig::checkpoint_ttl`], default 30 days),
//! refreshed by each write to it, but the record of a run that ended (and its pointer) gets
//! [`RedisConfig::finished_run_ttl`] (default 7 days), and a thread's freshness key
//! (`<p>:cpfresh:{<thread>}`) lives at most half the TTL; a running run's lease renewals
//! refresh its record. Each thread keeps its newest [`RedisConfig::keep_checkpoints`] checkpoints
//! (default 20): see [`retention`]; and the records of its newest
//! [`RedisConfig::keep_ended_runs`] ended runs (default 20), older ones going when a run ends.
//!
//! # Atomicity and fencing
//!
//! A run holds its thread's lease ([`RedisLeaseStore`]) and writes with the lease's fencing
//! token. Every script that writes for a run first compares the token with the thread's
//! counter `<p>:fence:{<thread>}`, in the same script and slot, and refuses the whole write
//! when they differ ([`StoreError::Fenced`](crate::StoreError::Fenced)): a run whose thread
//! was taken over cannot write a checkpoint, a message, its record or a flag clear.
//!
//! - A checkpoint `put` is one Lua script: it refuses a sequence not greater than the run's
//!   stored one ([`StoreError::StaleSequence`](crate::StoreError::StaleSequence)), then writes
//!   payload, index entry and sequence together and prunes the thread to its retention (the
//!   oldest payloads, their index entries, the sequence keys of their runs but the writer's),
//!   or does nothing.
//! - A history `append` is one Lua script: it appends, in order, the messages whose id is not
//!   yet in the id set, and records their ids, or does nothing.
//! - `prune` removes the oldest checkpoints in batches of at most 1,000; each batch
//!   (payloads, index entries, the sequence keys of their runs but the lease holder's) is one
//!   Lua script. Reads drop index entries whose payload expired, in a script that checks
//!   again that it is missing.
//! - A run `put` writes the run's thread pointer, then index entry and hash in one Lua script;
//!   a reader skips an index entry whose hash is missing.
//! - A run's flag clear is one script over the fence counter and the flags.
//! - A new run's start ([`RedisStartStore`]) is one script in the thread's slot: the lease's
//!   acquire, then the run's first record fenced by (and naming) the new token, then the
//!   thread's history (whole, or its newest messages within the runtime's `history_window`)
//!   with the list's length and its newest checkpoint id (the run's checkpoints sort after
//!   it). A lease held by another run writes nothing; a record that
//!   is refused gives the lease back; either way the start goes on step by step.
//! - A resume's first record and the `answered` of the paused run it answers are one script
//!   in the thread's slot (`RunStore::put_answering`): the record, then, once it is written,
//!   the paused run's.
//! - A run's end ([`RedisEndStore`]) is one script in the thread's slot made of the scripts
//!   above as Lua functions, each with its own keys and arguments: the final checkpoint's
//!   `put`, then the history's `append` (when the run has messages), then the record's `put`,
//!   then the run's flags deleted, their notices published (not on a cluster) and its lease
//!   deleted if it still holds the run's token (where every flag is in the thread's slot).
//!   Each runs only when the one before it answered ok, so one that refuses (a stale token, a
//!   key of another type) leaves the steps after it undone and the steps before it stored.
//! - Scripts check the types of their keys before writing, so a key holding something else
//!   fails the call with [`StoreError::Corrupt`](crate::StoreError::Corrupt) and writes
//!   nothing. Keys and values reach scripts as `KEYS` and `ARGV`, never as script text. The
//!   checkpoint scripts also name the payload and sequence keys of the ids they find in the
//!   index, from the thread's key prefixes (given in `ARGV`): those keys carry the thread's
//!   tag, so they are in the script's slot.
//!
//! # Failures
//!
//! Calls go through one auto-reconnecting connection (to the server, or to every node of the
//! cluster) with explicit connect and response timeouts, and each call is bounded by
//! [`RedisConfig::call_timeout`] however the connection behaves. Each call is tried once;
//! errors say whether trying again may help ([`StoreError::is_transient`](crate::StoreError::is_transient)):
//!
//! - transient: an unreachable Redis (refused, reset or dropped connections) gives
//!   [`StoreError::Unavailable`](crate::StoreError::Unavailable), a silent one
//!   [`StoreError::Timeout`](crate::StoreError::Timeout); so do `LOADING`, `BUSY`, `TRYAGAIN`,
//!   `MASTERDOWN`, `CLUSTERDOWN`, `READONLY` (a failover), `OOM`, `MISCONF` and unresolved
//!   `MOVED`/`ASK` replies. The engine retries these with backoff until its store deadline.
//! - permanent: `NOAUTH`, `WRONGPASS`, `NOPERM`, `CROSSSLOT`, `EXECABORT`, `NOSCRIPT` (once
//!   the script was loaded again), script errors, any other `ERR`, and a reply that does not
//!   parse (the endpoint is not Redis) give [`StoreError::Rejected`](crate::StoreError::Rejected)
//!   naming the command (or script) and the key; a key of the wrong type gives
//!   [`StoreError::Corrupt`](crate::StoreError::Corrupt) naming the key, as does data that
//!   cannot be read. These fail at once.
//!
//! [`RedisStores::connect`] sends a `PING` first: a server that refuses this client (a
//! password required or wrong) or does not speak Redis is [`ConnectError::Refused`] there.
//! What a run's end could not store by the deadline goes to a spill file
//! ([`RedisStores::spill`], see [`spill`]), replayed into Redis once by
//! [`RedisStores::recover_spilled`].
//! Nothing panics on what Redis returns.
//!
//! Redis should run with `maxmemory-policy noeviction`: an evicting policy may drop
//! checkpoints. [`RedisStores::connect`] warns when it is not.

mod checkpoint;
mod conn;
pub mod control;
mod end;
mod history;
mod keys;
mod lease;
pub mod queue;
mod reply;
pub mod retention;
mod run;
mod scripts;
pub mod signal;
mod start;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use runvisor_actors::store::{
    CheckpointStore, EndStore, HistoryStore, LeaseStore, RunStore, SignalSource, StartStore,
};
use runvisor_actors::{Runtime, RuntimeBuilder};
use serde::{Deserialize, Serialize};

pub use checkpoint::RedisCheckpointStore;
pub use end::RedisEndStore;
pub use history::RedisHistoryStore;
pub use keys::{Keys, SLOTS, hash_slot};
pub use lease::RedisLeaseStore;
pub use retention::{Keep, KeepCheckpoints};
pub use run::RedisRunStore;
pub use signal::RedisSignalSource;
pub use start::RedisStartStore;

use crate::spill::{self, FileSpill, RecoverReport};
use conn::{Conn, Endpoint};

/// How to reach Redis and how long to wait for it. Durations are humantime strings in config
/// files (`"500ms"`, `"30d"`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// The server, as a `redis://` (or `rediss://`, `unix://`) URL, or a Redis Cluster as
    /// `redis+cluster://h1:p1,h2:p2[,...]` (seed nodes; `rediss+cluster://` for TLS).
    pub url: String,
    /// What every key starts with. No whitespace, no braces.
    pub prefix: String,
    /// How long one connection attempt may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long Redis may take to answer one command.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// The most one store call may take, reconnects and script loads included: the backstop
    /// over the two timeouts above.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// How long written keys live (refreshed by each write): checkpoints, histories and the
    /// records of open runs alike.
    #[serde(with = "humantime_serde")]
    pub checkpoint_ttl: Duration,
    /// Where the ends of runs that Redis did not take are kept until they are replayed
    /// (see [`spill`]); by default [`spill::default_dir`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spill_dir: Option<std::path::PathBuf>,
    /// How many checkpoints each thread keeps: a number (at least 1), or `"all"`. Each write
    /// past it removes the thread's oldest checkpoints in the same script.
    pub keep_checkpoints: KeepCheckpoints,
    /// How long the record of a run that ended (succeeded, failed, stopped, cancelled) lives
    /// after its last write. Records of open runs (running, awaiting input) live for
    /// `checkpoint_ttl`, and a running run's lease renewals keep its record alive.
    #[serde(with = "humantime_serde")]
    pub finished_run_ttl: Duration,
    /// How many ended runs' records each thread keeps: a number (at least 1), or `"all"`. When
    /// a run ends, the records of the thread's older ended runs past it go in the same script
    /// (with their index entries); open runs' records are never pruned.
    pub keep_ended_runs: Keep,
}

impl RedisConfig {
    /// The defaults, with this server.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// The URL with any password replaced by `***`, for messages and logs.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    fn check(&self) -> Result<(), ConnectError> {
        let invalid = |what: String| Err(ConnectError::InvalidConfig(what));
        if self.prefix.is_empty()
            || self
                .prefix
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '{' || c == '}')
        {
            return invalid(format!(
                "prefix {:?} must be non-empty, without whitespace or braces",
                self.prefix
            ));
        }
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
            ("call_timeout", self.call_timeout),
        ] {
            if value.is_zero() {
                return invalid(format!("{name} must be greater than zero"));
            }
        }
        if self.checkpoint_ttl < Duration::from_millis(1) {
            return invalid("checkpoint_ttl must be at least 1ms".to_owned());
        }
        if self.finished_run_ttl < Duration::from_millis(1) {
            return invalid("finished_run_ttl must be at least 1ms".to_owned());
        }
        if self.keep_checkpoints == Keep::Newest(0) {
            return invalid("keep_checkpoints must be at least 1, or \"all\"".to_owned());
        }
        if self.keep_ended_runs == Keep::Newest(0) {
            return invalid("keep_ended_runs must be at least 1, or \"all\"".to_owned());
        }
        Ok(())
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379/".to_owned(),
            prefix: "runvisor".to_owned(),
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_millis(500),
            call_timeout: Duration::from_secs(2),
            checkpoint_ttl: Duration::from_secs(30 * 24 * 60 * 60),
            spill_dir: None,
            keep_checkpoints: KeepCheckpoints::default(),
            finished_run_ttl: Duration::from_secs(7 * 24 * 60 * 60),
            keep_ended_runs: Keep::default(),
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("checkpoint_ttl", &self.checkpoint_ttl)
            .field("spill_dir", &self.spill_dir)
            .field("keep_checkpoints", &self.keep_checkpoints)
            .field("finished_run_ttl", &self.finished_run_ttl)
            .field("keep_ended_runs", &self.keep_ended_runs)
            .finish()
    }
}

/// `redis://user:secret@host/` -> `redis://user:***@host/`.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let hidden = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        "***".to_owned()
    };
    format!("{}{hidden}{}", &url[..scheme_end], &rest[at..])
}

/// Why [`RedisStores::connect`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The config cannot work (bad URL, prefix or duration).
    #[error("invalid redis config: {0}")]
    InvalidConfig(String),
    /// Redis could not be reached or refused the connection.
    #[error("cannot connect to redis at {url}: {error}")]
    Connect {
        /// The server (password hidden).
        url: String,
        /// What went wrong.
        error: String,
    },
    /// Redis did not answer in time.
    #[error("redis at {url} did not answer within {timeout:?}")]
    Timeout {
        /// The server (password hidden).
        url: String,
        /// How long it was given.
        timeout: Duration,
    },
    /// The endpoint answered, but refuses this client for a reason that retrying cannot fix:
    /// a password that is required, wrong, or a user without permission; or it does not speak
    /// the Redis protocol at all (another service on that port).
    #[error("redis at {url} refused the connection: {error}")]
    Refused {
        /// The server (password hidden).
        url: String,
        /// What it said.
        error: String,
    },
}

impl ConnectError {
    /// Whether connecting again later may succeed (Redis was out of reach or slow), as
    /// opposed to a config that cannot work or a refusal.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::Timeout { .. })
    }
}

/// The Redis-backed stores and signal source, sharing one connection (the signal source adds
/// a pub/sub connection of its own). Cheap to clone.
#[derive(Clone)]
pub struct RedisStores {
    /// Checkpoints.
    pub checkpoints: Arc<dyn CheckpointStore>,
    /// Run records.
    pub runs: Arc<dyn RunStore>,
    /// Thread histories.
    pub history: Arc<dyn HistoryStore>,
    /// Stop and cancel flags, and their notices.
    pub signals: Arc<dyn SignalSource>,
    /// Workers' heartbeats, threads' leases and fencing tokens.
    pub leases: Arc<dyn LeaseStore>,
    /// Runs' whole ends in one step (final checkpoint, messages, record, flags, lease).
    pub ends: Arc<dyn EndStore>,
    /// New runs' starts in one step (lease, first record, history and newest checkpoint id
    /// read).
    pub starts: Arc<dyn StartStore>,
    /// Where the ends of runs that Redis did not take are kept, to be replayed.
    spill: FileSpill,
    keys: Keys,
    config: RedisConfig,
    conn: Conn,
    endpoint: Endpoint,
}

impl fmt::Debug for RedisStores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStores")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RedisStores {
    /// Connects to Redis (bounded by the configured timeouts) and builds the stores.
    ///
    /// Logs a warning when Redis may evict keys (`maxmemory-policy` other than `noeviction`);
    /// a server that refuses `CONFIG GET` is accepted as it is.
    ///
    /// A `redis://` URL that names a node of a Redis Cluster is refused
    /// ([`ConnectError::InvalidConfig`]): use `redis+cluster://`. So is a server that refuses
    /// this client for good (a password required or wrong, a user without permission to
    /// `PING`) or an endpoint that does not speak Redis ([`ConnectError::Refused`]): nothing
    /// would work on it.
    pub async fn connect(config: RedisConfig) -> Result<Self, ConnectError> {
        config.check()?;
        let endpoint = Endpoint::of(&config)?;
        let conn = Conn::connect(&config, &endpoint).await?;
        conn.check_access(&config).await?;
        if !conn.is_cluster() {
            refuse_cluster_node(&conn, &config).await?;
        }
        check_eviction_policy(&conn, &config).await;
        let keys = Keys::new(&config.prefix);
        let ttl = config.checkpoint_ttl;
        let spill = FileSpill::new(
            config.spill_dir.clone().unwrap_or_else(spill::default_dir),
            format!("{} {}", config.redacted_url(), config.prefix),
        );
        let checkpoints = Arc::new(RedisCheckpointStore::new(
            conn.clone(),
            keys.clone(),
            ttl,
            config.keep_checkpoints.limit(),
        ));
        let runs = Arc::new(RedisRunStore::new(
            conn.clone(),
            keys.clone(),
            ttl,
            config.finished_run_ttl,
            config.keep_ended_runs.limit(),
            // Notices travel on a shard channel on a cluster, out of a script's reach.
            (!matches!(endpoint, Endpoint::Cluster(_))).then(|| signal::channel(&config.prefix)),
        ));
        let history = Arc::new(RedisHistoryStore::new(conn.clone(), keys.clone(), ttl));
        let leases = Arc::new(RedisLeaseStore::new(conn.clone(), keys.clone(), ttl));
        Ok(Self {
            spill,
            starts: Arc::new(RedisStartStore::new(
                leases.clone(),
                runs.clone(),
                keys.clone(),
            )),
            ends: Arc::new(RedisEndStore::new(
                checkpoints.clone(),
                history.clone(),
                runs.clone(),
            )),
            checkpoints,
            runs,
            history,
            leases,
            signals: Arc::new(RedisSignalSource::new(
                conn.clone(),
                Conn::connect(&config, &endpoint).await?,
                &config,
                endpoint.clone(),
            )?),
            keys,
            config,
            conn,
            endpoint,
        })
    }

    /// Makes a runtime builder use these stores, leases and signal source, and keep the end
    /// of a run that Redis does not take in a spill file ([`Self::spill`]).
    pub fn install(&self, builder: RuntimeBuilder) -> RuntimeBuilder {
        builder
            .spill_store(Arc::new(self.spill.clone()))
            .lease_store(self.leases.clone())
            .checkpoint_store(self.checkpoints.clone())
            .run_store(self.runs.clone())
            .history_store(self.history.clone())
            .signal_source(self.signals.clone())
            .end_store(self.ends.clone())
            .start_store(self.starts.clone())
    }

    /// The spill files of these stores: where runs whose end Redis did not take are kept.
    pub fn spill(&self) -> &FileSpill {
        &self.spill
    }

    /// Replays the spill files meant for this Redis (and key prefix) into it, through
    /// `runtime` (built with these stores), exactly once each: what every worker does when it
    /// starts, and `runvisor recover`. See [`spill`].
    pub async fn recover_spilled(&self, runtime: &Runtime) -> RecoverReport {
        self.spill.recover(runtime).await
    }

    /// The key names in use.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The config the stores were built with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }
}

/// Warns loudly when Redis may evict keys under memory pressure: an evicted checkpoint or
/// history is lost work.
/// On a cluster every master is asked.
async fn check_eviction_policy(conn: &Conn, config: &RedisConfig) {
    let mut cmd = ::redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let replies = match conn
        .on_every_primary("CONFIG GET maxmemory-policy", &cmd)
        .await
    {
        Ok(replies) => replies,
        Err(error) => {
            tracing::info!(
                url = %config.redacted_url(),
                %error,
                "cannot read redis maxmemory-policy (CONFIG may be disabled); make sure it is noeviction"
            );
            return;
        }
    };
    for (node, value) in replies {
        let node = node.as_deref().unwrap_or("");
        match reply::config_value(&value, "maxmemory-policy").as_deref() {
            Some("noeviction") => {}
            Some(policy) => tracing::warn!(
                url = %config.redacted_url(),
                node,
                policy,
                "REDIS MAY EVICT RUNVISOR DATA: maxmemory-policy is `{policy}`, not `noeviction`; \
                 checkpoints, run records and histories can disappear under memory pressure"
            ),
            None => tracing::info!(
                url = %config.redacted_url(),
                node,
                "redis did not report its maxmemory-policy; make sure it is noeviction"
            ),
        }
    }
}

/// Refuses a single-server connection to a node of a Redis Cluster, whose other nodes own most
/// keys. A server that does not answer `INFO cluster` is taken as it is.
async fn refuse_cluster_node(conn: &Conn, config: &RedisConfig) -> Result<(), ConnectError> {
    let mut cmd = ::redis::cmd("INFO");
    cmd.arg("cluster");
    let Ok(value) = conn.query("INFO cluster", &cmd).await else {
        return Ok(());
    };
    let enabled = reply::text(&value, "INFO cluster")
        .is_ok_and(|info| info.lines().any(|line| line.trim() == "cluster_enabled:1"));
    if enabled {
        return Err(ConnectError::InvalidConfig(format!(
            "{} is a node of a Redis Cluster: connect with redis+cluster://host:port[,host:port...]",
            config.redacted_url()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_humantime_fields() {
        let config: RedisConfig = serde_json::from_str("{}").expect("defaults");
        assert_eq!(config, RedisConfig::default());
        assert_eq!(config.prefix, "runvisor");
        assert_eq!(config.connect_timeout, Duration::from_secs(1));
        assert_eq!(config.response_timeout, Duration::from_millis(500));
        assert_eq!(config.checkpoint_ttl, Duration::from_secs(30 * 86_400));
        let config: RedisConfig = serde_json::from_str(
            r#"{"url": "redis://h:1/", "response_timeout": "250ms", "checkpoint_ttl": "7d"}"#,
        )
        .expect("valid");
        assert_eq!(config.response_timeout, Duration::from_millis(250));
        assert_eq!(config.checkpoint_ttl, Duration::from_secs(7 * 86_400));
        let json = serde_json::to_value(&config).expect("serializes");
        assert_eq!(json["checkpoint_ttl"], "7days");
        assert!(serde_json::from_str::<RedisConfig>(r#"{"ttl": "1d"}"#).is_err());
    }

    #[test]
    fn bad_configs_are_refused() {
        for prefix in ["", "a b", "a{b", "x}"] {
            let config = RedisConfig {
                prefix: prefix.to_owned(),
                ..RedisConfig::default()
            };
            assert!(config.check().is_err(), "{prefix:?}");
        }
        let config = RedisConfig {
            call_timeout: Duration::ZERO,
            ..RedisConfig::default()
        };
        assert!(config.check().is_err());
        assert!(RedisConfig::default().check().is_ok());
    }

    #[test]
    fn cluster_urls_are_read_and_bad_ones_refused_without_their_password() {
        assert_eq!(
            Endpoint::of(&RedisConfig::new("redis+cluster://h1:7000,h2:7001")),
            Ok(Endpoint::Cluster(vec![
                "redis://h1:7000/".to_owned(),
                "redis://h2:7001/".to_owned()
            ]))
        );
        assert_eq!(
            Endpoint::of(&RedisConfig::default()),
            Ok(Endpoint::Single("redis://127.0.0.1:6379/".to_owned()))
        );
        match Endpoint::of(&RedisConfig::new("redis+cluster://u:pw@h1:1,,h2:2")) {
            Err(ConnectError::InvalidConfig(message)) => {
                assert!(message.contains("seed nodes"), "{message}");
                assert!(!message.contains("pw"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("redis://user:s3cret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact("redis://:s3cret@host/"), "redis://:***@host/");
        assert_eq!(redact("redis://token@host"), "redis://***@host");
        assert_eq!(redact("redis://host:6379/"), "redis://host:6379/");
        assert_eq!(
            redact("redis+cluster://u:pw@h1:7000,h2:7001"),
            "redis+cluster://u:***@h1:7000,h2:7001"
        );
        let config = RedisConfig::new("rediss://u:pw@h/");
        assert!(!format!("{config:?}").contains("pw"));
    }
}
