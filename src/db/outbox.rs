//! The transactional outbox `mailroom_outbox`: producers insert a job inside their own
//! transaction ([`enqueue`]); the relay claims batches of unpublished rows with
//! `FOR UPDATE SKIP LOCKED`, publishes them, and marks the ones the broker confirmed.
//!
//! Rows are selected by state (`published_at IS NULL`), never by "id greater than the last one
//! seen": ids are allocated before commit, so a slow transaction can commit a smaller id after
//! a larger one was published, and a high-water mark would skip it forever.

use std::time::Duration;

use sqlx::{PgConnection, Postgres, Row, Transaction};

use crate::job::{EmailJob, JobError};

/// The channel the outbox trigger notifies.
pub const NOTIFY_CHANNEL: &str = "mailroom_outbox";

/// What [`enqueue`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// A new row, with its outbox id.
    New(i64),
    /// The same `(job_id, kind)` was enqueued before; nothing was written.
    AlreadyQueued,
}

/// Why a job could not be enqueued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error(transparent)]
    Invalid(#[from] JobError),
    #[error("writing the outbox row: {0}")]
    Database(#[from] sqlx::Error),
}

const INSERT: &str = "
INSERT INTO mailroom_outbox (job_id, kind, payload)
VALUES ($1, $2, $3)
ON CONFLICT (job_id, kind) DO NOTHING
RETURNING id";

/// Validates `job` and inserts it into the outbox inside the caller's transaction, so the email
/// exists if and only if the caller's business rows commit:
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool, job: mailroom::job::EmailJob) -> anyhow::Result<()> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (1042)").execute(&mut *tx).await?;
/// mailroom::db::outbox::enqueue(&mut tx, &job).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue(
    tx: &mut Transaction<'_, Postgres>,
    job: &EmailJob,
) -> Result<Enqueued, EnqueueError> {
    enqueue_on(tx, job).await
}

/// [`enqueue`] on any connection; outside a transaction the row commits on its own.
pub async fn enqueue_on(conn: &mut PgConnection, job: &EmailJob) -> Result<Enqueued, EnqueueError> {
    let job = job.clone().validate()?.job;
    let mut payload = serde_json::to_value(&job).map_err(|e| JobError::Malformed(e.to_string()))?;
    if job.created_at.is_none() {
        payload["created_at"] = serde_json::json!(chrono::Utc::now());
    }
    let id: Option<i64> = sqlx::query_scalar(INSERT)
        .bind(&job.job_id)
        .bind(&job.kind)
        .bind(payload)
        .fetch_optional(conn)
        .await?;
    Ok(id.map_or(Enqueued::AlreadyQueued, Enqueued::New))
}

/// An outbox row claimed by a relay.
#[derive(Clone, Debug)]
pub struct PendingRow {
    pub id: i64,
    pub job_id: String,
    pub kind: String,
    pub payload: String,
    pub publish_attempts: i32,
}

const CLAIM_BATCH: &str = "
SELECT id, job_id, kind, payload::text AS payload, publish_attempts
FROM mailroom_outbox
WHERE published_at IS NULL AND parked_at IS NULL
  AND (next_attempt_at IS NULL OR next_attempt_at <= now())
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED";

/// Locks up to `limit` publishable rows; other relays skip them until this transaction ends.
pub async fn claim_outbox_batch(
    tx: &mut PgConnection,
    limit: i64,
) -> Result<Vec<PendingRow>, sqlx::Error> {
    let rows = sqlx::query(CLAIM_BATCH).bind(limit).fetch_all(tx).await?;
    rows.into_iter()
        .map(|r| {
            Ok(PendingRow {
                id: r.try_get("id")?,
                job_id: r.try_get("job_id")?,
                kind: r.try_get("kind")?,
                payload: r.try_get("payload")?,
                publish_attempts: r.try_get("publish_attempts")?,
            })
        })
        .collect()
}

/// Marks rows the broker confirmed.
pub async fn mark_published(tx: &mut PgConnection, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE mailroom_outbox
         SET published_at = now(), publish_attempts = publish_attempts + 1, last_error = NULL
         WHERE id = ANY($1)",
    )
    .bind(ids)
    .execute(tx)
    .await?;
    Ok(())
}

/// Records a refused publish: the row is retried after `retry_in`, or parked when `park`.
pub async fn mark_publish_failed(
    tx: &mut PgConnection,
    id: i64,
    error: &str,
    retry_in: Duration,
    park: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE mailroom_outbox
         SET publish_attempts = publish_attempts + 1, last_error = $2,
             next_attempt_at = now() + make_interval(secs => $3),
             parked_at = CASE WHEN $4 THEN now() END
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

/// Deletes up to `limit` rows published more than `age` ago; returns how many went.
pub async fn delete_published_before(
    conn: &mut PgConnection,
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
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// The outbox side of a job's status.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboxStatus {
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub published_at: Option<chrono::DateTime<chrono::Utc>>,
    pub publish_attempts: i32,
    pub last_error: Option<String>,
    pub parked: bool,
}

/// Reads the outbox row of `(job_id, kind)`.
pub async fn outbox_status(
    conn: &mut PgConnection,
    job_id: &str,
    kind: &str,
) -> Result<Option<OutboxStatus>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT created_at, published_at, publish_attempts, last_error, parked_at IS NOT NULL AS parked
         FROM mailroom_outbox WHERE job_id = $1 AND kind = $2",
    )
    .bind(job_id)
    .bind(kind)
    .fetch_optional(conn)
    .await?;
    row.map(|r| {
        Ok(OutboxStatus {
            created_at: r.try_get("created_at")?,
            published_at: r.try_get("published_at")?,
            publish_attempts: r.try_get("publish_attempts")?,
            last_error: r.try_get("last_error")?,
            parked: r.try_get("parked")?,
        })
    })
    .transpose()
}

/// Every kind known for `job_id`, in the outbox or the ledger.
pub async fn kinds_of_job(
    conn: &mut PgConnection,
    job_id: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT kind FROM mailroom_outbox WHERE job_id = $1
         UNION SELECT kind FROM sent_notifications WHERE job_id = $1
         ORDER BY 1",
    )
    .bind(job_id)
    .fetch_all(conn)
    .await
}

/// Age in seconds of the oldest unpublished, unparked outbox row (the relay lag), or `None` when
/// the relay is caught up. Oldest by id, which follows the pending index: one row read.
pub async fn oldest_unpublished_age(pool: &sqlx::PgPool) -> Result<Option<f64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (now() - created_at))::float8 FROM mailroom_outbox
         WHERE published_at IS NULL AND parked_at IS NULL
         ORDER BY id LIMIT 1",
    )
    .fetch_optional(pool)
    .await
}
