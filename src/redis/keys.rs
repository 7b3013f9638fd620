//! Key names: the one place that spells the layout described in the [module docs](super).
//!
//! Every key of a thread carries the hash tag `{<thread>}`, so a thread's keys share one
//! Redis Cluster slot ([`hash_slot`]). The prefix may not contain braces, so the tag is always
//! the thread's: Redis hashes what lies between the first `{` and the first `}` after it, which
//! for every key of one thread is the same text (the thread id up to its first `}`). Only an
//! empty tag would break that (Redis then hashes the whole key), so a thread id that starts
//! with `}` is written with that first character escaped as `%7D`, and to keep names distinct
//! one that starts with `%` has it escaped as `%25`; every other id appears as it is.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use runvisor_actors::{CheckpointId, RunId, ThreadId, WorkerId};

/// The number of Redis Cluster hash slots.
pub const SLOTS: u16 = 16_384;

/// The Redis Cluster hash slot of a key, as `CLUSTER KEYSLOT` computes it: CRC16 (XMODEM) of
/// the key's hash tag (the text between its first `{` and the next `}`, when not empty) or of
/// the whole key, modulo [`SLOTS`].
pub fn hash_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// What Redis hashes of a key that has a non-empty hash tag.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let len = rest.iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &rest[..len])
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The CRC16/XMODEM value of every byte, computed at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A thread id as it appears inside its hash tag: escaped only when it starts with `}` (which
/// would make the tag empty) or `%` (so that no two ids share a tag text).
fn tag(thread: &ThreadId) -> Cow<'_, str> {
    let id = thread.as_str();
    if let Some(rest) = id.strip_prefix('}') {
        Cow::Owned(format!("%7D{rest}"))
    } else if let Some(rest) = id.strip_prefix('%') {
        Cow::Owned(format!("%25{rest}"))
    } else {
        Cow::Borrowed(id)
    }
}

/// A key's TTL in whole milliseconds, at least 1 (0 would delete the key).
pub(crate) fn ttl_ms(ttl: std::time::Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Builds the Redis key names under a prefix. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: Arc<str>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Keys").field(&&*self.prefix).finish()
    }
}

impl Keys {
    /// Keys under this prefix.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: Arc::from(prefix),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<p>:cp:{<thread>}:<checkpoint_id>`: one checkpoint (STRING: a header, then the payload).
    pub fn checkpoint(&self, thread: &ThreadId, id: CheckpointId) -> String {
        self.checkpoint_member(thread, &id.to_string())
    }

    /// The checkpoint key for an index member, as stored (it may not be a valid id).
    pub(crate) fn checkpoint_member(&self, thread: &ThreadId, member: &str) -> String {
        format!("{}:cp:{{{}}}:{member}", self.prefix, tag(thread))
    }

    /// What every checkpoint key of a thread starts with: `<p>:cp:{<thread>}:`, for scripts that
    /// name the payloads of the ids they find in the index.
    pub(crate) fn checkpoint_prefix(&self, thread: &ThreadId) -> String {
        format!("{}:cp:{{{}}}:", self.prefix, tag(thread))
    }

    /// What every checkpoint sequence key of a thread starts with: `<p>:cpseq:{<thread>}:`.
    pub(crate) fn checkpoint_sequence_prefix(&self, thread: &ThreadId) -> String {
        format!("{}:cpseq:{{{}}}:", self.prefix, tag(thread))
    }

    /// `<p>:wf:{<thread>}:<hash>`: a workflow definition the thread's snapshots refer to by
    /// content hash (STRING, JSON).
    pub fn workflow(&self, thread: &ThreadId, hash: &str) -> String {
        format!("{}:wf:{{{}}}:{hash}", self.prefix, tag(thread))
    }

    /// `<p>:cpidx:{<thread>}`: the thread's checkpoint ids (ZSET, score 0, id order).
    pub fn checkpoint_index(&self, thread: &ThreadId) -> String {
        format!("{}:cpidx:{{{}}}", self.prefix, tag(thread))
    }

    /// `<p>:cpseq:{<thread>}:<run_id>`: the newest checkpoint sequence of a run (STRING).
    pub fn checkpoint_sequence(&self, thread: &ThreadId, run: RunId) -> String {
        format!("{}:cpseq:{{{}}}:{run}", self.prefix, tag(thread))
    }

    /// `<p>:cpfresh:{<thread>}`: the base of the thread's chain of checkpoints while that chain
    /// is known to live more than half the data TTL longer and the thread's index holds nothing
    /// older (STRING, the base's id; it expires when the chain is down to half its TTL), so a
    /// write on the chain needs not ask the base's TTL nor the index's oldest entry.
    pub fn checkpoint_fresh(&self, thread: &ThreadId) -> String {
        format!("{}:cpfresh:{{{}}}", self.prefix, tag(thread))
    }

