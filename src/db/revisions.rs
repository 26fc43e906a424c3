//! `mailroom_template_revisions`: the console's history of template edits, one row per save of
//! one kind and locale, with the parts as saved (see the migration for why a table).

use super::Database;

/// One saved revision of a kind's templates in one locale (`""`: the default files).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TemplateRevision {
    pub id: i64,
    pub kind: String,
    pub locale: String,
    /// SHA-256 (hex) of the parts, as the console computes it.
    pub hash: String,
    pub subject: String,
    pub html: String,
    pub text: Option<String>,
    /// The name given at login, or a marker such as `(on disk)`.
    pub author: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A revision to record.
#[derive(Clone, Copy, Debug)]
pub struct NewRevision<'a> {
    pub kind: &'a str,
    pub locale: &'a str,
    pub hash: &'a str,
    pub subject: &'a str,
    pub html: &'a str,
    pub text: Option<&'a str>,
    pub author: &'a str,
}

macro_rules! select {
    ($where:literal) => {
        concat!(
            "SELECT id, kind, locale, hash, subject, html, text, author, created_at ",
            "FROM mailroom_template_revisions ",
            $where
        )
    };
}
const PG_LIST: &str = select!("WHERE kind = $1 AND locale = $2 ORDER BY id DESC LIMIT $3");
const MYSQL_LIST: &str = select!("WHERE kind = ? AND locale = ? ORDER BY id DESC LIMIT ?");

impl Database {
    /// Records one revision.
    pub async fn insert_template_revision(&self, r: &NewRevision<'_>) -> sqlx::Result<()> {
        let sql = match self {
            Database::Postgres(_) => {
                "INSERT INTO mailroom_template_revisions \
                 (kind, locale, hash, subject, html, text, author) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)"
            }
            Database::MySql(_) => {
                "INSERT INTO mailroom_template_revisions \
                 (kind, locale, hash, subject, html, text, author) VALUES (?, ?, ?, ?, ?, ?, ?)"
            }
        };
        macro_rules! run {
            ($pool:expr) => {
                sqlx::query(sql)
                    .bind(r.kind)
                    .bind(r.locale)
                    .bind(r.hash)
                    .bind(r.subject)
                    .bind(r.html)
                    .bind(r.text)
                    .bind(r.author)
                    .execute($pool)
                    .await
                    .map(drop)
            };
        }
        match self {
            Database::Postgres(pool) => run!(pool),
            Database::MySql(pool) => run!(pool),
        }
    }

    /// The newest `limit` revisions of `kind` in `locale`, newest first.
    pub async fn template_revisions(
        &self,
        kind: &str,
        locale: &str,
        limit: i64,
    ) -> sqlx::Result<Vec<TemplateRevision>> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query_as(PG_LIST)
                    .bind(kind)
                    .bind(locale)
                    .bind(limit)
                    .fetch_all(pool)
                    .await
            }
            Database::MySql(pool) => {
                sqlx::query_as(MYSQL_LIST)
                    .bind(kind)
                    .bind(locale)
                    .bind(limit)
                    .fetch_all(pool)
                    .await
            }
        }
    }
}
