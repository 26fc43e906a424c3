//! `TestApp`: one isolated world per test (database, broker namespace, SMTP recorder), and the
//! handles to run workers in-process or as real processes that can be killed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Once};
use std::time::Duration;

use clap::Parser;
use lapin::{BasicProperties, Channel, Connection, options::*, types::AMQPValue};
use mailroom::broker::{self, Topology};
use mailroom::cli::{Cli, Command};
use mailroom::config::SecretUrl;
use mailroom::db::outbox::{self, EnqueueError, Enqueued};
use mailroom::db::{Database, Engine, Notification};
use mailroom::job::EmailJob;
use mailroom::render::LiveTemplates;
use mailroom::worker::Stats;
use serde_json::{Value, json};
use sqlx::{Connection as _, Executor as _, MySql, MySqlConnection, PgConnection, Postgres};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command as Process};
use tokio_util::sync::CancellationToken;

pub use crate::fault_proxy::{Fault, FaultProxy};

/// How long any awaited condition may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);
/// Retry tiers short enough for tests.
pub const TEST_RETRY_DELAYS: &str = "200ms,500ms,1s";

pub fn database_url() -> String {
    std::env::var("MAILROOM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://mailroom:mailroom@127.0.0.1:5432/mailroom".into())
}

pub fn mysql_url() -> String {
    std::env::var("MAILROOM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://mailroom:mailroom@127.0.0.1:3306/mailroom".into())
}

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

/// Creates an empty database of the suite's engine; returns its URL.
async fn create_database(name: &str) -> String {
    let admin = match engine() {
        Engine::Postgres => database_url(),
        Engine::MySql => mysql_url(),
    };
    match engine() {
        Engine::Postgres => PgConnection::connect(&admin)
            .await
            .expect("PostgreSQL is up (scripts/services)")
            .execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
            .await
            .map(drop),
        Engine::MySql => MySqlConnection::connect(&admin)
            .await
            .expect("MariaDB/MySQL is up (scripts/services)")
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .await
            .map(drop),
    }
    .unwrap();
    let mut url = url::Url::parse(&admin).unwrap();
    url.set_path(name);
    url.to_string()
}

async fn drop_database(name: &str) {
    match engine() {
        Engine::Postgres => {
            if let Ok(mut admin) = PgConnection::connect(&database_url()).await {
                let drop = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
                let _ = admin.execute(sqlx::AssertSqlSafe(drop)).await;
            }
        }
        Engine::MySql => {
            if let Ok(mut admin) = MySqlConnection::connect(&mysql_url()).await {
                let drop = format!("DROP DATABASE IF EXISTS `{name}`");
                let _ = admin.execute(sqlx::AssertSqlSafe(drop)).await;
            }
        }
    }
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

pub fn amqp_url() -> String {
    std::env::var("MAILROOM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            mailroom::telemetry::init(mailroom::telemetry::LogFormat::Text);
        }
    });
}

/// Polls `check` until it returns `Some`, failing the test after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(PATIENCE, what, check).await
}

/// [`eventually`] with a patience of its own, for the few tests that move thousands of jobs.
pub async fn eventually_within<T, F, Fut>(patience: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A loopback port nothing listens on (free when this returns; a test may start a server on it
/// later, to play a server that is down and comes back).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One accepted email, as the SMTP server recorded it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Received {
    pub mail_from: String,
    pub rcpt_tos: Vec<String>,
    pub message_id: Option<String>,
    pub data: String,
}

/// A real SMTP server (tests/support/smtp_recorder.py) that logs every accepted message.
pub struct SmtpServer {
    pub port: u16,
    log: PathBuf,
    _child: Child,
}

impl SmtpServer {
    pub async fn start(dir: &Path, args: &[&str]) -> SmtpServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_recorder.py");
        let log = dir.join("received.jsonl");
        let mut child = Process::new("/usr/bin/python3")
            .arg(script)
            .args(["--port", "0", "--log"])
            .arg(&log)
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the SMTP recorder (apt-get install python3-aiosmtpd)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("SMTP recorder did not start")
            .unwrap()
            .expect("SMTP recorder exited");
        let port = first
            .strip_prefix("LISTENING ")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        SmtpServer {
            port,
            log,
            _child: child,
        }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Everything accepted so far.
    pub fn received(&self) -> Vec<Received> {
        match std::fs::read_to_string(&self.log) {
            // The last line may still be being written: take complete lines only.
            Ok(text) => text
                .split_inclusive('\n')
                .filter(|l| l.ends_with('\n'))
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            Err(_) => vec![],
        }
    }

    /// Waits until at least `n` emails were accepted, and returns them all.
    pub async fn wait_for(&self, n: usize) -> Vec<Received> {
        self.wait_for_within(n, PATIENCE).await
    }

    pub async fn wait_for_within(&self, n: usize, patience: Duration) -> Vec<Received> {
        eventually_within(
            patience,
            &format!("{n} emails at the SMTP server"),
            || async {
                let got = self.received();
                (got.len() >= n).then_some(got)
            },
        )
        .await
    }

    /// How many accepted emails carry `message_id`.
    pub fn count(&self, message_id: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| r.message_id.as_deref() == Some(message_id))
            .count()
    }
}

