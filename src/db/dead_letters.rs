//! `mailroom_dead_letters`, the table every dead letter is ingested into from `<ns>.dead`
//! ([`crate::dlq::ingest`]) and every reader browses: each method dispatches to the engine's
//! statements (`postgres/dead_letters.rs`, `mysql/dead_letters.rs`), which the integration
//! suite checks on both engines.

use chrono::{DateTime, Utc};

pub use super::rows::{DeadLetterRow, GroupRow, LetterQuery, NewDeadLetter, like_pattern};
use super::{Database, mysql, postgres};

impl Database {
    /// Stores ingested letters in one transaction, each once: a letter stored before (same
    /// key) is not stored again. Each one's row id, and whether this call stored it. Any error
    /// other than a duplicate key fails them all (the caller must not ack them then).
    pub async fn insert_dead_letters(
        &self,
        letters: &[NewDeadLetter],
    ) -> sqlx::Result<Vec<(i64, bool)>> {
        match self {
            Database::Postgres(pool) => postgres::dead_letters::insert(pool, letters).await,
            Database::MySql(pool) => mysql::dead_letters::insert(pool, letters).await,
        }
    }

    /// The rows `query` selects, newest first.
    pub async fn dead_letters(&self, query: &LetterQuery) -> sqlx::Result<Vec<DeadLetterRow>> {
        match self {
            Database::Postgres(pool) => postgres::dead_letters::select(pool, query).await,
            Database::MySql(pool) => mysql::dead_letters::select(pool, query).await,
        }
    }

    /// The failure groups among the rows `query` selects (its `before`, `limit`, `ids` apply
    /// too), largest first.
    pub async fn dead_letter_groups(&self, query: &LetterQuery) -> sqlx::Result<Vec<GroupRow>> {
        match self {
            Database::Postgres(pool) => postgres::dead_letters::groups(pool, query).await,
            Database::MySql(pool) => mysql::dead_letters::groups(pool, query).await,
        }
    }

    /// How many rows `query` selects, by kind.
    pub async fn dead_letters_by_kind(
        &self,
        query: &LetterQuery,
    ) -> sqlx::Result<Vec<(String, i64)>> {
        match self {
            Database::Postgres(pool) => postgres::dead_letters::count_by_kind(pool, query).await,
            Database::MySql(pool) => mysql::dead_letters::count_by_kind(pool, query).await,
        }
    }

    /// Before a replay's publish: claims the `dead` rows among `ids` for the replay `token`
    /// for `ttl`, except those another replay holds a live claim on (a claim older than its
    /// `ttl` is taken over: its replay crashed). One atomic UPDATE on both engines; the ids
    /// this call claimed.
    pub async fn claim_dead_letters(
        &self,
        ids: &[i64],
        token: &str,
        ttl: std::time::Duration,
    ) -> sqlx::Result<Vec<i64>> {
        let secs = ttl.as_secs_f64();
        match self {
            Database::Postgres(pool) => postgres::dead_letters::claim(pool, ids, token, secs).await,
            Database::MySql(pool) => mysql::dead_letters::claim(pool, ids, token, secs).await,
        }
    }

    /// After a replay's publishes: marks the `dead` rows among `ids` claimed by `token`
    /// replayed by `by` with `result` when `published`, else only notes `result` (they stay
    /// dead); either way the claims are released. How many rows were still dead and claimed by
    /// `token`.
    pub async fn mark_dead_letters_replay(
        &self,
        ids: &[i64],
        token: &str,
        by: &str,
        result: &str,
        published: bool,
    ) -> sqlx::Result<u64> {
        match self {
            Database::Postgres(pool) => {
                postgres::dead_letters::mark_replay(pool, ids, token, by, result, published).await
            }
            Database::MySql(pool) => {
                mysql::dead_letters::mark_replay(pool, ids, token, by, result, published).await
            }
        }
    }

    /// Marks the `dead` rows among `ids` purged by `by` (not those a replay holds a live claim
    /// on), or, with `delete`, deletes every row of `ids`. How many rows changed.
    pub async fn purge_dead_letters(
        &self,
        ids: &[i64],
        by: &str,
        delete: bool,
    ) -> sqlx::Result<u64> {
        match self {
            Database::Postgres(pool) => postgres::dead_letters::purge(pool, ids, by, delete).await,
            Database::MySql(pool) => mysql::dead_letters::purge(pool, ids, by, delete).await,
        }
    }

    /// Deletes at most `batch` replayed or purged rows that left `dead` before `cutoff`; rows
    /// still `dead` are kept whatever their age. How many were deleted.
    pub async fn expire_dead_letters(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> sqlx::Result<u64> {
        match self {
            Database::Postgres(pool) => postgres::dead_letters::expire(pool, cutoff, batch).await,
            Database::MySql(pool) => mysql::dead_letters::expire(pool, cutoff, batch).await,
        }
    }
}
