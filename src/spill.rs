//! Spill files: the ends of runs that Redis did not take (it stayed unreachable past the
//! store deadline, or refused), kept on the local disk until they are replayed into Redis,
//! exactly once (`runvisor recover`, and every worker when it starts).
//!
//! # Where
//!
//! One file per run, `<dir>/<run_id>.spill`. The directory is `redis.spill_dir` in the config
//! (`--spill-dir` or `RUNVISOR_SPILL_DIR` on the command line); by default
//! `$XDG_DATA_HOME/runvisor/spill`, else `$HOME/.local/share/runvisor/spill`, else
//! `.runvisor/spill` under the working directory ([`default_dir`]). A file is written to a
//! temporary name, synced, then renamed into place (and the directory synced): a crash never
//! leaves a partial spill file under a `.spill` name.
//!
//! # Format (version 1)
//!
//! A header line, then a JSON document of exactly the length it gives:
//!
//! ```text
//! runvisor-spill 1 crc32c=<8 hex digits> length=<bytes>
//! {"store": "redis://127.0.0.1:6379/ runvisor", "run_id": "...", "thread": "...", ...}
//! ```
//!
//! The checksum (CRC-32C, as the snapshot envelope uses) covers the JSON bytes. JSON, not a
//! binary codec: a spill file is written rarely, after something went wrong, and an operator
//! should be able to read what it holds (`tail -n +2 F | jq`); the final checkpoint inside is
//! the snapshot envelope itself (hex), checked by its own checksum when it is restored. The
//! document holds the store it was meant for (`store`: URL without password, and key prefix),
//! the run and thread, the lease the run held, why it was spilled (`reasons`), the messages
//! the history did not take, the final checkpoint (`id`, `run`, `sequence`, `bytes_hex`), the
//! workflow definition, and the final run record. A reader refuses an unknown version, a
//! length or checksum that does not match, and a document that does not parse, naming the
//! file.
//!
//! # Replay
//!
//! [`FileSpill::recover`] replays the files meant for its store (others are listed and left
//! alone) through [`Runtime::replay_spilled`]: under the thread's lease, never over a thread
//! that moved on. Each file is locked (`flock`) while it is replayed, so two processes never
//! replay one file; another process finds it busy and leaves it. A file is removed only once
//! everything it holds is written; one whose thread moved on is moved to `<dir>/skipped/`,
//! with a note saying why, for an operator to look at.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use runvisor_actors::store::{SpillStore, SpilledRun, StoredCheckpoint};
use runvisor_actors::{
    CheckpointId, Lease, Message, ReplayError, Replayed, RunId, RunRecord, Runtime, StoreError,
    ThreadId,
};
use serde::{Deserialize, Serialize};

/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The largest spill document read (a run's messages and final snapshot).
const MAX_LENGTH: usize = 1 << 30;
const MAGIC: &str = "runvisor-spill";
const EXTENSION: &str = "spill";
const CRC: crc::Crc<u32, crc::Table<16>> = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISCSI);

/// The default spill directory: `$XDG_DATA_HOME/runvisor/spill`, else
/// `$HOME/.local/share/runvisor/spill`, else `.runvisor/spill` (relative to the working
/// directory).
pub fn default_dir() -> PathBuf {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(data) = from("XDG_DATA_HOME") {
        return data.join("runvisor").join("spill");
    }
    if let Some(home) = from("HOME") {
        return home.join(".local/share/runvisor/spill");
    }
    PathBuf::from(".runvisor/spill")
}

/// Spill files in one directory, for one store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FileSpill {
    dir: PathBuf,
    store: String,
}

