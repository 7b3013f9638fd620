//! A private `redis-server` for the benches that need one: no persistence, a free loopback
//! port (never 6379), killed and reaped when dropped, and killed by the kernel if the bench
//! ends without dropping it. `redis-server` must be on the PATH.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;

// Benches that load the tests' harness load this file through both harnesses.
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/shared/redis_pid.rs"]
mod redis_pid;
use redis_pid::server_pid;

/// A `redis-server` owned by the bench: killed (and reaped) on drop.
pub(crate) struct PrivateRedis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    /// Starts a server on a free loopback port and waits until it answers, itself: when it
    /// cannot bind the port (another process took it since the probe), another port is tried,
    /// and whatever listens on the first is left alone.
    pub(crate) fn start() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            match Self::launch() {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-server: {last}");
    }

    fn launch() -> Result<Self, String> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = loop {
            let probe = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
                .expect("bind a probe socket");
            let port = probe.local_addr().expect("probe address").port();
            if port != 6379 {
                break port;
            }
        };
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // A bench killed before it drops the server (a signal, a timeout) takes the server with
        // it: the kernel kills the child when the thread that started it ends. Benches start
        // their server on criterion's main thread, which lives as long as the bench.
        let parent = std::process::id();
        // SAFETY: between fork and exec only async-signal-safe calls are made: prctl(2) and
        // getppid(2), touching no memory of the parent.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have ended before the request was made.
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    return Err(std::io::Error::other(
                        "the bench ended before its server started",
                    ));
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("redis-server on the PATH");
        let mut server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server_pid(port) != Some(server.pid()) {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("redis-server exited with {status} on port {port}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("redis-server did not answer on port {port}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain multiplexed connection to `url`, for raw commands.
pub(crate) async fn raw(url: &str) -> MultiplexedConnection {
    ::redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// Empties the database. After a large run the server may take seconds to free it all: this
/// waits up to a minute for the answer (on a clone, so the caller's timeout stays).
pub(crate) async fn flush(con: &mut MultiplexedConnection) {
    let mut patient = con.clone();
    patient.set_response_timeout(Duration::from_secs(60));
    let _: () = ::redis::cmd("FLUSHDB")
        .query_async(&mut patient)
        .await
        .expect("FLUSHDB");
}

/// A number from `INFO <section>`.
pub(crate) async fn info(con: &mut MultiplexedConnection, section: &str, field: &str) -> u64 {
    let text: String = ::redis::cmd("INFO")
        .arg(section)
        .query_async(con)
        .await
        .expect("INFO");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Server-side time per call of each command since the last `CONFIG RESETSTAT` (from `INFO
/// commandstats`): `(command, calls, µs per call)`, busiest first.
pub(crate) async fn command_times(con: &mut MultiplexedConnection) -> Vec<(String, u64, f64)> {
    let text: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .expect("INFO commandstats");
    let mut times: Vec<(String, u64, f64)> = text
        .lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(&format!("{key}=")))
            };
            let calls = field("calls")?.parse().ok()?;
            let per_call = field("usec_per_call")?.parse().ok()?;
            Some((name.to_owned(), calls, per_call))
        })
        .collect();
    times.sort_by(|a, b| (b.1 as f64 * b.2).total_cmp(&(a.1 as f64 * a.2)));
    times
}

/// Resets the server's command statistics.
pub(crate) async fn reset_stats(con: &mut MultiplexedConnection) {
    let _: () = ::redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(con)
        .await
        .expect("CONFIG RESETSTAT");
}

/// `MEMORY USAGE` of every key, summed by the kind its name gives (`<prefix>:<kind>:...`), with
/// the number of keys of each kind.
pub(crate) async fn by_kind(con: &mut MultiplexedConnection) -> BTreeMap<String, (u64, u64)> {
    let mut kinds = BTreeMap::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await
            .expect("SCAN");
        for key in keys {
            let bytes: Option<u64> = ::redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(con)
                .await
                .expect("MEMORY USAGE");
            let kind = key.split(':').nth(1).unwrap_or("?").to_owned();
            let entry = kinds.entry(kind).or_insert((0, 0));
            entry.0 += bytes.unwrap_or(0);
            entry.1 += 1;
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    kinds
}
