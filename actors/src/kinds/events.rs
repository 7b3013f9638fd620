//! A run's event log: what its nodes and supervisor publish and its event streams read.
//!
//! A broadcast channel with the semantics the engine's event streams had on tokio's
//! `broadcast`: every receiver sees every event published after it subscribed (the first
//! receiver, made with the log, from the run's start), in order; a receiver that falls more
//! than `capacity` events behind is told how many it missed and goes on from the oldest kept;
//! an event published while nobody listens is dropped; once every sender is gone a receiver
//! that has read everything is told the log is closed.
//!
//! Unlike tokio's channel, which makes all `capacity` slots when it is made, the log holds only
//! the events some receiver has not read yet: a run costs what its unread events cost, not its
//! buffer's capacity (a run makes one log, and most of its events are read at once or never
//! subscribed to).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::model::RunEvent;

/// Makes a log keeping at most `capacity` (at least one) unread events, with its first
/// receiver.
pub(crate) fn channel(capacity: usize) -> (EventSender, EventReceiver) {
    let log = Arc::new(Log {
        state: Mutex::new(LogState {
            events: VecDeque::new(),
            first: 0,
            capacity: capacity.max(1),
            senders: 1,
            readers: BTreeMap::from([(0, 1)]),
        }),
        notify: Notify::new(),
    });
    (
        EventSender { log: log.clone() },
        EventReceiver { log, next: 0 },
    )
}

struct Log {
    state: Mutex<LogState>,
    /// Woken when an event is published or the last sender goes.
    notify: Notify,
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct LogState {
    /// Events not read by every receiver yet, oldest first.
    events: VecDeque<RunEvent>,
    /// The position of `events[0]` (positions count every event kept since the start).
    first: u64,
    capacity: usize,
    senders: usize,
    /// How many receivers read next at each position.
    readers: BTreeMap<u64, usize>,
}

impl LogState {
    fn add_reader(&mut self, at: u64) {
        *self.readers.entry(at).or_default() += 1;
    }

    fn remove_reader(&mut self, at: u64) {
        if let Some(count) = self.readers.get_mut(&at) {
            *count -= 1;
            if *count == 0 {
                self.readers.remove(&at);
            }
        }
    }

    /// A receiver moved from `from` to `to`: events every receiver has read are dropped.
    fn advance(&mut self, from: u64, to: u64) {
        self.remove_reader(from);
        self.add_reader(to);
        self.trim();
    }

    /// Drops the events before the slowest receiver (all of them when none is left).
    fn trim(&mut self) {
        let end = self.first + self.events.len() as u64;
        let slowest = self.readers.keys().next().copied().unwrap_or(end).min(end);
        while self.first < slowest {
            self.events.pop_front();
            self.first += 1;
        }
    }
}

/// Publishes events to a run's log. Clones share the log; the log closes when the last one
/// is dropped.
pub(crate) struct EventSender {
    log: Arc<Log>,
}

impl EventSender {
    /// Publishes an event to every receiver; with no receiver it is dropped. A receiver more
    /// than the capacity behind loses the oldest event it has not read.
    pub(crate) fn send(&self, event: RunEvent) {
        {
            let mut state = self.log.lock();
            if state.readers.is_empty() {
                return;
            }
            state.events.push_back(event);
            if state.events.len() > state.capacity {
                state.events.pop_front();
                state.first += 1;
            }
        }
        self.log.notify.notify_waiters();
    }

    /// A receiver of the events published from now on.
    pub(crate) fn subscribe(&self) -> EventReceiver {
        let mut state = self.log.lock();
        let next = state.first + state.events.len() as u64;
        state.add_reader(next);
        EventReceiver {
            log: self.log.clone(),
            next,
        }
    }
}

impl Clone for EventSender {
    fn clone(&self) -> Self {
        self.log.lock().senders += 1;
        Self {
            log: self.log.clone(),
        }
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        let last = {
            let mut state = self.log.lock();
            state.senders -= 1;
            state.senders == 0
        };
        if last {
            self.log.notify.notify_waiters();
        }
    }
}

impl std::fmt::Debug for EventSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSender").finish_non_exhaustive()
    }
}

/// What a receiver got.
#[derive(Debug, PartialEq)]
pub(crate) enum Received {
    /// The next event.
    Event(RunEvent),
    /// The receiver fell behind: this many events were dropped before it read them; it goes
    /// on from the oldest event kept.
    Missed(u64),
    /// Every sender is gone and every event was read.
    Closed,
}

/// Reads a run's events in order, from where it subscribed.
pub(crate) struct EventReceiver {
    log: Arc<Log>,
    /// The position of the next event to read.
    next: u64,
}

