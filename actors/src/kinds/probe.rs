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

    /// A node completed and its output was recorded; its successors have not started yet.
    fn node_completed(&self, run: RunId, path: &NodePath) -> ProbeStop {
        let _ = (run, path);
        None
    }
}
