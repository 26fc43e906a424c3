//! `mailroom_workers` and `mailroom_worker_minutes`: the workers that run and what they did in
//! each minute, written by each worker's heartbeat ([`crate::worker::heartbeat`]) every few
//! seconds and read by the console's overview. Every write sets absolute values (the worker's
//! counters, a minute's totals), so a write that is retried or lost changes nothing twice.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::Database;

/// A worker's row as its heartbeat writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beat {
    pub worker_id: String,
    pub namespace: String,
    pub host: String,
    pub pid: u32,
    pub version: String,
    pub counts: Counts,
    pub in_flight: i64,
    pub circuit_open: bool,
    /// The worker stops: its last beat.
    pub stopping: bool,
}

/// Sent, retried and dead-lettered deliveries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub sent: i64,
    pub retried: i64,
    pub dead: i64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, base: Counts) -> Counts {
        Counts {
            sent: self.sent - base.sent,
            retried: self.retried - base.retried,
            dead: self.dead - base.dead,
        }
    }
}

/// A worker as the fleet listing shows it.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
pub struct WorkerSeen {
    pub worker_id: String,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub started_at: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub sent: i64,
    pub retried: i64,
    pub dead: i64,
    pub in_flight: i32,
    pub circuit_open: bool,
    /// Seconds since `last_seen`, by the database's clock.
    pub silent_for: f64,
}

/// The whole fleet's totals of one minute.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
pub struct Minute {
    pub minute: DateTime<Utc>,
    pub sent: i64,
    pub retried: i64,
    pub dead: i64,
}

const PG_BEAT: &str = "INSERT INTO mailroom_workers \
    (worker_id, namespace, host, pid, version, sent, retried, dead, in_flight, circuit_open, stopped_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, CASE WHEN $11 THEN now() END) \
    ON CONFLICT (worker_id) DO UPDATE SET last_seen = now(), sent = excluded.sent, \
    retried = excluded.retried, dead = excluded.dead, in_flight = excluded.in_flight, \
    circuit_open = excluded.circuit_open, stopped_at = excluded.stopped_at";
const MYSQL_BEAT: &str = "INSERT INTO mailroom_workers \
    (worker_id, namespace, host, pid, version, sent, retried, dead, in_flight, circuit_open, stopped_at) \
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, CASE WHEN ? THEN UTC_TIMESTAMP(6) END) \
    ON DUPLICATE KEY UPDATE last_seen = UTC_TIMESTAMP(6), sent = VALUES(sent), \
    retried = VALUES(retried), dead = VALUES(dead), in_flight = VALUES(in_flight), \
    circuit_open = VALUES(circuit_open), stopped_at = VALUES(stopped_at)";

const PG_MINUTE: &str = "INSERT INTO mailroom_worker_minutes \
    (minute, worker_id, namespace, sent, retried, dead) VALUES ($1, $2, $3, $4, $5, $6) \
    ON CONFLICT (minute, worker_id) DO UPDATE SET sent = excluded.sent, \
    retried = excluded.retried, dead = excluded.dead";
const MYSQL_MINUTE: &str = "INSERT INTO mailroom_worker_minutes \
    (minute, worker_id, namespace, sent, retried, dead) VALUES (?, ?, ?, ?, ?, ?) \
    ON DUPLICATE KEY UPDATE sent = VALUES(sent), retried = VALUES(retried), dead = VALUES(dead)";

const PG_WORKERS: &str = "SELECT worker_id, host, pid, version, started_at, last_seen, stopped_at, \
    sent, retried, dead, in_flight, circuit_open, \
    EXTRACT(EPOCH FROM now() - last_seen)::float8 AS silent_for \
    FROM mailroom_workers WHERE namespace = $1 AND last_seen >= $2 ORDER BY started_at, worker_id";
const MYSQL_WORKERS: &str = "SELECT CAST(worker_id AS CHAR) AS worker_id, host, pid, version, \
    started_at, last_seen, stopped_at, sent, retried, dead, in_flight, circuit_open, \
    TIMESTAMPDIFF(MICROSECOND, last_seen, UTC_TIMESTAMP(6)) / 1e6 AS silent_for \
    FROM mailroom_workers WHERE namespace = ? AND last_seen >= ? ORDER BY started_at, worker_id";

const PG_MINUTES: &str = "SELECT minute, SUM(sent)::int8 AS sent, SUM(retried)::int8 AS retried, \
    SUM(dead)::int8 AS dead FROM mailroom_worker_minutes WHERE namespace = $1 AND minute >= $2 \
    GROUP BY minute ORDER BY minute";
const MYSQL_MINUTES: &str = "SELECT minute, CAST(SUM(sent) AS SIGNED) AS sent, \
    CAST(SUM(retried) AS SIGNED) AS retried, CAST(SUM(dead) AS SIGNED) AS dead \
    FROM mailroom_worker_minutes WHERE namespace = ? AND minute >= ? \
    GROUP BY minute ORDER BY minute";

