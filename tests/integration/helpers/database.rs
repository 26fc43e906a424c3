//! The suite's database engine (`MAILROOM_TEST_ENGINE`), tests skipped visibly on the other
//! one, each test's own database, and transactions of either engine.

use mailroom::db::Engine;
use mailroom::db::outbox::{self, EnqueueError, Enqueued};
use mailroom::job::EmailJob;
use mailroom_test_kit::database;
use mailroom_test_kit::services::{mysql_url, postgres_url};
use sqlx::{Executor as _, MySql, Postgres};

/// The engine the suite runs against: `MAILROOM_TEST_ENGINE=postgres` (the default) or
/// `mysql` (MySQL 8 / MariaDB). `scripts/test` runs the integration suite once per engine.
pub fn engine() -> Engine {
    match std::env::var("MAILROOM_TEST_ENGINE").as_deref() {
        Ok("mysql" | "mariadb") => Engine::MySql,
        Ok("postgres" | "postgresql") | Err(_) => Engine::Postgres,
        Ok(other) => panic!("MAILROOM_TEST_ENGINE={other}: expected postgres or mysql"),
    }
}

/// Whether the calling test runs on the suite's engine. If not, it is skipped, visibly: a
/// `SKIP` line on stderr (shown with `--nocapture`), and the test's name appended to the file
/// named by `MAILROOM_TEST_SKIPS`, which `scripts/test` lists after each engine's pass, failing
/// the run if a test was skipped on every engine. Use as
/// `if !runs_on(Engine::Postgres, "LISTEN/NOTIFY is PostgreSQL's") { return; }`.
pub fn runs_on(wanted: Engine, why: &str) -> bool {
    let here = engine();
    if here == wanted {
        return true;
    }
    // libtest runs each test on a thread named after it.
    let test = std::thread::current().name().unwrap_or("?").to_string();
    eprintln!("SKIP {test} on {here:?}: {why}");
    if let Some(path) = std::env::var_os("MAILROOM_TEST_SKIPS") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(file, "{test}\t{why}").unwrap();
    }
    false
}

/// The admin URL of the suite's engine, on which each test creates its own database.
fn admin_url() -> String {
    match engine() {
        Engine::Postgres => postgres_url(),
        Engine::MySql => mysql_url(),
    }
}

/// Creates an empty database of the suite's engine; returns its URL.
pub(super) async fn create_database(name: &str) -> String {
    database::create_database(&admin_url(), name).await.unwrap()
}

pub(super) async fn drop_database(name: &str) {
    database::drop_database(&admin_url(), name).await
}

/// A transaction on the test's database, of either engine, through the public enqueue API.
pub enum TestTx {
    Pg(sqlx::Transaction<'static, Postgres>),
    My(sqlx::Transaction<'static, MySql>),
}

impl TestTx {
    /// Runs one statement written in SQL both engines accept.
    pub async fn execute(&mut self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        match self {
            TestTx::Pg(tx) => tx.execute(sql).await.map(drop),
            TestTx::My(tx) => tx.execute(sql).await.map(drop),
        }
        .unwrap();
    }

    pub async fn enqueue(&mut self, job: &EmailJob) -> Result<Enqueued, EnqueueError> {
        match self {
            TestTx::Pg(tx) => outbox::enqueue(tx, job).await,
            TestTx::My(tx) => outbox::enqueue(tx, job).await,
        }
    }

    pub async fn commit(self) {
        match self {
            TestTx::Pg(tx) => tx.commit().await,
            TestTx::My(tx) => tx.commit().await,
        }
        .unwrap()
    }

    pub async fn rollback(self) {
        match self {
            TestTx::Pg(tx) => tx.rollback().await,
            TestTx::My(tx) => tx.rollback().await,
        }
        .unwrap()
    }
}
