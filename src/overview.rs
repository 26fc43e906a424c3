//! The pipeline at a glance: the data of `GET /v1/overview` and the console's Overview page. Sent,
//! retried and dead per minute over the last hour and the workers seen (from the workers'
//! heartbeats, [`crate::db::fleet`]); the queue depths (work, retry tiers, dead); the outbox
//! backlog and the relay lag; how many workers have their SMTP circuit open.
//!
//! Each source answers within a bound or is left out with a line in `unavailable` saying
//! which and why: an overview is most needed when something is down, so it never waits on it.

use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;

use crate::db::Database;
use crate::db::fleet::{Counts, Minute, WorkerSeen};
use crate::worker::heartbeat::INTERVAL;

/// How long each source may take.
const SOURCE_TIMEOUT: Duration = Duration::from_secs(2);
/// The window of the per-minute counts and of the workers listed.
const WINDOW: TimeDelta = TimeDelta::hours(1);

/// The pipeline at a glance.
#[derive(Debug, Serialize)]
pub struct Overview {
    pub namespace: String,
    pub generated_at: DateTime<Utc>,
    /// Every minute of the last hour, oldest first, zeros where no worker counted anything.
    pub minutes: Vec<Minute>,
    /// The sum of `minutes`.
    pub last_hour: Counts,
    pub workers: Vec<FleetMember>,
    /// Workers running now whose SMTP circuit is open.
    pub circuits_open: usize,
    pub queues: Option<Queues>,
    pub outbox: Option<Outbox>,
    /// One line per source that did not answer.
    pub unavailable: Vec<String>,
}

/// A worker seen in the last hour, with what its heartbeat says of it now.
#[derive(Debug, Serialize)]
pub struct FleetMember {
    #[serde(flatten)]
    pub worker: WorkerSeen,
    /// `running`, `silent` (no beat for three intervals: hung, partitioned or killed) or
    /// `stopped` (its last beat said so).
    pub state: &'static str,
}

/// The broker's queues as last read.
#[derive(Debug, Serialize)]
pub struct Queues {
    /// Seconds since they were read (near 0 when this request read them).
    pub age_seconds: f64,
    pub queues: Vec<QueueDepth>,
}

#[derive(Debug, Serialize)]
pub struct QueueDepth {
    /// `work`, `retry` or `dead`.
    pub role: &'static str,
    pub tier: Option<String>,
    pub messages: u32,
    pub consumers: u32,
}

/// The transactional outbox now.
#[derive(Debug, Serialize)]
pub struct Outbox {
    pub pending: i64,
    pub parked: i64,
    /// Age of the oldest pending row (the relay lag); 0 when none.
    pub relay_lag_seconds: f64,
}

/// Where the queue depths come from: the API's kept broker connection (`http::metrics`).
pub trait QueueSource: Send + Sync {
    /// Fresh depths, or the last ones read with their age; `None` before any read succeeded.
    fn depths(&self) -> Pin<Box<dyn Future<Output = Option<Queues>> + Send + '_>>;
}

/// Gathers the overview of `namespace`; `queues` is `None` where no broker is configured.
pub async fn overview(
    db: &Database,
    queues: Option<&dyn QueueSource>,
    namespace: &str,
) -> Overview {
    let now = Utc::now();
    let since = now - WINDOW;
    let (minutes, workers, outbox, depths) = tokio::join!(
        bounded(db.fleet_minutes(namespace, since)),
        bounded(db.workers_seen(namespace, since)),
        bounded(async { tokio::try_join!(db.outbox_backlog(), db.oldest_unpublished_age()) }),
        async {
            match queues {
                Some(q) => q.depths().await,
                None => None,
            }
        },
    );
    let mut unavailable = Vec::new();
    let minutes = every_minute(
        take(&mut unavailable, "worker minutes", minutes).unwrap_or_default(),
        now,
    );
    let workers: Vec<FleetMember> = take(&mut unavailable, "workers", workers)
        .unwrap_or_default()
        .into_iter()
        .map(FleetMember::of)
        .collect();
    let outbox = take(&mut unavailable, "outbox", outbox).map(|((pending, parked), age)| Outbox {
        pending,
        parked,
        relay_lag_seconds: age.unwrap_or(0.0),
    });
    let queues = match (queues, depths) {
        (None, _) => None,
        (Some(_), None) => {
            unavailable.push("queues: the broker did not tell the queue depths".into());
            None
        }
        (Some(_), Some(queues)) => Some(queues),
    };
    let last_hour = minutes.iter().fold(Counts::default(), |a, m| Counts {
        sent: a.sent + m.sent,
        retried: a.retried + m.retried,
        dead: a.dead + m.dead,
    });
    let circuits_open = workers
        .iter()
        .filter(|w| w.state == "running" && w.worker.circuit_open)
        .count();
    Overview {
        namespace: namespace.to_owned(),
        generated_at: now,
        minutes,
        last_hour,
        workers,
        circuits_open,
        queues,
        outbox,
        unavailable,
    }
}

impl FleetMember {
    fn of(worker: WorkerSeen) -> FleetMember {
        let state = if worker.stopped_at.is_some() {
            "stopped"
        } else if worker.silent_for > 3.0 * INTERVAL.as_secs_f64() {
            "silent"
        } else {
            "running"
        };
        FleetMember { worker, state }
    }
}

/// `found` with a zero for every minute of the hour before `now` that has no row.
fn every_minute(found: Vec<Minute>, now: DateTime<Utc>) -> Vec<Minute> {
    let last = now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now);
    (0..60)
        .rev()
        .map(|ago| last - TimeDelta::minutes(ago))
        .map(|minute| {
            found
                .iter()
                .find(|m| m.minute == minute)
                .cloned()
                .unwrap_or(Minute {
                    minute,
                    sent: 0,
                    retried: 0,
                    dead: 0,
                })
        })
        .collect()
}

/// The value, or its error noted as unavailable.
fn take<T>(unavailable: &mut Vec<String>, what: &str, r: Result<T, String>) -> Option<T> {
    r.map_err(|e| unavailable.push(format!("{what}: {e}"))).ok()
}

/// `read` within [`SOURCE_TIMEOUT`], its error as a line.
async fn bounded<T>(read: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, String> {
    match tokio::time::timeout(SOURCE_TIMEOUT, read).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(crate::db::sqlx_text(&e)),
        Err(_) => Err(format!("no answer within {}s", SOURCE_TIMEOUT.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hour_has_sixty_minutes_with_zeros_where_nothing_was_counted() {
        let now: DateTime<Utc> = "2026-12-01T10:30:20Z".parse().unwrap();
        let seen = Minute {
            minute: "2026-12-01T10:29:00Z".parse().unwrap(),
            sent: 4,
            retried: 1,
            dead: 0,
        };
        let hour = every_minute(vec![seen.clone()], now);
        assert_eq!(hour.len(), 60);
        assert_eq!(
            hour[59].minute,
            "2026-12-01T10:30:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert_eq!(
            hour[0].minute,
            "2026-12-01T09:31:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert_eq!(hour[58], seen);
        assert_eq!(hour.iter().map(|m| m.sent).sum::<i64>(), 4);
    }
}