impl Database {
    /// Writes a worker's row and the totals of its current `minute` (absolute values).
    pub async fn heartbeat(
        &self,
        beat: &Beat,
        minute: DateTime<Utc>,
        in_minute: Counts,
    ) -> sqlx::Result<()> {
        let pid = i64::from(beat.pid);
        let c = beat.counts;
        match self {
            Database::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query(PG_BEAT)
                    .bind(&beat.worker_id)
                    .bind(&beat.namespace)
                    .bind(&beat.host)
                    .bind(i32::try_from(pid).unwrap_or(i32::MAX))
                    .bind(&beat.version)
                    .bind(c.sent)
                    .bind(c.retried)
                    .bind(c.dead)
                    .bind(i32::try_from(beat.in_flight).unwrap_or(i32::MAX))
                    .bind(beat.circuit_open)
                    .bind(beat.stopping)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(PG_MINUTE)
                    .bind(minute)
                    .bind(&beat.worker_id)
                    .bind(&beat.namespace)
                    .bind(in_minute.sent)
                    .bind(in_minute.retried)
                    .bind(in_minute.dead)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            }
            Database::MySql(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query(MYSQL_BEAT)
                    .bind(&beat.worker_id)
                    .bind(&beat.namespace)
                    .bind(&beat.host)
                    .bind(pid)
                    .bind(&beat.version)
                    .bind(c.sent)
                    .bind(c.retried)
                    .bind(c.dead)
                    .bind(beat.in_flight)
                    .bind(beat.circuit_open)
                    .bind(beat.stopping)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(MYSQL_MINUTE)
                    .bind(minute)
                    .bind(&beat.worker_id)
                    .bind(&beat.namespace)
                    .bind(in_minute.sent)
                    .bind(in_minute.retried)
                    .bind(in_minute.dead)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            }
        }
    }

    /// The workers of `namespace` that beat within `within` (by the database's clock) and have
    /// not stopped.
    pub async fn live_workers(
        &self,
        namespace: &str,
        within: std::time::Duration,
    ) -> sqlx::Result<i64> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM mailroom_workers WHERE namespace = $1 \
                     AND stopped_at IS NULL AND last_seen >= now() - make_interval(secs => $2)",
                )
                .bind(namespace)
                .bind(within.as_secs_f64())
                .fetch_one(pool)
                .await
            }
            Database::MySql(pool) => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM mailroom_workers WHERE namespace = ? \
                     AND stopped_at IS NULL AND last_seen >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
                )
                .bind(namespace)
                .bind(i64::try_from(within.as_micros()).unwrap_or(i64::MAX))
                .fetch_one(pool)
                .await
            }
        }
    }

    /// The workers of `namespace` seen since `since`, oldest first.
    pub async fn workers_seen(
        &self,
        namespace: &str,
        since: DateTime<Utc>,
    ) -> sqlx::Result<Vec<WorkerSeen>> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query_as(PG_WORKERS)
                    .bind(namespace)
                    .bind(since)
                    .fetch_all(pool)
                    .await
            }
            Database::MySql(pool) => {
                sqlx::query_as(MYSQL_WORKERS)
                    .bind(namespace)
                    .bind(since)
                    .fetch_all(pool)
                    .await
            }
        }
    }

    /// The fleet's totals of every minute of `namespace` since `since`, in order; minutes in
    /// which no worker wrote are absent.
    pub async fn fleet_minutes(
        &self,
        namespace: &str,
        since: DateTime<Utc>,
    ) -> sqlx::Result<Vec<Minute>> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query_as(PG_MINUTES)
                    .bind(namespace)
                    .bind(since)
                    .fetch_all(pool)
                    .await
            }
            Database::MySql(pool) => {
                sqlx::query_as(MYSQL_MINUTES)
                    .bind(namespace)
                    .bind(since)
                    .fetch_all(pool)
                    .await
            }
        }
    }

    /// Deletes minutes and workers not written since `before`, at most `limit` rows of each.
    pub async fn forget_fleet_before(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let (minutes, workers) = match self {
            Database::Postgres(_) => (
                "DELETE FROM mailroom_worker_minutes WHERE (minute, worker_id) IN \
                 (SELECT minute, worker_id FROM mailroom_worker_minutes WHERE minute < $1 LIMIT $2)",
                "DELETE FROM mailroom_workers WHERE worker_id IN \
                 (SELECT worker_id FROM mailroom_workers WHERE last_seen < $1 LIMIT $2)",
            ),
            Database::MySql(_) => (
                "DELETE FROM mailroom_worker_minutes WHERE minute < ? LIMIT ?",
                "DELETE FROM mailroom_workers WHERE last_seen < ? LIMIT ?",
            ),
        };
        let mut deleted = 0;
        for sql in [minutes, workers] {
            deleted += match self {
                Database::Postgres(pool) => {
                    let q = sqlx::query(sql).bind(before).bind(i64::from(limit));
                    q.execute(pool).await?.rows_affected()
                }
                Database::MySql(pool) => {
                    let q = sqlx::query(sql).bind(before).bind(limit);
                    q.execute(pool).await?.rows_affected()
                }
            };
        }
        Ok(deleted)
    }
}
