//! What the actors of one run share: its identity and scope, its live state (what the
//! registry shows), and the runtime's services, reached through [`RunServices`] so the
//! actors never import the layers above them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use async_trait::async_trait;
use ractor::ActorRef;

use super::config::RuntimeConfig;
use super::supervisor::RunMsg;
use crate::kinds::{Kinds, RunScope};
use crate::model::{
    CheckpointId, Fence, Lease, Message, NodePath, RunEvent, RunId, RunLabels, RunOutcome,
    RunRecord, RunStatus, ThreadId, Value,
};
use crate::persist::snapshot::{SaveFailed, SnapshotWrite};
use crate::persist::{EndWritten, HistoryStore, RunStore, SignalSource, SpillStore, WatchedKeys};

/// What a run needs from the runtime that hosts it. The runtime implements it with its
/// stores, its checkpointer, its stop watcher and its registry.
#[async_trait]
pub(crate) trait RunServices: Send + Sync + 'static {
    /// The runtime's settings.
    fn config(&self) -> &RuntimeConfig;
    /// Where history goes.
    fn history(&self) -> &Arc<dyn HistoryStore>;
    /// Where run records go.
    fn runs(&self) -> &Arc<dyn RunStore>;
    /// Where stop and cancel flags live.
    fn signals(&self) -> &Arc<dyn SignalSource>;
    /// Where the end of a run the stores did not take is kept, if anywhere.
    fn spill(&self) -> Option<&Arc<dyn SpillStore>>;
    /// Bytes of background snapshots waiting for the checkpoint store.
    fn backlog_bytes(&self) -> usize;
    /// Hands a snapshot to the checkpointer, to write in the background (coalesced per run).
    async fn save_background(&self, write: SnapshotWrite);
    /// Writes a snapshot through the checkpointer and waits until it is stored, refused, or
    /// still failing at `deadline`; a snapshot not stored comes back with the error.
    async fn save_awaited(
        &self,
        write: SnapshotWrite,
        deadline: tokio::time::Instant,
    ) -> Result<CheckpointId, SaveFailed>;
    /// Whether the stores write a run's whole end in one step ([`save_end`](Self::save_end)).
    fn writes_whole_end(&self) -> bool;
    /// Writes a run's final checkpoint as [`save_awaited`](Self::save_awaited) does, its first
    /// attempt as the run's whole end in one step (see [`EndStore`](crate::persist::EndStore)):
    /// after the checkpoint, `end`'s messages to the history, its record (naming the
    /// checkpoint), its flags and its lease. Answers the checkpoint as `save_awaited` does, and
    /// how far the rest of the end went; what did not go is the caller's to write.
    async fn save_end(
        &self,
        write: SnapshotWrite,
        end: EndParts<'_>,
        deadline: tokio::time::Instant,
    ) -> (Result<CheckpointId, SaveFailed>, EndReached);
    /// Watches a run's stop and cancel flags; a raised flag stops it through `supervisor`.
    async fn watch(&self, run: RunId, keys: WatchedKeys, supervisor: ActorRef<RunMsg>);
    /// Stops watching a run's flags.
    async fn unwatch(&self, run: RunId);
    /// Lists a live run.
    fn register(&self, run: RunId, entry: LiveRun);
    /// The run ended with `outcome`: keep listing it without actors (it waits for input), or
    /// drop it; either way its thread is free again.
    fn unregister(&self, run: RunId, waiting: bool, outcome: Arc<RunOutcome>);
    /// Keeps a run's thread lease alive while it runs; if the lease is lost, the run is stopped
    /// through `supervisor` (force, reason `lease_lost`).
    async fn hold_lease(
        &self,
        run: RunId,
        thread: ThreadId,
        lease: Lease,
        supervisor: ActorRef<RunMsg>,
    );
    /// Stops renewing a run's lease; waits for a renewal in flight, so none lands after this
    /// returns.
    async fn stop_renewing(&self, run: RunId);
    /// Gives a run's lease up (after [`stop_renewing`](Self::stop_renewing): a renewal landing
    /// after the release would take the thread again). A store that fails transiently is
    /// tried again until `deadline`, in the background after the first attempt: a lease left
    /// behind keeps the thread busy until it expires, and the run's outcome does not wait.
    async fn release_lease(
        &self,
        run: RunId,
        thread: &ThreadId,
        lease: &Lease,
        deadline: tokio::time::Instant,
    );
}

