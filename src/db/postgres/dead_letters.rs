//! PostgreSQL statements of `mailroom_dead_letters`: the idempotent insert of an ingested letter
//! (`ON CONFLICT DO NOTHING` on the letter's key, which swallows nothing but the duplicate), the
//! reads every listing, group and replay takes, and the marks a replay or purge leaves.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, QueryBuilder, Row};

use crate::db::rows::{DeadLetterRow, GroupRow, LetterQuery, NewDeadLetter, like_pattern};

const INSERT: &str = "
INSERT INTO mailroom_dead_letters
    (letter_key, job_id, kind, recipient, recipients, class, reason, reason_group, group_key,
     attempts, failed_at, replays, exchange, routing_key, properties, body, body_size)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
ON CONFLICT (letter_key) DO NOTHING
RETURNING id";

const ID_OF_KEY: &str = "SELECT id FROM mailroom_dead_letters WHERE letter_key = $1";

const COLUMNS: &str = "id, job_id, kind, recipient, recipients, class, reason, reason_group, \
    group_key, attempts, failed_at, replays, exchange, routing_key, body_size, ingested_at, \
    state, replayed_at, replayed_by, replay_result, purged_at, purged_by";

/// When a letter failed, or, without a failure time, when it was ingested.
const SEEN: &str = "COALESCE(failed_at, ingested_at)";

/// Stores letters in one transaction, each unless its key is there; each one's row id, and
/// whether this call inserted it.
pub(in crate::db) async fn insert(
    pool: &PgPool,
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
    conn: &mut PgConnection,
    l: &NewDeadLetter,
) -> Result<(i64, bool), sqlx::Error> {
    let inserted: Option<i64> = sqlx::query_scalar(INSERT)
        .bind(&l.letter_key)
        .bind(&l.job_id)
        .bind(&l.kind)
        .bind(&l.recipient)
        .bind(l.recipients)
        .bind(&l.class)
        .bind(&l.reason)
        .bind(&l.reason_group)
        .bind(&l.group_key)
        .bind(l.attempts)
        .bind(l.failed_at)
        .bind(l.replays)
        .bind(&l.exchange)
        .bind(&l.routing_key)
        .bind(&l.properties)
        .bind(&l.body)
        .bind(l.body_size)
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(id) = inserted {
        return Ok((id, true));
    }
    let id = sqlx::query_scalar(ID_OF_KEY)
        .bind(&l.letter_key)
        .fetch_one(&mut *conn)
        .await?;
    Ok((id, false))
}

/// The conditions of `q`, after a `WHERE TRUE`.
fn push_filter(qb: &mut QueryBuilder<Postgres>, q: &LetterQuery) {
    qb.push(" WHERE TRUE");
    if let Some(state) = &q.state {
        qb.push(" AND state = ").push_bind(state.clone());
    }
    if let Some(kind) = &q.kind {
        qb.push(" AND kind = ").push_bind(kind.clone());
    }
    if let Some(class) = &q.class {
        qb.push(" AND class = ").push_bind(class.clone());
    }
    if let Some(since) = q.since {
        qb.push(format!(" AND {SEEN} >= ")).push_bind(since);
    }
    if let Some(until) = q.until {
        qb.push(format!(" AND {SEEN} < ")).push_bind(until);
    }
    if let Some(text) = &q.text {
        let p = like_pattern(text);
        qb.push(" AND (reason ILIKE ").push_bind(p.clone());
        qb.push(" ESCAPE '!' OR recipient ILIKE ")
            .push_bind(p.clone());
        qb.push(" ESCAPE '!' OR job_id ILIKE ").push_bind(p);
        qb.push(" ESCAPE '!')");
    }
    if let Some(group) = &q.group_key {
        qb.push(" AND group_key = ").push_bind(group.clone());
    }
    if !q.ids.is_empty() {
        qb.push(" AND id = ANY(").push_bind(q.ids.clone()).push(")");
    }
    if !q.job_ids.is_empty() {
        qb.push(" AND job_id = ANY(")
            .push_bind(q.job_ids.clone())
            .push(")");
    }
    if let Some(before) = q.before {
        qb.push(" AND id < ").push_bind(before);
    }
}