impl EventReceiver {
    /// The next event, waiting for it. Cancel-safe: nothing is read unless it is returned.
    pub(crate) async fn recv(&mut self) -> Received {
        let log = self.log.clone();
        loop {
            let notified = log.notify.notified();
            tokio::pin!(notified);
            // Registered before the log is looked at: an event published after the look wakes
            // this wait.
            notified.as_mut().enable();
            if let Some(received) = self.try_recv() {
                return received;
            }
            notified.await;
        }
    }

    /// The next event if one is there (or what else there is to tell); `None` if the
    /// receiver has to wait.
    fn try_recv(&mut self) -> Option<Received> {
        let mut state = self.log.lock();
        if self.next < state.first {
            let missed = state.first - self.next;
            let oldest = state.first;
            state.advance(self.next, oldest);
            self.next = oldest;
            return Some(Received::Missed(missed));
        }
        let index = usize::try_from(self.next - state.first).unwrap_or(usize::MAX);
        if let Some(event) = state.events.get(index).cloned() {
            state.advance(self.next, self.next + 1);
            self.next += 1;
            return Some(Received::Event(event));
        }
        (state.senders == 0).then_some(Received::Closed)
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut state = self.log.lock();
        state.remove_reader(self.next);
        state.trim();
    }
}

impl std::fmt::Debug for EventReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReceiver")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events told apart by their number.
    fn event(n: u64) -> RunEvent {
        RunEvent::EventsMissed { count: n }
    }

    /// What the receiver can read now: the numbers of the events, what it missed, and whether
    /// the log closed.
    fn read(rx: &mut EventReceiver) -> (Vec<u64>, Vec<u64>, bool) {
        let (mut events, mut missed) = (Vec::new(), Vec::new());
        loop {
            match rx.try_recv() {
                Some(Received::Event(RunEvent::EventsMissed { count })) => events.push(count),
                Some(Received::Event(other)) => panic!("not a test event: {other:?}"),
                Some(Received::Missed(n)) => missed.push(n),
                Some(Received::Closed) => return (events, missed, true),
                None => return (events, missed, false),
            }
        }
    }

    #[test]
    fn the_first_receiver_sees_every_event_and_later_ones_from_their_subscription() {
        let (tx, mut first) = channel(8);
        tx.send(event(0));
        let mut later = tx.subscribe();
        tx.send(event(1));
        tx.send(event(2));
        assert_eq!(read(&mut first), (vec![0, 1, 2], vec![], false));
        assert_eq!(read(&mut later), (vec![1, 2], vec![], false));
        // Read by everyone: nothing is kept.
        assert!(tx.log.lock().events.is_empty());
    }

    #[test]
    fn a_slow_receiver_is_told_how_many_it_missed_and_goes_on_from_the_oldest_kept() {
        let (tx, mut rx) = channel(3);
        for n in 0..5 {
            tx.send(event(n));
        }
        assert_eq!(read(&mut rx), (vec![2, 3, 4], vec![2], false));
        assert!(tx.log.lock().events.len() <= 3);
    }

    #[test]
    fn events_nobody_listens_to_are_dropped() {
        let (tx, rx) = channel(4);
        drop(rx);
        tx.send(event(0));
        assert!(tx.log.lock().events.is_empty());
        let mut rx = tx.subscribe();
        tx.send(event(1));
        assert_eq!(read(&mut rx), (vec![1], vec![], false));
    }

    #[test]
    fn the_log_closes_when_every_sender_is_gone_and_everything_was_read() {
        let (tx, mut rx) = channel(4);
        let other = tx.clone();
        tx.send(event(0));
        drop(tx);
        assert_eq!(read(&mut rx), (vec![0], vec![], false));
        other.send(event(1));
        drop(other);
        assert_eq!(read(&mut rx), (vec![1], vec![], true));
    }

    #[test]
    fn a_dropped_receiver_no_longer_holds_events() {
        let (tx, rx) = channel(8);
        let mut fast = tx.subscribe();
        tx.send(event(0));
        tx.send(event(1));
        assert_eq!(read(&mut fast), (vec![0, 1], vec![], false));
        assert_eq!(tx.log.lock().events.len(), 2);
        drop(rx);
        assert!(tx.log.lock().events.is_empty());
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_for_an_event_and_for_the_close() {
        let (tx, mut rx) = channel(4);
        let reader = tokio::spawn(async move {
            let first = rx.recv().await;
            let second = rx.recv().await;
            (first, second)
        });
        tokio::task::yield_now().await;
        tx.send(event(0));
        drop(tx);
        let (first, second) = reader.await.expect("reader");
        assert_eq!(first, Received::Event(event(0)));
        assert_eq!(second, Received::Closed);
    }
}
