//! Checkpoint cleanup at scale, on a private `redis-server` the bench starts itself (the
//! integration tests' harness: a free loopback port, never 6379, killed at the end).
//!
//! Each iteration flushes Redis, writes 1,000,000 checkpoints (outside the timing) as 10,000
//! threads of 100, then times one `CheckpointOps::cleanup(.., Scope::All, 20)`, which deletes
//! 800,000 of them:
//!
//! - `cleanup/compat_1m`: keys `checkpoint:<user>:<timestamp>:<id>` (1,000 users of 10
//!   threads), found by `SCAN` (1,000 keys per call) and unlinked by pipelined `UNLINK`s;
//! - `cleanup/native_1m`: runvisor's own layout (a value and an index entry per
//!   checkpoint, 5 runs per thread, each with its sequence key), threads found through
//!   `<p>:threads`, each trimmed by one script.
//!
//! Criterion's throughput is the checkpoints deleted (800,000 per iteration), so its
//! `thrpt` is deleted checkpoints per second. Printed to stderr for each layout: the median,
//! fastest and slowest cleanup, the median rate of checkpoints deleted and looked at per
//! second, the four commands Redis spent most time on in the median cleanup (from
//! `INFO commandstats`, which counts calls made inside scripts too), the slowest single Redis
//! command any cleanup ran and how many took over 10 ms, from Redis's own `SLOWLOG` (every
//! command over 1 ms is logged; "none over 1 ms" when none was). Commands the bench itself
//! runs to fill Redis are excluded: stats and log are reset just before each cleanup.
//! `SLOWLOG` times are wall clock: on a busy machine they include the time Redis waited for a
//! CPU, so the bench asks the OS to run its `redis-server` at a higher priority (nice -10)
//! when it may.
//!
//! `RUNVISOR_CLEANUP_BENCH_CHECKPOINTS` sets another total (a multiple of 100; default
//! 1,000,000). Run with `cargo bench --bench cleanup` (a few minutes, most of it filling
//! Redis between cleanups).

#[allow(dead_code)]
#[path = "../tests/redis/support.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use runvisor::redis::retention::{CheckpointOps, Layout, Scope};
use runvisor::redis::{KeepCheckpoints, Keys, RedisConfig, RedisStores};
use runvisor::{CheckpointId, RunId, ThreadId};
use tokio::runtime::Runtime as Tokio;

use support::RedisServer;

/// Checkpoints per thread.
const PER_THREAD: usize = 100;
/// Checkpoints each thread keeps.
const KEEP: usize = 20;
/// Runs per native thread (each wrote a fifth of its checkpoints).
const RUNS: usize = 5;
/// Commands per round trip while filling Redis.
const FILL_PIPELINE: usize = 5_000;
/// SLOWLOG threshold, in microseconds.
const SLOW_US: u64 = 1_000;

fn total() -> usize {
    std::env::var("RUNVISOR_CLEANUP_BENCH_CHECKPOINTS")
        .ok()
        .and_then(|v| v.replace('_', "").parse::<usize>().ok())
        .filter(|n| *n >= PER_THREAD)
        .unwrap_or(1_000_000)
        / PER_THREAD
        * PER_THREAD
}

struct Bench {
    _server: RedisServer,
    con: MultiplexedConnection,
    ops: CheckpointOps,
    keys: Keys,
    threads: usize,
}

/// One timed cleanup: how long, how many deleted, Redis's time per command (calls inside
/// scripts counted too: name, calls, microseconds), the slowest command it logged and how
/// many took over 10 ms.
#[derive(Debug, Clone)]
struct Measured {
    took: Duration,
    deleted: u64,
    commands: Vec<(String, u64, u64)>,
    slowest: Option<(u64, String)>,
    over_10ms: Vec<(u64, String)>,
}

async fn query<T: ::redis::FromRedisValue>(
    con: &mut MultiplexedConnection,
    cmd: &::redis::Cmd,
) -> T {
    cmd.query_async(con).await.expect("redis command")
}

