//! Statements for jobs refused past the doors, both engines side by side:
//!
//! - a job the relay or the worker refuses (a producer wrote raw SQL, or published straight to
//!   the broker) gets a ledger row `dead` with class `invalid` and its reason, so `status` and
//!   `GET /v1/emails/…` tell the truth. Insert-if-absent: an existing row, `sent` above all,
//!   is never overwritten. Nothing was ever sent, so the row has no Message-ID (empty).
//! - the payload of an outbox row, for the HTTP API to tell a retried request from a different
//!   body under the same idempotency key.

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySqlConnection, PgConnection};

use super::Database;

/// MySQL's "Duplicate entry … for key …".
const ER_DUP_ENTRY: u16 = 1062;
/// Longest reason stored; the full text is in the log and the dead letter's header.
const MAX_REASON: usize = 2000;

const PG_INSERT_DEAD: &str = "
INSERT INTO sent_notifications
    (job_id, kind, status, attempts, message_id, last_error, error_class)
VALUES ($1, $2, 'dead', 0, '', $3, 'invalid')
ON CONFLICT (job_id, kind) DO NOTHING";

const MY_INSERT_DEAD: &str = "
INSERT INTO sent_notifications
    (job_id, kind, status, attempts, message_id, last_error, error_class)
VALUES (?, ?, 'dead', 0, '', ?, 'invalid')";

/// Inserts a `dead`/`invalid` row unless `(job_id, kind)` has one; true when inserted.
pub(super) async fn pg_insert_dead(
    conn: &mut PgConnection,
    job_id: &str,
    kind: &str,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(PG_INSERT_DEAD)
        .bind(job_id)
        .bind(kind)
        .bind(storable(reason))
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The same on MySQL: a plain `INSERT` whose duplicate-key error means "already there" (it
/// rolls back this statement only, never the caller's transaction).
pub(super) async fn my_insert_dead(
    conn: &mut MySqlConnection,
    job_id: &str,
    kind: &str,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(MY_INSERT_DEAD)
        .bind(job_id)
        .bind(kind)
        .bind(storable(reason))
        .execute(conn)
        .await;
    match done {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(db))
            if db
                .try_downcast_ref::<MySqlDatabaseError>()
                .is_some_and(|m| m.number() == ER_DUP_ENTRY) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The reason clipped to [`MAX_REASON`] bytes, without NUL (PostgreSQL text cannot hold it).
fn storable(reason: &str) -> String {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].replace('\0', "")
}

impl Database {
    /// Records a job refused past the doors as `dead` (class `invalid`) unless a row exists.
    /// Returns whether a row was inserted.
    pub async fn record_refused(
        &self,
        job_id: &str,
        kind: &str,
        reason: &str,
    ) -> Result<bool, sqlx::Error> {
        match self {
            Database::Postgres(pool) => {
                pg_insert_dead(&mut *pool.acquire().await?, job_id, kind, reason).await
            }
            Database::MySql(pool) => {
                my_insert_dead(&mut *pool.acquire().await?, job_id, kind, reason).await
            }
        }
    }

    /// The stored payload of the outbox row of `(job_id, kind)`, as text.
    pub async fn outbox_payload(
        &self,
        job_id: &str,
        kind: &str,
    ) -> Result<Option<String>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT payload::text FROM mailroom_outbox WHERE job_id = $1 AND kind = $2",
                )
                .bind(job_id)
                .bind(kind)
                .fetch_optional(pool)
                .await
            }
            Database::MySql(pool) => sqlx::query_scalar(
                "SELECT CAST(payload AS CHAR) FROM mailroom_outbox WHERE job_id = ? AND kind = ?",
            )
            .bind(job_id)
            .bind(kind)
            .fetch_optional(pool)
            .await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_reason_is_clipped_on_a_char_boundary_without_nul() {
        let long = "é".repeat(MAX_REASON);
        let clipped = storable(&long);
        assert!(clipped.len() <= MAX_REASON);
        assert!(clipped.chars().all(|c| c == 'é'));
        assert_eq!(storable("a\0b"), "ab");
    }
}
