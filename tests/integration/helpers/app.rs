//! `TestApp`: one isolated world per test (a database of the suite's engine, a uuid-suffixed
//! broker namespace, an SMTP recorder), its jobs, what it published and what its database and
//! queues hold; everything is removed when it is dropped.

use std::sync::Once;
use std::time::Duration;

use lapin::{Channel, Connection, options::*};
use mailroom::broker::{self, Topology};
use mailroom::config::{SecretUrl, UrlList};
use mailroom::db::dead_letters::LetterQuery;
use mailroom::db::outbox::{EnqueueError, Enqueued};
use mailroom::db::{Database, Notification};
use mailroom::dlq::ingest::Drained;
use mailroom::job::EmailJob;
use mailroom_test_kit::services::amqp_url;
use mailroom_test_kit::smtp::SmtpServer;
use mailroom_test_kit::waits::{PATIENCE, eventually};
use serde_json::{Value, json};
use sqlx::Executor as _;

use super::broker::DeadLetter;
use super::database::{TestTx, create_database, database_name, drop_database};

/// Retry tiers short enough for tests.
pub const TEST_RETRY_DELAYS: &str = "200ms,500ms,1s";

fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            mailroom::telemetry::init(mailroom::telemetry::LogFormat::Text);
        }
    });
}

