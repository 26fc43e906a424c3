//! PostgreSQL statements of the claim ledger and the outbox; those of group commit are in
//! `postgres/group.rs`. Times come from the database clock (`now()`), so workers on machines
//! with skewed clocks still agree on leases.

// Before the statements that use its macro.
#[macro_use]
mod history;

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::rows::{
    Claim, ClaimRequest, ExistingClaim, LedgerStatus, Notification, OutboxRow, OutboxStatus,
    PendingRow, Record,
};

/// The takeover of an existing row by a claim, shared by the single and the group claim: `$6`
/// is the claim's `resend_uncertain`.
macro_rules! take_over {
    () => {
        "
ON CONFLICT (job_id, kind) DO UPDATE
SET status = 'sending',
    attempts = n.attempts + 1,
    lease_until = EXCLUDED.lease_until,
    claim_token = EXCLUDED.claim_token,
    recipient = EXCLUDED.recipient,
    claimed_at = now(),
    updated_at = now()
WHERE n.status = 'failed'
   OR ($6 AND n.status = 'sending' AND n.lease_until < now())
   OR ($6 AND n.status = 'uncertain')"
    };
}

// After `take_over!`, which its statements use too.
pub(super) mod dead_letters;
mod group;
pub(super) use group::write_group;

/// Inserts a `sending` row with a lease, or takes over a row that may be retried (a replay,
/// `$7`, also a `dead` or `uncertain` one). No row comes back when the claim is refused.
const CLAIM: &str = concat!(
    "
INSERT INTO sent_notifications AS n
    (job_id, kind, status, attempts, lease_until, claim_token, message_id, recipient, claimed_at)
VALUES ($1, $2, 'sending', 1, now() + make_interval(secs => $3), $4, $5, $8, now())",
    take_over!(),
    "
   OR ($7 AND n.status IN ('dead', 'uncertain', 'failed'))
RETURNING n.attempts"
);

const READ_CLAIM: &str = "
SELECT status, attempts, error_class, last_error,
       CASE WHEN lease_until > now()
            THEN EXTRACT(EPOCH FROM (lease_until - now()))::float8 END AS lease_left
FROM sent_notifications WHERE job_id = $1 AND kind = $2";

pub(super) async fn claim(pool: &PgPool, req: &ClaimRequest<'_>) -> Result<Claim, sqlx::Error> {
    let token = req.token;
    let claimed: Option<i32> = sqlx::query_scalar(CLAIM)
        .bind(req.job_id)
        .bind(req.kind)
        .bind(req.lease.as_secs_f64())
        .bind(token)
        .bind(req.message_id)
        .bind(req.resend_uncertain)
        .bind(req.replay)
        .bind(req.recipient.as_deref())
        .fetch_optional(pool)
        .await?;
    if let Some(attempt) = claimed {
        return Ok(Claim::taken(attempt, token, &[], &[]));
    }
    // A fresh statement sees the row that refused us, even if it committed after our claim began.
    let existing = sqlx::query(READ_CLAIM)
        .bind(req.job_id)
        .bind(req.kind)
        .fetch_optional(pool)
        .await?
        .map(|row| existing_claim(&row))
        .transpose()?;
    Ok(Claim::Refused(existing))
}

/// With a token: only the claim holder may record. Without: only over an expired `sending` row.
const RECORD: &str = concat!(
    "
UPDATE sent_notifications AS n
SET history = ",
    history_append!("$3", "$8", "$4", "$5"),
    ",
    status = $3,
    smtp_reply = COALESCE($4, smtp_reply),
    last_error = $5,
    error_class = $8,
    template_revision = COALESCE($7, template_revision),
    lease_until = NULL,
    sent_at = CASE WHEN $3 = 'sent' THEN now() ELSE sent_at END,
    updated_at = now()
WHERE job_id = $1 AND kind = $2
  AND (claim_token = $6 OR ($6 IS NULL AND status = 'sending' AND lease_until < now()))"
);

