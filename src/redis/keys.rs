//! Key names: the one place that spells the layout described in the [module docs](super).
//!
//! Every key of a thread carries the hash tag `{<thread>}`, so a thread's keys share one
//! Redis Cluster slot. The prefix may not contain braces, so the tag is always the thread's.
//! (A thread id that starts with `}` makes an empty tag, which Redis ignores; that only
//! matters on a cluster.)

use std::fmt;
use std::sync::Arc;

use runvisor_actors::{CheckpointId, RunId, ThreadId, WorkerId};

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

    /// `<p>:cp:{<thread>}:<checkpoint_id>`: one checkpoint (HASH).
    pub fn checkpoint(&self, thread: &ThreadId, id: CheckpointId) -> String {
        self.checkpoint_member(thread, &id.to_string())
    }

    /// The checkpoint key for an index member, as stored (it may not be a valid id).
    pub(crate) fn checkpoint_member(&self, thread: &ThreadId, member: &str) -> String {
        format!("{}:cp:{{{thread}}}:{member}", self.prefix)
    }

    /// `<p>:wf:{<thread>}:<hash>`: a workflow definition the thread's snapshots refer to by
    /// content hash (STRING, JSON).
    pub fn workflow(&self, thread: &ThreadId, hash: &str) -> String {
        format!("{}:wf:{{{thread}}}:{hash}", self.prefix)
    }

    /// `<p>:cpidx:{<thread>}`: the thread's checkpoint ids (ZSET, score 0, id order).
    pub fn checkpoint_index(&self, thread: &ThreadId) -> String {
        format!("{}:cpidx:{{{thread}}}", self.prefix)
    }

    /// `<p>:cpseq:{<thread>}:<run_id>`: the newest checkpoint sequence of a run (STRING).
    pub fn checkpoint_sequence(&self, thread: &ThreadId, run: RunId) -> String {
        format!("{}:cpseq:{{{thread}}}:{run}", self.prefix)
    }

    /// `<p>:run:{<thread>}:<run_id>`: a run record (HASH), in its thread's slot so that its
    /// writes are fenced by the thread's token in one script.
    pub fn run(&self, thread: &ThreadId, run: RunId) -> String {
        format!("{}:run:{{{thread}}}:{run}", self.prefix)
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

    /// `<p>:lease:{<thread>}`: the thread's lease (HASH: `worker`, `run`, `token`), with the
    /// lease TTL.
    pub fn lease(&self, thread: &ThreadId) -> String {
        format!("{}:lease:{{{thread}}}", self.prefix)
    }

    /// `<p>:fence:{<thread>}`: the thread's newest fencing token (STRING, a counter).
    pub fn fence(&self, thread: &ThreadId) -> String {
        format!("{}:fence:{{{thread}}}", self.prefix)
    }

    /// `<p>:worker:<worker_id>`: a worker's heartbeat (HASH), with the lease TTL.
    pub fn worker(&self, worker: &WorkerId) -> String {
        format!("{}:worker:{worker}", self.prefix)
    }

    /// `<p>:runs:{<thread>}`: the thread's run ids (ZSET, score 0, id order).
    pub fn thread_runs(&self, thread: &ThreadId) -> String {
        format!("{}:runs:{{{thread}}}", self.prefix)
    }

    /// `<p>:hist:{<thread>}`: the thread's history (LIST of JSON messages, oldest first).
    pub fn history(&self, thread: &ThreadId) -> String {
        format!("{}:hist:{{{thread}}}", self.prefix)
    }

    /// `<p>:histids:{<thread>}`: the ids of the messages in the history (SET).
    pub fn history_ids(&self, thread: &ThreadId) -> String {
        format!("{}:histids:{{{thread}}}", self.prefix)
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
    }
}