/// One test's world.
pub struct TestApp {
    pub db: Database,
    pub db_url: String,
    db_name: String,
    pub namespace: String,
    pub topology: Topology,
    pub amqp_url: String,
    pub smtp: SmtpServer,
    pub dir: tempfile::TempDir,
    conn: Connection,
    publisher: Channel,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        TestApp::spawn_with(&[]).await
    }

    /// `smtp_args` go to the SMTP recorder, e.g. `["--fail", "DATA:451:2"]`.
    pub async fn spawn_with(smtp_args: &[&str]) -> TestApp {
        TestApp::spawn_on(amqp_url(), smtp_args).await
    }

    pub async fn spawn_on(amqp_url: String, smtp_args: &[&str]) -> TestApp {
        init_logs();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = database_name(&id[..16]);
        let db_url = create_database(&db_name).await;
        let db = Database::connect_lazy(&db_url.parse::<SecretUrl>().unwrap(), 8).unwrap();
        db.migrate().await.unwrap();
        let namespace = format!("mr-{}", &id[..12]);
        let delays = mailroom::config::parse_delays(TEST_RETRY_DELAYS).unwrap();
        let topology = Topology::new(&namespace, delays.0);
        let conn = Connection::connect(&amqp_url, Default::default())
            .await
            .expect("RabbitMQ is up (scripts/services)");
        broker::declare_topology(&conn, &topology).await.unwrap();
        let publisher = broker::confirm_channel(&conn).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let smtp = SmtpServer::start(dir.path(), smtp_args).await;
        TestApp {
            db,
            db_url,
            db_name,
            namespace,
            topology,
            amqp_url,
            smtp,
            dir,
            conn,
            publisher,
        }
    }

    /// A job for this test, as the README's "The job" shows it.
    pub fn job(&self, job_id: &str) -> Value {
        json!({
            "job_id": job_id, "kind": "welcome",
            "to": ["Ada Lovelace <ada@example.com>"],
            "data": {
                "product_name": "Acme Cloud", "user": { "name": "Ada" },
                "getting_started_url": "https://acme.example/start",
                "support_email": "support@acme.example"
            },
            "created_at": "2026-11-30T12:00:00Z"
        })
    }

    pub fn message_id(&self, job_id: &str, kind: &str) -> String {
        mailroom::smtp::message_id(job_id, kind, "mailroom.test")
    }

    /// Publishes a job as a producer would, with confirms.
    pub async fn publish(&self, job: &Value) {
        let kind = job["kind"].as_str().unwrap_or("unknown");
        let id = job["job_id"].as_str().unwrap_or("?");
        self.publish_raw(kind, id, job.to_string().as_bytes()).await;
    }

    /// Publishes any bytes, as anyone with access to the exchange could.
    pub async fn publish_raw(&self, routing_key: &str, message_id: &str, body: &[u8]) {
        self.try_publish_raw(routing_key, message_id, body)
            .await
            .unwrap();
    }

    /// Publishes a job; `false` when the broker did not route it to a queue (or refused it).
    pub async fn try_publish(&self, job: &Value) -> bool {
        let kind = job["kind"].as_str().unwrap_or("unknown");
        let id = job["job_id"].as_str().unwrap_or("?");
        self.try_publish_raw(kind, id, job.to_string().as_bytes())
            .await
            .is_ok()
    }

    async fn try_publish_raw(
        &self,
        routing_key: &str,
        message_id: &str,
        body: &[u8],
    ) -> Result<(), broker::PublishError> {
        let props = broker::job_properties(message_id, routing_key, 1);
        broker::publish_confirmed(
            &self.publisher,
            &self.topology.exchange,
            routing_key,
            body,
            props,
        )
        .await
    }

    pub async fn notification(&self, job_id: &str, kind: &str) -> Option<Notification> {
        self.db.notification(job_id, kind).await.unwrap()
    }

    /// Waits until the row of `(job_id, kind)` satisfies `pred`.
    pub async fn wait_for_row(
        &self,
        job_id: &str,
        kind: &str,
        what: &str,
        pred: impl Fn(&Notification) -> bool,
    ) -> Notification {
        eventually(what, || async {
            self.notification(job_id, kind).await.filter(|n| pred(n))
        })
        .await
    }

    /// Counts rows by status.
    pub async fn count_status(&self, status: &str) -> i64 {
        assert!(status.chars().all(|c| c.is_ascii_lowercase()));
        self.count(&format!(
            "SELECT count(*) FROM sent_notifications WHERE status = '{status}'"
        ))
        .await
    }

    /// Runs a `SELECT count(*) …` written in SQL both engines accept.
    pub async fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        match &self.db {
            Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Database::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap()
    }

    /// Runs one statement written in SQL both engines accept, in a transaction of its own.
    pub async fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        match &self.db {
            Database::Postgres(pool) => pool.execute(sql).await.map(drop),
            Database::MySql(pool) => pool.execute(sql).await.map(drop),
        }
        .unwrap();
    }

    /// Begins a transaction on this test's database. Like an application's request, it tries
    /// again when the connection breaks before anything was written (seen once on MariaDB just
    /// after the disruptive tests had SIGKILLed and restarted it).
    pub async fn begin(&self) -> TestTx {
        let mut attempt = 1;
        loop {
            let begun = match &self.db {
                Database::Postgres(pool) => pool.begin().await.map(TestTx::Pg),
                Database::MySql(pool) => pool.begin().await.map(TestTx::My),
            };
            match begun {
                Ok(tx) => return tx,
                Err(e) if attempt < 5 && matches!(e, sqlx::Error::Io(_)) => {
                    eprintln!("begin failed ({e}); trying again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot begin a transaction: {e}"),
            }
        }
    }

    /// Enqueues in a transaction of its own.
    pub async fn enqueue(&self, job: &EmailJob) -> Result<Enqueued, EnqueueError> {
        self.db.enqueue(job).await
    }

    /// The job as the Rust enqueue API takes it.
    pub fn email_job(&self, job_id: &str) -> mailroom::job::EmailJob {
        serde_json::from_value(self.job(job_id)).unwrap()
    }

    /// Rows in the outbox not yet published.
    pub async fn unpublished(&self) -> i64 {
        self.count("SELECT count(*) FROM mailroom_outbox WHERE published_at IS NULL")
            .await
    }

    /// The ids of unpublished outbox rows no transaction holds locked, in id order: what a
    /// relay's `SKIP LOCKED` claim could take right now.
    pub async fn unlocked_unpublished_ids(&self) -> Vec<i64> {
        const SQL: &str = "SELECT id FROM mailroom_outbox WHERE published_at IS NULL \
                           ORDER BY id FOR UPDATE SKIP LOCKED";
        match &self.db {
            Database::Postgres(pool) => {
                let mut tx = pool.begin().await.unwrap();
                let ids = sqlx::query_scalar(SQL).fetch_all(&mut *tx).await.unwrap();
                tx.rollback().await.unwrap();
                ids
            }
            Database::MySql(pool) => {
                let mut tx = pool.begin().await.unwrap();
                let ids = sqlx::query_scalar(SQL).fetch_all(&mut *tx).await.unwrap();
                tx.rollback().await.unwrap();
                ids
            }
        }
    }

    /// Takes `n` dead letters, oldest first: what the dead-letter queue received, through the
    /// table (the queue is ingested meanwhile, as a worker process does), each row deleted as
    /// it is taken so the next call takes the next ones.
    pub async fn dead_letters(&self, n: usize) -> Vec<DeadLetter> {
        let dead = LetterQuery {
            state: Some("dead".into()),
            payload: true,
            ..LetterQuery::default()
        };
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            self.ingest_dead().await;
            let mut rows = self.db.dead_letters(&dead).await.unwrap();
            if rows.len() >= n {
                rows.reverse();
                rows.truncate(n);
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                self.db
                    .purge_dead_letters(&ids, "test", true)
                    .await
                    .unwrap();
                return rows
                    .into_iter()
                    .map(|r| DeadLetter {
                        properties: mailroom::dlq::decode_properties(&r.properties).unwrap(),
                        body: r.body,
                    })
                    .collect();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {n} dead letters, got {}",
                rows.len()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Moves what is in the dead-letter queue into the table now (`mailroom dlq ingest`).
    pub async fn ingest_dead(&self) -> Drained {
        let urls: UrlList = self.amqp_url.parse().unwrap();
        mailroom::dlq::ingest::drain(&urls, &self.topology, &self.db)
            .await
            .unwrap()
    }

    /// Messages ready in the work queue, by a passive declare (exact, unlike the periodically
    /// refreshed counts of `rabbitmqctl list_queues`). Once every consumer is gone, unacked
    /// deliveries are back among the ready ones, so 0 means every delivery was settled.
    pub async fn ready_messages(&self) -> u32 {
        self.queue_length(&self.topology.queue).await
    }

    /// Dead letters still dead: in the dead-letter queue, or ingested and neither replayed
    /// nor purged.
    pub async fn dead_count(&self) -> u32 {
        let rows = self
            .count("SELECT count(*) FROM mailroom_dead_letters WHERE state = 'dead'")
            .await;
        self.queue_length(&self.topology.dead).await + u32::try_from(rows).unwrap()
    }

    /// Messages in the dead-letter queue itself, not yet ingested.
    pub async fn dead_queue_length(&self) -> u32 {
        self.queue_length(&self.topology.dead).await
    }

    /// Deletes the work queue, as an operator's mistake or a broker incident would.
    pub async fn delete_work_queue(&self) {
        let ch = self.conn.create_channel().await.unwrap();
        ch.queue_delete(
            self.topology.queue.as_str().into(),
            QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    }

    async fn queue_length(&self, queue: &str) -> u32 {
        self.queue_counts(queue).await.0
    }

    /// Consumers of the dead-letter queue (ingesters).
    pub async fn dead_consumers(&self) -> u32 {
        self.queue_counts(&self.topology.dead).await.1
    }

    /// Ready messages and consumers of `queue`.
    async fn queue_counts(&self, queue: &str) -> (u32, u32) {
        let ch = self.conn.create_channel().await.unwrap();
        let opts = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = ch
            .queue_declare(queue.into(), opts, Default::default())
            .await
            .unwrap();
        (q.message_count(), q.consumer_count())
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let db_name = self.db_name.clone();
        let amqp = self.amqp_url.clone();
        let t = self.topology.clone();
        // Cleanup needs async clients; run it on a thread of its own, outside the test runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(conn) = Connection::connect(&amqp, Default::default()).await
                    && let Ok(ch) = conn.create_channel().await
                {
                    let mut queues = vec![t.queue.clone(), t.dead.clone()];
                    queues.extend(t.retry_delays.iter().map(|d| t.retry_queue(*d)));
                    for q in queues {
                        let _ = ch
                            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                    for x in [&t.exchange, &t.retry_exchange, &t.dlx] {
                        let _ = ch
                            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                            .await;
                    }
                }
                drop_database(&db_name).await;
            });
        })
        .join();
    }
}
