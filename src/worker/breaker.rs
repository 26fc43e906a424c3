//! The SMTP circuit breaker: when the SMTP server cannot be reached, stop taking deliveries
//! instead of burning every job's attempts (and then the whole backlog) into the dead-letter
//! queue. After [`THRESHOLD`] consecutive connection-level failures (refused, unreachable, no
//! greeting in time) the circuit opens: the consumer loop stops pulling deliveries (the broker
//! keeps them, unacknowledged or ready), and probes the server with capped exponential backoff
//! until it answers; then the circuit closes and consumption resumes. Any answer from the
//! server (a 250, or even a 4xx/5xx reply) proves it is up and resets the count. Deliveries
//! already in flight when the circuit opens end as usual (a retry tier).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::smtp::{Mailer, SendError};

/// Consecutive connection-level failures that open the circuit.
pub const THRESHOLD: u32 = 5;
/// First and longest wait between probes while the circuit is open.
const PROBE_MIN: Duration = Duration::from_millis(250);
const PROBE_MAX: Duration = Duration::from_secs(30);

pub struct Breaker {
    consecutive: AtomicU32,
    open: watch::Sender<bool>,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            consecutive: AtomicU32::new(0),
            open: watch::Sender::new(false),
        }
    }
}

/// Whether a send failed before the server said anything: the server (or the way to it) is
/// down, not this job's fault.
pub fn is_connection_failure(result: &Result<String, SendError>) -> bool {
    matches!(result, Err(SendError::Unreachable { .. }))
}

impl Breaker {
    /// Counts one send's result.
    pub fn record(&self, result: &Result<String, SendError>) {
        if !is_connection_failure(result) {
            self.consecutive.store(0, Ordering::Relaxed);
            return;
        }
        let n = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= THRESHOLD && !*self.open.borrow() {
            self.open.send_replace(true);
            tracing::warn!(
                consecutive_failures = n,
                "SMTP server unreachable: circuit open, pausing consumption"
            );
        }
    }

    /// The circuit's state as it changes (`true`: open), for `/metrics`.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.open.subscribe()
    }

    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Probes the SMTP server until it answers (then closes the circuit) or `shutdown`.
    pub async fn wait_until_closed(&self, mailer: &Mailer, shutdown: &CancellationToken) {
        let mut waits = ExponentialBuilder::default()
            .with_min_delay(PROBE_MIN)
            .with_max_delay(PROBE_MAX)
            .with_jitter()
            .without_max_times()
            .build();
        let mut probes = 0u32;
        while self.is_open() {
            let wait = waits.next().unwrap_or(PROBE_MAX);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return,
            }
            probes += 1;
            if mailer.probe().await {
                self.consecutive.store(0, Ordering::Relaxed);
                self.open.send_replace(false);
                tracing::info!(
                    probes,
                    "SMTP server answers again: circuit closed, resuming consumption"
                );
            } else {
                tracing::info!(probes, waited = ?wait, "SMTP server still unreachable; circuit stays open");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> Result<String, SendError> {
        Err(SendError::Unreachable {
            reason: "Connection error: Connection refused (os error 111)".into(),
        })
    }

    #[test]
    fn opens_after_consecutive_connection_failures_only() {
        let b = Breaker::default();
        for _ in 0..THRESHOLD - 1 {
            b.record(&refused());
        }
        assert!(!b.is_open());
        // A reply, even a refusal, proves the server is up.
        b.record(&Err(SendError::Transient {
            reason: "transient error (451): try later".into(),
        }));
        for _ in 0..THRESHOLD - 1 {
            b.record(&refused());
        }
        assert!(!b.is_open());
        b.record(&refused());
        assert!(b.is_open());
    }
}
