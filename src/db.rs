//! Database access. One `Database` handle wraps the pool of the engine named by `DATABASE_URL`
//! (`postgres://…` or `mysql://…`, the latter for MySQL 8 and MariaDB ≥ 10.6); each engine keeps
//! its own SQL side by side in its module, and the integration suite, run against every engine,
//! is the check (sqlx's compile-time checks cover only one engine).
//!
//! The modules, leaf first (each imports only those above it):
//!
//! - `rows`: the values the others pass around (statuses, claims, records, outbox rows, group
//!   items); imports nothing of `db`.
//! - `postgres`, `mysql`: the statements of each engine, those of group commit in their
//!   `group` submodule; import only `rows`.
//! - `ledger`: the claim ledger (`sent_notifications`), its state machine and what a refused
//!   claim means.
//! - `group`: group commit of the ledger's claims and records, the worker's [`group::Ledger`].
//! - `ledger_retention`: deletes settled ledger rows past `MAILROOM_LEDGER_RETENTION`.
//! - `outbox`: the transactional outbox (`mailroom_outbox`): enqueue, and the relay's batches.
//! - `refused`: `dead`/`invalid` rows for jobs refused past the doors, and stored payloads.
//! - `fleet`: the workers that run and their per-minute counts (`mailroom_workers`).
//! - `dead_letters`: `mailroom_dead_letters`, the dead letters ingested from `<ns>.dead`.
//! - `secrets`: values mailroom's processes share (the replay key).
//! - `connect`: the first contact (one connection whose failure is told plainly) and the
//!   schema version against the migrations built into the binary.

mod connect;
pub mod dead_letters;
pub mod fleet;
pub mod group;
pub mod jobs;
pub mod ledger;
mod ledger_retention;
mod mysql;
pub mod outbox;
mod postgres;
mod refused;
pub mod revisions;
mod rows;
mod secrets;
pub mod suppressions;

use std::time::Duration;

use anyhow::Context;
use sqlx::Executor as _;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};

use crate::config::SecretUrl;
use crate::exit::Fatal;

pub use connect::{Schema, Server, judge_schema, refusal, sqlx_text};

pub use ledger::{
    Claim, ClaimRequest, ExistingClaim, LedgerStatus, Notification, Record, Refusal, judge_refusal,
};

/// How long a statement may run before the server cancels it; far below RabbitMQ's
/// consumer_timeout so a stuck database never holds a delivery past it.
const STATEMENT_TIMEOUT: &str = "30s";
/// How long an InnoDB statement waits for a row lock before failing (seconds); the same bound.
const LOCK_WAIT_TIMEOUT_SECS: u32 = 30;
/// How long a caller waits for a pooled connection before the attempt counts as
/// "database unavailable" (a transient failure).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`Database::close`] waits for the pool to close.
pub const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// A pooled connection to the configured database engine.
#[derive(Clone, Debug)]
pub enum Database {
    Postgres(PgPool),
    /// MySQL 8 or MariaDB ≥ 10.6 (InnoDB), every session at READ COMMITTED.
    MySql(MySqlPool),
}

/// Whether the database refused a statement because of the values in it (too long for its
/// column, an encoding it cannot store, a check it fails): the same job fails the same way on
/// every try, so the error is the job's, permanent, and never "database unavailable".
pub fn is_data_error(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // 1048 NULL in a NOT NULL column, 1264 out of range, 1265 truncated, 1292 incorrect
        // value, 1366 incorrect string value, 1406 data too long, 3140 invalid JSON, 3819 check
        // constraint (MySQL), 4025 constraint failed (MariaDB).
        return matches!(
            my.number(),
            1048 | 1264 | 1265 | 1292 | 1366 | 1406 | 3140 | 3819 | 4025
        );
    }
    // SQLSTATE class 22 (data exception), 23502 not null, 23514 check violation.
    db.code()
        .is_some_and(|c| c.starts_with("22") || c == "23502" || c == "23514")
}

/// The engines mailroom runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Postgres,
    MySql,
}

impl Engine {
    /// The engine a `DATABASE_URL` names, from its scheme.
    pub fn of(url: &SecretUrl) -> anyhow::Result<Engine> {
        match url.scheme() {
            "postgres" | "postgresql" => Ok(Engine::Postgres),
            "mysql" | "mariadb" => Ok(Engine::MySql),
            other => Err(Fatal::Config(format!(
                "DATABASE_URL {url}: unsupported scheme `{other}` (expected postgres:// or mysql://)"
            ))
            .into()),
        }
    }
}