/// What a run's whole end writes after its final checkpoint ([`RunServices::save_end`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndParts<'a> {
    /// The messages for the history.
    pub(crate) messages: &'a [Message],
    /// The record of the run's end; its checkpoint id is set to the final checkpoint's.
    pub(crate) record: &'a RunRecord,
    /// The run's lease.
    pub(crate) lease: &'a Lease,
    /// The run's stop and cancel flags.
    pub(crate) flags: &'a [String],
}

/// How far a run's whole end went past its final checkpoint ([`RunServices::save_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReached {
    /// Nothing after the checkpoint (stored or not, as its answer says).
    Checkpoint,
    /// The checkpoint, then the messages.
    History,
    /// The checkpoint, the messages, the record and what [`EndWritten`] says.
    Record(EndWritten),
    /// The checkpoint, the messages and the record, found stored after the answer was lost,
    /// while another run took the thread since (its retry was refused as fenced): what
    /// follows the record (flags, notices, lease) is not this run's to touch any more.
    Taken,
}

/// The part of a live run that changes while it runs.
#[derive(Debug)]
pub(crate) struct LiveState {
    pub(crate) status: RunStatus,
    pub(crate) running: BTreeSet<NodePath>,
    pub(crate) waiting_for_storage: bool,
}

/// A live run's registry entry.
#[derive(Debug, Clone)]
pub(crate) struct LiveRun {
    pub(crate) thread: ThreadId,
    pub(crate) workflow_id: String,
    pub(crate) started_at_ms: u64,
    pub(crate) state: Arc<Mutex<LiveState>>,
    /// The run's supervisor; `None` while the run waits for input (it holds no actors).
    pub(crate) supervisor: Option<ActorRef<RunMsg>>,
    pub(crate) outcome: tokio::sync::watch::Receiver<Option<Arc<RunOutcome>>>,
}

impl LiveRun {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Everything the actors of a run share.
pub(crate) struct RunInfo {
    pub(crate) run_id: RunId,
    pub(crate) thread: ThreadId,
    /// What its nodes may read, and their way to ask for a stop.
    pub(crate) scope: Arc<RunScope>,
    /// The run's supervisor, set when it starts.
    pub(crate) supervisor: OnceLock<ActorRef<RunMsg>>,
    /// Answers given on resume, by the path of the interactive node they answer.
    pub(crate) answers: HashMap<NodePath, Value>,
    /// What the registry shows of the run (status, running nodes).
    pub(crate) live: Arc<Mutex<LiveState>>,
    /// The runtime's services.
    pub(crate) services: Arc<dyn RunServices>,
    /// The node kinds, by name.
    pub(crate) kinds: Arc<Kinds>,
    /// The ids the run's flags are named by.
    pub(crate) labels: RunLabels,
    /// The run's stop and cancel flags.
    pub(crate) signal_keys: WatchedKeys,
    /// Whether parallel items saved as failed run again (a resume asked to retry failures).
    pub(crate) retry_failed: bool,
    /// The run's lease on its thread: every write the run makes carries its fencing token.
    pub(crate) lease: Lease,
}

impl std::fmt::Debug for RunInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunInfo")
            .field("run_id", &self.run_id)
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

impl RunInfo {
    pub(crate) fn live(&self) -> MutexGuard<'_, LiveState> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes an event; no subscriber is fine.
    pub(crate) fn emit(&self, event: RunEvent) {
        self.scope.emit(event);
    }

    /// The runtime's settings.
    pub(crate) fn config(&self) -> &RuntimeConfig {
        self.services.config()
    }

    /// The fencing token every write of the run carries.
    pub(crate) fn fence(&self) -> Option<Fence> {
        Some(self.lease.fence)
    }
}