async fn run_pipeline(con: &mut MultiplexedConnection, cmds: &mut Vec<::redis::Cmd>) {
    if cmds.is_empty() {
        return;
    }
    let mut pipe = ::redis::pipe();
    for cmd in cmds.drain(..) {
        pipe.add_command(cmd).ignore();
    }
    let () = pipe.query_async(con).await.expect("fill pipeline");
}

impl Bench {
    async fn new() -> Self {
        let server = RedisServer::start();
        raise_priority(server.pid());
        let config = RedisConfig {
            // Scripts and round trips of a million keys take their time on a loaded machine.
            call_timeout: Duration::from_secs(30),
            response_timeout: Duration::from_secs(10),
            keep_checkpoints: KeepCheckpoints::All,
            ..RedisConfig::new(server.url())
        };
        let stores = RedisStores::connect(config).await.expect("connect");
        let mut con = support::raw(&server).await;
        // Filling and flushing a million keys takes longer than a test's patience.
        con.set_response_timeout(Duration::from_secs(120));
        Self {
            ops: stores.checkpoint_ops(),
            keys: stores.keys().clone(),
            threads: total() / PER_THREAD,
            con,
            _server: server,
        }
    }

    async fn flush(&mut self) {
        let () = query(&mut self.con, &::redis::cmd("FLUSHALL")).await;
    }

    /// `checkpoint:user<u>:<timestamp>:<id>`: 10 threads per user.
    async fn fill_compat(&mut self) {
        let mut cmds = Vec::new();
        for thread in 0..self.threads {
            let mut mset = ::redis::cmd("MSET");
            for _ in 0..PER_THREAD {
                let key = format!(
                    "checkpoint:user{}:2025{:09}:{}",
                    thread / 10,
                    thread,
                    CheckpointId::new()
                );
                mset.arg(key).arg("{\"v\":1}");
            }
            cmds.push(mset);
            if cmds.len() * PER_THREAD >= FILL_PIPELINE {
                run_pipeline(&mut self.con, &mut cmds).await;
            }
        }
        run_pipeline(&mut self.con, &mut cmds).await;
    }

    /// runvisor's own layout, as checkpoint writes leave it with retention off.
    async fn fill_native(&mut self) {
        let mut cmds = Vec::new();
        let all = self.keys.threads();
        for i in 0..self.threads {
            let thread = ThreadId::new(format!("thread-{i}")).expect("valid thread");
            let index = self.keys.checkpoint_index(&thread);
            let mut zadd = ::redis::cmd("ZADD");
            zadd.arg(&index);
            for _ in 0..RUNS {
                let run = RunId::new();
                let per_run = PER_THREAD / RUNS;
                for sequence in 1..=per_run {
                    let id = CheckpointId::new();
                    // A whole snapshot's value: its header (format, kind, run, sequence),
                    // then a 64-byte payload.
                    let mut value = format!("rvc1w{run}{sequence:020}").into_bytes();
                    value.extend_from_slice(&[0u8; 64]);
                    let mut set = ::redis::cmd("SET");
                    set.arg(self.keys.checkpoint(&thread, id)).arg(value);
                    cmds.push(set);
                    zadd.arg(0).arg(id.to_string());
                }
                let mut set = ::redis::cmd("SET");
                set.arg(self.keys.checkpoint_sequence(&thread, run))
                    .arg(per_run);
                cmds.push(set);
            }
            cmds.push(zadd);
            let mut sadd = ::redis::cmd("SADD");
            sadd.arg(&all).arg(thread.as_str());
            cmds.push(sadd);
            if cmds.len() >= FILL_PIPELINE {
                run_pipeline(&mut self.con, &mut cmds).await;
            }
        }
        run_pipeline(&mut self.con, &mut cmds).await;
    }

    async fn count_keys(&mut self) -> u64 {
        query(&mut self.con, &::redis::cmd("DBSIZE")).await
    }