/// A pooled connection idle at least this long is pinged before it is handed out
/// ([`OnAcquire::Ping`]). A connection in steady use (a statement every few milliseconds) goes
/// straight to its statement, so a busy worker's claim is one round trip, not two; one the
/// server dropped while the pool was quiet (a restart, a failover, an idle timeout) is found
/// and replaced before a claim fails on it. A connection dropped within this moment of its
/// last statement fails the next one, as a connection dropped during a statement does: a
/// transient failure the delivery is retried for.
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// What a pool does with an idle connection before handing it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnAcquire {
    /// Pings it if it has been idle [`PING_IDLE_AFTER`] or longer, so a connection the server
    /// dropped while the pool was quiet is replaced instead of failing a claim.
    Ping,
    /// Hands it out unchecked: saves a round trip per use, for callers that simply try again
    /// after a failed statement (the relay's loop). Their idle probe is then the statement and
    /// the ping sqlx 0.9 always sends when a connection returns to the pool, not two pings and
    /// the statement.
    NoPing,
}

impl Database {
    /// Connects a pool of at most `max_connections` to `url`. The pool is lazy: the first
    /// query opens the first connection, so a process starts even while the database is down.
    /// A pooled connection idle for a while is pinged before use ([`OnAcquire::Ping`]).
    pub fn connect_lazy(url: &SecretUrl, max_connections: u32) -> anyhow::Result<Database> {
        Database::connect_lazy_with(url, max_connections, OnAcquire::Ping)
    }

    /// [`Database::connect_lazy`], choosing what the pool does before handing out a connection.
    pub fn connect_lazy_with(
        url: &SecretUrl,
        max_connections: u32,
        on_acquire: OnAcquire,
    ) -> anyhow::Result<Database> {
        Ok(match Engine::of(url)? {
            Engine::Postgres => Database::Postgres(pg_pool(url, max_connections, on_acquire)?),
            Engine::MySql => Database::MySql(mysql_pool(url, max_connections, on_acquire)?),
        })
    }

    /// [`Database::connect_lazy_with`], after one connection opened at once
    /// ([`Database::verify`]): a database that is down or refuses the login fails here, in
    /// one sentence, not at the first query after the pool's acquire timeout.
    pub async fn connect(
        url: &SecretUrl,
        max_connections: u32,
        on_acquire: OnAcquire,
    ) -> anyhow::Result<Database> {
        let db = Database::connect_lazy_with(url, max_connections, on_acquire)?;
        db.verify().await?;
        Ok(db)
    }

    /// The engine of this pool.
    pub fn engine(&self) -> Engine {
        match self {
            Database::Postgres(_) => Engine::Postgres,
            Database::MySql(_) => Engine::MySql,
        }
    }

    /// Applies the migrations of this engine; refuses a database a newer mailroom migrated.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let server = self.server();
        let at = format!("the database {} at {}", server.database, server.addr);
        if let Schema::Newer(unknown) = self.schema().await.map_err(|e| sqlx_error(&e))? {
            return Err(connect::newer_schema(&at, &unknown).into());
        }
        let migrator = connect::migrator(self.engine());
        let applied = match self {
            Database::Postgres(pool) => migrator.run(pool).await,
            Database::MySql(pool) => migrator.run(pool).await,
        };
        applied
            .map_err(|e| match e {
                sqlx::migrate::MigrateError::Execute(e) => sqlx_error(&e),
                sqlx::migrate::MigrateError::ExecuteMigration(e, version) => {
                    anyhow::anyhow!("migration {version}: {}", sqlx_text(&e))
                }
                other => anyhow::anyhow!("{other}"),
            })
            .with_context(|| format!("applying {} migrations to {at}", server.engine))
    }

    /// One round trip to the database, for readiness probes.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        match self {
            Database::Postgres(pool) => pool.execute("SELECT 1").await.map(drop),
            Database::MySql(pool) => pool.execute("SELECT 1").await.map(drop),
        }
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        let close = async {
            match self {
                Database::Postgres(pool) => pool.close().await,
                Database::MySql(pool) => pool.close().await,
            }
        };
        // sqlx's close waits until every connection is back in the pool and closed, and a
        // connection returned as the pool closes can be missed for good (a `mailroom dlq
        // ingest` was seen waiting for ever with nothing left to do). Past this bound the
        // pool is left to the process's exit, which closes its sockets.
        if tokio::time::timeout(CLOSE_PATIENCE, close).await.is_err() {
            tracing::debug!(
                "the database pool did not close within {CLOSE_PATIENCE:?}; leaving it to the exit"
            );
        }
    }
}

/// An sqlx error as one line, without the server's source line number.
fn sqlx_error(e: &sqlx::Error) -> anyhow::Error {
    anyhow::anyhow!(sqlx_text(e))
}

