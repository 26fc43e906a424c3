//! Database access. One `Database` handle wraps the pool of the engine named by `DATABASE_URL`;
//! each engine keeps its own SQL side by side in its module, and integration tests against
//! every engine are the check (sqlx's compile-time checks cover only one engine).
//!
//! - `notifications`: the claim ledger (`sent_notifications`) and its state machine.
//! - `postgres`: the PostgreSQL statements of the ledger.
//! - `outbox`: the transactional outbox (`mailroom_outbox`): enqueue, and the relay's batches.

pub mod notifications;
pub mod outbox;
mod postgres;

use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::config::SecretUrl;

pub use notifications::{Claim, ClaimRequest, ExistingClaim, Notification, Status};

/// How long a statement may run before the server cancels it; far below RabbitMQ's
/// consumer_timeout so a stuck database never holds a delivery past it.
const STATEMENT_TIMEOUT: &str = "30s";
/// How long a caller waits for a pooled connection before the attempt counts as
/// "database unavailable" (a transient failure).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled connection to the configured database engine.
#[derive(Clone, Debug)]
pub enum Database {
    Postgres(PgPool),
}

impl Database {
    /// Connects a pool of at most `max_connections` to `url`. The pool is lazy: the first
    /// query opens the first connection, so a process starts even while the database is down.
    pub fn connect_lazy(url: &SecretUrl, max_connections: u32) -> anyhow::Result<Database> {
        match url.scheme() {
            "postgres" | "postgresql" => {
                let options: PgConnectOptions = url
                    .expose()
                    .parse()
                    .with_context(|| format!("invalid DATABASE_URL {url}"))?;
                let options = options
                    .application_name("mailroom")
                    .options([("statement_timeout", STATEMENT_TIMEOUT)]);
                let pool = PgPoolOptions::new()
                    .max_connections(max_connections)
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .connect_lazy_with(options);
                Ok(Database::Postgres(pool))
            }
            other => anyhow::bail!(
                "DATABASE_URL {url}: unsupported scheme `{other}` (expected postgres://)"
            ),
        }
    }

    /// Applies the migrations of this engine.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        match self {
            Database::Postgres(pool) => sqlx::migrate!("./migrations/postgres")
                .run(pool)
                .await
                .context("applying PostgreSQL migrations")?,
        }
        Ok(())
    }

    /// The PostgreSQL pool, for the outbox and the relay.
    pub fn postgres(&self) -> &PgPool {
        match self {
            Database::Postgres(pool) => pool,
        }
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        match self {
            Database::Postgres(pool) => pool.close().await,
        }
    }
}