/// A spill file that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillFileError {
    /// The file system failed.
    #[error("spill file {}: {error}", path.display())]
    Io {
        /// The file (or directory).
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
    /// The file is not a spill file this build can read.
    #[error("spill file {}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// What [`FileSpill::recover`] did with one spill file.
#[derive(Debug)]
#[non_exhaustive]
pub struct Recovered {
    /// The file.
    pub path: PathBuf,
    /// Its run and thread, when the file could be read.
    pub run: Option<(RunId, ThreadId)>,
    /// What became of it.
    pub outcome: RecoverOutcome,
}

/// What became of one spill file.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecoverOutcome {
    /// Written into the store; the file is gone.
    Replayed(Replayed),
    /// Not written: the thread moved on. The file was moved to `kept`, with a note.
    Skipped {
        /// Why.
        why: String,
        /// Where the file is now.
        kept: PathBuf,
    },
    /// Another process is replaying it (its lock is held), or a run holds its thread: it
    /// stays for a later replay.
    Busy(String),
    /// Meant for another store (URL or key prefix): left alone.
    OtherStore(String),
    /// The file cannot be read: left alone.
    Unreadable(SpillFileError),
    /// The store failed: the file stays for a later replay.
    Failed(ReplayError),
    /// Written into the store, but the file could not be removed (a later replay finds
    /// everything in place and writes nothing).
    NotRemoved(Replayed, SpillFileError),
}

/// What [`FileSpill::recover`] did, file by file.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct RecoverReport {
    /// One entry per spill file found.
    pub files: Vec<Recovered>,
}

