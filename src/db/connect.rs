//! The first contact with the database, at the start of every process and command: one
//! connection opened directly (the pool would retry a refused connection until its acquire
//! timeout, and say only that it timed out), its failure told as one sentence that names the
//! server and the fix where it is known; then the schema, checked against the migrations built
//! into this binary.

use std::time::Duration;

use sqlx::Connection as _;
use sqlx::migrate::Migrator;

use super::{Database, Engine};
use crate::exit::Fatal;

/// How long the first connection may take before the database counts as unreachable: a host
/// that drops packets would otherwise hold the start for the system's TCP timeout (minutes).
const FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");
static MYSQL_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/mysql");

/// The migrations built into this binary for `engine`.
pub(super) fn migrator(engine: Engine) -> &'static Migrator {
    match engine {
        Engine::Postgres => &POSTGRES_MIGRATIONS,
        Engine::MySql => &MYSQL_MIGRATIONS,
    }
}

/// Where a pool connects, as an error message names it: the engine, `host:port` (or the
/// socket), the user and the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub engine: &'static str,
    pub addr: String,
    pub user: String,
    pub database: String,
}

/// How the schema in the database compares with the migrations this binary carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schema {
    /// Every migration applied, none unknown.
    Current,
    /// No migration applied (no `_sqlx_migrations` table, or an empty one).
    Missing,
    /// These known migrations are not applied yet.
    Behind(Vec<i64>),
    /// Applied migrations this binary does not know: a newer mailroom migrated the database.
    Newer(Vec<i64>),
}

/// Compares the applied migration versions with the known ones.
pub fn judge_schema(applied: &[i64], known: &[i64]) -> Schema {
    let unknown: Vec<i64> = applied
        .iter()
        .filter(|v| !known.contains(v))
        .copied()
        .collect();
    let pending: Vec<i64> = known
        .iter()
        .filter(|v| !applied.contains(v))
        .copied()
        .collect();
    if !unknown.is_empty() {
        Schema::Newer(unknown)
    } else if applied.is_empty() {
        Schema::Missing
    } else if !pending.is_empty() {
        Schema::Behind(pending)
    } else {
        Schema::Current
    }
}

impl Database {
    /// Where this pool connects.
    pub fn server(&self) -> Server {
        match self {
            Database::Postgres(pool) => {
                let o = pool.connect_options();
                let addr = match o.get_socket() {
                    Some(path) => path.display().to_string(),
                    None => format!("{}:{}", o.get_host(), o.get_port()),
                };
                Server {
                    engine: "PostgreSQL",
                    addr,
                    user: o.get_username().to_string(),
                    database: o.get_database().unwrap_or(o.get_username()).to_string(),
                }
            }
            Database::MySql(pool) => {
                let o = pool.connect_options();
                Server {
                    engine: "MySQL/MariaDB",
                    addr: format!("{}:{}", o.get_host(), o.get_port()),
                    user: o.get_username().to_string(),
                    database: o.get_database().unwrap_or_default().to_string(),
                }
            }
        }
    }

    /// Opens one connection outside the pool and closes it: the database is reachable and
    /// takes the login, or the error says which of the two failed, where, and what to check.
    pub async fn verify(&self) -> Result<(), Fatal> {
        let server = self.server();
        let attempt = async {
            match self {
                Database::Postgres(pool) => {
                    let conn = sqlx::PgConnection::connect_with(&pool.connect_options()).await?;
                    conn.close().await
                }
                Database::MySql(pool) => {
                    let conn = sqlx::MySqlConnection::connect_with(&pool.connect_options()).await?;
                    conn.close().await
                }
            }
        };
        match tokio::time::timeout(FIRST_CONNECT_TIMEOUT, attempt).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(refusal(&server, &e)),
            Err(_) => Err(Fatal::Unavailable(format!(
                "connecting to {} at {}: no answer within {FIRST_CONNECT_TIMEOUT:?}: check the host and port in DATABASE_URL and any firewall between",
                server.engine, server.addr
            ))),
        }
    }

    /// The versions of the migrations applied to this database (none when it has no
    /// `_sqlx_migrations` table).
    pub async fn applied_migrations(&self) -> Result<Vec<i64>, sqlx::Error> {
        const SQL: &str =
            "SELECT version FROM _sqlx_migrations WHERE success = TRUE ORDER BY version";
        let found = match self {
            Database::Postgres(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await,
            Database::MySql(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await,
        };
        match found {
            Err(sqlx::Error::Database(db)) if is_missing_table(db.code().as_deref()) => Ok(vec![]),
            other => other,
        }
    }

    /// How this database's schema compares with this binary's migrations.
    pub async fn schema(&self) -> Result<Schema, sqlx::Error> {
        let known: Vec<i64> = migrator(self.engine())
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| m.version)
            .collect();
        Ok(judge_schema(&self.applied_migrations().await?, &known))
    }

    /// Refuses a database this binary cannot run against: one without mailroom's schema, one
    /// behind it (both: run `mailroom migrate`), one a newer mailroom migrated.
    pub async fn require_schema(&self) -> Result<(), Fatal> {
        let server = self.server();
        let at = format!(
            "the database {} at {} ({})",
            server.database, server.addr, server.engine
        );
        let schema = self.schema().await.map_err(|e| {
            Fatal::Unavailable(format!(
                "reading the schema version of {at}: {}",
                sqlx_text(&e)
            ))
        })?;
        match schema {
            Schema::Current => Ok(()),
            Schema::Missing => Err(Fatal::Unavailable(format!(
                "{at} has no mailroom schema: run `mailroom migrate`"
            ))),
            Schema::Behind(pending) => Err(Fatal::Unavailable(format!(
                "{at} is behind this mailroom (migrations {} not applied): run `mailroom migrate`",
                versions(&pending)
            ))),
            Schema::Newer(unknown) => Err(newer_schema(&at, &unknown)),
        }
    }
}

