//! The suite's database engine (`MAILROOM_TEST_ENGINE`), tests skipped visibly on the other
//! one, each test's own database, and transactions of either engine.

use mailroom::config::SecretUrl;
use mailroom::db::Database;
use mailroom::db::Engine;
use mailroom::db::outbox::{self, EnqueueError, Enqueued};
use mailroom::job::EmailJob;
use mailroom_test_kit::database;
use mailroom_test_kit::services::{mysql_url, postgres_url};
use sqlx::{Connection as _, Executor as _, MySql, PgConnection, Postgres};

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
        // One write: tests skip at once, and `writeln!` would write the line in pieces that
        // another test's line can come between (O_APPEND keeps a single write whole).
        file.write_all(format!("{test}\t{why}\n").as_bytes())
            .unwrap();
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

/// Every test database's name starts so: `mailroom_test_<pid>_<random>`, telling the databases
/// of a test process still running from those a finished one left behind.
const PREFIX: &str = "mailroom_test_";

/// The name of a test database of this process.
pub(super) fn database_name(random: &str) -> String {
    format!("{PREFIX}{}_{random}", std::process::id())
}

/// Creates a database of the suite's engine with mailroom's migrations applied; returns its
/// URL. On PostgreSQL it is a copy of a template migrated once (`CREATE DATABASE … TEMPLATE`,
/// a fraction of running fourteen migrations per test); on MySQL, which has no templates, the
/// caller's `migrate` runs them.
pub(super) async fn create_database(name: &str) -> String {
    let template = match engine() {
        Engine::Postgres => Some(pg_template().await),
        Engine::MySql => None,
    };
    database::create_database_from(&admin_url(), name, template.as_deref())
        .await
        .unwrap()
}

/// Drops a test's database. On PostgreSQL, `DROP DATABASE` forces a checkpoint that takes
/// seconds on a busy machine, so its databases are left in place and dropped by the next test
/// process (see [`pg_template`]) once this one has ended.
pub(super) async fn drop_database(name: &str) {
    if engine() == Engine::MySql {
        database::drop_database(&admin_url(), name).await
    }
}

/// The PostgreSQL template with every migration applied, `mailroom_test_tpl_<hash of
/// migrations/postgres>`, built once for all test processes (under an advisory lock, then
/// renamed into place, so nobody clones a half-migrated one). The first call in a process also
/// starts dropping, in the background, the databases of test processes that have ended.
async fn pg_template() -> String {
    static TEMPLATE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TEMPLATE
        .get_or_init(|| async {
            // The migrations disable the NOTIFY trigger where the server's WAL is logical.
            let template = format!(
                "{PREFIX}tpl_{:016x}",
                migrations_hash() ^ wal_level_hash().await
            );
            build_pg_template(&template).await;
            std::thread::spawn(drop_pg_orphans);
            template
        })
        .await
        .clone()
}

async fn build_pg_template(template: &str) {
    let admin = admin_url();
    let mut lock = PgConnection::connect(&admin).await.unwrap();
    // Any fixed key: the template's builders, across processes, take turns.
    lock.execute("SELECT pg_advisory_lock(72350017)")
        .await
        .unwrap();
    if !database::pg_database_exists(&mut lock, template)
        .await
        .unwrap()
    {
        let building = database_name("tpl_building");
        database::drop_database(&admin, &building).await;
        let url = database::create_database(&admin, &building).await.unwrap();
        let db = Database::connect_lazy(&url.parse::<SecretUrl>().unwrap(), 1).unwrap();
        db.migrate().await.unwrap();
        db.close().await;
        let rename = format!(r#"ALTER DATABASE "{building}" RENAME TO "{template}""#);
        lock.execute(sqlx::AssertSqlSafe(rename)).await.unwrap();
    }
    lock.execute("SELECT pg_advisory_unlock(72350017)")
        .await
        .unwrap();
    let _ = lock.close().await;
}

/// A hash of the PostgreSQL migrations' names and contents, naming the template they build.
fn migrations_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in files {
        file.file_name().hash(&mut hasher);
        std::fs::read(&file).unwrap().hash(&mut hasher);
    }
    hasher.finish()
}

/// A hash of the server's `wal_level`: a template migrated under another one differs.
async fn wal_level_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut conn = PgConnection::connect(&admin_url()).await.unwrap();
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let _ = conn.close().await;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    level.hash(&mut hasher);
    hasher.finish()
}

/// Drops, one at a time, the PostgreSQL test databases of processes that have ended.
fn drop_pg_orphans() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = admin_url();
        for name in database::pg_orphans(&admin, PREFIX)
            .await
            .unwrap_or_default()
        {
            database::drop_database(&admin, &name).await;
        }
    });
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
