//! `mailroom_suppressions`: the addresses mailroom does not send to, each with why (a hard
//! bounce, a complaint, an unsubscribe, an operator's entry), when and by whom. Addresses are
//! stored and looked up normalised ([`crate::job::normalised_address`]: the domain in lower
//! case, the local part as given) and compared byte for byte on both engines.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::Database;
use crate::job::{MAX_RECIPIENT_BYTES, normalised_address};

/// The ledger's class, and the state `status` shows, of a job not sent because its recipient
/// is suppressed: a `dead` row that was never a failure, and never dead-lettered.
pub const SUPPRESSED: &str = "suppressed";

/// Why an address is suppressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The recipient's server said the mailbox does not exist (5.1.x).
    HardBounce,
    /// The recipient marked an email as spam.
    Complaint,
    /// The recipient asked not to be mailed.
    Unsubscribed,
    /// An operator's entry.
    Manual,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::HardBounce,
        Reason::Complaint,
        Reason::Unsubscribed,
        Reason::Manual,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::HardBounce => "hard_bounce",
            Reason::Complaint => "complaint",
            Reason::Unsubscribed => "unsubscribed",
            Reason::Manual => "manual",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Reason {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
                format!(
                    "unknown reason {s:?}; the reasons are: {}",
                    names.join(", ")
                )
            })
    }
}

/// One suppressed address.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Suppression {
    pub address: String,
    pub reason: Reason,
    pub detail: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct Row {
    address: String,
    reason: String,
    detail: Option<String>,
    created_by: String,
    created_at: DateTime<Utc>,
}

impl Row {
    fn entry(self) -> Suppression {
        Suppression {
            address: self.address,
            // The column's CHECK admits only these names.
            reason: self.reason.parse().unwrap_or(Reason::Manual),
            detail: self.detail,
            created_by: self.created_by,
            created_at: self.created_at,
        }
    }
}

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
const MYSQL_COLUMNS: &str = "CAST(address AS CHAR CHARACTER SET utf8mb4) AS address, reason, \
    detail, created_by, created_at";

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

    /// The entries among `addresses` (normalised keys), in one statement.
    pub async fn suppressed_among(&self, addresses: &[String]) -> sqlx::Result<Vec<Suppression>> {
        if addresses.is_empty() {
            return Ok(vec![]);
        }
        let rows: Vec<Row> = match self {
            Database::Postgres(pool) => {
                let sql = format!(
                    "SELECT {PG_COLUMNS} FROM mailroom_suppressions WHERE address = ANY($1)"
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(addresses)
                    .fetch_all(pool)
                    .await?
            }
            Database::MySql(pool) => {
                let marks = vec!["?"; addresses.len()].join(", ");
                let sql = format!(
                    "SELECT {MYSQL_COLUMNS} FROM mailroom_suppressions WHERE address IN ({marks})"
                );
                let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
                for a in addresses {
                    query = query.bind(a.as_bytes());
                }
                query.fetch_all(pool).await?
            }
        };
        Ok(rows.into_iter().map(Row::entry).collect())
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
