//! Chaos across processes, with the real binary: four `runvisor worker --adopt-orphans`
//! processes take 200 queued durable runs while random workers are killed with SIGKILL and
//! restarted. Afterwards every run must have reached a final state, every thread's history
//! must hold each message once, in order, and no two fencing tokens of one thread may have
//! executed nodes at the same time: each node execution is read from the workers' logs (each
//! names its run, thread and fencing token), and an execution that never returned ends when
//! its process was killed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runvisor::redis::queue::Job;
use runvisor::{Map, RunLabels, RunStatus};

use super::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

const WORKERS: usize = 4;
const RUNS: usize = 200;

/// Two-second leases: a killed worker's runs are taken over within about two seconds.
const CONFIG: &str = r#"{"runtime": {"lease": {"ttl": "2s", "renew": "300ms"},
    "adopt_every": "300ms", "durability": "sync", "stop_timeout": "2s"}}"#;

/// Three messages with two sleeps between them: about a second a run.
const WORKFLOW: &str = r#"{"id": "chaos", "nodes": [
    {"id": "start", "kind": "begin"},
    {"id": "one", "kind": "stream_text", "params": {"text": "one", "interval": "10ms"}},
    {"id": "w1", "kind": "sleep", "params": {"duration": "400ms"}},
    {"id": "two", "kind": "stream_text", "params": {"text": "two", "interval": "10ms"}},
    {"id": "w2", "kind": "sleep", "params": {"duration": "400ms"}},
    {"id": "three", "kind": "stream_text", "params": {"text": "three", "interval": "10ms"}}
], "edges": [{"from": "start", "to": "one"}, {"from": "one", "to": "w1"},
    {"from": "w1", "to": "two"}, {"from": "two", "to": "w2"}, {"from": "w2", "to": "three"}]}"#;

/// A worker process and the log of each of its incarnations.
struct Worker {
    child: Child,
    log: PathBuf,
}

/// One incarnation's log and when its process was killed (µs since the epoch).
struct Incarnation {
    log: PathBuf,
    killed_at: Option<i64>,
}

fn now_us() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_micros()).expect("µs fit i64")
}

fn spawn_worker(server: &RedisServer, dir: &Path, name: &str) -> Worker {
    let log = dir.join(format!("{name}.err"));
    let child = Command::new(BIN)
        .args([
            "--config",
            dir.join("config.json").to_str().expect("utf-8 path"),
            "--redis",
            &server.url(),
            "worker",
            "--adopt-orphans",
            "--concurrency",
            "16",
        ])
        // Node spans (exec::graph) inside their run's span (runtime::start), which names the
        // run, thread and fencing token; the node's start and end events (exec::node).
        .env(
            "RUST_LOG",
            "warn,runvisor_actors::exec::node=debug,runvisor_actors::exec::graph=info,\
             runvisor_actors::runtime::start=info",
        )
        .env_remove("RUNVISOR_REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("worker log"))
        .spawn()
        .expect("spawn runvisor worker");
    Worker { child, log }
}

/// A small xorshift generator: the test needs no cryptographic randomness, only a seed it can
/// print.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One execution of a node, read from a worker's log.
#[derive(Debug, Clone)]
struct Execution {
    thread: String,
    run: String,
    node: String,
    fence: u64,
    started: i64,
    /// When the handler returned or was aborted; `None` if the log never says.
    ended: Option<i64>,
    log: PathBuf,
}

/// µs since the epoch of an RFC 3339 UTC timestamp as the log writes it
/// (`2026-11-23T14:34:21.044208Z`).
fn parse_time(text: &str) -> Option<i64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let micros: i64 = format!("{frac:0<6}")[..6].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3_600 + min * 60 + s) * 1_000_000) + micros)
}

/// The fields of a log line's spans that say who ran a node: its `node{...}` span (the
/// innermost) and the `run{...}` span it descends from (its run, thread and fencing token).
fn node_fields(line: &str) -> Option<HashMap<&str, &str>> {
    let group = |start: usize| -> Option<&str> {
        let end = start + line[start..].find('}')?;
        Some(&line[start..end])
    };
    let node = group(line.rfind("node{")? + "node{".len())?;
    let run = group(line.find("run{")? + "run{".len())?;
    Some(
        run.split(' ')
            .chain(node.split(' '))
            .filter_map(|pair| pair.split_once('='))
            .collect(),
    )
}

