//! MySQL/MariaDB statements of `mailroom_dead_letters`. The insert of an ingested letter is a
//! plain `INSERT` whose duplicate-key error (1062) on the letter's key means "already stored";
//! never `INSERT IGNORE`, which would turn a too-long value or a lost packet into a warning and
//! let the caller ack a letter that has no row. Identifiers are VARBINARY (read back as bytes);
//! the searched text is lowered on both sides, so the match ignores case as PostgreSQL's ILIKE.

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlDatabaseError, MySqlRow};
use sqlx::{MySql, MySqlConnection, MySqlPool, QueryBuilder, Row};

use crate::db::rows::{DeadLetterRow, GroupRow, LetterQuery, NewDeadLetter, like_pattern};

/// MySQL's "Duplicate entry … for key …".
const ER_DUP_ENTRY: u16 = 1062;

const INSERT: &str = "
INSERT INTO mailroom_dead_letters
    (letter_key, job_id, kind, recipient, recipients, class, reason, reason_group, group_key,
     attempts, failed_at, replays, exchange, routing_key, properties, body, body_size)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// A locking read: inside a group's transaction it sees the row another ingester committed
/// after the transaction's snapshot (the one its duplicate key ran into).
const ID_OF_KEY: &str =
    "SELECT id FROM mailroom_dead_letters WHERE letter_key = ? LOCK IN SHARE MODE";

const COLUMNS: &str = "id, job_id, kind, recipient, recipients, class, reason, reason_group, \
    group_key, attempts, failed_at, replays, exchange, routing_key, body_size, ingested_at, \
    state, replayed_at, replayed_by, replay_result, purged_at, purged_by";

/// When a letter failed, or, without a failure time, when it was ingested.
const SEEN: &str = "COALESCE(failed_at, ingested_at)";

fn is_duplicate_key(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.try_downcast_ref::<MySqlDatabaseError>().is_some_and(|m| m.number() == ER_DUP_ENTRY))
}

/// Stores letters in one transaction, each unless its key is there; each one's row id, and
/// whether this call inserted it. A duplicate key fails only its statement in InnoDB, so the
/// transaction goes on.
pub(in crate::db) async fn insert(
    pool: &MySqlPool,
    letters: &[NewDeadLetter],
) -> Result<Vec<(i64, bool)>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut stored = Vec::with_capacity(letters.len());
    for l in letters {
        stored.push(insert_one(&mut tx, l).await?);
    }
    tx.commit().await?;
    Ok(stored)
}

async fn insert_one(
    conn: &mut MySqlConnection,
    l: &NewDeadLetter,
) -> Result<(i64, bool), sqlx::Error> {
    let done = sqlx::query(INSERT)
        .bind(&l.letter_key)
        .bind(l.job_id.as_bytes())
        .bind(l.kind.as_bytes())
        .bind(&l.recipient)
        .bind(l.recipients)
        .bind(l.class.as_bytes())
        .bind(&l.reason)
        .bind(&l.reason_group)
        .bind(&l.group_key)
        .bind(l.attempts)
        .bind(l.failed_at)
        .bind(l.replays)
        .bind(l.exchange.as_bytes())
        .bind(l.routing_key.as_bytes())
        .bind(&l.properties)
        .bind(&l.body)
        .bind(l.body_size)
        .execute(&mut *conn)
        .await;
    match done {
        Ok(done) => Ok((
            i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX),
            true,
        )),
        Err(e) if is_duplicate_key(&e) => {
            let id = sqlx::query_scalar(ID_OF_KEY)
                .bind(&l.letter_key)
                .fetch_one(&mut *conn)
                .await?;
            Ok((id, false))
        }
        Err(e) => Err(e),
    }
}

/// `column IN (…)` of `values`.
fn push_in<T>(qb: &mut QueryBuilder<MySql>, column: &str, values: &[T])
where
    T: for<'q> sqlx::Encode<'q, MySql> + sqlx::Type<MySql> + Clone + Send + 'static,
{
    qb.push(format!(" AND {column} IN ("));
    let mut list = qb.separated(", ");
    for v in values {
        list.push_bind(v.clone());
    }
    qb.push(")");
}

