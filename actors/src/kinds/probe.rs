//! Probes: points inside a run where a test (or a host's policy) may request a stop at an
//! exact moment. The supervisor and the node context consult the runtime's probe, if one is
//! installed; the `testkit` module (cargo feature) builds scripted interrupts on top of this.

use crate::model::{NodePath, RunId, StopMode, StopReason};

/// A stop a probe asks for.
pub type ProbeStop = Option<(StopMode, StopReason)>;

/// Observation points of a run. Every method defaults to "carry on".
///
/// Calls are synchronous and on the run's hot path: keep them cheap.
pub trait Probe: std::fmt::Debug + Send + Sync + 'static {
    /// A node is about to start. A stop requested here means the node never starts.
    fn before_node(&self, run: RunId, path: &NodePath) -> ProbeStop {
        let _ = (run, path);
        None
    }

    /// A node's actor was spawned and its handler task is starting.
    fn node_started(&self, run: RunId, path: &NodePath) -> ProbeStop {
        let _ = (run, path);
        None
    }

    /// A node streamed its `count`-th chunk (kept). A stop requested here refuses the next one.
    fn chunk(&self, run: RunId, path: &NodePath, count: u64) -> ProbeStop {
        let _ = (run, path, count);
        None
    }

    /// A node's handler has returned (its result is kept, whatever comes next) and the node's
    /// actor has not learnt of it yet. A stop requested here lands in that instant: the
    /// handler's task waits until the stop reaches its actor (a force stop: the abort begins;
    /// graceful: the node's stop flag is raised, at most 5 s) before it delivers the result.
    /// It exists to test the race between a handler's return and a stop.
    fn handler_returned(&self, run: RunId, path: &NodePath) -> ProbeStop {
        let _ = (run, path);
        None
    }

    /// A node completed and its output was recorded; its successors have not started yet.
    fn node_completed(&self, run: RunId, path: &NodePath) -> ProbeStop {
        let _ = (run, path);
        None
    }
}
