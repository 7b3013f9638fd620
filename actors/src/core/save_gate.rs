//! The save gate: what must be durable before what may start.
//!
//! When the durability mode asks for it (`sync`, or `async` with too much waiting for the
//! store), nodes made ready by a completion wait until a snapshot holding that completion is
//! stored; in `sync` mode, so do loops and parallels (at any depth) before their next
//! iteration or item begins. The gate is generic in what it holds (nodes, bodies): it only
//! says which of them a stored snapshot covers. The gate holds them, says when to write the awaited snapshot, releases them when it
//! is stored, and, when the store fails, keeps them held (the run waits for the store rather than
//! going on unsaved) and says when the wait starts and ends. In `async` mode it also coalesces
//! background snapshots: one per window, armed by the first completion in it.

/// What to do with newly ready nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadyStep<T> {
    /// Start them now.
    Launch(Vec<T>),
    /// Write the awaited snapshot now (the nodes are held until it is stored).
    Save,
    /// Hold them: an awaited snapshot is being written; another follows it.
    Hold,
}

/// What an awaited snapshot's answer means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedStep<T> {
    /// What it held, to start now.
    pub(crate) launch: Vec<T>,
    /// More nodes were held meanwhile: write another awaited snapshot.
    pub(crate) save_again: bool,
    /// The store had been failing and is back.
    pub(crate) wait_over: bool,
    /// The store failed: this wait for it begins now (it was not waiting before).
    pub(crate) wait_begins: bool,
    /// The store failed: try again later.
    pub(crate) retry: bool,
}

impl<T> Default for SavedStep<T> {
    fn default() -> Self {
        Self {
            launch: Vec::new(),
            save_again: false,
            wait_over: false,
            wait_begins: false,
            retry: false,
        }
    }
}

/// The gate between a completion and what follows it.
#[derive(Debug)]
pub(crate) struct SaveGate<T> {
    held: Vec<T>,
    saving: Option<Vec<T>>,
    waiting: bool,
    armed: bool,
}

impl<T> Default for SaveGate<T> {
    fn default() -> Self {
        Self {
            held: Vec::new(),
            saving: None,
            waiting: false,
            armed: false,
        }
    }
}

impl<T> SaveGate<T> {
    /// Nodes became ready (or a body waits to go on); `save_first` says whether they must wait
    /// for a stored snapshot.
    pub(crate) fn ready(&mut self, nodes: Vec<T>, save_first: bool) -> ReadyStep<T> {
        if !save_first {
            return ReadyStep::Launch(nodes);
        }
        self.held.extend(nodes);
        if self.saving.is_some() {
            ReadyStep::Hold
        } else {
            self.saving = Some(std::mem::take(&mut self.held));
            ReadyStep::Save
        }
    }

    /// The awaited snapshot came back. `running` says whether the run still starts nodes (a
    /// stopping run starts none, and retries nothing).
    pub(crate) fn saved(&mut self, stored: bool, running: bool) -> SavedStep<T> {
        let covered = self.saving.take().unwrap_or_default();
        let mut step = SavedStep::default();
        if stored {
            step.wait_over = std::mem::take(&mut self.waiting);
            if running {
                step.launch = covered;
            }
            if running && !self.held.is_empty() {
                self.saving = Some(std::mem::take(&mut self.held));
                step.save_again = true;
            }
        } else {
            // Nothing starts unsaved: the nodes wait for the next attempt.
            let mut held = covered;
            held.append(&mut self.held);
            self.held = held;
            step.wait_begins = !self.waiting;
            self.waiting = true;
            step.retry = running;
        }
        step
    }

    /// Time to try again: whether to write the awaited snapshot now.
    pub(crate) fn retry(&mut self) -> bool {
        if self.saving.is_none() && !self.held.is_empty() {
            self.saving = Some(std::mem::take(&mut self.held));
            true
        } else {
            false
        }
    }

    /// Whether nodes wait for a snapshot (the run must not end as done meanwhile).
    pub(crate) fn busy(&self) -> bool {
        self.saving.is_some() || !self.held.is_empty()
    }

    /// Whether the run waits for a failing store.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> bool {
        self.waiting
    }

    /// A completion in `async` mode: whether to arm the background save at the end of the
    /// window (once per window).
    pub(crate) fn arm(&mut self) -> bool {
        !std::mem::replace(&mut self.armed, true)
    }

    /// The window ended: the background save is due.
    pub(crate) fn fired(&mut self) {
        self.armed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_holds_until_stored_and_batches_what_came_meanwhile() {
        let mut gate = SaveGate::<u32>::default();
        assert_eq!(gate.ready(vec![1], true), ReadyStep::Save);
        assert!(gate.busy());
        assert_eq!(gate.ready(vec![2], true), ReadyStep::Hold);
        assert_eq!(gate.ready(vec![3], true), ReadyStep::Hold);
        let step = gate.saved(true, true);
        assert_eq!(step.launch, vec![1]);
        assert!(step.save_again);
        let step = gate.saved(true, true);
        assert_eq!(step.launch, vec![2, 3]);
        assert!(!step.save_again);
        assert!(!gate.busy());
    }

    #[test]
    fn a_failing_store_holds_everything_and_retries() {
        let mut gate = SaveGate::<u32>::default();
        assert_eq!(gate.ready(vec![1], true), ReadyStep::Save);
        assert_eq!(gate.ready(vec![2], true), ReadyStep::Hold);
        let step = gate.saved(false, true);
        assert!(step.launch.is_empty());
        assert!(step.wait_begins && step.retry);
        assert!(gate.waiting());
        let again = gate.saved(false, true);
        assert!(!again.wait_begins, "the wait began once");
        assert!(gate.retry());
        let step = gate.saved(true, true);
        assert_eq!(step.launch, vec![1, 2]);
        assert!(step.wait_over);
        assert!(!gate.waiting());
    }

    #[test]
    fn a_stopping_run_starts_nothing_and_retries_nothing() {
        let mut gate = SaveGate::<u32>::default();
        gate.ready(vec![1], true);
        let step = gate.saved(true, false);
        assert!(step.launch.is_empty() && !step.save_again);
        gate.ready(vec![2], true);
        let step = gate.saved(false, false);
        assert!(!step.retry);
    }

    #[test]
    fn async_launches_at_once_and_arms_one_save_per_window() {
        let mut gate = SaveGate::<u32>::default();
        assert_eq!(gate.ready(vec![4], false), ReadyStep::Launch(vec![4]));
        assert!(gate.arm());
        assert!(!gate.arm());
        gate.fired();
        assert!(gate.arm());
        assert!(!gate.busy());
    }
}
