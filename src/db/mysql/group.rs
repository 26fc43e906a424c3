//! MySQL/MariaDB statements of group commit (see `db/group.rs`): the claims and records of a
//! group in one transaction, so one commit.

use std::collections::{HashMap, HashSet};

use sqlx::{MySqlConnection, MySqlPool, QueryBuilder, Row};
use uuid::Uuid;

use super::{existing_claim, micros};
use crate::db::rows::{
    Claim, ClaimItem, ExistingClaim, Group, GroupResult, RecordItem, Suppression,
};

/// Row `i` of a derived table of bound values, `SELECT ? AS job_id, ? AS kind, ? AS token`
/// (`UNION ALL` before every row but the first), which MySQL 8 and MariaDB both read (their
/// `VALUES` constructors differ). The caller may add columns.
fn push_union_row(
    q: &mut QueryBuilder<sqlx::MySql>,
    i: usize,
    job_id: &str,
    kind: &str,
    token: Uuid,
) {
    q.push(if i == 0 {
        "SELECT "
    } else {
        " UNION ALL SELECT "
    })
    .push_bind(job_id.to_owned())
    .push(" AS job_id, ")
    .push_bind(kind.to_owned())
    .push(" AS kind, ")
    .push_bind(token)
    .push(" AS token");
}

/// `(job_id = ? AND kind = ?) OR …` over `keys`, for the unique key's range scan.
fn push_keys<'a>(
    q: &mut QueryBuilder<sqlx::MySql>,
    keys: impl Iterator<Item = (&'a str, &'a str)>,
) {
    let mut first = true;
    for (job_id, kind) in keys {
        q.push(if first { "(" } else { " OR (" });
        first = false;
        q.push("job_id = ")
            .push_bind(job_id)
            .push(" AND kind = ")
            .push_bind(kind)
            .push(")");
    }
}

/// A row's unique key, `(job_id, kind)`.
type Key = (String, String);

fn key_of(job_id: &str, kind: &str) -> Key {
    (job_id.to_owned(), kind.to_owned())
}

/// The claims and records of a group in one transaction, so one commit:
/// 1. which of the claimed keys have a row already (a plain read);
/// 2. one multi-row `INSERT` of the others (a key inserted meanwhile by another worker fails
///    the group with 1062, and its writes are done one by one);
/// 3. one guarded takeover `UPDATE … JOIN` of the existing rows, each with its own token;
/// 4. one `UPDATE … JOIN` of the records, each guarded by its token;
/// 5. a read of the rows whose outcome the counts do not tell (taken over or not, recorded or
///    not): the token in the row says whose claim it is;
/// 6. the suppression list's entries among the claims' addresses (`ClaimItem::screen`), so a
///    worker's lookup costs no statement outside the group.
pub(in crate::db) async fn write_group(
    pool: &MySqlPool,
    group: &Group,
) -> Result<GroupResult, sqlx::Error> {
    let lease = micros(group.lease);
    let mut tx = pool.begin().await?;
    let existing = existing_keys(&mut tx, &group.claims).await?;
    let (old, fresh): (Vec<&ClaimItem>, Vec<&ClaimItem>) = group
        .claims
        .iter()
        .partition(|c| existing.contains(&key_of(&c.job_id, &c.kind)));
    insert_claims(&mut tx, &fresh, lease).await?;
    take_over_claims(&mut tx, &old, lease, group.resend_uncertain).await?;
    let all_recorded = record_group(&mut tx, &group.records).await?;
    let unknown_records = group.records.iter().filter(|_| !all_recorded);
    let to_read: Vec<(&str, &str)> = old
        .iter()
        .map(|c| (c.job_id.as_str(), c.kind.as_str()))
        .chain(unknown_records.map(|r| (r.job_id.as_str(), r.kind.as_str())))
        .collect();
    let rows = read_group_rows(&mut tx, to_read).await?;
    let suppressed = super::suppressed_among(&mut tx, &group.screened_addresses()).await?;
    tx.commit().await?;
    Ok(group_result(
        group,
        &existing,
        &rows,
        all_recorded,
        &suppressed,
    ))
}

