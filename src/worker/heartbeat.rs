//! The worker's heartbeat: every [`INTERVAL`], at each minute's end and when the worker stops,
//! one transaction writes the worker's row in `mailroom_workers` (host, pid, version, its
//! counters, deliveries in flight, the SMTP circuit) and what it did in the current minute
//! ([`crate::db::fleet`]). The console's overview reads the fleet and its last hour from there.
//!
//! When sending limits are configured, each beat also counts the live workers of the namespace
//! (a third statement) and sets this worker's share of the limits ([`Throttle::set_workers`]).
//!
//! A beat costs two statements every ten seconds whatever the traffic, never a statement per
//! email. A beat that fails (the database is down) is logged once and the next one writes the
//! same absolute values, so nothing is counted twice or lost but the minutes the database missed
//! entirely. Minutes are those of the worker's clock.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tokio_util::sync::CancellationToken;

use super::Stats;
use super::throttle::Throttle;
use crate::db::Database;
use crate::db::fleet::{Beat, Counts};

/// Time between beats (and the most a minute's last beat is late by, rounded to this).
pub const INTERVAL: Duration = Duration::from_secs(10);
/// A worker that beat within this long, and has not stopped, shares the sending limits.
pub const LIVE_WITHIN: Duration = Duration::from_secs(30);
/// How long a stopping worker waits for its last beat (one statement, milliseconds when the
/// database answers).
pub const LAST_BEAT_PATIENCE: Duration = Duration::from_secs(3);
/// Rows not written for this long are deleted (by any worker, at start and every few hours).
const FORGET_AFTER: TimeDelta = TimeDelta::hours(24);
const FORGET_EVERY: u32 = 6 * 360;
const FORGET_BATCH: u32 = 10_000;

/// The worker's identity in the fleet.
pub struct Heartbeat {
    db: Database,
    stats: Arc<Stats>,
    beat: Beat,
    /// The limits whose share follows the fleet's size.
    throttle: Option<Arc<Throttle>>,
}

impl Heartbeat {
    pub fn new(db: Database, stats: Arc<Stats>, namespace: &str) -> Heartbeat {
        let host = hostname::get()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        let pid = std::process::id();
        let worker_id = format!("{}-{pid}-{:08x}", truncate(&host, 60), rand_u32());
        let version = format!(
            "{} ({})",
            env!("CARGO_PKG_VERSION"),
            env!("MAILROOM_GIT_COMMIT")
        );
        Heartbeat {
            db,
            stats,
            beat: Beat {
                worker_id,
                namespace: namespace.to_owned(),
                host: truncate(&host, 255).to_owned(),
                pid,
                version: truncate(&version, 100).to_owned(),
                counts: Counts::default(),
                in_flight: 0,
                circuit_open: false,
                stopping: false,
            },
            throttle: None,
        }
    }

    /// Counts the live workers at each beat and gives `throttle` this worker's share.
    pub fn sharing(mut self, throttle: Arc<Throttle>) -> Heartbeat {
        self.throttle = throttle.is_active().then_some(throttle);
        self
    }

    /// This worker's id in `mailroom_workers`.
    pub fn worker_id(&self) -> &str {
        &self.beat.worker_id
    }

