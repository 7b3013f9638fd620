//! Key names: the one place that spells the layout described in the [module docs](super).
//!
//! Every key of a thread carries the hash tag `{<thread>}`, so a thread's keys share one
//! Redis Cluster slot. The prefix may not contain braces, so the tag is always the thread's.
//! (A thread id that starts with `}` makes an empty tag, which Redis ignores; that only
//! matters on a cluster.)

use std::fmt;
use std::sync::Arc;

use runvisor_actors::{CheckpointId, RunId, ThreadId};

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

    /// `<p>:run:<run_id>`: a run record (HASH).
    pub fn run(&self, run: RunId) -> String {
        format!("{}:run:{run}", self.prefix)
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
        assert_eq!(keys.run(run), "rv:run:0190a0b0-0000-7000-8000-000000000001");
        assert_eq!(keys.thread_runs(&t), "rv:runs:{chat:42}");
        assert_eq!(keys.history(&t), "rv:hist:{chat:42}");
        assert_eq!(keys.history_ids(&t), "rv:histids:{chat:42}");
    }
}
