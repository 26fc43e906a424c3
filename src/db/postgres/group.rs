//! PostgreSQL statements of group commit (see `db/group.rs`): the claims and records of a
//! group in one statement, so one commit.

use std::collections::{HashMap, HashSet};

use sqlx::{FromRow, PgPool, Row};

use super::existing_claim;
use crate::db::rows::{
    Claim, ClaimItem, ExistingClaim, Group, GroupResult, Suppression, SuppressionRow,
};

/// The claims of a group: inserted in key order, so two groups lock rows in the same order.
/// `$1`–`$6` and the recipients' parameter are the claims'.
macro_rules! insert_claims {
    ($recipients:literal) => {
        concat!(
            "
    INSERT INTO sent_notifications AS n
        (job_id, kind, status, attempts, lease_until, claim_token, message_id, recipient, claimed_at)
    SELECT c.job_id, c.kind, 'sending', 1, now() + make_interval(secs => $5), c.token, c.message_id,
           c.recipient, now()
    FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], ",
            $recipients,
            "::text[])
         AS c(job_id, kind, token, message_id, recipient)
    ORDER BY c.job_id, c.kind",
            take_over!(),
            "
    RETURNING n.job_id, n.kind, n.attempts"
        )
    };
}

/// The records of a group, from their eight arrays' parameters. The keys come
/// through `mailroom_ledger_records` (a migration), declared to return one row, so the plan a
/// connection caches probes the unique index per key even when it was made while the table
/// was small.
macro_rules! update_records {
    ($first:literal $(, $param:literal)*) => {
        concat!(
            "
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
    FROM mailroom_ledger_records(",
            $first,
            $(", ", $param,)*
            ") AS r
    WHERE n.job_id = r.job_id AND n.kind = r.kind AND n.claim_token = r.token
    RETURNING n.job_id, n.kind"
        )
    };
}

/// The rows of the claims as [`claim_and_record`] reads them: `what` says what a row is, and
/// the suppression list's columns are those of [`screened!`]'s rows.
macro_rules! claimed_rows {
    () => {
        "
SELECT 'claim' AS what, job_id, kind, attempts, NULL::text AS address, NULL::text AS reason,
       NULL::text AS detail, NULL::text AS created_by, NULL::timestamptz AS created_at
FROM claimed"
    };
}

/// The rows of the records, after [`claimed_rows!`].
macro_rules! recorded_rows {
    () => {
        "
UNION ALL
SELECT 'record', job_id, kind, NULL, NULL, NULL, NULL, NULL, NULL FROM recorded"
    };
}

/// The suppression list's entries among the claims' addresses (`ClaimItem::screen`, all of
/// the group's in one parameter), read in the claims' statement: a worker looks its
/// recipients up with no statement, round trip or wake-up of its own.
macro_rules! screened {
    ($addresses:literal) => {
        concat!(
            "
UNION ALL
SELECT 'suppressed', NULL, NULL, NULL, address, reason, detail, created_by, created_at
FROM mailroom_suppressions WHERE address = ANY(",
            $addresses,
            "::text[])"
        )
    };
}

/// The claims and records of a group in one statement, so one commit. The two CTEs touch
/// different keys (a group holds each key once).
const WRITE_GROUP: &str = concat!(
    "WITH claimed AS (",
    insert_claims!("$15"),
    "), recorded AS (",
    update_records!(
        "$7::text[]",
        "$8::text[]",
        "$9::uuid[]",
        "$10::text[]",
        "$11::text[]",
        "$12::text[]",
        "$13::text[]",
        "$14::text[]"
    ),
    ")",
    claimed_rows!(),
    recorded_rows!(),
    screened!("$16")
);

/// A group of claims alone (at low load, a group is one write): the INSERT of
/// [`WRITE_GROUP`] without the UPDATE the database would otherwise prepare and run empty.
const CLAIM_GROUP: &str = concat!(
    "WITH claimed AS (",
    insert_claims!("$7"),
    ")",
    claimed_rows!(),
    screened!("$8")
);

/// A group of records alone: the UPDATE of [`WRITE_GROUP`] without the INSERT.
const RECORD_GROUP: &str = concat!(
    "WITH recorded AS (",
    update_records!(
        "$1::text[]",
        "$2::text[]",
        "$3::uuid[]",
        "$4::text[]",
        "$5::text[]",
        "$6::text[]",
        "$7::text[]",
        "$8::text[]"
    ),
    ")
SELECT 'record' AS what, job_id, kind, NULL::int4 AS attempts FROM recorded"
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

/// Writes a group with one statement ([`claim_and_record`]), then reads the rows that refused some
/// of its claims ([`READ_CLAIMS`]).
pub(in crate::db) async fn write_group(
    pool: &PgPool,
    group: &Group,
) -> Result<GroupResult, sqlx::Error> {
    let Written {
        claimed,
        recorded,
        suppressed,
    } = claim_and_record(pool, group).await?;
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
                Some(&attempt) => Claim::taken(attempt, c.token, &c.screen, &suppressed),
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

/// What one group statement wrote and read.
struct Written {
    /// The keys claimed, with their attempt.
    claimed: HashMap<Key, i32>,
    recorded: HashSet<Key>,
    /// The suppression list's entries among the claims' addresses.
    suppressed: Vec<Suppression>,
}

/// Runs [`WRITE_GROUP`], or [`CLAIM_GROUP`] or [`RECORD_GROUP`] for a group of one kind of
/// write.
async fn claim_and_record(pool: &PgPool, group: &Group) -> Result<Written, sqlx::Error> {
    let screened = group.screened_addresses();
    let query = match (group.claims.is_empty(), group.records.is_empty()) {
        (false, true) => recipients(claims(sqlx::query(CLAIM_GROUP), group), group).bind(&screened),
        (true, false) => records(sqlx::query(RECORD_GROUP), group),
        _ => recipients(
            records(claims(sqlx::query(WRITE_GROUP), group), group),
            group,
        )
        .bind(&screened),
    };
    let rows = query.fetch_all(pool).await?;
    let mut written = Written {
        claimed: HashMap::new(),
        recorded: HashSet::new(),
        suppressed: Vec::new(),
    };
    for row in rows {
        let what: &str = row.try_get("what")?;
        if what == "suppressed" {
            written
                .suppressed
                .push(SuppressionRow::from_row(&row)?.entry());
            continue;
        }
        let key = (row.try_get("job_id")?, row.try_get("kind")?);
        if what == "claim" {
            written.claimed.insert(key, row.try_get("attempts")?);
        } else {
            written.recorded.insert(key);
        }
    }
    Ok(written)
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds the claims' parameters but their recipients (`$1`–`$6`).
fn claims<'q>(query: Query<'q>, group: &'q Group) -> Query<'q> {
    let c = &group.claims;
    query
        .bind(c.iter().map(|c| c.job_id.as_str()).collect::<Vec<_>>())
        .bind(c.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>())
        .bind(c.iter().map(|c| c.token).collect::<Vec<_>>())
        .bind(c.iter().map(|c| c.message_id.as_str()).collect::<Vec<_>>())
        .bind(group.lease.as_secs_f64())
        .bind(group.resend_uncertain)
}

/// Binds the claims' recipients, the parameter of [`WRITE_GROUP`] and [`CLAIM_GROUP`] before
/// the addresses to look up (the last).
fn recipients<'q>(query: Query<'q>, group: &'q Group) -> Query<'q> {
    query.bind(
        group
            .claims
            .iter()
            .map(|c| c.recipient.as_deref())
            .collect::<Vec<_>>(),
    )
}

/// Binds the records' eight parameters.
fn records<'q>(query: Query<'q>, group: &'q Group) -> Query<'q> {
    let r = &group.records;
    query
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
