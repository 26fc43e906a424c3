//! `mailroom_secrets`: values mailroom's own processes share through the database, created by
//! whichever process needs one first (today only the replay key, see [`crate::dlq::seal`]).
//! The first writer wins; everyone reads back the stored value.

use super::Database;

const PG_INSERT: &str = "INSERT INTO mailroom_secrets (name, value) VALUES ($1, $2) \
                         ON CONFLICT (name) DO NOTHING";
const PG_SELECT: &str = "SELECT value FROM mailroom_secrets WHERE name = $1";
// Not INSERT IGNORE, which would also swallow errors other than the duplicate key.
const MYSQL_INSERT: &str = "INSERT INTO mailroom_secrets (name, value) VALUES (?, ?) \
                            ON DUPLICATE KEY UPDATE name = name";
const MYSQL_SELECT: &str = "SELECT value FROM mailroom_secrets WHERE name = ?";

impl Database {
    /// The secret stored under `name`; `candidate` is stored first when there is none.
    pub async fn secret_or_insert(&self, name: &str, candidate: &str) -> sqlx::Result<String> {
        match self {
            Database::Postgres(pool) => {
                sqlx::query(PG_INSERT)
                    .bind(name)
                    .bind(candidate)
                    .execute(pool)
                    .await?;
                sqlx::query_scalar(PG_SELECT)
                    .bind(name)
                    .fetch_one(pool)
                    .await
            }
            Database::MySql(pool) => {
                sqlx::query(MYSQL_INSERT)
                    .bind(name)
                    .bind(candidate)
                    .execute(pool)
                    .await?;
                sqlx::query_scalar(MYSQL_SELECT)
                    .bind(name)
                    .fetch_one(pool)
                    .await
            }
        }
    }
}
