//! The ledger's horizon: `sent` and `dead` rows older than `MAILROOM_LEDGER_RETENTION` are
//! deleted in bounded batches ([`crate::worker::retention`]). A row in `sending`, `failed` or
//! `uncertain` is never deleted: its job is still in flight, or a human has to decide.

use std::time::Duration;

use super::Database;

/// Rows skipped by a concurrent deleter (another worker) are left to it: no worker waits on
/// another's batch.
const PG_DELETE: &str = "DELETE FROM sent_notifications WHERE (job_id, kind) IN (
    SELECT job_id, kind FROM sent_notifications
    WHERE status IN ('sent', 'dead') AND updated_at < now() - make_interval(secs => $1)
    LIMIT $2 FOR UPDATE SKIP LOCKED)";
const MYSQL_DELETE: &str = "DELETE FROM sent_notifications
    WHERE status IN ('sent', 'dead') AND updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
    ORDER BY updated_at LIMIT ?";

impl Database {
    /// Deletes at most `limit` `sent` or `dead` rows last updated more than `age` ago; returns
    /// how many.
    pub async fn delete_settled_before(&self, age: Duration, limit: i64) -> sqlx::Result<u64> {
        let done = match self {
            Database::Postgres(pool) => sqlx::query(PG_DELETE)
                .bind(age.as_secs_f64())
                .bind(limit)
                .execute(pool)
                .await?
                .rows_affected(),
            Database::MySql(pool) => {
                let micros = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
                sqlx::query(MYSQL_DELETE)
                    .bind(micros)
                    .bind(limit)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
        };
        Ok(done)
    }
}
