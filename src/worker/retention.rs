//! The ledger's retention (`MAILROOM_LEDGER_RETENTION`): every worker deletes `sent` and `dead`
//! rows of `sent_notifications` created and last updated longer ago than the retention, in
//! batches of [`BATCH`], at start and then every [`EVERY`] (sooner for short retentions). On
//! PostgreSQL batches skip rows another worker is deleting, so N workers share the work instead
//! of queueing on it.
//!
//! The retention is the **dedup horizon**: a copy of a job that arrives after its row is gone is
//! claimed as a new job and sent again. So [`check`] refuses a retention shorter than the
//! longest a copy can legitimately arrive late: the whole retry schedule (every attempt's delay
//! and lease) plus the time a dead letter may wait before an operator replays it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Stats;
use crate::db::Database;

/// Rows deleted per statement: bounded, so a batch never holds many locks for long.
pub const BATCH: i64 = 1000;
/// The longest time between two passes.
const EVERY: Duration = Duration::from_secs(60);

/// What a copy's latest arrival depends on.
#[derive(Clone, Debug)]
pub struct Horizon<'a> {
    pub retry_delays: &'a [Duration],
    pub max_attempts: i32,
    pub lease: Duration,
    /// How long replayed or purged dead letters are kept (a replay comes no later).
    pub dead_letter_retention: Duration,
}

impl Horizon<'_> {
    /// The latest a copy of a settled job can arrive: a lease and a retry delay for every
    /// attempt (the last tier repeats once the schedule runs out), then the dead-letter
    /// retention.
    pub fn latest_copy(&self) -> Duration {
        let attempts = usize::try_from(self.max_attempts.max(1)).unwrap_or(1);
        let delays: Duration = (0..attempts - 1)
            .map(|i| {
                let tier = i.min(self.retry_delays.len().saturating_sub(1));
                self.retry_delays.get(tier).copied().unwrap_or_default()
            })
            .sum();
        delays
            + self.lease * u32::try_from(attempts).unwrap_or(u32::MAX)
            + self.dead_letter_retention
    }
}

/// Refuses a retention shorter than `horizon` needs; `None` keeps every row.
pub fn check(retention: Option<Duration>, horizon: &Horizon) -> Result<(), String> {
    let Some(retention) = retention else {
        return Ok(());
    };
    let needed = horizon.latest_copy();
    if retention < needed {
        return Err(format!(
            "MAILROOM_LEDGER_RETENTION {} is shorter than the {} a copy of a job can arrive late (retry schedule × MAILROOM_MAX_ATTEMPTS, leases, and MAILROOM_DEAD_LETTER_RETENTION): such a copy would be sent again; use at least {} (or 0 to keep every row)",
            humantime::format_duration(retention),
            humantime::format_duration(round_up(needed)),
            humantime::format_duration(round_up(needed)),
        ));
    }
    Ok(())
}

fn round_up(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// Deletes settled rows past `retention` until `stop`.
pub async fn run(db: Database, retention: Duration, stats: Arc<Stats>, stop: CancellationToken) {
    let every = (retention / 2).clamp(Duration::from_secs(1), EVERY);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let mut deleted = 0;
        loop {
            match db.delete_settled_before(retention, BATCH).await {
                Ok(n) => {
                    deleted += n;
                    stats.ledger_deleted.fetch_add(n, Ordering::Relaxed);
                    if n < BATCH as u64 || stop.is_cancelled() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %crate::db::sqlx_text(&e), "ledger retention failed; trying again later");
                    break;
                }
            }
        }
        if deleted > 0 {
            tracing::info!(deleted, "deleted settled ledger rows past retention");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn horizon(delays: &[Duration], max_attempts: i32) -> Horizon<'_> {
        Horizon {
            retry_delays: delays,
            max_attempts,
            lease: S(120),
            dead_letter_retention: S(86_400),
        }
    }

    #[test]
    fn the_last_retry_tier_repeats_for_the_attempts_beyond_the_schedule() {
        let delays = [S(5), S(30), S(120), S(600), S(3600)];
        // 8 attempts: 7 retries = 5 + 30 + 120 + 600 + 3600 × 3, and 8 leases.
        let h = horizon(&delays, 8);
        assert_eq!(
            h.latest_copy(),
            S(5 + 30 + 120 + 600 + 3 * 3600 + 8 * 120 + 86_400)
        );
        assert_eq!(horizon(&delays, 1).latest_copy(), S(120 + 86_400));
    }

    #[test]
    fn a_retention_shorter_than_the_horizon_is_refused_naming_the_minimum() {
        let delays = [S(60)];
        let h = horizon(&delays, 2);
        let needed = S(60 + 240 + 86_400);
        assert_eq!(check(Some(needed), &h), Ok(()));
        assert_eq!(check(None, &h), Ok(()));
        let err = check(Some(needed - S(1)), &h).unwrap_err();
        assert!(err.contains("use at least 1day 5m"), "{err}");
    }
}
