//! MySQL 8 / MariaDB ≥ 10.6 (InnoDB) statements of the claim ledger and the outbox; those of
//! group commit are in `mysql/group.rs`.
//!
//! MySQL has no `ON CONFLICT … RETURNING`, so the claim is a plain `INSERT` whose duplicate-key
//! error (1062) is caught, then a guarded `UPDATE` that takes over only a claimable row. Neither
//! `INSERT IGNORE` (it turns unrelated errors into warnings) nor `ON DUPLICATE KEY UPDATE` row
//! counts (sqlx sets CLIENT_FOUND_ROWS, so "inserted" and "updated" look alike) are used; the
//! guarded `UPDATE`'s count is exact because its WHERE clause is the guard.
//!
//! `job_id` is `VARBINARY`: keys compare byte for byte, with no PAD SPACE collation making
//! `same` and `same ` one job, so it is read back with `CAST(job_id AS CHAR …)`.
//!
//! Times are `DATETIME(6)` in UTC from the database clock (`UTC_TIMESTAMP(6)`), whatever the
//! session time zone, so leases agree across workers and producers in any language.

// Before the statements that use its macro.
#[macro_use]
mod history;

use std::time::Duration;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySqlConnection, MySqlPool, QueryBuilder, Row};
use uuid::Uuid;

use super::rows::{
    Claim, ClaimRequest, ExistingClaim, LedgerStatus, Notification, OutboxRow, OutboxStatus,
    PendingRow, Record, Suppression, SuppressionRow,
};

pub(super) mod dead_letters;
mod group;
pub(super) use group::write_group;

/// MySQL's "Duplicate entry … for key …".
const ER_DUP_ENTRY: u16 = 1062;

fn is_duplicate_key(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.try_downcast_ref::<MySqlDatabaseError>().is_some_and(|m| m.number() == ER_DUP_ENTRY))
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

// ---- the claim ledger ----

const INSERT_CLAIM: &str = "
INSERT INTO sent_notifications
    (job_id, kind, status, attempts, lease_until, claim_token, message_id, recipient, claimed_at)
VALUES (?, ?, 'sending', 1, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?, ?, ?, UTC_TIMESTAMP(6))";

/// Takes over a row that may be retried; the same guard as PostgreSQL's `ON CONFLICT … WHERE`.
const TAKE_OVER: &str = "
UPDATE sent_notifications
SET status = 'sending',
    attempts = attempts + 1,
    lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    claim_token = ?,
    recipient = ?,
    claimed_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE job_id = ? AND kind = ?
  AND (status = 'failed'
       OR (? AND status = 'sending' AND lease_until < UTC_TIMESTAMP(6))
       OR (? AND status = 'uncertain')
       OR (? AND status IN ('dead', 'uncertain', 'failed')))";

const READ_CLAIM: &str = "
SELECT status, attempts, claim_token, error_class, last_error,
       CASE WHEN lease_until > UTC_TIMESTAMP(6)
            THEN TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) END AS lease_left_us
FROM sent_notifications WHERE job_id = ? AND kind = ?";

pub(super) async fn claim(pool: &MySqlPool, req: &ClaimRequest<'_>) -> Result<Claim, sqlx::Error> {
    let token = req.token;
    if insert_claim(pool, req).await? {
        return Ok(Claim::taken(1, token, &[], &[]));
    }
    let taken = take_over(pool, req).await?;
    // A fresh statement (READ COMMITTED) sees the row as it is now, ours or someone else's.
    let Some(row) = sqlx::query(READ_CLAIM)
        .bind(req.job_id)
        .bind(req.kind)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(Claim::Refused(None));
    };
    let attempts: i32 = row.try_get("attempts")?;
    let holder: Option<Uuid> = row.try_get("claim_token")?;
    if taken == 1 && holder == Some(token) {
        return Ok(Claim::taken(attempts, token, &[], &[]));
    }
    // Taken over and lost again within the two statements (a lease shorter than a round trip,
    // in practice never): report the row as it is; the delivery retries shortly.
    Ok(Claim::Refused(Some(existing_claim(&row)?)))
}

