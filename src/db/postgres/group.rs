//! PostgreSQL statements of group commit (see `db/group.rs`): the claims and records of a
//! group in one statement, so one commit.

use std::collections::{HashMap, HashSet};

use sqlx::{PgPool, Row};

use super::existing_claim;
use crate::db::rows::{Claim, ClaimItem, ExistingClaim, Group, GroupResult};

/// The claims and records of a group in one statement, so one commit. The two CTEs touch
/// different keys (a group holds each key once). Claims insert in key order, so two groups
/// lock rows in the same order. The records' keys come through `mailroom_ledger_records`
/// (a migration), declared to return one row, so the plan a connection caches probes the
/// unique index per key even when it was made while the table was small.
const WRITE_GROUP: &str = concat!(
    "
WITH claimed AS (
    INSERT INTO sent_notifications AS n
        (job_id, kind, status, attempts, lease_until, claim_token, message_id, recipient, claimed_at)
    SELECT c.job_id, c.kind, 'sending', 1, now() + make_interval(secs => $5), c.token, c.message_id,
           c.recipient, now()
    FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $15::text[])
         AS c(job_id, kind, token, message_id, recipient)
    ORDER BY c.job_id, c.kind",
    take_over!(),
    "
    RETURNING n.job_id, n.kind, n.attempts
), recorded AS (
    UPDATE sent_notifications AS n
    SET history = ",
    history_append!("r.status", "r.class", "r.reply", "r.error"),
    ",
        status = r.status,
        smtp_reply = COALESCE(r.reply, n.smtp_reply),
        last_error = r.error,
        error_class = r.class,
        template_revision = COALESCE(r.revision, n.template_revision),
        lease_until = NULL,
        sent_at = CASE WHEN r.status = 'sent' THEN now() ELSE n.sent_at END,
        updated_at = now()
    FROM mailroom_ledger_records($7::text[], $8::text[], $9::uuid[], $10::text[], $11::text[],
                                 $12::text[], $13::text[], $14::text[]) AS r
    WHERE n.job_id = r.job_id AND n.kind = r.kind AND n.claim_token = r.token
    RETURNING n.job_id, n.kind
)
SELECT true AS claim, job_id, kind, attempts FROM claimed
UNION ALL
SELECT false, job_id, kind, NULL FROM recorded"
);

/// The rows that refused some of a group's claims, read after the group's statement.
const READ_CLAIMS: &str = "
SELECT n.job_id, n.kind, status, attempts, error_class, last_error,
       CASE WHEN lease_until > now()
            THEN EXTRACT(EPOCH FROM (lease_until - now()))::float8 END AS lease_left
FROM sent_notifications n
JOIN unnest($1::text[], $2::text[]) AS k(job_id, kind)
  ON n.job_id = k.job_id AND n.kind = k.kind";

/// A row's unique key, `(job_id, kind)`.
type Key = (String, String);

fn key_of(job_id: &str, kind: &str) -> Key {
    (job_id.to_owned(), kind.to_owned())
}

/// Writes a group with one statement ([`WRITE_GROUP`]), then reads the rows that refused some
/// of its claims ([`READ_CLAIMS`]).
pub(in crate::db) async fn write_group(
    pool: &PgPool,
    group: &Group,
) -> Result<GroupResult, sqlx::Error> {
    let (claimed, recorded) = claim_and_record(pool, group).await?;
    let refused: Vec<&ClaimItem> = group
        .claims
        .iter()
        .filter(|c| !claimed.contains_key(&key_of(&c.job_id, &c.kind)))
        .collect();
    let mut existing = read_refused(pool, &refused).await?;
    let claims = group
        .claims
        .iter()
        .map(|c| {
            let key = key_of(&c.job_id, &c.kind);
            match claimed.get(&key) {
                Some(&attempt) => Claim::Claimed {
                    attempt,
                    token: c.token,
                },
                None => Claim::Refused(existing.remove(&key)),
            }
        })
        .collect();
    let records = group
        .records
        .iter()
        .map(|r| recorded.contains(&key_of(&r.job_id, &r.kind)))
        .collect();
    Ok(GroupResult { claims, records })
}

/// Runs [`WRITE_GROUP`]: the keys claimed, with their attempt, and the keys recorded.
async fn claim_and_record(
    pool: &PgPool,
    group: &Group,
) -> Result<(HashMap<Key, i32>, HashSet<Key>), sqlx::Error> {
    let c = &group.claims;
    let r = &group.records;
    let rows = sqlx::query(WRITE_GROUP)
        .bind(c.iter().map(|c| c.job_id.as_str()).collect::<Vec<_>>())
        .bind(c.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>())
        .bind(c.iter().map(|c| c.token).collect::<Vec<_>>())
        .bind(c.iter().map(|c| c.message_id.as_str()).collect::<Vec<_>>())
        .bind(group.lease.as_secs_f64())
        .bind(group.resend_uncertain)
        .bind(r.iter().map(|r| r.job_id.as_str()).collect::<Vec<_>>())
        .bind(r.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>())
        .bind(r.iter().map(|r| r.token).collect::<Vec<_>>())
        .bind(r.iter().map(|r| r.status.as_str()).collect::<Vec<_>>())
        .bind(
            r.iter()
                .map(|r| r.smtp_reply.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(r.iter().map(|r| r.error.as_deref()).collect::<Vec<_>>())
        .bind(r.iter().map(|r| r.class.as_deref()).collect::<Vec<_>>())
        .bind(r.iter().map(|r| r.revision.as_deref()).collect::<Vec<_>>())
        .bind(c.iter().map(|c| c.recipient.as_deref()).collect::<Vec<_>>())
        .fetch_all(pool)
        .await?;
    let mut claimed = HashMap::new();
    let mut recorded = HashSet::new();
    for row in rows {
        let key = (row.try_get("job_id")?, row.try_get("kind")?);
        if row.try_get("claim")? {
            claimed.insert(key, row.try_get("attempts")?);
        } else {
            recorded.insert(key);
        }
    }
    Ok((claimed, recorded))
}

/// The rows that refused `refused`, read by a fresh statement (as in `claim`).
async fn read_refused(
    pool: &PgPool,
    refused: &[&ClaimItem],
) -> Result<HashMap<Key, ExistingClaim>, sqlx::Error> {
    let mut existing = HashMap::new();
    if refused.is_empty() {
        return Ok(existing);
    }
    let rows = sqlx::query(READ_CLAIMS)
        .bind(
            refused
                .iter()
                .map(|c| c.job_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(refused.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>())
        .fetch_all(pool)
        .await?;
    for row in rows {
        let key = (row.try_get("job_id")?, row.try_get("kind")?);
        existing.insert(key, existing_claim(&row)?);
    }
    Ok(existing)
}
