//! Retrying a store call: a transient error ([`StoreError::is_transient`]: the store was out
//! of reach, slow, or busy) is tried again with backoff until a deadline; a permanent one
//! (refused, fenced, corrupt) is returned at once, since trying again gives the same answer.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::StoreError;

/// The first pause between two attempts; it doubles up to [`MAX_DELAY`].
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(50);
/// The longest pause between two attempts.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(2);

/// A store call that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GaveUp {
    /// The last error.
    pub(crate) error: StoreError,
    /// How many times the call was made.
    pub(crate) attempts: u64,
    /// How long it was tried for.
    pub(crate) waited: Duration,
}

/// Pauses between attempts: doubling from [`FIRST_DELAY`] up to [`MAX_DELAY`], never past
/// the deadline.
#[derive(Debug)]
pub(crate) struct Backoff {
    deadline: Instant,
    next: Duration,
}

impl Backoff {
    pub(crate) fn until(deadline: Instant) -> Self {
        Self {
            deadline,
            next: FIRST_DELAY,
        }
    }

    /// Waits before the next attempt; `false` (without waiting) once the deadline has passed.
    pub(crate) async fn wait(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.next.min(self.deadline - now)).await;
        self.next = (self.next * 2).min(MAX_DELAY);
        true
    }
}

/// Makes `call` until it succeeds, fails permanently, or fails transiently at or after
/// `deadline` (it is always made at least once; the last attempt starts by the deadline).
pub(crate) async fn until<T, F, Fut>(deadline: Instant, mut call: F) -> Result<T, GaveUp>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    let mut backoff = Backoff::until(deadline);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) if !error.is_transient() || !backoff.wait().await => {
                return Err(GaveUp {
                    error,
                    attempts,
                    waited: started.elapsed(),
                });
            }
            Err(error) => {
                if attempts.is_power_of_two() {
                    tracing::warn!(%error, attempts, "store call failed; retrying");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_the_deadline_permanent_ones_never() {
        let calls = AtomicU64::new(0);
        let deadline = Instant::now() + Duration::from_secs(1);
        let result: Result<(), GaveUp> = until(deadline, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Timeout(Duration::from_millis(10)))
        })
        .await;
        let gave_up = result.expect_err("never succeeds");
        assert_eq!(gave_up.attempts, calls.load(Ordering::SeqCst));
        // 50 + 100 + 200 + 400 ms, then the rest of the second, then one last try.
        assert_eq!(gave_up.attempts, 6);
        assert_eq!(gave_up.waited, Duration::from_secs(1));

        calls.store(0, Ordering::SeqCst);
        let refused = StoreError::Rejected {
            command: "SET".into(),
            key: "k".into(),
            reason: "NOPERM".into(),
        };
        let result: Result<(), GaveUp> = until(deadline + Duration::from_secs(60), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(refused.clone())
        })
        .await;
        let gave_up = result.expect_err("refused");
        assert_eq!((gave_up.attempts, gave_up.error), (1, refused));
        assert_eq!(gave_up.waited, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_comes_back_before_the_deadline_succeeds() {
        let calls = AtomicU64::new(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        let result = until(deadline, || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 3 {
                Err(StoreError::Unavailable("down".into()))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(result, Ok(7));
        // A deadline already passed still gets one attempt.
        let result = until(Instant::now(), || async { Ok::<_, StoreError>(1) }).await;
        assert_eq!(result, Ok(1));
    }
}
