//! PostgreSQL statements of the claim ledger. Times come from the database clock (`now()`),
//! so workers on machines with skewed clocks still agree on leases.

use std::time::Duration;

use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::notifications::{Claim, ClaimRequest, ExistingClaim, Notification, Record, Status};

/// Inserts a `sending` row with a lease, or takes over a row that may be retried. No row comes
/// back when the claim is refused.
const CLAIM: &str = "
INSERT INTO sent_notifications AS n
    (job_id, kind, status, attempts, lease_until, claim_token, message_id)
VALUES ($1, $2, 'sending', 1, now() + make_interval(secs => $3), $4, $5)
ON CONFLICT (job_id, kind) DO UPDATE
SET status = 'sending',
    attempts = n.attempts + 1,
    lease_until = EXCLUDED.lease_until,
    claim_token = EXCLUDED.claim_token,
    updated_at = now()
WHERE n.status = 'failed'
   OR ($6 AND n.status = 'sending' AND n.lease_until < now())
   OR ($6 AND n.status = 'uncertain')
   OR ($7 AND n.status IN ('dead', 'uncertain', 'failed'))
RETURNING n.attempts";

const READ_CLAIM: &str = "
SELECT status, attempts,
       CASE WHEN lease_until > now()
            THEN EXTRACT(EPOCH FROM (lease_until - now()))::float8 END AS lease_left
FROM sent_notifications WHERE job_id = $1 AND kind = $2";

pub(super) async fn claim(pool: &PgPool, req: &ClaimRequest<'_>) -> Result<Claim, sqlx::Error> {
    let token = Uuid::new_v4();
    let claimed: Option<i32> = sqlx::query_scalar(CLAIM)
        .bind(req.job_id)
        .bind(req.kind)
        .bind(req.lease.as_secs_f64())
        .bind(token)
        .bind(req.message_id)
        .bind(req.resend_uncertain)
        .bind(req.replay)
        .fetch_optional(pool)
        .await?;
    if let Some(attempt) = claimed {
        return Ok(Claim::Claimed { attempt, token });
    }
    // A fresh statement sees the row that refused us, even if it committed after our claim began.
    let existing = sqlx::query(READ_CLAIM)
        .bind(req.job_id)
        .bind(req.kind)
        .fetch_optional(pool)
        .await?
        .map(|row| -> Result<ExistingClaim, sqlx::Error> {
            Ok(ExistingClaim {
                status: parse_status(row.try_get("status")?)?,
                attempts: row.try_get("attempts")?,
                lease_remaining: row
                    .try_get::<Option<f64>, _>("lease_left")?
                    .map(|s| Duration::from_secs_f64(s.max(0.0))),
            })
        })
        .transpose()?;
    Ok(Claim::Refused(existing))
}

/// With a token: only the claim holder may record. Without: only over an expired `sending` row.
const RECORD: &str = "
UPDATE sent_notifications
SET status = $3,
    smtp_reply = COALESCE($4, smtp_reply),
    last_error = $5,
    template_revision = COALESCE($7, template_revision),
    lease_until = NULL,
    sent_at = CASE WHEN $3 = 'sent' THEN now() ELSE sent_at END,
    updated_at = now()
WHERE job_id = $1 AND kind = $2
  AND (claim_token = $6 OR ($6 IS NULL AND status = 'sending' AND lease_until < now()))";

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
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

const NOTIFICATION: &str = "
SELECT job_id, kind, status, attempts, message_id, smtp_reply, last_error,
       created_at, updated_at, sent_at, template_revision
FROM sent_notifications WHERE job_id = $1 AND kind = $2";

pub(super) async fn notification(
    pool: &PgPool,
    job_id: &str,
    kind: &str,
) -> Result<Option<Notification>, sqlx::Error> {
    let Some(row) = sqlx::query(NOTIFICATION)
        .bind(job_id)
        .bind(kind)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(Notification {
        job_id: row.try_get("job_id")?,
        kind: row.try_get("kind")?,
        status: parse_status(row.try_get("status")?)?,
        attempts: row.try_get("attempts")?,
        message_id: row.try_get("message_id")?,
        smtp_reply: row.try_get("smtp_reply")?,
        last_error: row.try_get("last_error")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        sent_at: row.try_get("sent_at")?,
        template_revision: row.try_get("template_revision")?,
    }))
}

fn parse_status(text: String) -> Result<Status, sqlx::Error> {
    Status::parse(&text)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown status {text:?}").into()))
}