/// The rows `q` selects, newest first.
pub(in crate::db) async fn select(
    pool: &PgPool,
    q: &LetterQuery,
) -> Result<Vec<DeadLetterRow>, sqlx::Error> {
    let payload = if q.payload {
        "properties, body"
    } else {
        "''::bytea AS properties, ''::bytea AS body"
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

fn row(r: &PgRow) -> Result<DeadLetterRow, sqlx::Error> {
    Ok(DeadLetterRow {
        id: r.try_get("id")?,
        job_id: r.try_get("job_id")?,
        kind: r.try_get("kind")?,
        recipient: r.try_get("recipient")?,
        recipients: r.try_get("recipients")?,
        class: r.try_get("class")?,
        reason: r.try_get("reason")?,
        reason_group: r.try_get("reason_group")?,
        group_key: r.try_get("group_key")?,
        attempts: r.try_get("attempts")?,
        failed_at: r.try_get("failed_at")?,
        replays: r.try_get("replays")?,
        exchange: r.try_get("exchange")?,
        routing_key: r.try_get("routing_key")?,
        properties: r.try_get("properties")?,
        body: r.try_get("body")?,
        body_size: r.try_get("body_size")?,
        ingested_at: r.try_get("ingested_at")?,
        state: r.try_get("state")?,
        replayed_at: r.try_get("replayed_at")?,
        replayed_by: r.try_get("replayed_by")?,
        replay_result: r.try_get("replay_result")?,
        purged_at: r.try_get("purged_at")?,
        purged_by: r.try_get("purged_by")?,
    })
}

/// The failure groups among the rows `q` selects, largest first.
pub(in crate::db) async fn groups(
    pool: &PgPool,
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
                class: r.try_get("class")?,
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
    pool: &PgPool,
    q: &LetterQuery,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let mut qb = QueryBuilder::new("SELECT kind, COUNT(*) FROM mailroom_dead_letters");
    push_filter(&mut qb, q);
    qb.push(" GROUP BY kind");
    qb.build_query_as().fetch_all(pool).await
}

const CLAIM: &str = "
UPDATE mailroom_dead_letters
SET claim_token = $2, claimed_until = now() + make_interval(secs => $3)
WHERE id = ANY($1) AND state = 'dead' AND (claimed_until IS NULL OR claimed_until < now())
RETURNING id";

/// Claims the `dead` rows among `ids` for the replay `token` for `ttl_secs`, except those
/// another replay holds a live claim on; the ids this call claimed.
pub(in crate::db) async fn claim(
    pool: &PgPool,
    ids: &[i64],
    token: &str,
    ttl_secs: f64,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(CLAIM)
        .bind(ids)
        .bind(token)
        .bind(ttl_secs)
        .fetch_all(pool)
        .await
}

const MARK_REPLAYED: &str = "
UPDATE mailroom_dead_letters
SET state = 'replayed', replayed_at = now(), replayed_by = $2, replay_result = $3,
    settled_at = now(), claim_token = NULL, claimed_until = NULL
WHERE id = ANY($1) AND state = 'dead' AND claim_token = $4";

const NOTE_REPLAY_FAILED: &str = "
UPDATE mailroom_dead_letters
SET replayed_by = $2, replay_result = $3, claim_token = NULL, claimed_until = NULL
WHERE id = ANY($1) AND state = 'dead' AND claim_token = $4";

/// Marks the `dead` rows among `ids` claimed by `token` replayed (`published`) or notes why
/// their replay failed, releasing the claims; how many rows were still dead and claimed by
/// `token`.
pub(in crate::db) async fn mark_replay(
    pool: &PgPool,
    ids: &[i64],
    token: &str,
    by: &str,
    result: &str,
    published: bool,
) -> Result<u64, sqlx::Error> {
    let sql = if published {
        MARK_REPLAYED
    } else {
        NOTE_REPLAY_FAILED
    };
    let done = sqlx::query(sql)
        .bind(ids)
        .bind(by)
        .bind(result)
        .bind(token)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

const MARK_PURGED: &str = "
UPDATE mailroom_dead_letters
SET state = 'purged', purged_at = now(), purged_by = $2, settled_at = now()
WHERE id = ANY($1) AND state = 'dead' AND (claimed_until IS NULL OR claimed_until < now())";

const DELETE: &str = "DELETE FROM mailroom_dead_letters WHERE id = ANY($1)";

/// Marks the `dead` rows among `ids` purged (not those a replay holds), or deletes every row of
/// `ids`; how many.
pub(in crate::db) async fn purge(
    pool: &PgPool,
    ids: &[i64],
    by: &str,
    delete: bool,
) -> Result<u64, sqlx::Error> {
    let done = if delete {
        sqlx::query(DELETE).bind(ids).execute(pool).await?
    } else {
        sqlx::query(MARK_PURGED)
            .bind(ids)
            .bind(by)
            .execute(pool)
            .await?
    };
    Ok(done.rows_affected())
}

const EXPIRE: &str = "
DELETE FROM mailroom_dead_letters
WHERE id IN (SELECT id FROM mailroom_dead_letters
             WHERE state <> 'dead' AND settled_at < $1
             ORDER BY id LIMIT $2)";

/// Deletes at most `batch` replayed or purged rows settled before `cutoff`; how many.
pub(in crate::db) async fn expire(
    pool: &PgPool,
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
