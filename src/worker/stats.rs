//! Counters of what the worker did, shared by its tasks. Tests and `/metrics`
//! ([`crate::metrics`]) read them; every settled delivery bumps a generation number that can be
//! awaited.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::db::group::LedgerStats;
use crate::metrics::{END_TO_END_BUCKETS, Histogram, LabelCounts, SMTP_BUCKETS};

/// Counts since the worker started.
#[derive(Debug)]
pub struct Stats {
    pub received: AtomicU64,
    pub sent: AtomicU64,
    pub duplicates: AtomicU64,
    pub retried: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Settle actions the broker may not have seen (ack on a closed channel, failed republish).
    pub unsettled: AtomicU64,
    /// Claims given back unused because their lease could not cover a whole send.
    pub given_back: AtomicU64,
    /// Longest wait for an SMTP session so far, in microseconds (before any claim).
    longest_session_wait_us: AtomicU64,
    /// Dead-lettered, by (kind, error class).
    dead_by: Mutex<LabelCounts>,
    in_flight: AtomicI64,
    /// Duration of each SMTP send, whatever its result.
    pub smtp_latency: Histogram,
    /// Job `created_at` → SMTP accepted.
    pub end_to_end: Histogram,
    /// The claim ledger's group commits.
    pub ledger: Arc<LedgerStats>,
    settled: watch::Sender<u64>,
}

/// A snapshot of [`Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub received: u64,
    pub sent: u64,
    pub duplicates: u64,
    pub retried: u64,
    pub dead_lettered: u64,
    pub unsettled: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            unsettled: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
            longest_session_wait_us: AtomicU64::new(0),
            dead_by: Mutex::default(),
            in_flight: AtomicI64::new(0),
            smtp_latency: Histogram::new(SMTP_BUCKETS),
            end_to_end: Histogram::new(END_TO_END_BUCKETS),
            ledger: Arc::default(),
            settled: watch::channel(0).0,
        }
    }
}

impl Stats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one dead letter of `kind` and `class` (also in the total).
    pub(crate) fn dead_lettered(&self, kind: &str, class: &str) {
        Stats::bump(&self.dead_lettered);
        let mut by = self.dead_by.lock().unwrap_or_else(|e| e.into_inner());
        *by.entry((kind.to_owned(), class.to_owned())).or_default() += 1;
    }

    /// Dead letters by (kind, class).
    pub fn dead_lettered_by(&self) -> LabelCounts {
        self.dead_by
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A delivery waited `wait` for its SMTP session.
    pub(crate) fn observe_session_wait(&self, wait: std::time::Duration) {
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.longest_session_wait_us
            .fetch_max(us, Ordering::Relaxed);
    }

    /// The longest any delivery waited for an SMTP session (it held no claim meanwhile).
    pub fn longest_session_wait(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.longest_session_wait_us.load(Ordering::Relaxed))
    }

    /// A delivery started (`+1`) or settled (`-1`).
    pub(crate) fn in_flight_add(&self, n: i64) {
        self.in_flight.fetch_add(n, Ordering::Relaxed);
    }

    /// Deliveries being processed now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Marks one delivery as settled and wakes whoever waits on [`Stats::wait_until`].
    pub(crate) fn settled(&self) {
        self.settled.send_modify(|n| *n += 1);
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            received: get(&self.received),
            sent: get(&self.sent),
            duplicates: get(&self.duplicates),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            unsettled: get(&self.unsettled),
        }
    }

    /// Waits until `done` holds for a snapshot taken after a settle (or right away).
    pub async fn wait_until(&self, mut done: impl FnMut(&Snapshot) -> bool) {
        let mut rx = self.settled.subscribe();
        loop {
            if done(&self.snapshot()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}
