//! The reads of the Jobs page: every job, whether the ledger has it (claimed at least once)
//! or only the outbox does (pending or published, not yet claimed), searched and paged newest
//! first (the outbox's `recipient` is generated from the payload's first `to`); and the ledger's side of one job's timeline. Both engines, side by side: the query is
//! one shape, the differences are how a key compares byte for byte (MariaDB's `VARBINARY`,
//! PostgreSQL's `COLLATE "C"`) and how a prefix is tested.

use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Row};

use super::Database;

/// What to look for; every filter set must hold.
#[derive(Clone, Debug, Default)]
pub struct JobQuery {
    /// A job id, exact, or a prefix of it when `prefix`.
    pub job_id: Option<String>,
    pub prefix: bool,
    /// The normalised first `to` address (`job::normalised_address`), exact.
    pub recipient: Option<String>,
    pub kind: Option<String>,
    /// A ledger status, or `pending`, `published`, `parked` (outbox only).
    pub state: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Only jobs after this one in the order (newest first): the cursor.
    pub after: Option<JobKey>,
    pub limit: i64,
}

/// A job's place in the order: newest first, then job id and kind, byte for byte, descending.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobKey {
    pub created_at: DateTime<Utc>,
    pub job_id: String,
    pub kind: String,
}

/// One job found.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    pub job_id: String,
    pub kind: String,
    pub state: String,
    /// When its outbox row was written, or (published straight to the broker) first claimed.
    pub created_at: DateTime<Utc>,
    pub recipient: Option<String>,
}

/// The ledger's columns for a timeline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LedgerTimeline {
    pub recipient: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
    /// The `history` column: a JSON array of failed attempts and replays.
    pub history: Option<String>,
}

/// The union of ledger rows (with their outbox row, if any) and outbox rows not yet claimed.
const JOBS: &str = "
    SELECT n.job_id, n.kind, n.status AS state, COALESCE(o.created_at, n.created_at) AS created_at,
           n.recipient
    FROM sent_notifications n
    LEFT JOIN mailroom_outbox o ON o.job_id = n.job_id AND o.kind = n.kind
    UNION ALL
    SELECT o.job_id, o.kind,
           CASE WHEN o.parked_at IS NOT NULL THEN 'parked'
                WHEN o.published_at IS NOT NULL THEN 'published' ELSE 'pending' END,
           o.created_at, o.recipient
    FROM mailroom_outbox o
    WHERE NOT EXISTS (SELECT 1 FROM sent_notifications n
                      WHERE n.job_id = o.job_id AND n.kind = o.kind)";