impl FileSpill {
    /// Spill files in `dir` for the store named `store` (the URL without its password and
    /// the key prefix, as [`RedisStores`](crate::redis::RedisStores) names it).
    pub fn new(dir: impl Into<PathBuf>, store: impl Into<String>) -> Self {
        Self {
            dir: dir.into(),
            store: store.into(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The store these files are meant for.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// The spill files waiting in the directory (any store's), oldest name first; none when
    /// the directory does not exist.
    pub fn pending(&self) -> Result<Vec<PathBuf>, SpillFileError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(SpillFileError::Io {
                    path: self.dir.clone(),
                    error,
                });
            }
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|error| SpillFileError::Io {
                path: self.dir.clone(),
                error,
            })?;
            let path = entry.path();
            let visible = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'));
            if visible && path.extension().and_then(|e| e.to_str()) == Some(EXTENSION) {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// Writes a spilled run durably: a temporary file, synced, renamed into place, and the
    /// directory synced. Returns the file.
    pub fn write(&self, run: &SpilledRun) -> Result<PathBuf, SpillFileError> {
        let io_at = |path: &Path| {
            let path = path.to_owned();
            move |error| SpillFileError::Io { path, error }
        };
        fs::create_dir_all(&self.dir).map_err(io_at(&self.dir))?;
        let document = Document::of(run, &self.store);
        let body = serde_json::to_vec(&document).map_err(|e| SpillFileError::Invalid {
            path: self.dir.clone(),
            reason: format!("cannot encode run {}: {e}", run.run_id),
        })?;
        let header = format!(
            "{MAGIC} {FORMAT_VERSION} crc32c={:08x} length={}\n",
            CRC.checksum(&body),
            body.len()
        );
        let path = self.dir.join(format!("{}.{EXTENSION}", run.run_id));
        let temp = self.dir.join(format!(
            ".{}.{EXTENSION}.tmp-{}",
            run.run_id,
            std::process::id()
        ));
        let written = (|| {
            let mut file = File::create(&temp)?;
            file.write_all(header.as_bytes())?;
            file.write_all(&body)?;
            file.sync_all()
        })();
        if let Err(error) = written {
            let _ = fs::remove_file(&temp);
            return Err(SpillFileError::Io { path: temp, error });
        }
        fs::rename(&temp, &path).map_err(io_at(&path))?;
        sync_dir(&self.dir).map_err(io_at(&self.dir))?;
        Ok(path)
    }

    /// Reads a spill file: its store and the spilled run.
    pub fn read(path: &Path) -> Result<(String, SpilledRun), SpillFileError> {
        let mut file = File::open(path).map_err(|error| SpillFileError::Io {
            path: path.to_owned(),
            error,
        })?;
        read_from(&mut file, path)
    }

    /// Replays every spill file of this store into the runtime's stores (see the module
    /// docs); files of other stores, unreadable ones and busy ones are reported and left.
    pub async fn recover(&self, runtime: &Runtime) -> RecoverReport {
        let mut report = RecoverReport::default();
        let files = match self.pending() {
            Ok(files) => files,
            Err(e) => {
                report.files.push(Recovered {
                    path: self.dir.clone(),
                    run: None,
                    outcome: RecoverOutcome::Unreadable(e),
                });
                return report;
            }
        };
        for path in files {
            if let Some(entry) = self.recover_one(runtime, path).await {
                report.files.push(entry);
            }
        }
        report
    }

    /// Replays one file under its lock; `None` when it was gone by the time it was locked (a
    /// concurrent replay finished it).
    async fn recover_one(&self, runtime: &Runtime, path: PathBuf) -> Option<Recovered> {
        let entry = |run, outcome| {
            Some(Recovered {
                path: path.clone(),
                run,
                outcome,
            })
        };
        let mut file = match OpenOptions::new().read(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => {
                let e = SpillFileError::Io {
                    path: path.clone(),
                    error,
                };
                return entry(None, RecoverOutcome::Unreadable(e));
            }
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let why = "another process is replaying it".to_owned();
                return entry(None, RecoverOutcome::Busy(why));
            }
            Err(fs::TryLockError::Error(error)) => {
                let e = SpillFileError::Io {
                    path: path.clone(),
                    error,
                };
                return entry(None, RecoverOutcome::Unreadable(e));
            }
        }
        // Locked: but a process that finished it meanwhile removed it (and this is an
        // unlinked file), or put another file in its place.
        if !still_at(&file, &path) {
            return None;
        }
        let (store, spilled) = match read_from(&mut file, &path) {
            Ok(read) => read,
            Err(e) => return entry(None, RecoverOutcome::Unreadable(e)),
        };
        let run = Some((spilled.run_id, spilled.thread.clone()));
        if store != self.store {
            return entry(run, RecoverOutcome::OtherStore(store));
        }
        let outcome = match runtime.replay_spilled(&spilled).await {
            Ok(replayed) => match replayed.skipped.clone() {
                None => match remove(&path, &self.dir) {
                    Ok(()) => RecoverOutcome::Replayed(replayed),
                    Err(e) => RecoverOutcome::NotRemoved(replayed, e),
                },
                Some(why) => match self.set_aside(&path, &why) {
                    Ok(kept) => RecoverOutcome::Skipped { why, kept },
                    Err(e) => RecoverOutcome::Unreadable(e),
                },
            },
            Err(e @ ReplayError::ThreadBusy { .. }) => RecoverOutcome::Busy(e.to_string()),
            Err(e) => RecoverOutcome::Failed(e),
        };
        // The lock goes with the file handle, after the file is gone.
        drop(file);
        entry(run, outcome)
    }

    /// Moves a file whose thread moved on to `<dir>/skipped/`, with a note saying why.
    fn set_aside(&self, path: &Path, why: &str) -> Result<PathBuf, SpillFileError> {
        let skipped = self.dir.join("skipped");
        let io_at = |path: &Path| {
            let path = path.to_owned();
            move |error| SpillFileError::Io { path, error }
        };
        fs::create_dir_all(&skipped).map_err(io_at(&skipped))?;
        let name = path.file_name().map(PathBuf::from).unwrap_or_default();
        let kept = skipped.join(&name);
        let note = skipped.join(name.with_extension("why.txt"));
        fs::write(&note, format!("not replayed: {why}\n")).map_err(io_at(&note))?;
        fs::rename(path, &kept).map_err(io_at(&kept))?;
        sync_dir(&self.dir).map_err(io_at(&self.dir))?;
        Ok(kept)
    }
}

#[async_trait]
impl SpillStore for FileSpill {
    async fn spill(&self, run: &SpilledRun) -> Result<String, StoreError> {
        let this = self.clone();
        let run = run.clone();
        match tokio::task::spawn_blocking(move || this.write(&run)).await {
            Ok(Ok(path)) => Ok(path.display().to_string()),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(e) => Err(StoreError::Unavailable(format!(
                "the spill file writer failed: {e}"
            ))),
        }
    }
}

/// Whether `file` is still the file at `path`.
fn still_at(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), fs::metadata(path)) {
            (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

fn remove(path: &Path, dir: &Path) -> Result<(), SpillFileError> {
    fs::remove_file(path).map_err(|error| SpillFileError::Io {
        path: path.to_owned(),
        error,
    })?;
    sync_dir(dir).map_err(|error| SpillFileError::Io {
        path: dir.to_owned(),
        error,
    })
}

/// Makes a rename or removal in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

fn read_from(file: &mut File, path: &Path) -> Result<(String, SpilledRun), SpillFileError> {
    let invalid = |reason: String| SpillFileError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let mut bytes = Vec::new();
    file.take(MAX_LENGTH as u64 + 256)
        .read_to_end(&mut bytes)
        .map_err(|error| SpillFileError::Io {
            path: path.to_owned(),
            error,
        })?;
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| invalid("no header line".to_owned()))?;
    let header = std::str::from_utf8(&bytes[..newline])
        .map_err(|_| invalid("the header is not text".to_owned()))?;
    let body = &bytes[newline + 1..];
    let fields: Vec<&str> = header.split(' ').collect();
    if fields.first() != Some(&MAGIC) {
        return Err(invalid("not a runvisor spill file".to_owned()));
    }
    let [_, version, crc, length] = fields.as_slice() else {
        return Err(invalid(format!("bad header {header:?}")));
    };
    let version: u32 = version
        .parse()
        .map_err(|_| invalid(format!("bad version {version:?}")))?;
    if version != FORMAT_VERSION {
        return Err(invalid(format!(
            "format version {version}, this runvisor reads {FORMAT_VERSION} (written by a newer runvisor?)"
        )));
    }
    let crc = crc
        .strip_prefix("crc32c=")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| invalid(format!("bad checksum field {crc:?}")))?;
    let length: usize = length
        .strip_prefix("length=")
        .and_then(|n| n.parse().ok())
        .filter(|n| *n <= MAX_LENGTH)
        .ok_or_else(|| invalid(format!("bad length field {length:?}")))?;
    if body.len() != length {
        return Err(invalid(format!(
            "holds {} bytes after its header, not {length} (truncated?)",
            body.len()
        )));
    }
    if CRC.checksum(body) != crc {
        return Err(invalid("checksum mismatch (corrupt)".to_owned()));
    }
    let document: Document =
        serde_json::from_slice(body).map_err(|e| invalid(format!("unreadable document: {e}")))?;
    document.into_run().map_err(invalid)
}