    /// Beats until `stop` is cancelled, then writes the last beat (marked stopped).
    pub async fn run(mut self, stop: CancellationToken) {
        let mut minutes = Minutes::new(Utc::now(), self.counts());
        let mut failing = false;
        for n in 0u32.. {
            if n % FORGET_EVERY == 0 {
                self.forget().await;
            }
            let stopping = stop.is_cancelled();
            self.beat.stopping = stopping;
            let now = Utc::now();
            let (minute, in_minute) = minutes.advance(now, self.counts());
            self.beat.counts = self.counts();
            self.beat.in_flight = self.stats.in_flight();
            self.beat.circuit_open = self.stats.circuit_open().unwrap_or(false);
            match self.db.heartbeat(&self.beat, minute, in_minute).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("heartbeat written again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %crate::db::sqlx_text(&e), "cannot write the heartbeat to mailroom_workers; the console's overview misses this worker until it can");
                }
                Err(_) => {}
            }
            if stopping {
                return;
            }
            self.share().await;
            tokio::select! {
                _ = tokio::time::sleep(next_beat(Utc::now())) => {}
                _ = stop.cancelled() => {}
            }
        }
    }

    /// Sets the throttle's share from the live workers counted now; on a failure the share
    /// stays as it was.
    async fn share(&self) {
        let Some(throttle) = &self.throttle else {
            return;
        };
        match self
            .db
            .live_workers(&self.beat.namespace, LIVE_WITHIN)
            .await
        {
            Ok(n) => {
                let n = u32::try_from(n).unwrap_or(u32::MAX).max(1);
                if n != throttle.workers() {
                    tracing::info!(
                        workers = n,
                        "live workers changed; sending limits shared anew"
                    );
                }
                throttle.set_workers(n);
            }
            Err(e) => {
                tracing::debug!(error = %crate::db::sqlx_text(&e), "cannot count the live workers; the share of the limits stays")
            }
        }
    }

    fn counts(&self) -> Counts {
        let s = self.stats.snapshot();
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Counts {
            sent: n(s.sent),
            retried: n(s.retried),
            dead: n(s.dead_lettered),
        }
    }

    async fn forget(&self) {
        if let Err(e) = self
            .db
            .forget_fleet_before(Utc::now() - FORGET_AFTER, FORGET_BATCH)
            .await
        {
            tracing::debug!(error = %crate::db::sqlx_text(&e), "cannot delete old heartbeats");
        }
    }
}

/// The minute being counted and the counters at its start.
#[derive(Debug)]
struct Minutes {
    minute: DateTime<Utc>,
    base: Counts,
}

impl Minutes {
    fn new(now: DateTime<Utc>, counts: Counts) -> Minutes {
        Minutes {
            minute: minute_of(now),
            base: counts,
        }
    }

    /// The minute to write at `now` and its totals. A beat at or after a minute's end closes
    /// that minute with everything counted so far, and the next beat starts the new one.
    fn advance(&mut self, now: DateTime<Utc>, counts: Counts) -> (DateTime<Utc>, Counts) {
        let current = (self.minute, counts - self.base);
        if minute_of(now) > self.minute {
            self.minute = minute_of(now);
            self.base = counts;
        }
        current
    }
}

fn minute_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::minutes(1)).unwrap_or(t)
}

/// How long until the next beat: [`INTERVAL`], or less to land on the next minute's start.
fn next_beat(now: DateTime<Utc>) -> Duration {
    let to_minute_end = (minute_of(now) + TimeDelta::minutes(1) - now)
        .to_std()
        .unwrap_or_default();
    INTERVAL.min(to_minute_end)
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn rand_u32() -> u32 {
    let id = uuid::Uuid::new_v4();
    let b = id.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn sent(n: i64) -> Counts {
        Counts {
            sent: n,
            ..Counts::default()
        }
    }

    #[test]
    fn a_minute_counts_from_its_start_and_closes_at_the_first_beat_after_it() {
        let mut m = Minutes::new(at("2026-12-01T10:00:30Z"), sent(5));
        assert_eq!(
            m.advance(at("2026-12-01T10:00:40Z"), sent(7)),
            (at("2026-12-01T10:00:00Z"), sent(2))
        );
        // The beat at the minute's end closes 10:00 with everything so far.
        assert_eq!(
            m.advance(at("2026-12-01T10:01:00Z"), sent(9)),
            (at("2026-12-01T10:00:00Z"), sent(4))
        );
        assert_eq!(
            m.advance(at("2026-12-01T10:01:10Z"), sent(10)),
            (at("2026-12-01T10:01:00Z"), sent(1))
        );
    }

    #[test]
    fn a_beat_lands_on_the_next_minute_when_it_is_nearer_than_the_interval() {
        assert_eq!(
            next_beat(at("2026-12-01T10:00:55Z")),
            Duration::from_secs(5)
        );
        assert_eq!(next_beat(at("2026-12-01T10:00:20Z")), INTERVAL);
        assert_eq!(next_beat(at("2026-12-01T10:00:00Z")), INTERVAL);
    }

    #[test]
    fn names_are_cut_on_character_boundaries() {
        assert_eq!(truncate("日本語", 4), "日");
        assert_eq!(truncate("host", 60), "host");
    }
}