/// Step 1: the keys among `claims` that have a row already.
async fn existing_keys(
    tx: &mut MySqlConnection,
    claims: &[ClaimItem],
) -> Result<HashSet<Key>, sqlx::Error> {
    let mut existing = HashSet::new();
    if claims.is_empty() {
        return Ok(existing);
    }
    let mut q = QueryBuilder::new(
        "SELECT CAST(job_id AS CHAR CHARACTER SET utf8mb4) AS job_id, kind \
         FROM sent_notifications WHERE ",
    );
    push_keys(
        &mut q,
        claims.iter().map(|c| (c.job_id.as_str(), c.kind.as_str())),
    );
    for row in q.build().fetch_all(&mut *tx).await? {
        existing.insert((row.try_get("job_id")?, row.try_get("kind")?));
    }
    Ok(existing)
}

/// Step 2: one multi-row `INSERT` of the claims whose key has no row.
async fn insert_claims(
    tx: &mut MySqlConnection,
    fresh: &[&ClaimItem],
    lease: i64,
) -> Result<(), sqlx::Error> {
    if fresh.is_empty() {
        return Ok(());
    }
    let mut q = QueryBuilder::new(
        "INSERT INTO sent_notifications \
         (job_id, kind, status, attempts, lease_until, claim_token, message_id, recipient, \
          claimed_at) ",
    );
    q.push_values(fresh, |mut b, c| {
        b.push_bind(c.job_id.as_str())
            .push_bind(c.kind.as_str())
            .push("'sending'")
            .push("1")
            .push("UTC_TIMESTAMP(6) + INTERVAL ")
            .push_bind_unseparated(lease)
            .push_unseparated(" MICROSECOND")
            .push_bind(c.token)
            .push_bind(c.message_id.as_str())
            .push_bind(c.recipient.as_deref())
            .push("UTC_TIMESTAMP(6)");
    });
    q.build().execute(&mut *tx).await?;
    Ok(())
}

/// Step 3: one guarded takeover of the claims whose key has a row, each with its own token.
async fn take_over_claims(
    tx: &mut MySqlConnection,
    old: &[&ClaimItem],
    lease: i64,
    resend_uncertain: bool,
) -> Result<(), sqlx::Error> {
    if old.is_empty() {
        return Ok(());
    }
    let mut q = QueryBuilder::new("UPDATE sent_notifications n JOIN (");
    for (i, c) in old.iter().enumerate() {
        push_union_row(&mut q, i, &c.job_id, &c.kind, c.token);
        q.push(", ")
            .push_bind(c.recipient.as_deref())
            .push(" AS recipient");
    }
    q.push(
        ") c ON n.job_id = c.job_id AND n.kind = c.kind \
         SET n.status = 'sending', n.attempts = n.attempts + 1, \
             n.lease_until = UTC_TIMESTAMP(6) + INTERVAL ",
    )
    .push_bind(lease)
    .push(
        " MICROSECOND, n.claim_token = c.token, n.recipient = c.recipient, \
             n.claimed_at = UTC_TIMESTAMP(6), n.updated_at = UTC_TIMESTAMP(6) \
         WHERE n.status = 'failed' \
            OR (",
    )
    .push_bind(resend_uncertain)
    .push(" AND n.status = 'sending' AND n.lease_until < UTC_TIMESTAMP(6)) OR (")
    .push_bind(resend_uncertain)
    .push(" AND n.status = 'uncertain')");
    q.build().execute(&mut *tx).await?;
    Ok(())
}

