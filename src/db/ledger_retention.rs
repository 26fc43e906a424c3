//! The ledger's horizon: `sent` and `dead` rows created and last updated longer ago than
//! `MAILROOM_LEDGER_RETENTION` are deleted in bounded batches ([`crate::worker::retention`]). A
//! row in `sending`, `failed` or `uncertain` is never deleted: its job is still in flight, or a
//! human has to decide.

use std::time::Duration;

use super::Database;

/// Old rows are found through `created_at`, which a row never changes (an index on `updated_at`
/// would make every record a non-HOT update); a row is deleted only when it was also last updated
/// before the horizon. Rows skipped by a concurrent deleter (another worker) are left to it: no
/// worker waits on another's batch.
const PG_DELETE: &str = "DELETE FROM sent_notifications WHERE (job_id, kind) IN (
    SELECT job_id, kind FROM sent_notifications
    WHERE created_at < now() - make_interval(secs => $1)
      AND updated_at < now() - make_interval(secs => $1)
      AND status IN ('sent', 'dead')
    LIMIT $2 FOR UPDATE SKIP LOCKED)";
/// MySQL/MariaDB: the newest row created before the horizon bounds a walk of the clustered
/// primary key from its start. A `DELETE … ORDER BY` a secondary index sorted every old row of a
/// large table for each batch (3 to 4 s per batch of 1,000 at 10 million rows); the walk reads
/// the oldest rows in key order and stops at the batch's size.
const MYSQL_BOUND: &str = "SELECT id FROM sent_notifications
    WHERE created_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
    ORDER BY created_at DESC LIMIT 1";
const MYSQL_DELETE: &str = "DELETE FROM sent_notifications
    WHERE id <= ? AND status IN ('sent', 'dead')
      AND updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
    ORDER BY id LIMIT ?";

impl Database {
    /// Deletes at most `limit` `sent` or `dead` rows created and last updated more than `age`
    /// ago; returns how many.
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
                let bound: Option<i64> = sqlx::query_scalar(MYSQL_BOUND)
                    .bind(micros)
                    .fetch_optional(pool)
                    .await?;
                let Some(bound) = bound else {
                    return Ok(0);
                };
                sqlx::query(MYSQL_DELETE)
                    .bind(bound)
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