    /// Logs every command over [`SLOW_US`], from now on.
    async fn reset_slowlog(&mut self) {
        let mut set = ::redis::cmd("CONFIG");
        set.arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(SLOW_US)
            .arg("slowlog-max-len")
            .arg(100_000);
        let () = query(&mut self.con, &set).await;
        let mut reset = ::redis::cmd("SLOWLOG");
        reset.arg("RESET");
        let () = query(&mut self.con, &reset).await;
        let mut reset = ::redis::cmd("CONFIG");
        reset.arg("RESETSTAT");
        let () = query(&mut self.con, &reset).await;
    }

    /// Redis's calls and time per command since the last `CONFIG RESETSTAT`, the most time
    /// first (the bench's own `CONFIG`, `SLOWLOG` and `INFO` left out).
    async fn command_stats(&mut self) -> Vec<(String, u64, u64)> {
        let mut info = ::redis::cmd("INFO");
        info.arg("commandstats");
        let text: String = query(&mut self.con, &info).await;
        let mut stats: Vec<(String, u64, u64)> = text
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |key: &str| {
                    rest.split(',')
                        .find_map(|f| f.strip_prefix(key))
                        .and_then(|v| v.parse::<u64>().ok())
                };
                Some((name.to_owned(), field("calls=")?, field("usec=")?))
            })
            .filter(|(name, ..)| {
                !(name.starts_with("config") || name.starts_with("slowlog") || name == "info")
            })
            .collect();
        stats.sort_by_key(|(_, _, usec)| std::cmp::Reverse(*usec));
        stats
    }

    /// The commands logged since the reset: microseconds, and each command's name and key.
    async fn logged(&mut self) -> Vec<(u64, String)> {
        let mut get = ::redis::cmd("SLOWLOG");
        get.arg("GET").arg(100_000);
        let entries: Vec<::redis::Value> = query(&mut self.con, &get).await;
        entries
            .iter()
            .filter_map(|entry| {
                let ::redis::Value::Array(fields) = entry else {
                    return None;
                };
                let us = match fields.get(2) {
                    Some(::redis::Value::Int(us)) => u64::try_from(*us).ok()?,
                    _ => return None,
                };
                // The command and its key: `EVALSHA <sha> <numkeys> <key>`, `SCAN <cursor>`.
                let name = match fields.get(3) {
                    Some(::redis::Value::Array(args)) => {
                        let arg = |i: usize| match args.get(i) {
                            Some(::redis::Value::BulkString(b)) => {
                                String::from_utf8_lossy(b).into_owned()
                            }
                            _ => String::new(),
                        };
                        let name = arg(0);
                        let key = if name.eq_ignore_ascii_case("evalsha") {
                            arg(3)
                        } else {
                            arg(1)
                        };
                        format!("{name} {key}")
                    }
                    _ => String::new(),
                };
                Some((us, name))
            })
            .collect()
    }

    /// Fills Redis with one layout, then times its cleanup.
    async fn once(&mut self, layout: Layout) -> Measured {
        self.flush().await;
        match layout {
            Layout::Native => self.fill_native().await,
            Layout::Compat => self.fill_compat().await,
        }
        let before = self.count_keys().await;
        self.reset_slowlog().await;
        let begun = Instant::now();
        let report = self
            .ops
            .cleanup(layout, &Scope::All, KEEP)
            .await
            .expect("cleanup");
        let took = begun.elapsed();
        let commands = self.command_stats().await;
        let logged = self.logged().await;
        let slowest = logged.iter().max().cloned();
        let over_10ms = logged.into_iter().filter(|(us, _)| *us > 10_000).collect();
        let expected = (self.threads * (PER_THREAD - KEEP)) as u64;
        assert_eq!(report.total_deleted, expected, "{layout} cleanup deleted");
        let after = self.count_keys().await;
        assert!(
            after < before,
            "{layout}: {before} keys before, {after} after"
        );
        Measured {
            took,
            deleted: report.total_deleted,
            commands,
            slowest,
            over_10ms,
        }
    }
}