/// What this process calls itself on the server (`mailroom worker`, `mailroom relay`): the
/// subcommand, set once by the command line before any pool opens.
static SESSION_ROLE: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names this process's PostgreSQL sessions after `role` (the subcommand), so that
/// `pg_stat_activity.application_name` tells an operator which mailroom process holds a
/// connection (and the benchmark what each one costs the server). The first call wins.
pub fn name_sessions(role: &'static str) {
    let _ = SESSION_ROLE.set(role);
}

/// The `application_name` of this process's sessions: the URL's own when it names one, else
/// `mailroom` and the role given to [`name_sessions`].
pub(crate) fn session_name(from_url: Option<&str>) -> String {
    match (from_url, SESSION_ROLE.get()) {
        (Some(name), _) => name.to_string(),
        (None, Some(role)) => format!("mailroom {role}"),
        (None, None) => "mailroom".to_string(),
    }
}

/// A lazy PostgreSQL pool: every session named after the process ([`session_name`]), with a
/// statement timeout.
fn pg_pool(url: &SecretUrl, max_connections: u32, on_acquire: OnAcquire) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions = url
        .expose()
        .parse()
        .map_err(|e| Fatal::Config(format!("invalid DATABASE_URL {url}: {e}")))?;
    let name = session_name(options.get_application_name());
    let options = options
        .application_name(&name)
        .options([("statement_timeout", STATEMENT_TIMEOUT)]);
    let options = match options.get_ssl_mode() {
        PgSslMode::Allow | PgSslMode::Prefer
            if plain_on_loopback(options.get_socket().is_some(), options.get_host()) =>
        {
            options.ssl_mode(PgSslMode::Disable)
        }
        _ => options,
    };
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| Box::pin(ping_if_idle(conn, meta, on_acquire)))
        .connect_lazy_with(options);
    Ok(pool)
}

/// Whether a connection that may go either way (`sslmode=prefer`, the default, or `allow`;
/// MySQL's `ssl-mode=preferred`) goes in the clear: to a server on this machine, over TCP
/// loopback, where no link needs protecting and TLS would cost every statement an encryption
/// and a decryption on both sides. The relay's WAL stream decides the same way; `sslmode=require` keeps TLS everywhere.
fn plain_on_loopback(has_socket: bool, host: &str) -> bool {
    !has_socket && crate::config::is_loopback(host)
}

/// The pools' `before_acquire`: pings a connection idle [`PING_IDLE_AFTER`] or longer when
/// `on_acquire` says so.
async fn ping_if_idle<C: sqlx::Connection>(
    conn: &mut C,
    meta: sqlx::pool::PoolConnectionMetadata,
    on_acquire: OnAcquire,
) -> Result<bool, sqlx::Error> {
    if on_acquire == OnAcquire::Ping && meta.idle_for >= PING_IDLE_AFTER {
        conn.ping().await?;
    }
    Ok(true)
}

/// A lazy MySQL/MariaDB pool: every session in UTC, at READ COMMITTED, with a lock wait timeout.
fn mysql_pool(
    url: &SecretUrl,
    max_connections: u32,
    on_acquire: OnAcquire,
) -> anyhow::Result<MySqlPool> {
    // sqlx knows the scheme `mysql` only; `mariadb://` is accepted as a synonym.
    let mut exposed = url.expose().to_string();
    if let Some(rest) = exposed.strip_prefix("mariadb:") {
        exposed = format!("mysql:{rest}");
    }
    let options: MySqlConnectOptions = exposed
        .parse()
        .map_err(|e| Fatal::Config(format!("invalid DATABASE_URL {url}: {e}")))?;
    // Session time zone UTC (sqlx's default, stated here because DATETIME values are
    // read as UTC), utf8mb4.
    let options = options.timezone(Some("+00:00".to_string()));
    // `ssl-mode=preferred` (the default) to a server on this machine: in the clear, as
    // PostgreSQL's `prefer` ([`plain_on_loopback`]).
    let loopback = plain_on_loopback(options.get_socket().is_some(), options.get_host());
    let options = match options.get_ssl_mode() {
        MySqlSslMode::Preferred if loopback => options.ssl_mode(MySqlSslMode::Disabled),
        _ => options,
    };
    let pool = MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| Box::pin(ping_if_idle(conn, meta, on_acquire)))
        .after_connect(|conn, _meta| {
            Box::pin(async move {
                // READ COMMITTED: the relay's `FOR UPDATE SKIP LOCKED` and the
                // ledger's claims take no gap locks, so they never block the
                // application's own inserts into the outbox.
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                let timeout =
                    format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_SECS}");
                conn.execute(sqlx::AssertSqlSafe(timeout)).await?;
                Ok(())
            })
        })
        .connect_lazy_with(options);
    Ok(pool)
}