    /// `<p>:run:{<thread>}:<run_id>`: a run record (HASH), in its thread's slot so that its
    /// writes are fenced by the thread's token in one script.
    pub fn run(&self, thread: &ThreadId, run: RunId) -> String {
        format!("{}:run:{{{}}}:{run}", self.prefix, tag(thread))
    }

    /// `<p>:run:{<thread>}:`: what the record keys of the thread's runs begin with.
    pub(crate) fn run_prefix(&self, thread: &ThreadId) -> String {
        format!("{}:run:{{{}}}:", self.prefix, tag(thread))
    }

    /// `<p>:runthread:<run_id>`: the thread of a run (STRING), so a run is found by its id.
    pub fn run_thread(&self, run: RunId) -> String {
        format!("{}:runthread:{run}", self.prefix)
    }

    /// `<p>:run:<run_id>`: where run records were kept before they moved into their thread's
    /// slot; still read, never written.
    pub(crate) fn legacy_run(&self, run: RunId) -> String {
        format!("{}:run:{run}", self.prefix)
    }

    /// `<p>:open`: the open runs (running or awaiting input) of every thread (ZSET, member
    /// `<run_id> <thread>`, score the start in ms since the epoch).
    pub fn open_runs(&self) -> String {
        format!("{}:open", self.prefix)
    }

    /// `<p>:recent`: every run of the data TTL (ZSET, member `<run_id> <thread>`, score the
    /// start in ms since the epoch).
    pub fn recent_runs(&self) -> String {
        format!("{}:recent", self.prefix)
    }

    /// `<p>:threads`: every thread a run was recorded on (SET of thread ids), so that
    /// checkpoint cleanup and stats find threads without a keyspace scan.
    pub fn threads(&self) -> String {
        format!("{}:threads", self.prefix)
    }

    /// `<p>:users`: every user label a run was recorded with (SET of user ids).
    pub fn users(&self) -> String {
        format!("{}:users", self.prefix)
    }

    /// `<p>:threads:<user_id>`: the threads of a user's runs (SET of thread ids). The user id
    /// is the whole rest of the key, so two users never share one, nor one with `<p>:threads`.
    pub fn user_threads(&self, user: &str) -> String {
        format!("{}:threads:{user}", self.prefix)
    }

    /// `<p>:ctl:<worker_id>`: a worker's control mailbox (LIST of JSON requests).
    pub fn control(&self, worker: &WorkerId) -> String {
        format!("{}:ctl:{worker}", self.prefix)
    }

    /// `<p>:ctlreply:{<request_id>}:<worker_id>`: a worker's answer to a control request
    /// (LIST); the answers to one request share a slot.
    pub fn control_reply(&self, request: &str, worker: &WorkerId) -> String {
        format!("{}:ctlreply:{{{request}}}:{worker}", self.prefix)
    }

    /// `<p>:lease:{<thread>}`: the thread's lease (HASH: `worker`, `run`, `token`), with the
    /// lease TTL.
    pub fn lease(&self, thread: &ThreadId) -> String {
        format!("{}:lease:{{{}}}", self.prefix, tag(thread))
    }

    /// `<p>:fence:{<thread>}`: the thread's newest fencing token (STRING, a counter).
    pub fn fence(&self, thread: &ThreadId) -> String {
        format!("{}:fence:{{{}}}", self.prefix, tag(thread))
    }

    /// `<p>:worker:<worker_id>`: a worker's heartbeat (HASH), with the lease TTL.
    pub fn worker(&self, worker: &WorkerId) -> String {
        format!("{}:worker:{worker}", self.prefix)
    }

    /// `<p>:runs:{<thread>}`: the thread's run ids (ZSET, score 0, id order).
    pub fn thread_runs(&self, thread: &ThreadId) -> String {
        format!("{}:runs:{{{}}}", self.prefix, tag(thread))
    }

    /// `<p>:hist:{<thread>}`: the thread's history (LIST of messages, oldest first).
    pub fn history(&self, thread: &ThreadId) -> String {
        format!("{}:hist:{{{}}}", self.prefix, tag(thread))
    }

    /// `<p>:histids:{<thread>}`: the ids of the messages in the history (SET).
    pub fn history_ids(&self, thread: &ThreadId) -> String {
        format!("{}:histids:{{{}}}", self.prefix, tag(thread))
    }

    /// LIST of submitted jobs waiting for a worker (pushed on the left, claimed from the
    /// right). The job keys share the hash tag `{jobs}`, so moving a job between them is one
    /// command on one Cluster slot.
    pub fn job_queue(&self) -> String {
        format!("{}:jobs:{{jobs}}", self.prefix)
    }

    /// LIST of the jobs a worker claimed and has not finished.
    pub fn claimed_jobs(&self, worker: &WorkerId) -> String {
        format!("{}:claimed:{{jobs}}:{worker}", self.prefix)
    }

