//! Where the bench's threads and its private `redis-server` run, by CPU affinity.
//!
//! On a small virtual machine the loopback round trip depends less on Redis than on where the
//! kernel put the two ends: with the client and the server on one CPU a PING costs a few
//! context switches (about 15 µs on the two-CPU machines these benches run on); on two CPUs it
//! costs waking the other CPU, twice (80-100 µs there). Left to itself the kernel moves them
//! between the two from one second to the next, so a PING batch and the run right after it
//! can be measured in different placements. Pinning holds one placement for a whole
//! measurement:
//!
//! - [`Placement::Apart`]: Redis on a CPU of its own, the bench's threads on the others: the
//!   placement of a deployment, where Redis runs on its own cores or host and every request
//!   wakes another CPU;
//! - [`Placement::Together`]: Redis and the bench's threads on one CPU: every request is a
//!   hand-over on that CPU, and whatever the engine and the server spend adds up there;
//! - [`Placement::Free`]: no pinning, the kernel places them.
//!
//! Threads are pinned by id (every thread of this process and of the server, as
//! `/proc/<pid>/task` lists them); threads started later inherit the mask of the thread that
//! starts them.

use std::fmt;

/// One placement of the bench and its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Redis on a CPU of its own, the bench on the others.
    Apart,
    /// Redis and the bench on one CPU.
    Together,
    /// Wherever the kernel puts them.
    Free,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Apart => "apart",
            Self::Together => "together",
            Self::Free => "free",
        })
    }
}

impl Placement {
    /// The placements `var` names (comma-separated `apart`, `together`, `free`), or `default`;
    /// `apart` is left out (with a note) where this process may use fewer than two CPUs.
    pub(crate) fn from_env(var: &str, default: &[Placement]) -> Vec<Placement> {
        let named: Vec<Placement> = match std::env::var(var) {
            Ok(list) => list
                .split(',')
                .map(|name| match name.trim() {
                    "apart" => Self::Apart,
                    "together" => Self::Together,
                    "free" => Self::Free,
                    other => panic!("{var}: unknown placement {other:?} (apart, together, free)"),
                })
                .collect(),
            Err(_) => default.to_vec(),
        };
        let cpus = allowed();
        named
            .into_iter()
            .filter(|p| {
                let fits = *p != Self::Apart || cpus.len() >= 2;
                if !fits {
                    eprintln!("placement apart needs two CPUs; this process may use {cpus:?}");
                }
                fits
            })
            .collect()
    }

    /// Pins every thread of this process and of the server `server` (a pid) to this placement.
    pub(crate) fn apply(self, server: u32) {
        let cpus = allowed();
        let (ours, theirs) = match self {
            Self::Apart => {
                let (last, rest) = cpus.split_last().expect("at least one CPU");
                (rest.to_vec(), vec![*last])
            }
            Self::Together => (cpus[..1].to_vec(), cpus[..1].to_vec()),
            Self::Free => (cpus.clone(), cpus.clone()),
        };
        pin_process(std::process::id(), &ours);
        pin_process(server, &theirs);
    }
}

/// The CPUs this process was started with (its affinity before any pinning).
fn allowed() -> Vec<usize> {
    static ALLOWED: std::sync::LazyLock<Vec<usize>> = std::sync::LazyLock::new(|| {
        // SAFETY: `set` is a plain bit set the kernel fills; its size is passed with it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let filled =
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            assert_eq!(
                filled,
                0,
                "sched_getaffinity: {}",
                std::io::Error::last_os_error()
            );
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
                .collect()
        }
    });
    ALLOWED.clone()
}

/// Pins every thread of process `pid` to `cpus`.
fn pin_process(pid: u32, cpus: &[usize]) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    for task in tasks {
        let tid: libc::pid_t = task
            .expect("a thread entry")
            .file_name()
            .to_string_lossy()
            .parse()
            .expect("a thread id");
        // SAFETY: as above; a thread that ended meanwhile answers ESRCH, which is fine.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus {
                libc::CPU_SET(cpu, &mut set);
            }
            let pinned = libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
            let error = std::io::Error::last_os_error();
            assert!(
                pinned == 0 || error.raw_os_error() == Some(libc::ESRCH),
                "sched_setaffinity of thread {tid}: {error}"
            );
        }
    }
}