/// A message read back from the dead-letter queue.
#[derive(Debug)]
pub struct DeadLetter {
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl DeadLetter {
    pub fn header(&self, name: &str) -> Option<String> {
        match self.properties.headers().as_ref()?.inner().get(name)? {
            AMQPValue::LongString(s) => Some(s.to_string()),
            AMQPValue::ShortString(s) => Some(s.to_string()),
            AMQPValue::LongLongInt(i) => Some(i.to_string()),
            other => Some(format!("{other:?}")),
        }
    }
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
        let db_name = format!("mailroom_test_{}", &id[..16]);
        let db_url = create_database(&db_name).await;
        let db = Database::connect_lazy(&db_url.parse::<SecretUrl>().unwrap(), 8).unwrap();
        db.migrate().await.unwrap();
        let namespace = format!("mr-{}", &id[..12]);
        let delays = mailroom::config::parse_delays(TEST_RETRY_DELAYS).unwrap();
        let topology = Topology::new(&namespace, delays.0);
        let conn = Connection::connect(&amqp_url, Default::default())
            .await
            .expect("RabbitMQ is up (scripts/services)");
        broker::declare_topology(&conn.create_channel().await.unwrap(), &topology)
            .await
            .unwrap();
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

    /// The worker's command line (after `mailroom worker`): test-sized defaults, with the flags
    /// named in `extra` replacing the defaults of the same name.
    pub fn worker_args(&self, extra: &[&str]) -> Vec<String> {
        with_overrides(self.default_worker_args(), extra)
    }

    fn default_worker_args(&self) -> Vec<String> {
        let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        [
            "--database-url",
            &self.db_url,
            "--amqp-url",
            &self.amqp_url,
            "--namespace",
            &self.namespace,
            "--retry-delays",
            TEST_RETRY_DELAYS,
            "--smtp-url",
            &self.smtp.url(),
            "--from",
            "Mailroom Tests <noreply@mailroom.test>",
            "--templates",
            templates.to_str().unwrap(),
            // The shortest lease that covers a 2 s send (worker::lease::minimum_lease) plus 1 s
            // for claims slowed by a loaded machine.
            "--lease",
            "5s",
            "--smtp-timeout",
            "2s",
            "--concurrency",
            "8",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Starts a worker in this process; `extra` args override the defaults.
    pub fn start_worker(&self, extra: &[&str]) -> RunningWorker {
        let mut argv = vec!["mailroom".to_string(), "worker".to_string()];
        argv.extend(self.worker_args(extra));
        let Command::Worker(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let worker = args.build().unwrap();
        Running::spawn(worker.stats(), |stop| tokio::spawn(worker.run(stop)))
    }

    /// Starts a worker in this process that follows its template directory like `mailroom
    /// worker` (polling every `--template-reload-interval`); returns its live template set too.
    pub fn start_live_worker(&self, extra: &[&str]) -> (RunningWorker, Arc<LiveTemplates>) {
        let mut argv = vec!["mailroom".to_string(), "worker".to_string()];
        argv.extend(self.worker_args(extra));
        let Command::Worker(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let worker = args.build().unwrap();
        let live = worker.templates();
        let (watched, every) = (live.clone(), args.template_reload_interval);
        let running = Running::spawn(worker.stats(), |stop| {
            tokio::spawn(watched.watch(every, stop.clone()));
            tokio::spawn(worker.run(stop))
        });
        (running, live)
    }

    /// Starts `mailroom worker` as a real process, with `env` added (e.g. failpoints).
    pub fn spawn_worker_process(&self, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("worker.log"))
            .unwrap();
        let stderr = if std::env::var_os("TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::from(log)
        };
        Process::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg("worker")
            .args(self.worker_args(extra))
            .envs(env.iter().copied())
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start mailroom worker")
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

    /// Takes every message from the dead-letter queue (waiting for `n` of them).
    pub async fn dead_letters(&self, n: usize) -> Vec<DeadLetter> {
        let ch = self.conn.create_channel().await.unwrap();
        let queue = self.topology.dead.as_str();
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while got.len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {n} dead letters, got {}",
                got.len()
            );
            match ch
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap()
            {
                Some(m) => got.push(DeadLetter {
                    body: m.delivery.data.clone(),
                    properties: m.delivery.properties.clone(),
                }),
                None => tokio::time::sleep(Duration::from_millis(25)).await,
            }
        }
        got
    }

    /// Messages ready in the work queue, by a passive declare (exact, unlike the periodically
    /// refreshed counts of `rabbitmqctl list_queues`). Once every consumer is gone, unacked
    /// deliveries are back among the ready ones, so 0 means every delivery was settled.
    pub async fn ready_messages(&self) -> u32 {
        self.queue_length(&self.topology.queue).await
    }

    /// Messages in the dead-letter queue (left there).
    pub async fn dead_count(&self) -> u32 {
        self.queue_length(&self.topology.dead).await
    }

    async fn queue_length(&self, queue: &str) -> u32 {
        let ch = self.conn.create_channel().await.unwrap();
        let opts = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = ch
            .queue_declare(queue.into(), opts, Default::default())
            .await
            .unwrap();
        q.message_count()
    }
}

impl TestApp {
    /// After the workers of a test stopped: whatever is still ready in the work queue must be a
    /// copy of a job already settled (a redelivery after a crash, or a retry copy still on its
    /// way back from a tier). A fresh worker drains the queue until it is empty, and may not
    /// send anything new.
    pub async fn drain_duplicates(&self) {
        if self.ready_messages().await == 0 {
            return;
        }
        let before = self.smtp.received().len();
        let worker = self.start_worker(&[]);
        eventually("leftover copies drained", || async {
            // Empty twice in a row, a tier's delay apart: nothing is still coming back.
            if self.ready_messages().await > 0 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            (self.ready_messages().await == 0).then_some(())
        })
        .await;
        let snap = worker.stats.snapshot();
        worker.stop().await;
        eprintln!(
            "drained {} leftover copies ({} duplicates)",
            snap.received, snap.duplicates
        );
        assert_eq!(
            self.smtp.received().len(),
            before,
            "a leftover copy was sent again"
        );
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

/// A worker or relay running inside the test process, stopped when dropped.
pub struct Running<S> {
    pub stats: Arc<S>,
    pub shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub type RunningWorker = Running<Stats>;
pub type RunningRelay = Running<mailroom::relay::RelayStats>;

impl<S> Running<S> {
    fn spawn(
        stats: Arc<S>,
        run: impl FnOnce(CancellationToken) -> tokio::task::JoinHandle<anyhow::Result<()>>,
    ) -> Running<S> {
        let shutdown = CancellationToken::new();
        let task = Some(run(shutdown.clone()));
        Running {
            stats,
            shutdown,
            task,
        }
    }

    /// Stops it gracefully and waits.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// `defaults` with each `--flag value` pair of `extra` replacing the pair of the same flag.
fn with_overrides(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    for pair in extra.chunks(2) {
        if let Some(at) = args.iter().position(|a| a == pair[0]) {
            args.drain(at..at + 2);
        }
        args.extend(pair.iter().map(|s| s.to_string()));
    }
    args
}

/// Sends SIGTERM to a child process.
pub async fn terminate(child: &Child) {
    let pid = child.id().expect("process still running").to_string();
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

/// A RabbitMQ virtual host of its own, for tests that break every connection in it without
/// touching the tests running beside them.
pub struct Vhost {
    pub name: String,
    pub url: String,
}

impl Vhost {
    pub async fn create() -> Vhost {
        let name = format!(
            "mailroom-test-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        rabbitmqctl(&["add_vhost", &name]).await;
        rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]).await;
        let mut url = url::Url::parse(&amqp_url()).unwrap();
        url.set_path(&format!("/{name}"));
        Vhost {
            name,
            url: url.to_string(),
        }
    }

    pub async fn close_all_connections(&self) {
        rabbitmqctl(&[
            "close_all_connections",
            "-p",
            &self.name,
            "mailroom test: broker drops connections",
        ])
        .await;
    }

    pub async fn delete(&self) {
        rabbitmqctl(&["delete_vhost", &self.name]).await;
    }
}

async fn rabbitmqctl(args: &[&str]) {
    let out = tokio::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl RunningRelay {
    pub fn published(&self) -> u64 {
        self.stats
            .published
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl TestApp {
    /// The relay's command line (after `mailroom relay`).
    pub fn relay_args(&self, extra: &[&str]) -> Vec<String> {
        let args: Vec<String> = [
            "--database-url",
            &self.db_url,
            "--amqp-url",
            &self.amqp_url,
            "--namespace",
            &self.namespace,
            "--retry-delays",
            TEST_RETRY_DELAYS,
            "--relay-poll",
            "1s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        with_overrides(args, extra)
    }

    /// Starts a relay in this process.
    pub fn start_relay(&self, extra: &[&str]) -> RunningRelay {
        let mut argv = vec!["mailroom".to_string(), "relay".to_string()];
        argv.extend(self.relay_args(extra));
        let Command::Relay(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let relay = args.build().unwrap();
        Running::spawn(relay.stats(), |stop| tokio::spawn(relay.run(stop)))
    }

    /// Starts `mailroom relay` as a real process.
    pub fn spawn_relay_process(&self, extra: &[&str], env: &[(&str, &str)]) -> Child {
        Process::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg("relay")
            .args(self.relay_args(extra))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("TEST_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()
            .expect("start mailroom relay")
    }

    /// The job as the Rust enqueue API takes it.
    pub fn email_job(&self, job_id: &str) -> mailroom::job::EmailJob {
        serde_json::from_value(self.job(job_id)).unwrap()
    }

    /// Runs a worker and a relay until `(job_id, kind)` is recorded `sent`, then stops both:
    /// the outbox path end to end, for tests that check what the SMTP server got afterwards.
    pub async fn deliver_through_outbox(&self, job_id: &str, kind: &str) {
        let worker = self.start_worker(&[]);
        let relay = self.start_relay(&[]);
        self.wait_for_row(job_id, kind, "row sent", |n| n.status.as_str() == "sent")
            .await;
        relay.stop().await;
        worker.stop().await;
    }

    /// Rows in the outbox not yet published.
    pub async fn unpublished(&self) -> i64 {
        self.count("SELECT count(*) FROM mailroom_outbox WHERE published_at IS NULL")
            .await
    }
}

impl TestApp {
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

    /// Runs `mailroom <args>` against this test's world, returning stdout; fails on exit ≠ 0.
    pub async fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args).await;
        assert!(out.status.success(), "mailroom {args:?}: {}", out.stderr);
        out.stdout
    }
}

/// What a run of the `mailroom` binary printed, and how it ended.
#[derive(Debug)]
pub struct CliOutput {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the built `mailroom` binary with `args` and `env` (and nothing from the caller's
/// environment that mailroom reads).
pub async fn run_cli(args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    let mut cmd = Process::new(env!("CARGO_BIN_EXE_mailroom"));
    for var in [
        "DATABASE_URL",
        "AMQP_URL",
        "MAILROOM_NAMESPACE",
        "MAILROOM_TEMPLATES",
        "MAILROOM_FROM",
        "MAILROOM_MESSAGE_ID_DOMAIN",
        "MAILROOM_REPLAY_KEY",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run the mailroom binary");
    CliOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl TestApp {
    /// Runs `mailroom <args>` against this app's broker namespace and database, with the
    /// shipped templates, through the environment (so any subcommand takes them); unlike
    /// [`TestApp::cli`], returns the exit status and stderr too, for commands expected to fail.
    pub async fn cli_output(&self, args: &[&str]) -> CliOutput {
        let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let env = [
            ("AMQP_URL", self.amqp_url.as_str()),
            ("MAILROOM_NAMESPACE", self.namespace.as_str()),
            ("MAILROOM_RETRY_DELAYS", TEST_RETRY_DELAYS),
            ("DATABASE_URL", self.db_url.as_str()),
            ("MAILROOM_TEMPLATES", templates.to_str().unwrap()),
        ];
        run_cli(args, &env).await
    }
}
