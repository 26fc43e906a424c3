//! Latency histograms with fixed buckets, counted lock-free as the worker observes durations.
//! A leaf: it knows nothing of Prometheus or of the rest of mailroom; `/metrics`
//! ([`crate::http::metrics`]) reads the counts and writes the text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// SMTP send durations: loopback relays answer in milliseconds, remote ones in seconds, and the
/// whole-send timeout defaults to 60 s.
pub const SMTP_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// End-to-end latencies: sub-second when all is well, up to the longest retry tier (1 h).
pub const END_TO_END_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// The steps of a delivery around its send: a commit of the claim ledger (its group's, on a
/// loaded worker), a wait in line or for a connection. Sub-millisecond when idle; a claimed
/// delivery waits at most its lease (3 minutes by default).
pub const STEP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 180.0,
];

/// A histogram with fixed upper bounds (seconds), lock-free to observe.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts per bound; the `+Inf` bucket is `count`.
    buckets: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Each upper bound with the observations at or below it (cumulative), in order; the
    /// `+Inf` bucket is [`Histogram::count`].
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut cumulative = 0;
        self.bounds
            .iter()
            .zip(&self.buckets)
            .map(|(bound, n)| {
                cumulative += n.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect()
    }

    /// The sum of the observations, in seconds (kept in microseconds).
    pub fn sum_seconds(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// The mean observation; zero before the first.
    pub fn mean(&self) -> Duration {
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(self.sum_micros.load(Ordering::Relaxed) / count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_counts_include_every_smaller_bucket() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        assert_eq!(h.cumulative(), vec![(0.1, 1), (1.0, 2)]);
        assert_eq!(h.count(), 3);
        assert_eq!(h.sum_seconds(), 5.55);
        assert_eq!(h.mean(), Duration::from_millis(1850));
        assert_eq!(Histogram::new(&[1.0]).mean(), Duration::ZERO);
    }
}