/// Records a result; `revision` is the template revision that rendered a sent email.
pub(super) async fn record(
    pool: &PgPool,
    r: &Record<'_>,
    revision: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(RECORD)
        .bind(r.job_id)
        .bind(r.kind)
        .bind(r.status.as_str())
        .bind(r.smtp_reply)
        .bind(r.error)
        .bind(r.token)
        .bind(revision)
        .bind(r.class)
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
    last_error = $4,
    updated_at = now()
WHERE job_id = $1 AND kind = $2 AND claim_token = $3";

pub(super) async fn release(
    pool: &PgPool,
    job_id: &str,
    kind: &str,
    token: Uuid,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(RELEASE)
        .bind(job_id)
        .bind(kind)
        .bind(token)
        .bind(reason)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

const NOTIFICATION: &str = "
SELECT job_id, kind, status, attempts, message_id, smtp_reply, last_error,
       created_at, updated_at, sent_at, template_revision, error_class
FROM sent_notifications WHERE job_id = $1 AND kind = $2";

pub(super) async fn notification(
    pool: &PgPool,
    job_id: &str,
    kind: &str,
) -> Result<Option<Notification>, sqlx::Error> {
    sqlx::query_as(NOTIFICATION)
        .bind(job_id)
        .bind(kind)
        .fetch_optional(pool)
        .await
}

// ---- the outbox ----

const INSERT_OUTBOX: &str = "
INSERT INTO mailroom_outbox (job_id, kind, payload)
VALUES ($1, $2, $3::jsonb)
ON CONFLICT (job_id, kind) DO NOTHING
RETURNING id";

/// `ON CONFLICT DO NOTHING`: a duplicate is no error, so the caller's transaction stays usable.
pub(super) async fn insert_outbox_row(
    conn: &mut PgConnection,
    job_id: &str,
    kind: &str,
    payload: String,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(INSERT_OUTBOX)
        .bind(job_id)
        .bind(kind)
        .bind(payload)
        .fetch_optional(conn)
        .await
}

/// Locks and marks in one statement: the marks commit only after the broker confirmed (the
/// relay un-marks what it did not publish), so marking first is the same as marking last, for
/// one statement per batch instead of two. `publish_attempts` is returned as it was before.
const CLAIM_BATCH: &str = "
UPDATE mailroom_outbox o
SET published_at = statement_timestamp(), publish_attempts = o.publish_attempts + 1,
    last_error = NULL
FROM (SELECT id FROM mailroom_outbox
      WHERE published_at IS NULL AND parked_at IS NULL AND id >= $2
        AND (next_attempt_at IS NULL OR next_attempt_at <= statement_timestamp())
      ORDER BY id
      LIMIT $1
      FOR UPDATE SKIP LOCKED) claimed
WHERE o.id = claimed.id
RETURNING o.id, o.job_id, o.kind, o.payload::text AS payload,
          o.publish_attempts - 1 AS publish_attempts";

pub(super) async fn claim_outbox_batch(
    tx: &mut PgConnection,
    limit: i64,
    from: i64,
) -> Result<Vec<PendingRow>, sqlx::Error> {
    let mut rows: Vec<PendingRow> = sqlx::query_as(CLAIM_BATCH)
        .bind(limit)
        .bind(from)
        .fetch_all(tx)
        .await?;
    // RETURNING follows the join, not the subquery's order.
    rows.sort_unstable_by_key(|row| row.id);
    Ok(rows)
}

pub(super) async fn outbox_has_work(pool: &PgPool, from: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM mailroom_outbox
         WHERE published_at IS NULL AND parked_at IS NULL AND id >= $1
           AND (next_attempt_at IS NULL OR next_attempt_at <= now()))",
    )
    .bind(from)
    .fetch_one(pool)
    .await
}

/// The last outbox id handed out so far (0 before the first), then the transactions, by
/// virtual id, that are writing to the outbox now: only an `INSERT` into it takes an id (the
/// column is `GENERATED ALWAYS`), after its lock on the table, so a transaction that took an
/// id up to the first answer and has not ended is among the second. Not a snapshot's `xmin`:
/// a transaction gets an xid at its first row written, after its id.
pub(super) async fn outbox_ids_in_doubt(pool: &PgPool) -> Result<(i64, Vec<String>), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let last: i64 = sqlx::query_scalar(
        "SELECT COALESCE(pg_sequence_last_value(
             pg_get_serial_sequence('mailroom_outbox', 'id')::regclass), 0)",
    )
    .fetch_one(&mut *conn)
    .await?;
    let writing: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT virtualtransaction FROM pg_locks
         WHERE locktype = 'relation' AND relation = 'mailroom_outbox'::regclass
           AND mode = 'RowExclusiveLock' AND pid IS DISTINCT FROM pg_backend_pid()",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok((last, writing))
}

