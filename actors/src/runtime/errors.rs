//! Why starting a run or querying one failed.

use crate::model::{RunId, RunStatus, StoreError, ThreadId, WorkerId};

/// Why a run could not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A declared input is missing, has the wrong type, or an input is not declared.
    #[error("input `{input}`: {problem}")]
    InvalidInput {
        /// The input's name.
        input: String,
        /// What is wrong.
        problem: String,
    },
    /// An input nests deeper than `limit` levels of arrays and objects: the inputs count as
    /// one object, nesting at most [`MAX_DEPTH`](crate::MAX_DEPTH) levels.
    #[error(
        "input `{input}` is nested deeper than {limit} levels of arrays and objects (the limit)"
    )]
    InputTooDeep {
        /// The input's name.
        input: String,
        /// How deep an input may nest.
        limit: usize,
    },
    /// A run of the thread is starting or live, in this process or on another worker.
    #[error("thread `{thread}` has a live run {run}{}", worker.as_ref().map(|w| format!(" on worker {w}")).unwrap_or_default())]
    ThreadBusy {
        /// The thread.
        thread: ThreadId,
        /// The run holding it.
        run: RunId,
        /// The worker running it.
        worker: Option<WorkerId>,
    },
    /// The thread's lease could not be taken: the lease store failed.
    #[error("could not take the lease of thread `{thread}`: {error}")]
    Lease {
        /// The thread.
        thread: ThreadId,
        /// The store's error.
        error: StoreError,
    },
    /// The workflow uses a kind this runtime does not know.
    #[error("node kind `{0}` is not registered on this runtime")]
    UnknownKind(String),
    /// The thread's history could not be loaded.
    #[error("could not load the history of thread `{thread}`: {error}")]
    History {
        /// The thread.
        thread: ThreadId,
        /// The store's error.
        error: StoreError,
    },
    /// The run could not be recorded.
    #[error("could not record run: {0}")]
    RunStore(StoreError),
    /// The run's supervisor could not be spawned.
    #[error("could not spawn the run supervisor: {0}")]
    Spawn(String),
}

impl StartError {
    /// The store error behind this one, when a store failed: the thread's lease could not be
    /// taken, its history read or the run recorded.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Lease { error, .. } | Self::History { error, .. } | Self::RunStore(error) => {
                Some(error)
            }
            _ => None,
        }
    }
}

/// Why an ops query about a run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// No live run has this id in this process.
    #[error("no live run {0} in this process")]
    UnknownRun(RunId),
    /// The run ended or did not answer in time.
    #[error("run {0} did not answer: {1}")]
    NoAnswer(RunId, String),
    /// The run holds no actors: it waits for input.
    #[error("run {0} holds no actors ({1})")]
    NotRunning(RunId, RunStatus),
}