/// Inserts the claim's row; false when `(job_id, kind)` has one already.
async fn insert_claim(pool: &MySqlPool, req: &ClaimRequest<'_>) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(INSERT_CLAIM)
        .bind(req.job_id)
        .bind(req.kind)
        .bind(micros(req.lease))
        .bind(req.token)
        .bind(req.message_id)
        .bind(req.recipient.as_deref())
        .execute(pool)
        .await;
    match inserted {
        Ok(_) => Ok(true),
        Err(e) if is_duplicate_key(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes the existing row over if it may be retried; the number of rows taken (0 or 1).
async fn take_over(pool: &MySqlPool, req: &ClaimRequest<'_>) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(TAKE_OVER)
        .bind(micros(req.lease))
        .bind(req.token)
        .bind(req.recipient.as_deref())
        .bind(req.job_id)
        .bind(req.kind)
        .bind(req.resend_uncertain)
        .bind(req.resend_uncertain)
        .bind(req.replay)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// With a token: only the claim holder may record. Without: only over an expired `sending` row.
/// (MySQL applies SET assignments left to right, so `sent_at` tests the bound status, not the
/// column just assigned.)
const RECORD: &str = concat!(
    "
UPDATE sent_notifications AS n
SET history = ",
    history_append!("?", "?", "?", "?", "?"),
    ",
    status = ?,
    smtp_reply = COALESCE(?, smtp_reply),
    last_error = ?,
    error_class = ?,
    template_revision = COALESCE(?, template_revision),
    lease_until = NULL,
    sent_at = CASE WHEN ? = 'sent' THEN UTC_TIMESTAMP(6) ELSE sent_at END,
    updated_at = UTC_TIMESTAMP(6)
WHERE job_id = ? AND kind = ?
  AND (claim_token = ? OR (? IS NULL AND status = 'sending' AND lease_until < UTC_TIMESTAMP(6)))"
);

/// Records a result; `revision` is the template revision that rendered a sent email.
pub(super) async fn record(
    pool: &MySqlPool,
    r: &Record<'_>,
    revision: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(RECORD)
        // The history entry: status (tested, then written), class, reply, error.
        .bind(r.status.as_str())
        .bind(r.status.as_str())
        .bind(r.class)
        .bind(r.smtp_reply)
        .bind(r.error)
        .bind(r.status.as_str())
        .bind(r.smtp_reply)
        .bind(r.error)
        .bind(r.class)
        .bind(revision)
        .bind(r.status.as_str())
        .bind(r.job_id)
        .bind(r.kind)
        .bind(r.token)
        .bind(r.token)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Only the holder gives a claim back; the attempt it counted is uncounted.
const RELEASE: &str = "
UPDATE sent_notifications
SET status = 'failed',
    attempts = GREATEST(attempts - 1, 0),
    lease_until = NULL,
    claim_token = NULL,
    last_error = ?,
    updated_at = UTC_TIMESTAMP(6)
WHERE job_id = ? AND kind = ? AND claim_token = ?";

pub(super) async fn release(
    pool: &MySqlPool,
    job_id: &str,
    kind: &str,
    token: Uuid,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(RELEASE)
        .bind(reason)
        .bind(job_id)
        .bind(kind)
        .bind(token)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

const NOTIFICATION: &str = "
SELECT CAST(job_id AS CHAR CHARACTER SET utf8mb4) AS job_id, kind, status, attempts, message_id, smtp_reply, last_error,
       created_at, updated_at, sent_at, template_revision, error_class
FROM sent_notifications WHERE job_id = ? AND kind = ?";

pub(super) async fn notification(
    pool: &MySqlPool,
    job_id: &str,
    kind: &str,
) -> Result<Option<Notification>, sqlx::Error> {
    sqlx::query_as(NOTIFICATION)
        .bind(job_id)
        .bind(kind)
        .fetch_optional(pool)
        .await
}

fn parse_status(text: String) -> Result<LedgerStatus, sqlx::Error> {
    LedgerStatus::parse(&text)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown status {text:?}").into()))
}

// ---- the outbox ----

/// A plain `INSERT`; a duplicate key fails only this statement (InnoDB rolls back the
/// statement, not the caller's transaction), so it is caught and reported as a duplicate.
pub(super) async fn insert_outbox_row(
    conn: &mut MySqlConnection,
    job_id: &str,
    kind: &str,
    payload: String,
) -> Result<Option<i64>, sqlx::Error> {
    let done = sqlx::query("INSERT INTO mailroom_outbox (job_id, kind, payload) VALUES (?, ?, ?)")
        .bind(job_id)
        .bind(kind)
        .bind(payload)
        .execute(conn)
        .await;
    match done {
        Ok(done) => Ok(Some(done.last_insert_id() as i64)),
        Err(e) if is_duplicate_key(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

const CLAIM_BATCH: &str = "
SELECT id, CAST(job_id AS CHAR CHARACTER SET utf8mb4) AS job_id, kind, CAST(payload AS CHAR) AS payload, publish_attempts
FROM mailroom_outbox
WHERE published_at IS NULL AND parked_at IS NULL
  AND (next_attempt_at IS NULL OR next_attempt_at <= UTC_TIMESTAMP(6))
ORDER BY id
LIMIT ?
FOR UPDATE SKIP LOCKED";

/// Locks the rows, then marks them (MySQL has no `UPDATE … RETURNING`): the marks commit only
/// after the broker confirmed, and the relay un-marks what it did not publish.
pub(super) async fn claim_outbox_batch(
    tx: &mut MySqlConnection,
    limit: i64,
) -> Result<Vec<PendingRow>, sqlx::Error> {
    let rows: Vec<PendingRow> = sqlx::query_as(CLAIM_BATCH)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
    if !rows.is_empty() {
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        update_ids(
            tx,
            "SET published_at = UTC_TIMESTAMP(6), publish_attempts = publish_attempts + 1, \
             last_error = NULL",
            &ids,
        )
        .await?;
    }
    Ok(rows)
}

pub(super) async fn outbox_has_work(pool: &MySqlPool) -> Result<bool, sqlx::Error> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM mailroom_outbox
         WHERE published_at IS NULL AND parked_at IS NULL
           AND (next_attempt_at IS NULL OR next_attempt_at <= UTC_TIMESTAMP(6))
         LIMIT 1",
    )
    .fetch_optional(pool)
    .await?;
    Ok(found.is_some())
}

pub(super) async fn transaction_idle_limit(
    pool: &MySqlPool,
) -> Result<Option<Duration>, sqlx::Error> {
    // Seconds, 0 is off. MySQL has only `wait_timeout`; `SHOW` leaves out what the server
    // does not have, where `SELECT @@name` would fail.
    let values: Vec<(String, String)> = sqlx::query_as(
        "SHOW SESSION VARIABLES WHERE Variable_name IN
           ('wait_timeout', 'idle_transaction_timeout', 'idle_write_transaction_timeout')",
    )
    .fetch_all(pool)
    .await?;
    Ok(values
        .iter()
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .filter(|&seconds| seconds > 0.0)
        .map(Duration::from_secs_f64)
        .min())
}

pub(super) async fn unmark(tx: &mut MySqlConnection, ids: &[i64]) -> Result<(), sqlx::Error> {
    update_ids(
        tx,
        "SET published_at = NULL, publish_attempts = publish_attempts - 1",
        ids,
    )
    .await
}

/// `UPDATE mailroom_outbox <set> WHERE id IN (<ids>)`.
async fn update_ids(tx: &mut MySqlConnection, set: &str, ids: &[i64]) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::new("UPDATE mailroom_outbox ");
    q.push(set);
    q.push(" WHERE id IN (");
    let mut list = q.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    q.push(")");
    q.build().execute(tx).await?;
    Ok(())
}

pub(super) async fn mark_publish_failed(
    tx: &mut MySqlConnection,
    id: i64,
    error: &str,
    retry_in: Duration,
    park: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE mailroom_outbox
         SET published_at = NULL, last_error = ?,
             next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
             parked_at = CASE WHEN ? THEN UTC_TIMESTAMP(6) END
         WHERE id = ?",
    )
    .bind(error)
    .bind(micros(retry_in))
    .bind(park)
    .bind(id)
    .execute(tx)
    .await?;
    Ok(())
}

pub(super) async fn delete_published_before(
    pool: &MySqlPool,
    age: Duration,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM mailroom_outbox
         WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
         ORDER BY published_at
         LIMIT ?",
    )
    .bind(micros(age))
    .bind(limit)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

pub(super) async fn outbox_status(
    pool: &MySqlPool,
    job_id: &str,
    kind: &str,
) -> Result<Option<OutboxStatus>, sqlx::Error> {
    let row: Option<OutboxRow> = sqlx::query_as(
        "SELECT created_at, published_at, publish_attempts, last_error, parked_at
         FROM mailroom_outbox WHERE job_id = ? AND kind = ?",
    )
    .bind(job_id)
    .bind(kind)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(OutboxStatus::from))
}

pub(super) async fn oldest_unpublished_age(pool: &MySqlPool) -> Result<Option<f64>, sqlx::Error> {
    let micros: Option<i64> = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) FROM mailroom_outbox
         WHERE published_at IS NULL AND parked_at IS NULL
         ORDER BY published_at, parked_at, id LIMIT 1",
    )
    .fetch_optional(pool)
    .await?;
    Ok(micros.map(|us| us as f64 / 1e6))
}

pub(super) async fn kinds_of_job(
    pool: &MySqlPool,
    job_id: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT kind FROM mailroom_outbox WHERE job_id = ?
         UNION SELECT kind FROM sent_notifications WHERE job_id = ?
         ORDER BY 1",
    )
    .bind(job_id)
    .bind(job_id)
    .fetch_all(pool)
    .await
}

fn existing_claim(row: &sqlx::mysql::MySqlRow) -> Result<ExistingClaim, sqlx::Error> {
    Ok(ExistingClaim {
        status: parse_status(row.try_get("status")?)?,
        attempts: row.try_get("attempts")?,
        lease_remaining: row
            .try_get::<Option<i64>, _>("lease_left_us")?
            .map(|us| Duration::from_micros(us.max(0) as u64)),
        error_class: row.try_get("error_class")?,
        last_error: row.try_get("last_error")?,
    })
}

/// Addresses looked up per statement at most.
const LOOKUP_CHUNK: usize = 1_000;

/// The columns of a suppression list entry, its binary address as text.
pub(super) const SUPPRESSION_COLUMNS: &str = "CAST(address AS CHAR CHARACTER SET utf8mb4) AS address, \
    reason, detail, created_by, created_at";

/// The entries among `addresses` on MySQL/MariaDB, on `conn` (a claim's transaction). Bound as
/// bytes: the column is binary, so `a@x.com ` is not `a@x.com` (no PAD SPACE).
pub(super) async fn suppressed_among(
    conn: &mut sqlx::MySqlConnection,
    addresses: &[impl AsRef<str>],
) -> sqlx::Result<Vec<Suppression>> {
    let mut found = Vec::new();
    // A statement takes 65,535 parameters at most; a group's addresses may be more.
    for chunk in addresses.chunks(LOOKUP_CHUNK) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let sql = format!(
            "SELECT {SUPPRESSION_COLUMNS} FROM mailroom_suppressions WHERE address IN ({marks})"
        );
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
        for a in chunk {
            query = query.bind(a.as_ref().as_bytes());
        }
        let rows: Vec<SuppressionRow> = query.fetch_all(&mut *conn).await?;
        found.extend(rows.into_iter().map(SuppressionRow::entry));
    }
    Ok(found)
}