/// One thread: a cleanup is sequential, and the machine's other core stays Redis's.
/// Asks the OS to run the bench's Redis ahead of other work on the machine (nice -10), so
/// that the latencies measured are Redis's more than the scheduler's; without the right to,
/// says so and goes on.
fn raise_priority(pid: u32) {
    // SAFETY: setpriority(2) has no memory-safety preconditions; the pid is our own child.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid, -10) };
    if rc != 0 {
        eprintln!(
            "redis-server runs at the default priority (setpriority: {}): other work on this \
             machine may delay its commands",
            std::io::Error::last_os_error()
        );
    }
}

fn tokio() -> Tokio {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The median, slowest and fastest cleanup, rates, and the slowest command.
fn report(layout: Layout, checkpoints: usize, measured: &[Measured]) {
    if measured.is_empty() {
        return;
    }
    let mut times: Vec<Duration> = measured.iter().map(|m| m.took).collect();
    times.sort();
    let median = times[times.len() / 2];
    let deleted = measured[0].deleted as f64;
    let slowest = measured.iter().filter_map(|m| m.slowest.clone()).max();
    let over_10ms: Vec<String> = measured
        .iter()
        .flat_map(|m| &m.over_10ms)
        .map(|(us, name)| format!("{:.2} ms {name}", *us as f64 / 1000.0))
        .collect();
    // Redis's time per command in the median cleanup, the four it spent most on.
    let typical = measured
        .iter()
        .find(|m| m.took == median)
        .unwrap_or(&measured[0]);
    let busiest: Vec<String> = typical
        .commands
        .iter()
        .take(4)
        .map(|(name, calls, usec)| {
            format!(
                "{name} {calls} calls, {:.1} us each",
                *usec as f64 / (*calls).max(1) as f64
            )
        })
        .collect();
    eprintln!(
        "cleanup {layout}: {checkpoints} checkpoints, {} deleted per cleanup; {} cleanups: \
         median {median:?} (fastest {:?}, slowest {:?}); median rate {:.0} checkpoints \
         deleted/s, {:.0} looked at/s; Redis's time in the median one (calls inside scripts \
         counted too): {}; slowest single command of all cleanups: {}; {} commands \
         over 10 ms{}",
        measured[0].deleted,
        measured.len(),
        times[0],
        times[times.len() - 1],
        deleted / median.as_secs_f64(),
        checkpoints as f64 / median.as_secs_f64(),
        busiest.join("; "),
        match slowest {
            Some((us, name)) => format!("{:.2} ms, {name} (SLOWLOG)", us as f64 / 1000.0),
            None => format!("none over {} ms (SLOWLOG)", SLOW_US / 1000),
        },
        over_10ms.len(),
        if over_10ms.is_empty() {
            String::new()
        } else {
            format!(": {}", over_10ms.join(", "))
        }
    );
}

fn benches(c: &mut Criterion) {
    let rt = tokio();
    let bench = Arc::new(tokio::sync::Mutex::new(rt.block_on(Bench::new())));
    let checkpoints = total();
    let deleted = (checkpoints / PER_THREAD * (PER_THREAD - KEEP)) as u64;
    let mut group = c.benchmark_group("cleanup");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(deleted));
    for (name, layout) in [("compat_1m", Layout::Compat), ("native_1m", Layout::Native)] {
        let measured = Arc::new(Mutex::new(Vec::new()));
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let bench = bench.clone();
                let measured = measured.clone();
                async move {
                    let mut bench = bench.lock().await;
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let m = bench.once(layout).await;
                        total += m.took;
                        if let Ok(mut all) = measured.lock() {
                            all.push(m);
                        }
                    }
                    total
                }
            });
        });
        let all = measured.lock().map(|m| m.clone()).unwrap_or_default();
        report(layout, checkpoints, &all);
    }
    group.finish();
}

criterion_group!(cleanup, benches);
criterion_main!(cleanup);