/// The conditions of `q`, after a `WHERE TRUE`.
fn push_filter(qb: &mut QueryBuilder<MySql>, q: &LetterQuery) {
    qb.push(" WHERE TRUE");
    if let Some(state) = &q.state {
        qb.push(" AND state = ")
            .push_bind(state.clone().into_bytes());
    }
    if let Some(kind) = &q.kind {
        qb.push(" AND kind = ").push_bind(kind.clone().into_bytes());
    }
    if let Some(class) = &q.class {
        qb.push(" AND class = ")
            .push_bind(class.clone().into_bytes());
    }
    if let Some(since) = q.since {
        qb.push(format!(" AND {SEEN} >= ")).push_bind(since);
    }
    if let Some(until) = q.until {
        qb.push(format!(" AND {SEEN} < ")).push_bind(until);
    }
    if let Some(text) = &q.text {
        let p = like_pattern(text);
        qb.push(" AND (LOWER(reason) LIKE ").push_bind(p.clone());
        qb.push(" ESCAPE '!' OR LOWER(recipient) LIKE ")
            .push_bind(p.clone());
        qb.push(" ESCAPE '!' OR LOWER(CONVERT(job_id USING utf8mb4)) LIKE ")
            .push_bind(p);
        qb.push(" ESCAPE '!')");
    }
    if let Some(group) = &q.group_key {
        qb.push(" AND group_key = ").push_bind(group.clone());
    }
    if !q.ids.is_empty() {
        push_in(qb, "id", &q.ids);
    }
    if !q.job_ids.is_empty() {
        let ids: Vec<Vec<u8>> = q.job_ids.iter().map(|j| j.clone().into_bytes()).collect();
        push_in(qb, "job_id", &ids);
    }
    if let Some(before) = q.before {
        qb.push(" AND id < ").push_bind(before);
    }
}

/// The rows `q` selects, newest first.
pub(in crate::db) async fn select(
    pool: &MySqlPool,
    q: &LetterQuery,
) -> Result<Vec<DeadLetterRow>, sqlx::Error> {
    let payload = if q.payload {
        "properties, body"
    } else {
        "x'' AS properties, x'' AS body"
    };
    let mut qb = QueryBuilder::new(format!(
        "SELECT {COLUMNS}, {payload} FROM mailroom_dead_letters"
    ));
    push_filter(&mut qb, q);
    qb.push(" ORDER BY id DESC");
    if let Some(limit) = q.limit {
        qb.push(" LIMIT ").push_bind(limit);
    }
    let rows = qb.build().fetch_all(pool).await?;
    rows.iter().map(row).collect()
}

/// A VARBINARY column as text.
fn text(r: &MySqlRow, column: &str) -> Result<String, sqlx::Error> {
    let bytes: Vec<u8> = r.try_get(column)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn row(r: &MySqlRow) -> Result<DeadLetterRow, sqlx::Error> {
    Ok(DeadLetterRow {
        id: r.try_get("id")?,
        job_id: text(r, "job_id")?,
        kind: text(r, "kind")?,
        recipient: r.try_get("recipient")?,
        recipients: r.try_get("recipients")?,
        class: text(r, "class")?,
        reason: r.try_get("reason")?,
        reason_group: r.try_get("reason_group")?,
        group_key: r.try_get("group_key")?,
        attempts: r.try_get("attempts")?,
        failed_at: r.try_get("failed_at")?,
        replays: r.try_get("replays")?,
        exchange: text(r, "exchange")?,
        routing_key: text(r, "routing_key")?,
        properties: r.try_get("properties")?,
        body: r.try_get("body")?,
        body_size: r.try_get("body_size")?,
        ingested_at: r.try_get("ingested_at")?,
        state: text(r, "state")?,
        replayed_at: r.try_get("replayed_at")?,
        replayed_by: r.try_get("replayed_by")?,
        replay_result: r.try_get("replay_result")?,
        purged_at: r.try_get("purged_at")?,
        purged_by: r.try_get("purged_by")?,
    })
}

/// The failure groups among the rows `q` selects, largest first.
pub(in crate::db) async fn groups(
    pool: &MySqlPool,
    q: &LetterQuery,
) -> Result<Vec<GroupRow>, sqlx::Error> {
    let mut qb = QueryBuilder::new(format!(
        "SELECT group_key, class, reason_group, COUNT(*) AS n, MIN({SEEN}) AS first_seen, \
         MAX({SEEN}) AS last_seen FROM mailroom_dead_letters"
    ));
    push_filter(&mut qb, q);
    qb.push(" GROUP BY group_key, class, reason_group ORDER BY n DESC, last_seen DESC");
    let rows = qb.build().fetch_all(pool).await?;
    rows.iter()
        .map(|r| {
            Ok(GroupRow {
                group_key: r.try_get("group_key")?,
                class: text(r, "class")?,
                reason_group: r.try_get("reason_group")?,
                count: r.try_get("n")?,
                first_seen: r.try_get("first_seen")?,
                last_seen: r.try_get("last_seen")?,
            })
        })
        .collect()
}

/// How many rows `q` selects, by kind.
pub(in crate::db) async fn count_by_kind(
    pool: &MySqlPool,
    q: &LetterQuery,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let mut qb = QueryBuilder::new("SELECT kind, COUNT(*) AS n FROM mailroom_dead_letters");
    push_filter(&mut qb, q);
    qb.push(" GROUP BY kind");
    let rows = qb.build().fetch_all(pool).await?;
    rows.iter()
        .map(|r| Ok((text(r, "kind")?, r.try_get("n")?)))
        .collect()
}

/// Claims the `dead` rows among `ids` for the replay `token` for `ttl_secs`, except those
/// another replay holds a live claim on; the ids this call claimed (read back by the token,
/// which is this replay's alone).
pub(in crate::db) async fn claim(
    pool: &MySqlPool,
    ids: &[i64],
    token: &str,
    ttl_secs: f64,
) -> Result<Vec<i64>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(vec![]);
    }
    let mut qb = QueryBuilder::new("UPDATE mailroom_dead_letters SET claim_token = ");
    qb.push_bind(token.as_bytes().to_vec())
        .push(", claimed_until = UTC_TIMESTAMP(6) + INTERVAL ")
        .push_bind((ttl_secs * 1e6) as i64)
        .push(
            " MICROSECOND WHERE state = 'dead' \
             AND (claimed_until IS NULL OR claimed_until < UTC_TIMESTAMP(6))",
        );
    push_in(&mut qb, "id", ids);
    if qb.build().execute(pool).await?.rows_affected() == 0 {
        return Ok(vec![]);
    }
    let mut qb = QueryBuilder::new("SELECT id FROM mailroom_dead_letters WHERE claim_token = ");
    qb.push_bind(token.as_bytes().to_vec());
    push_in(&mut qb, "id", ids);
    qb.build_query_scalar().fetch_all(pool).await
}

