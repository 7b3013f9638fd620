//! The test harness: a private `redis-server` per test, on a free loopback port, in a
//! temporary directory, without persistence. The harness can kill it (SIGKILL), freeze it
//! (SIGSTOP), thaw it (SIGCONT) and restart it on the same port, and stops it by PID when
//! dropped. It never touches any other Redis and never uses port 6379.
//!
//! Also: stores connected to a server with short timeouts, a direct connection for poking at
//! keys, and bounded waits so a regression fails instead of hanging.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
// Benches that load the tests' harness load this file through both harnesses.
#[allow(clippy::duplicate_mod)]
#[path = "../shared/redis_pid.rs"]
mod redis_pid;
use redis_pid::server_pid;
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::store::{RunRecord, RunStatus};
use runvisor::{RunId, StoreError, ThreadId};

/// How long any test waits for something that should happen promptly before failing.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);

/// A `redis-server` owned by one test.
pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.child.as_ref().map(Child::id))
            .finish()
    }
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line settings (`["--maxmemory-policy", "allkeys-lru"]`).
    pub(crate) fn start_with(extra: &[&str]) -> Self {
        let mut last_error = String::new();
        // Another process may grab the port between our probe and the server's bind: retry.
        for _ in 0..5 {
            let mut server = Self {
                child: None,
                port: free_port(),
                dir: tempfile::tempdir().expect("temporary directory for redis-server"),
                extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            };
            match server.launch() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// The URL the stores connect to.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("the server is running")
    }

    /// Kills the server with SIGKILL and reaps it.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Suspends the server (SIGSTOP): it keeps its connections but answers nothing.
    pub(crate) fn freeze(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    /// Resumes a frozen server (SIGCONT).
    pub(crate) fn thaw(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    /// Kills the server if it runs and starts a fresh one on the same port (its data is gone:
    /// nothing is persisted).
    pub(crate) fn restart(&mut self) {
        self.kill9();
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => {
                    panic!("could not restart redis-server on port {}: {e}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The server's port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Starts `redis-server` on this server's port and waits until it answers (itself, not
    /// whatever else listens there).
    fn launch(&mut self) -> Result<(), String> {
        let log = self.dir.path().join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--daemonize", "no"])
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server is not installed; the Redis tests need it: \
                 `apt-get install redis-server` (as .ci/run does)"
            ),
            Err(e) => return Err(format!("cannot spawn redis-server: {e}")),
        };
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "redis-server exited with {status} on port {}: {}",
                    self.port,
                    tail(&log)
                ));
            }
            // The server answering must be this one: when it could not bind, another may.
            let pid = self.child.as_ref().map(Child::id);
            if pid.is_some() && server_pid(self.port) == pid {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill9();
        Err(format!(
            "redis-server did not answer on port {} within {PATIENCE:?}: {}",
            self.port,
            tail(&log)
        ))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL also ends a frozen server.
        self.kill9();
    }
}

/// A loopback port nobody listens on right now (never 6379), and that no other test of this
/// process was given: a test that kills its server and restarts it on the same port must not
/// find another test's server there, nor another test its own.
pub(crate) fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .expect("bind a probe socket on 127.0.0.1");
        let port = listener.local_addr().expect("probe address").port();
        // A test that panicked holding the lock poisoned it; the set is still sound.
        let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
        if port != 6379 && given.insert(port) {
            return port;
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

/// The last lines of the server's log, for failure messages.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// A config for a test server: short timeouts so fault tests finish in seconds, and spill
/// files in the server's temporary directory.
pub(crate) fn config(server: &RedisServer) -> RedisConfig {
    RedisConfig {
        connect_timeout: Duration::from_millis(300),
        response_timeout: Duration::from_millis(300),
        call_timeout: Duration::from_secs(1),
        spill_dir: Some(server.dir.path().join("spill")),
        ..RedisConfig::new(server.url())
    }
}

/// Stores connected to a test server with [`config`].
pub(crate) async fn stores(server: &RedisServer) -> RedisStores {
    within("connect", RedisStores::connect(config(server)))
        .await
        .expect("connect to the test redis-server")
}

/// Stores connected to a test server with [`config`], keeping every checkpoint (no
/// retention), for tests of `prune` and of many checkpoints.
pub(crate) async fn stores_keeping_all(server: &RedisServer) -> RedisStores {
    let config = RedisConfig {
        keep_checkpoints: runvisor::redis::KeepCheckpoints::All,
        ..config(server)
    };
    within("connect", RedisStores::connect(config))
        .await
        .expect("connect to the test redis-server")
}

/// A direct connection, to look at and tamper with keys. Its commands get [`PATIENCE`], as
/// [`within`] does, not the client's default of 500 ms: an administrative command such as
/// `CLUSTER SETSLOT` writes the node's cluster config to disk and may take longer on a loaded
/// machine.
pub(crate) async fn raw(server: &RedisServer) -> MultiplexedConnection {
    let client = ::redis::Client::open(server.url()).expect("valid url");
    let config = ::redis::AsyncConnectionConfig::new().set_response_timeout(Some(PATIENCE));
    within(
        "raw connection",
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .expect("raw connection to the test redis-server")
}

/// Milliseconds since the epoch, now.
pub(crate) fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

/// Runs a raw command and converts its reply.
pub(crate) async fn cmd<T: ::redis::FromRedisValue>(
    con: &mut MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut cmd = ::redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    within(args[0], cmd.query_async(con))
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// A running run's record with every optional field absent: the one place tests build records.
pub(crate) fn run_record(run: RunId, thread: &ThreadId) -> RunRecord {
    RunRecord {
        run_id: run,
        thread: thread.clone(),
        workflow_id: "wf".to_owned(),
        status: RunStatus::Running,
        parent_run_id: None,
        checkpoint_id: None,
        started_at_ms: 1,
        finished_at_ms: None,
        failure_reason: None,
        stop_reason: None,
        unpersisted: None,
        labels: runvisor::RunLabels::app_chat("app", "chat").expect("valid labels"),
        not_resumable: None,
        worker: None,
        fence: None,
        traceparent: None,
    }
}

pub(crate) fn thread(id: &str) -> ThreadId {
    ThreadId::new(id).expect("valid thread id")
}

/// Awaits a future, failing the test if it takes longer than [`PATIENCE`].
pub(crate) async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not finish within {PATIENCE:?}"),
    }
}

/// Asserts an error is corrupt data at `key`.
#[track_caller]
pub(crate) fn assert_corrupt_at<T: std::fmt::Debug>(result: Result<T, StoreError>, key: &str) {
    match result {
        Err(StoreError::Corrupt { key: at, reason }) => {
            assert_eq!(at, key, "corrupt data reported at the wrong key ({reason})")
        }
        other => panic!("expected corrupt data at {key}, got {other:?}"),
    }
}

/// The payload of a checkpoint's value (after its header), as a tool damaging it in place
/// reads it.
pub(crate) async fn checkpoint_payload(con: &mut MultiplexedConnection, key: &str) -> Vec<u8> {
    let value: Vec<u8> = cmd(con, &["GET", key]).await;
    value[checkpoint_header(&value)..].to_vec()
}

/// The length of a checkpoint value's header: 133 bytes for a delta (fifth byte `d`), 61 for a
/// whole snapshot.
fn checkpoint_header(value: &[u8]) -> usize {
    if value.get(4) == Some(&b'd') { 133 } else { 61 }
}

/// Replaces a checkpoint's payload, keeping its header and TTL.
pub(crate) async fn set_checkpoint_payload(
    con: &mut MultiplexedConnection,
    key: &str,
    payload: &[u8],
) {
    let value: Vec<u8> = cmd(con, &["GET", key]).await;
    let mut damaged = value[..checkpoint_header(&value)].to_vec();
    damaged.extend_from_slice(payload);
    let _: () = within(
        "SET",
        ::redis::cmd("SET")
            .arg(key)
            .arg(damaged)
            .arg("KEEPTTL")
            .query_async(con),
    )
    .await
    .expect("SET");
}

/// The harness itself: a server that cannot bind its port (another holds it) is never taken
/// for the one answering there, and a killed server's port is not given to another test.
#[test]
fn a_server_is_only_ever_its_own_and_its_port_stays_its_own() {
    let mut first = RedisServer::start();
    let mut second = RedisServer {
        child: None,
        port: first.port(),
        dir: tempfile::tempdir().expect("temporary directory for redis-server"),
        extra: Vec::new(),
    };
    let refused = second.launch().expect_err("the port is taken");
    assert!(refused.contains(&first.port().to_string()), "{refused}");
    assert_eq!(server_pid(first.port()), Some(first.pid()));

    // Down for a while: its port is still its own, and it gets it back.
    let port = first.port();
    first.kill9();
    assert!((0..200).all(|_| free_port() != port));
    first.restart();
    assert_eq!(server_pid(port), Some(first.pid()));
}