/// Step 4: one `UPDATE … JOIN` of the records, each guarded by its token. True when every
/// record was written; otherwise which ones were is read back in step 5.
async fn record_group(
    tx: &mut MySqlConnection,
    records: &[RecordItem],
) -> Result<bool, sqlx::Error> {
    if records.is_empty() {
        return Ok(true);
    }
    let mut q = QueryBuilder::new("UPDATE sent_notifications n JOIN (");
    for (i, r) in records.iter().enumerate() {
        push_union_row(&mut q, i, &r.job_id, &r.kind, r.token);
        q.push(", ")
            .push_bind(r.status.as_str())
            .push(" AS status, ")
            .push_bind(r.smtp_reply.as_deref())
            .push(" AS reply, ")
            .push_bind(r.error.as_deref())
            .push(" AS error, ")
            .push_bind(r.class.as_deref())
            .push(" AS class, ")
            .push_bind(r.revision.as_deref())
            .push(" AS revision");
    }
    // `sent_at` tests the bound status, not the column assigned before it.
    q.push(concat!(
        ") r ON n.job_id = r.job_id AND n.kind = r.kind AND n.claim_token = r.token \
         SET n.history = ",
        history_append!("r.status", "r.status", "r.class", "r.reply", "r.error"),
        ", n.status = r.status, \
             n.smtp_reply = COALESCE(r.reply, n.smtp_reply), \
             n.last_error = r.error, \
             n.error_class = r.class, \
             n.template_revision = COALESCE(r.revision, n.template_revision), \
             n.lease_until = NULL, \
             n.sent_at = CASE WHEN r.status = 'sent' THEN UTC_TIMESTAMP(6) ELSE n.sent_at END, \
             n.updated_at = UTC_TIMESTAMP(6)",
    ));
    // CLIENT_FOUND_ROWS: each record matches at most its one row, by token.
    let done = q.build().execute(&mut *tx).await?;
    Ok(done.rows_affected() == records.len() as u64)
}

/// Step 5: the rows of `keys` as they are now, with the token each holds.
async fn read_group_rows(
    tx: &mut MySqlConnection,
    keys: Vec<(&str, &str)>,
) -> Result<HashMap<Key, (Option<Uuid>, ExistingClaim)>, sqlx::Error> {
    let mut rows = HashMap::new();
    if keys.is_empty() {
        return Ok(rows);
    }
    let mut q = QueryBuilder::new(
        "SELECT CAST(job_id AS CHAR CHARACTER SET utf8mb4) AS job_id, kind, status, attempts, \
         claim_token, error_class, last_error, \
         CASE WHEN lease_until > UTC_TIMESTAMP(6) \
              THEN TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) END AS lease_left_us \
         FROM sent_notifications WHERE ",
    );
    push_keys(&mut q, keys.into_iter());
    for row in q.build().fetch_all(&mut *tx).await? {
        let key = (row.try_get("job_id")?, row.try_get("kind")?);
        rows.insert(key, (row.try_get("claim_token")?, existing_claim(&row)?));
    }
    Ok(rows)
}

/// The answers of a group from what its steps found: a claim is ours when its key had no row
/// (inserted) or the row holds its token (taken over); a record is written when all were, or
/// when its row still holds its token (a record keeps the token).
fn group_result(
    group: &Group,
    existing: &HashSet<Key>,
    rows: &HashMap<Key, (Option<Uuid>, ExistingClaim)>,
    all_recorded: bool,
    suppressed: &[Suppression],
) -> GroupResult {
    let claims = group
        .claims
        .iter()
        .map(|c| match rows.get(&key_of(&c.job_id, &c.kind)) {
            None if !existing.contains(&key_of(&c.job_id, &c.kind)) => {
                Claim::taken(1, c.token, &c.screen, suppressed)
            }
            Some((holder, row)) if *holder == Some(c.token) => {
                Claim::taken(row.attempts, c.token, &c.screen, suppressed)
            }
            Some((_, row)) => Claim::Refused(Some(row.clone())),
            // Deleted between the read and the takeover (retention).
            None => Claim::Refused(None),
        })
        .collect();
    let records = group
        .records
        .iter()
        .map(|r| {
            all_recorded
                || rows
                    .get(&key_of(&r.job_id, &r.kind))
                    .is_some_and(|(holder, _)| *holder == Some(r.token))
        })
        .collect();
    GroupResult { claims, records }
}
