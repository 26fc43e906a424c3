//! `mailroom_suppressions`: the addresses mailroom does not send to, each with why (a hard
//! bounce, a complaint, an unsubscribe, an operator's entry), when and by whom. Addresses are
//! stored and looked up normalised ([`crate::job::normalised_address`]: the domain in lower
//! case, the local part as given) and compared byte for byte on both engines.

use chrono::{DateTime, Utc};

use super::rows::SuppressionRow as Row;
pub use super::rows::{Reason, Suppression};
use super::{Database, mysql};
use crate::job::{MAX_RECIPIENT_BYTES, normalised_address};

/// The ledger's class, and the state `status` shows, of a job not sent because its recipient
/// is suppressed: a `dead` row that was never a failure, and never dead-lettered.
pub const SUPPRESSED: &str = "suppressed";

/// An address as the table keys it, or why it cannot be one.
pub fn key(address: &str) -> Result<String, String> {
    let address = address.trim();
    if !address.contains('@') {
        return Err(format!("{address:?} is not an email address"));
    }
    let key = normalised_address(address);
    if key.len() > MAX_RECIPIENT_BYTES {
        return Err(format!(
            "an address of {} bytes is longer than the {MAX_RECIPIENT_BYTES} kept",
            key.len()
        ));
    }
    Ok(key)
}

const PG_ADD: &str = "INSERT INTO mailroom_suppressions (address, reason, detail, created_by) \
    VALUES ($1, $2, $3, $4) ON CONFLICT (address) DO UPDATE SET reason = excluded.reason, \
    detail = excluded.detail, created_by = excluded.created_by, created_at = now()";
const MYSQL_ADD: &str = "INSERT INTO mailroom_suppressions (address, reason, detail, \
    created_by) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE reason = VALUES(reason), \
    detail = VALUES(detail), created_by = VALUES(created_by), created_at = UTC_TIMESTAMP(6)";
const PG_COLUMNS: &str = "address, reason, detail, created_by, created_at";
use super::mysql::SUPPRESSION_COLUMNS as MYSQL_COLUMNS;

impl Database {
    /// Suppresses `address` (normalised by the caller with [`key`]), replacing an entry that
    /// was there.
    pub async fn suppress(
        &self,
        address: &str,
        reason: Reason,
        detail: Option<&str>,
        by: &str,
    ) -> sqlx::Result<()> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query(PG_ADD)
                    .bind(address)
                    .bind(reason.as_str())
                    .bind(detail)
                    .bind(by)
                    .execute(pool)
                    .await?;
            }
            Database::MySql(pool) => {
                sqlx::query(MYSQL_ADD)
                    .bind(address.as_bytes())
                    .bind(reason.as_str())
                    .bind(detail)
                    .bind(by)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// Lifts the suppression of `address`; false when it was not suppressed.
    pub async fn unsuppress(&self, address: &str) -> sqlx::Result<bool> {
        let done = match self {
            Database::Postgres(pool) => {
                sqlx::query("DELETE FROM mailroom_suppressions WHERE address = $1")
                    .bind(address)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
            Database::MySql(pool) => {
                sqlx::query("DELETE FROM mailroom_suppressions WHERE address = ?")
                    .bind(address.as_bytes())
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
        };
        Ok(done > 0)
    }

    /// The entries among `addresses` (normalised keys), in one statement. A worker's claim
    /// reads them in its own statement instead (`ClaimRequest::screen`).
    pub async fn suppressed_among(&self, addresses: &[String]) -> sqlx::Result<Vec<Suppression>> {
        if addresses.is_empty() {
            return Ok(vec![]);
        }
        match self {
            Database::Postgres(pool) => {
                let sql = format!(
                    "SELECT {PG_COLUMNS} FROM mailroom_suppressions WHERE address = ANY($1)"
                );
                let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(addresses)
                    .fetch_all(pool)
                    .await?;
                Ok(rows.into_iter().map(Row::entry).collect())
            }
            Database::MySql(pool) => {
                mysql::suppressed_among(&mut *pool.acquire().await?, addresses).await
            }
        }
    }

    /// Entries newest first, at most `limit`, older than `before` when given (a page's last
    /// `(created_at, address)`), of one `reason` when given.
    pub async fn suppressions(
        &self,
        reason: Option<Reason>,
        before: Option<(DateTime<Utc>, String)>,
        limit: u32,
    ) -> sqlx::Result<Vec<Suppression>> {
        let (at, address) = before.unzip();
        let reason = reason.map(Reason::as_str);
        let rows: Vec<Row> = match self {
            Database::Postgres(pool) => {
                let sql = format!(
                    "SELECT {PG_COLUMNS} FROM mailroom_suppressions \
                     WHERE ($1::text IS NULL OR reason = $1) \
                     AND ($2::timestamptz IS NULL OR (created_at, address) < ($2, $3)) \
                     ORDER BY created_at DESC, address DESC LIMIT $4"
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(reason)
                    .bind(at)
                    .bind(address)
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?
            }
            Database::MySql(pool) => {
                let sql = format!(
                    "SELECT {MYSQL_COLUMNS} FROM mailroom_suppressions \
                     WHERE (? IS NULL OR reason = ?) \
                     AND (? IS NULL OR created_at < ? OR (created_at = ? AND address < ?)) \
                     ORDER BY created_at DESC, address DESC LIMIT ?"
                );
                let address = address.map(String::into_bytes);
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(reason)
                    .bind(reason)
                    .bind(at)
                    .bind(at)
                    .bind(at)
                    .bind(address)
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?
            }
        };
        Ok(rows.into_iter().map(Row::entry).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_lowers_the_domain_and_keeps_the_local_part() {
        assert_eq!(key(" Ada@Example.COM ").unwrap(), "Ada@example.com");
        assert!(
            key("no-at-sign")
                .unwrap_err()
                .contains("not an email address")
        );
        let long = format!("{}@example.com", "a".repeat(MAX_RECIPIENT_BYTES));
        assert!(key(&long).unwrap_err().contains("longer than"));
    }

    #[test]
    fn every_reason_reads_back_and_others_are_refused_with_the_list() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse(), Ok(r));
        }
        let err = "bounced".parse::<Reason>().unwrap_err();
        assert!(
            err.contains("hard_bounce, complaint, unsubscribed, manual"),
            "{err}"
        );
    }
}