/// The refusal of a schema migrated by a newer mailroom.
pub(super) fn newer_schema(at: &str, unknown: &[i64]) -> Fatal {
    Fatal::Config(format!(
        "{at} was migrated by a newer mailroom (migrations {} are unknown to this one): run that version or a newer one",
        versions(unknown)
    ))
}

fn versions(list: &[i64]) -> String {
    let shown: Vec<String> = list.iter().map(i64::to_string).collect();
    shown.join(", ")
}

/// PostgreSQL's `undefined_table`, MySQL's `ER_NO_SUCH_TABLE` (SQLSTATE 42S02).
fn is_missing_table(code: Option<&str>) -> bool {
    matches!(code, Some("42P01" | "42S02"))
}

/// What a failed first connection means, as one sentence with its fix.
pub fn refusal(server: &Server, e: &sqlx::Error) -> Fatal {
    let Server {
        engine,
        addr,
        user,
        database,
    } = server;
    let connecting = format!("connecting to {engine} at {addr}");
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Fatal::Unavailable(format!(
                "{connecting}: connection refused: is the server running, and is the port in DATABASE_URL right?"
            ))
        }
        sqlx::Error::Io(io) => Fatal::Unavailable(format!("{connecting}: {io}")),
        sqlx::Error::Tls(tls) => Fatal::Config(format!(
            "{connecting}: TLS failed: {tls}: check sslmode (PostgreSQL) or ssl-mode (MySQL) and the CA certificate in DATABASE_URL"
        )),
        sqlx::Error::Configuration(bad) => {
            Fatal::Config(format!("{connecting}: DATABASE_URL is not usable: {bad}"))
        }
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default().to_string();
            match code.as_str() {
                // invalid_password, invalid_authorization_specification; MySQL access denied.
                "28P01" | "28000" => Fatal::Config(format!(
                    "{engine} at {addr} refused the login for user {user}: check DATABASE_URL's user and password"
                )),
                // invalid_catalog_name; MySQL unknown database (SQLSTATE 42000, number 1049).
                "3D000" => no_database(engine, addr, database),
                "42000" if db.message().contains("Unknown database") => {
                    no_database(engine, addr, database)
                }
                _ => Fatal::Unavailable(format!("{connecting}: {}", db.message())),
            }
        }
        other => Fatal::Unavailable(format!("{connecting}: {}", sqlx_text(other))),
    }
}

fn no_database(engine: &str, addr: &str, database: &str) -> Fatal {
    Fatal::Config(format!(
        "{engine} at {addr} has no database {database:?}: create it, or fix the database name in DATABASE_URL"
    ))
}

/// An sqlx error's text without the server's source line (`… at line 334` of PostgreSQL's C
/// code): the server's message alone for an error the database returned.
pub fn sqlx_text(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_without_migrations_has_no_schema() {
        assert_eq!(judge_schema(&[], &[1, 2]), Schema::Missing);
    }

    #[test]
    fn a_database_missing_known_migrations_is_behind() {
        assert_eq!(judge_schema(&[1], &[1, 2, 3]), Schema::Behind(vec![2, 3]));
        assert_eq!(judge_schema(&[1, 2, 3], &[1, 2, 3]), Schema::Current);
    }

    #[test]
    fn a_database_with_unknown_migrations_is_newer_even_when_behind() {
        assert_eq!(judge_schema(&[1, 2, 9], &[1, 2, 3]), Schema::Newer(vec![9]));
    }

    #[test]
    fn the_binary_carries_migrations_for_both_engines() {
        assert!(migrator(Engine::Postgres).iter().count() > 0);
        assert!(migrator(Engine::MySql).iter().count() > 0);
    }

    fn server() -> Server {
        Server {
            engine: "PostgreSQL",
            addr: "127.0.0.1:5433".into(),
            user: "mailroom".into(),
            database: "mailroom".into(),
        }
    }

    #[test]
    fn a_refused_connection_names_the_address_and_is_unavailable() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let fatal = refusal(&server(), &sqlx::Error::Io(refused));
        assert!(matches!(fatal, Fatal::Unavailable(_)));
        assert!(
            fatal
                .to_string()
                .starts_with("connecting to PostgreSQL at 127.0.0.1:5433: connection refused"),
            "{fatal}"
        );
    }
}