/// Every node execution in the logs of the incarnations.
fn executions(incarnations: &[Incarnation]) -> Vec<Execution> {
    let mut all = Vec::new();
    for incarnation in incarnations {
        let text = std::fs::read_to_string(&incarnation.log).unwrap_or_default();
        let mut open: HashMap<(String, String), usize> = HashMap::new();
        for line in text.lines() {
            let event = if line.ends_with("node started") {
                "started"
            } else if line.contains("node returned") || line.ends_with("node aborted") {
                "ended"
            } else {
                continue;
            };
            let (Some(at), Some(fields)) = (
                line.split(' ').next().and_then(parse_time),
                node_fields(line),
            ) else {
                panic!(
                    "unreadable log line in {}: {line}",
                    incarnation.log.display()
                );
            };
            let field = |name: &str| (*fields.get(name).unwrap_or(&"")).to_owned();
            let key = (field("runvisor.run.id"), field("runvisor.node.path"));
            if event == "started" {
                open.insert(key, all.len());
                all.push(Execution {
                    thread: field("runvisor.thread.id"),
                    run: field("runvisor.run.id"),
                    node: field("runvisor.node.path"),
                    fence: field("runvisor.lease.fence")
                        .parse()
                        .expect("fence is a number"),
                    started: at,
                    ended: None,
                    log: incarnation.log.clone(),
                });
            } else if let Some(i) = open.remove(&key) {
                all[i].ended = Some(at);
            }
        }
        // An execution the log never ends ended at the latest when its process was killed.
        for i in open.into_values() {
            all[i].ended = incarnation.killed_at;
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_killed_at_random_lose_nothing_run_nothing_twice_and_never_overlap() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.json"), CONFIG).expect("config");
    let stores = stores(&server).await;
    let threads: Vec<_> = (0..RUNS).map(|i| thread(&format!("chaos-{i}"))).collect();
    for t in &threads {
        let job = Job::new(
            t.clone(),
            WORKFLOW.to_owned(),
            Map::new(),
            RunLabels::default(),
        );
        within("submit", stores.submit(&job)).await.expect("submit");
    }

    let seed = now_us().unsigned_abs() | 1;
    eprintln!("chaos seed {seed}");
    let mut rng = Rng(seed);
    let mut incarnations: Vec<Vec<Incarnation>> = (0..WORKERS).map(|_| Vec::new()).collect();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|i| spawn_worker(&server, dir.path(), &format!("w{i}-0")))
        .collect();
    // Kill a random worker every 0.7 to 1.7 s for 10 s, restarting it at once.
    let chaos_until = Instant::now() + Duration::from_secs(10);
    let mut kills = 0;
    while Instant::now() < chaos_until {
        tokio::time::sleep(Duration::from_millis(700 + rng.below(1000))).await;
        let i = usize::try_from(rng.below(WORKERS as u64)).expect("small");
        let worker = &mut workers[i];
        worker.child.kill().expect("SIGKILL a worker");
        let killed_at = now_us();
        worker.child.wait().expect("reap the killed worker");
        kills += 1;
        incarnations[i].push(Incarnation {
            log: worker.log.clone(),
            killed_at: Some(killed_at),
        });
        *worker = spawn_worker(&server, dir.path(), &format!("w{i}-{kills}"));
    }

    // Every run reaches a final state.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut unfinished = Vec::new();
    loop {
        unfinished.clear();
        for t in &threads {
            let records = stores.runs.list_thread(t).await.expect("thread's runs");
            let newest = records.iter().max_by_key(|r| (r.started_at_ms, r.run_id));
            if newest.map(|r| r.status) != Some(RunStatus::Succeeded) {
                unfinished.push((t.clone(), newest.map(|r| (r.status, r.stop_reason.clone()))));
            }
        }
        if unfinished.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (i, mut worker) in workers.into_iter().enumerate() {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child.
        let pid = libc::pid_t::try_from(worker.child.id()).expect("pid fits");
        unsafe { libc::kill(pid, libc::SIGTERM) };
        worker.child.wait().expect("worker exits");
        incarnations[i].push(Incarnation {
            log: worker.log,
            killed_at: None,
        });
    }
    let incarnations: Vec<Incarnation> = incarnations.into_iter().flatten().collect();
    assert!(
        unfinished.is_empty(),
        "seed {seed}: {} runs did not finish: {:?}",
        unfinished.len(),
        &unfinished[..unfinished.len().min(10)]
    );

    // Nothing in any history is lost or duplicated: each message once, in order.
    for t in &threads {
        let history = stores.history.load(t).await.expect("history");
        let texts: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(
            texts,
            ["one", "two", "three"],
            "seed {seed}: thread {t} has a history with messages lost or repeated"
        );
    }

    // No two fencing tokens of one thread ever executed nodes at the same time.
    let executions = executions(&incarnations);
    assert!(
        executions.len() >= RUNS * 5,
        "seed {seed}: only {} node executions in the logs",
        executions.len()
    );
    let mut by_thread: HashMap<&str, Vec<&Execution>> = HashMap::new();
    for e in &executions {
        by_thread.entry(e.thread.as_str()).or_default().push(e);
    }
    let mut taken_over = 0;
    for (thread, list) in &by_thread {
        let mut fences: Vec<u64> = list.iter().map(|e| e.fence).collect();
        fences.sort_unstable();
        fences.dedup();
        if fences.len() > 1 {
            taken_over += 1;
        }
        for a in list {
            for b in list {
                if a.fence >= b.fence {
                    continue;
                }
                let ended = a
                    .ended
                    .unwrap_or_else(|| panic!("seed {seed}: an execution that never ended: {a:?}"));
                assert!(
                    ended <= b.started,
                    "seed {seed}: thread {thread}: node {} of run {} (token {}, {}) was still \
                     running when node {} of run {} (token {}, {}) started",
                    a.node,
                    a.run,
                    a.fence,
                    a.log.display(),
                    b.node,
                    b.run,
                    b.fence,
                    b.log.display()
                );
            }
        }
    }
    assert!(kills >= 5, "seed {seed}: only {kills} kills");
    assert!(
        taken_over >= 1,
        "seed {seed}: {kills} kills and no thread was taken over: the chaos exercised nothing"
    );
    eprintln!(
        "chaos seed {seed}: {kills} kills, {taken_over} threads taken over, {} node executions",
        executions.len()
    );
}
