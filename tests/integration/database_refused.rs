//! The worker's pool cannot get a database connection (RELIABILITY D.25): the server refuses
//! new connections and has dropped the open ones, confined to this test's own database so the
//! tests beside it run on. PostgreSQL: the database's connection limit set to 0 (sqlx retries
//! "too many connections" until its acquire timeout: the pool times out exactly as when
//! exhausted). MariaDB/MySQL: the worker logs in as a user of its own, which is locked.

use mailroom::db::Engine;
use sqlx::{Connection as _, Executor as _, MySqlConnection, PgConnection};

use crate::helpers::*;

/// Opens and closes this test's database to the worker.
struct DatabaseGate {
    db_name: String,
    /// MariaDB/MySQL: the worker's own user.
    user: Option<String>,
    /// The worker's `--database-url`.
    url: String,
}

impl DatabaseGate {
    async fn new(app: &TestApp) -> DatabaseGate {
        let mut url = url::Url::parse(&app.db_url).unwrap();
        let db_name = url.path().trim_start_matches('/').to_string();
        let user = match engine() {
            Engine::Postgres => None,
            Engine::MySql => {
                let user = format!("mr_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
                let password = uuid::Uuid::new_v4().simple().to_string();
                mysql_admin(&format!(
                    "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"
                ))
                .await;
                mysql_admin(&format!(
                    "GRANT ALL PRIVILEGES ON `{db_name}`.* TO '{user}'@'%'"
                ))
                .await;
                url.set_username(&user).unwrap();
                url.set_password(Some(&password)).unwrap();
                Some(user)
            }
        };
        DatabaseGate {
            db_name,
            user,
            url: url.to_string(),
        }
    }

    /// Refuses new connections, then drops the open ones and waits until they are gone.
    async fn refuse(&self) {
        let db = &self.db_name;
        match &self.user {
            None => {
                pg_admin(&format!(r#"ALTER DATABASE "{db}" CONNECTION LIMIT 0"#)).await;
                eventually("every backend of the database terminated", || async {
                    let sql = format!(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE datname = '{db}' AND pid <> pg_backend_pid()"
                    );
                    (pg_admin_count(&sql).await == 0).then_some(())
                })
                .await;
            }
            Some(user) => {
                mysql_admin(&format!("ALTER USER '{user}'@'%' ACCOUNT LOCK")).await;
                eventually("every session of the worker's user killed", || async {
                    let ids = mysql_admin_ids(&format!(
                        "SELECT id FROM information_schema.processlist WHERE user = '{user}'"
                    ))
                    .await;
                    let mut admin = MySqlConnection::connect(&mysql_url()).await.unwrap();
                    for id in &ids {
                        // Gone already is fine: it is gone.
                        let kill = format!("KILL CONNECTION {id}");
                        let _ = admin.execute(sqlx::AssertSqlSafe(kill)).await;
                    }
                    ids.is_empty().then_some(())
                })
                .await;
            }
        }
    }

    /// Accepts connections again.
    async fn admit(&self) {
        match &self.user {
            None => {
                let db = &self.db_name;
                pg_admin(&format!(r#"ALTER DATABASE "{db}" CONNECTION LIMIT -1"#)).await
            }
            Some(user) => mysql_admin(&format!("ALTER USER '{user}'@'%' ACCOUNT UNLOCK")).await,
        }
    }
}

impl Drop for DatabaseGate {
    fn drop(&mut self) {
        // The test's database is dropped with the TestApp (PostgreSQL forces it, whatever the
        // limit); a MariaDB user outlives it unless dropped here.
        let Some(user) = self.user.clone() else {
            return;
        };
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(mysql_admin(&format!("DROP USER IF EXISTS '{user}'@'%'")));
        })
        .join();
    }
}

async fn pg_admin(sql: &str) {
    let mut admin = PgConnection::connect(&postgres_url()).await.unwrap();
    admin
        .execute(sqlx::AssertSqlSafe(sql.to_string()))
        .await
        .unwrap();
}

async fn pg_admin_count(sql: &str) -> i64 {
    let mut admin = PgConnection::connect(&postgres_url()).await.unwrap();
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&mut admin)
        .await
        .unwrap()
}

async fn mysql_admin(sql: &str) {
    let mut admin = MySqlConnection::connect(&mysql_url()).await.unwrap();
    admin
        .execute(sqlx::AssertSqlSafe(sql.to_string()))
        .await
        .unwrap();
}

async fn mysql_admin_ids(sql: &str) -> Vec<i64> {
    let mut admin = MySqlConnection::connect(&mysql_url()).await.unwrap();
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_all(&mut admin)
        .await
        .unwrap()
}

#[tokio::test]
async fn while_the_database_refuses_connections_jobs_are_retried_then_each_sent_once() {
    let app = TestApp::spawn().await;
    let gate = DatabaseGate::new(&app).await;
    let worker = app.start_worker(&["--database-url", &gate.url, "--concurrency", "4"]);
    // The worker's pool holds an open connection when the database turns it away.
    app.publish(&app.job("before")).await;
    // Recorded, not only received: the record follows the SMTP reply, and refusing in between
    // would leave "before" waiting for the database too.
    tokio::time::timeout(PATIENCE, worker.stats.wait_until(|s| s.sent >= 1))
        .await
        .expect("the first job recorded sent");

    gate.refuse().await;
    let ids: Vec<String> = (0..5).map(|i| format!("refused-{i}")).collect();
    for id in &ids {
        app.publish(&app.job(id)).await;
    }
    // Each job is retried at least twice (PostgreSQL: one acquire timeout each), and keeps its
    // place: nothing sent, nothing dead-lettered. On PostgreSQL that takes three rounds of the
    // pool's 10 s acquire timeout over 4 slots (about 31 s alone), half the usual patience: a
    // loaded machine gets twice that.
    let retried = 2 * ids.len() as u64;
    let waited = tokio::time::timeout(
        PATIENCE * 2,
        worker.stats.wait_until(|s| s.retried >= retried),
    );
    if waited.await.is_err() {
        let snap = worker.stats.snapshot();
        panic!("{retried} retries while the database refuses connections: {snap:?}");
    }
    let snap = worker.stats.snapshot();
    assert_eq!(snap.sent, 1, "{snap:?}");
    assert_eq!(snap.dead_lettered, 0, "{snap:?}");
    assert_eq!(app.smtp.received().len(), 1);

    gate.admit().await;
    app.smtp.wait_for(1 + ids.len()).await;
    for id in &ids {
        app.wait_for_row(id, "welcome", "row sent", |n| n.status.as_str() == "sent")
            .await;
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
    }
    assert_eq!(worker.stats.snapshot().dead_lettered, 0);
    worker.stop().await;
    assert_eq!(app.dead_count().await, 0, "nothing dead-lettered");
    // Copies still on their way back from a retry tier find their job sent.
    app.drain_duplicates().await;
    assert_eq!(app.smtp.received().len(), 1 + ids.len());
}
