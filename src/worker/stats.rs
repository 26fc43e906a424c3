//! Counters of what the worker did, shared by its tasks. Tests (and later the metrics
//! endpoint) read them; every settled delivery bumps a generation number that can be awaited.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

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
            settled: watch::channel(0).0,
        }
    }
}

impl Stats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
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