/// Whether every one of `writing` (virtual transaction ids) has ended, and no prepared
/// transaction (two-phase commit) holds the outbox.
pub(super) async fn transactions_ended(
    pool: &PgPool,
    writing: &[String],
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_locks
                            WHERE locktype = 'virtualxid' AND virtualxid = ANY($1))
            AND NOT EXISTS (SELECT 1 FROM pg_locks
                            WHERE locktype = 'relation' AND pid IS NULL
                              AND relation = 'mailroom_outbox'::regclass)",
    )
    .bind(writing)
    .fetch_one(pool)
    .await
}

/// The smallest id of a row that is or may again be published from `from` on: unpublished and
/// unparked, due or not (a row in another relay's uncommitted batch still reads unpublished).
pub(super) async fn first_pending_id(pool: &PgPool, from: i64) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT min(id) FROM mailroom_outbox
         WHERE published_at IS NULL AND parked_at IS NULL AND id >= $1",
    )
    .bind(from)
    .fetch_one(pool)
    .await
}

pub(super) async fn transaction_idle_limit(pool: &PgPool) -> Result<Option<Duration>, sqlx::Error> {
    // `setting` is in milliseconds for both; 0 is off; `transaction_timeout` is PostgreSQL 17's.
    let ms: Option<i64> = sqlx::query_scalar(
        "SELECT min(setting::bigint) FROM pg_settings
         WHERE name IN ('idle_in_transaction_session_timeout', 'transaction_timeout')
           AND setting::bigint > 0",
    )
    .fetch_one(pool)
    .await?;
    Ok(ms.map(|ms| Duration::from_millis(ms.unsigned_abs())))
}

pub(super) async fn unmark(tx: &mut PgConnection, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE mailroom_outbox
         SET published_at = NULL, publish_attempts = publish_attempts - 1
         WHERE id = ANY($1)",
    )
    .bind(ids)
    .execute(tx)
    .await?;
    Ok(())
}

pub(super) async fn mark_publish_failed(
    tx: &mut PgConnection,
    id: i64,
    error: &str,
    retry_in: Duration,
    park: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE mailroom_outbox
         SET published_at = NULL, last_error = $2,
             next_attempt_at = statement_timestamp() + make_interval(secs => $3),
             parked_at = CASE WHEN $4 THEN statement_timestamp() END
         WHERE id = $1",
    )
    .bind(id)
    .bind(error)
    .bind(retry_in.as_secs_f64())
    .bind(park)
    .execute(tx)
    .await?;
    Ok(())
}

pub(super) async fn delete_published_before(
    pool: &PgPool,
    age: Duration,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM mailroom_outbox WHERE id IN (
             SELECT id FROM mailroom_outbox
             WHERE published_at < now() - make_interval(secs => $1)
             LIMIT $2)",
    )
    .bind(age.as_secs_f64())
    .bind(limit)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

pub(super) async fn outbox_status(
    pool: &PgPool,
    job_id: &str,
    kind: &str,
) -> Result<Option<OutboxStatus>, sqlx::Error> {
    let row: Option<OutboxRow> = sqlx::query_as(
        "SELECT created_at, published_at, publish_attempts, last_error, parked_at
         FROM mailroom_outbox WHERE job_id = $1 AND kind = $2",
    )
    .bind(job_id)
    .bind(kind)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(OutboxStatus::from))
}

pub(super) async fn kinds_of_job(pool: &PgPool, job_id: &str) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT kind FROM mailroom_outbox WHERE job_id = $1
         UNION SELECT kind FROM sent_notifications WHERE job_id = $1
         ORDER BY 1",
    )
    .bind(job_id)
    .fetch_all(pool)
    .await
}

pub(super) async fn oldest_unpublished_age(pool: &PgPool) -> Result<Option<f64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (now() - created_at))::float8 FROM mailroom_outbox
         WHERE published_at IS NULL AND parked_at IS NULL
         ORDER BY id LIMIT 1",
    )
    .fetch_optional(pool)
    .await
}

fn parse_status(text: String) -> Result<LedgerStatus, sqlx::Error> {
    LedgerStatus::parse(&text)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown status {text:?}").into()))
}

fn existing_claim(row: &sqlx::postgres::PgRow) -> Result<ExistingClaim, sqlx::Error> {
    Ok(ExistingClaim {
        status: parse_status(row.try_get("status")?)?,
        attempts: row.try_get("attempts")?,
        lease_remaining: row
            .try_get::<Option<f64>, _>("lease_left")?
            .map(|s| Duration::from_secs_f64(s.max(0.0))),
        error_class: row.try_get("error_class")?,
        last_error: row.try_get("last_error")?,
    })
}