impl Database {
    /// The jobs that match `q`, newest first, at most `q.limit`.
    pub async fn search_jobs(&self, q: &JobQuery) -> Result<Vec<JobRow>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => {
                let mut b = QueryBuilder::new(
                    "SELECT j.job_id, j.kind, j.state, j.created_at, j.recipient FROM (",
                );
                push_filters(&mut b, q, Engine::Postgres);
                let rows = b.build().fetch_all(pool).await?;
                rows.iter().map(job_row).collect()
            }
            Database::MySql(pool) => {
                let mut b = QueryBuilder::new(
                    "SELECT CAST(j.job_id AS CHAR CHARACTER SET utf8mb4) AS job_id, j.kind, \
                     j.state, j.created_at, \
                     CAST(j.recipient AS CHAR CHARACTER SET utf8mb4) AS recipient FROM (",
                );
                push_filters(&mut b, q, Engine::MySql);
                let rows = b.build().fetch_all(pool).await?;
                rows.iter().map(job_row).collect()
            }
        }
    }

    /// The ledger's recipient, claim time and history of `(job_id, kind)`.
    pub async fn ledger_timeline(
        &self,
        job_id: &str,
        kind: &str,
    ) -> Result<Option<LedgerTimeline>, sqlx::Error> {
        let sql = match self {
            Database::Postgres(_) => {
                "SELECT recipient, claimed_at, history::text AS history FROM sent_notifications \
                 WHERE job_id = $1 AND kind = $2"
            }
            Database::MySql(_) => {
                "SELECT CAST(recipient AS CHAR CHARACTER SET utf8mb4) AS recipient, claimed_at, \
                 history FROM sent_notifications WHERE job_id = ? AND kind = ?"
            }
        };
        let row = match self {
            Database::Postgres(pool) => {
                let row = sqlx::query(sql)
                    .bind(job_id)
                    .bind(kind)
                    .fetch_optional(pool)
                    .await?;
                row.map(|r| timeline_of(&r)).transpose()?
            }
            Database::MySql(pool) => {
                let row = sqlx::query(sql)
                    .bind(job_id)
                    .bind(kind)
                    .fetch_optional(pool)
                    .await?;
                row.map(|r| timeline_of(&r)).transpose()?
            }
        };
        Ok(row)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Engine {
    Postgres,
    MySql,
}

/// The union, the filters, the cursor, the order and the limit, after the caller's `SELECT`.
fn push_filters<DB>(b: &mut QueryBuilder<DB>, q: &JobQuery, engine: Engine)
where
    DB: sqlx::Database,
    for<'a> String: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> DateTime<Utc>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    // Byte order on both engines: MariaDB's keys are VARBINARY (kind is utf8mb4_bin).
    let bytes = if engine == Engine::Postgres {
        " COLLATE \"C\""
    } else {
        ""
    };
    b.push(JOBS).push(") j WHERE 1 = 1");
    match (&q.job_id, q.prefix, engine) {
        (Some(id), false, _) => {
            b.push(" AND j.job_id = ").push_bind(id.clone());
        }
        (Some(id), true, Engine::Postgres) => {
            b.push(" AND starts_with(j.job_id, ")
                .push_bind(id.clone())
                .push(")");
        }
        (Some(id), true, Engine::MySql) => {
            b.push(" AND LEFT(j.job_id, ")
                .push_bind(id.len() as i64)
                .push(") = ")
                .push_bind(id.clone());
        }
        (None, _, _) => {}
    }
    if let Some(recipient) = &q.recipient {
        b.push(" AND j.recipient = ").push_bind(recipient.clone());
    }
    if let Some(kind) = &q.kind {
        b.push(" AND j.kind = ").push_bind(kind.clone());
    }
    if let Some(state) = &q.state {
        b.push(" AND j.state = ").push_bind(state.clone());
    }
    if let Some(since) = q.since {
        b.push(" AND j.created_at >= ").push_bind(since);
    }
    if let Some(until) = q.until {
        b.push(" AND j.created_at < ").push_bind(until);
    }
    if let Some(after) = &q.after {
        b.push(" AND (j.created_at < ")
            .push_bind(after.created_at)
            .push(" OR (j.created_at = ")
            .push_bind(after.created_at)
            .push(format!(" AND (j.job_id{bytes} < "))
            .push_bind(after.job_id.clone())
            .push(" OR (j.job_id = ")
            .push_bind(after.job_id.clone())
            .push(format!(" AND j.kind{bytes} < "))
            .push_bind(after.kind.clone())
            .push("))))");
    }
    b.push(format!(
        " ORDER BY j.created_at DESC, j.job_id{bytes} DESC, j.kind{bytes} DESC LIMIT "
    ))
    .push_bind(q.limit);
}

fn job_row<R: Row>(row: &R) -> Result<JobRow, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Option<String>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> DateTime<Utc>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(JobRow {
        job_id: row.try_get("job_id")?,
        kind: row.try_get("kind")?,
        state: row.try_get("state")?,
        created_at: row.try_get("created_at")?,
        recipient: row.try_get("recipient")?,
    })
}

fn timeline_of<R: Row>(row: &R) -> Result<LedgerTimeline, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> Option<String>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Option<DateTime<Utc>>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(LedgerTimeline {
        recipient: row.try_get("recipient")?,
        claimed_at: row.try_get("claimed_at")?,
        history: row.try_get("history")?,
    })
}