/// The JSON document of a spill file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    store: String,
    run_id: RunId,
    thread: ThreadId,
    lease: Lease,
    reasons: Vec<String>,
    messages: Vec<Message>,
    checkpoint: Option<CheckpointDocument>,
    workflow: Option<WorkflowDocument>,
    record: RunRecord,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointDocument {
    id: CheckpointId,
    run: RunId,
    sequence: u64,
    bytes_hex: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkflowDocument {
    hash: String,
    definition: String,
}

impl Document {
    fn of(run: &SpilledRun, store: &str) -> Self {
        Self {
            store: store.to_owned(),
            run_id: run.run_id,
            thread: run.thread.clone(),
            lease: run.lease.clone(),
            reasons: run.reasons.clone(),
            messages: run.messages.clone(),
            checkpoint: run.checkpoint.as_ref().map(|c| CheckpointDocument {
                id: c.id,
                run: c.run,
                sequence: c.sequence,
                bytes_hex: hex(&c.bytes),
            }),
            workflow: run
                .workflow
                .as_ref()
                .map(|(hash, definition)| WorkflowDocument {
                    hash: hash.clone(),
                    definition: definition.clone(),
                }),
            record: run.record.clone(),
        }
    }

    fn into_run(self) -> Result<(String, SpilledRun), String> {
        if self.record.run_id != self.run_id || self.record.thread != self.thread {
            return Err("the run record is of another run or thread".to_owned());
        }
        let checkpoint = match self.checkpoint {
            Some(c) => Some(StoredCheckpoint {
                id: c.id,
                run: c.run,
                sequence: c.sequence,
                bytes: unhex(&c.bytes_hex).ok_or("the checkpoint bytes are not hex")?,
                // A run's final checkpoint, the only one spilled, is spilled whole.
                link: None,
            }),
            None => None,
        };
        let mut run = SpilledRun::new(self.record, self.lease);
        run.reasons = self.reasons;
        run.messages = self.messages;
        run.checkpoint = checkpoint;
        run.workflow = self.workflow.map(|w| (w.hash, w.definition));
        Ok((self.store, run))
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| {
            let digit = |c: u8| char::from(c).to_digit(16);
            u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use runvisor_actors::{Fence, LeaseHolder, RunStatus, WorkerId};

    use super::*;

    fn spilled() -> SpilledRun {
        let run_id = RunId::new();
        let thread = ThreadId::new("t-1").expect("valid");
        let record = RunRecord {
            run_id,
            thread: thread.clone(),
            workflow_id: "w".into(),
            status: RunStatus::Succeeded,
            parent_run_id: None,
            checkpoint_id: None,
            started_at_ms: 1,
            finished_at_ms: Some(2),
            failure_reason: None,
            stop_reason: None,
            unpersisted: None,
            labels: Default::default(),
            not_resumable: None,
            worker: None,
            fence: Some(3),
            traceparent: None,
        };
        let lease = Lease {
            holder: LeaseHolder {
                worker: WorkerId::new("w1").expect("valid"),
                run: run_id,
            },
            fence: Fence(3),
        };
        let mut run = SpilledRun::new(record, lease);
        run.reasons = vec!["5 message(s) not in the history: down".into()];
        run.messages = vec![Message::user("hi"), Message::user("there")];
        run.checkpoint = Some(StoredCheckpoint {
            id: CheckpointId::new(),
            run: run_id,
            sequence: 9,
            bytes: vec![0, 1, 0xfe, 0xff, 0x42],
            link: None,
        });
        run.workflow = Some(("abc".into(), "{\"id\": \"w\"}".into()));
        run
    }

    #[test]
    fn a_spill_file_reads_back_as_written_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spill = FileSpill::new(dir.path().join("nested"), "redis://h/ p");
        assert_eq!(spill.pending().expect("none yet"), Vec::<PathBuf>::new());
        let run = spilled();
        let path = spill.write(&run).expect("written");
        assert_eq!(path, spill.dir().join(format!("{}.spill", run.run_id)));
        assert_eq!(
            spill.pending().expect("pending"),
            std::slice::from_ref(&path)
        );
        let (store, back) = FileSpill::read(&path).expect("read");
        assert_eq!(store, "redis://h/ p");
        assert_eq!(back, run);
        let names: Vec<_> = fs::read_dir(spill.dir())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let text = fs::read_to_string(&path).expect("text");
        assert!(text.starts_with("runvisor-spill 1 crc32c="), "{text}");
    }

    #[test]
    fn damaged_or_foreign_files_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spill = FileSpill::new(dir.path(), "s");
        let path = spill.write(&spilled()).expect("written");
        let good = fs::read(&path).expect("bytes");
        let newline = good.iter().position(|b| *b == b'\n').expect("header");
        let mut flipped = good.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x01;
        let future = String::from_utf8(good.clone()).expect("text").replacen(
            "runvisor-spill 1 ",
            "runvisor-spill 2 ",
            1,
        );
        let cases: [(&[u8], &str); 5] = [
            (&flipped, "checksum mismatch"),
            (&good[..good.len() - 10], "truncated"),
            (future.as_bytes(), "format version 2"),
            (b"hello world\n{}", "not a runvisor spill file"),
            (&good[..newline], "no header line"),
        ];
        for (bytes, want) in cases {
            fs::write(&path, bytes).expect("write");
            match FileSpill::read(&path) {
                Err(e @ SpillFileError::Invalid { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains(want), "{want}: {text}");
                    assert!(text.contains(&path.display().to_string()), "{text}");
                }
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&bytes)), Some(bytes));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn the_default_directory_is_the_platform_data_dir() {
        let dir = default_dir();
        assert!(dir.ends_with("runvisor/spill"), "{}", dir.display());
    }
}