/// Marks the `dead` rows among `ids` claimed by `token` replayed (`published`) or notes why
/// their replay failed, releasing the claims; how many rows were still dead and claimed by
/// `token`.
pub(in crate::db) async fn mark_replay(
    pool: &MySqlPool,
    ids: &[i64],
    token: &str,
    by: &str,
    result: &str,
    published: bool,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut qb = QueryBuilder::new("UPDATE mailroom_dead_letters SET ");
    if published {
        qb.push(
            "state = 'replayed', replayed_at = UTC_TIMESTAMP(6), \
             settled_at = UTC_TIMESTAMP(6), ",
        );
    }
    qb.push("replayed_by = ")
        .push_bind(by.to_string())
        .push(", replay_result = ")
        .push_bind(result.to_string())
        .push(", claim_token = NULL, claimed_until = NULL WHERE state = 'dead' AND claim_token = ")
        .push_bind(token.as_bytes().to_vec());
    push_in(&mut qb, "id", ids);
    Ok(qb.build().execute(pool).await?.rows_affected())
}

/// Marks the `dead` rows among `ids` purged (not those a replay holds), or deletes every row of
/// `ids`; how many.
pub(in crate::db) async fn purge(
    pool: &MySqlPool,
    ids: &[i64],
    by: &str,
    delete: bool,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut qb = if delete {
        QueryBuilder::new("DELETE FROM mailroom_dead_letters WHERE TRUE")
    } else {
        let mut qb = QueryBuilder::new(
            "UPDATE mailroom_dead_letters SET state = 'purged', purged_at = UTC_TIMESTAMP(6), \
             settled_at = UTC_TIMESTAMP(6), purged_by = ",
        );
        qb.push_bind(by.to_string()).push(
            " WHERE state = 'dead' \
             AND (claimed_until IS NULL OR claimed_until < UTC_TIMESTAMP(6))",
        );
        qb
    };
    push_in(&mut qb, "id", ids);
    Ok(qb.build().execute(pool).await?.rows_affected())
}

const EXPIRE: &str = "
DELETE FROM mailroom_dead_letters
WHERE state <> 'dead' AND settled_at < ?
ORDER BY id LIMIT ?";

/// Deletes at most `batch` replayed or purged rows settled before `cutoff`; how many.
pub(in crate::db) async fn expire(
    pool: &MySqlPool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(EXPIRE)
        .bind(cutoff)
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