    /// SET of the workers that ever claimed a job (whose claimed lists a sweep looks at).
    pub fn job_claimers(&self) -> String {
        format!("{}:claimers:{{jobs}}", self.prefix)
    }

    /// LIST of jobs no worker can run (malformed, invalid workflow), each with why.
    pub fn rejected_jobs(&self) -> String {
        format!("{}:rejected:{{jobs}}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let keys = Keys::new("rv");
        let t = ThreadId::new("chat:42").expect("valid");
        let run: RunId = "0190a0b0-0000-7000-8000-000000000001"
            .parse()
            .expect("uuid");
        let cp: CheckpointId = "0190a0b0-0000-7000-8000-000000000002"
            .parse()
            .expect("uuid");
        assert_eq!(
            keys.checkpoint(&t, cp),
            "rv:cp:{chat:42}:0190a0b0-0000-7000-8000-000000000002"
        );
        assert_eq!(keys.checkpoint_index(&t), "rv:cpidx:{chat:42}");
        assert_eq!(keys.checkpoint_fresh(&t), "rv:cpfresh:{chat:42}");
        assert_eq!(
            keys.checkpoint_sequence(&t, run),
            "rv:cpseq:{chat:42}:0190a0b0-0000-7000-8000-000000000001"
        );
        assert_eq!(
            keys.run(&t, run),
            "rv:run:{chat:42}:0190a0b0-0000-7000-8000-000000000001"
        );
        assert_eq!(
            keys.run_thread(run),
            "rv:runthread:0190a0b0-0000-7000-8000-000000000001"
        );
        assert_eq!(keys.lease(&t), "rv:lease:{chat:42}");
        assert_eq!(keys.fence(&t), "rv:fence:{chat:42}");
        let w = WorkerId::new("host-1").expect("valid");
        assert_eq!(keys.worker(&w), "rv:worker:host-1");
        assert_eq!(keys.thread_runs(&t), "rv:runs:{chat:42}");
        assert_eq!(keys.history(&t), "rv:hist:{chat:42}");
        assert_eq!(keys.history_ids(&t), "rv:histids:{chat:42}");
        assert_eq!(keys.job_queue(), "rv:jobs:{jobs}");
        assert_eq!(keys.claimed_jobs(&w), "rv:claimed:{jobs}:host-1");
        assert_eq!(
            hash_slot(keys.job_queue().as_bytes()),
            hash_slot(keys.claimed_jobs(&w).as_bytes())
        );
    }

    #[test]
    fn slots_are_redis_cluster_slots() {
        // Values from CLUSTER KEYSLOT (the integration tests compare more with a real cluster).
        assert_eq!(hash_slot(b"123456789"), 12739);
        assert_eq!(hash_slot(b"somekey"), 11058);
        assert_eq!(hash_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(hash_slot(b"bar{hash_tag}"), 2515);
        assert_eq!(hash_slot(b"{}x"), hash_slot(b"{}x"));
        assert_ne!(
            hash_slot(b"a{}x"),
            hash_slot(b"b{}x"),
            "an empty tag hashes the whole key"
        );
    }

    #[test]
    fn every_key_of_a_thread_shares_its_slot_whatever_its_braces() {
        let keys = Keys::new("rv");
        let run: RunId = "0190a0b0-0000-7000-8000-000000000001"
            .parse()
            .expect("uuid");
        let cp: CheckpointId = "0190a0b0-0000-7000-8000-000000000002"
            .parse()
            .expect("uuid");
        for id in [
            "chat:42", "}x", "}}", "{", "{}", "a}b", "a{b}c", "%7Dx", "%", "x%",
        ] {
            let t = ThreadId::new(id).expect("valid");
            let all = [
                keys.checkpoint(&t, cp),
                keys.workflow(&t, "h"),
                keys.checkpoint_index(&t),
                keys.checkpoint_sequence(&t, run),
                keys.thread_runs(&t),
                keys.history(&t),
                keys.history_ids(&t),
                keys.run(&t, run),
                keys.lease(&t),
                keys.fence(&t),
            ];
            let slot = hash_slot(all[0].as_bytes());
            for key in &all {
                assert!(hash_tag(key.as_bytes()).is_some(), "{key} has a tag");
                assert_eq!(hash_slot(key.as_bytes()), slot, "{key}");
            }
        }
        // Escaping keeps names apart.
        let escaped = |id: &str| keys.history(&ThreadId::new(id).expect("valid"));
        assert_eq!(escaped("}x"), "rv:hist:{%7Dx}");
        assert_eq!(escaped("%7Dx"), "rv:hist:{%257Dx}");
        assert_eq!(escaped("x%"), "rv:hist:{x%}");
        assert_ne!(escaped("}x"), escaped("%7Dx"));
    }
}
