//! The isolated world of one measurement: a fresh PostgreSQL database (migrated; MySQL/MariaDB
//! for the relay rows that compare the engines), a fresh broker namespace (declared with mailroom's own `declare_topology`), and Postfix's
//! `smtp-sink` on a free loopback port. Everything is removed again by [`World::cleanup`].

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use lapin::{Channel, Connection, options::*};
use mailroom::broker::{self, Topology};
use mailroom::config::SecretUrl;
use mailroom::db::{Database, Engine};
use mailroom_test_kit::{database, services};
use sqlx::{Connection as _, PgConnection};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// The retry tiers mailroom declares by default (so cleanup knows every queue name).
pub const DEFAULT_RETRY_DELAYS: &str = "5s,30s,2m,10m,1h";
/// Where Debian's `postfix` package installs its test SMTP server.
const SMTP_SINK: &str = "/usr/sbin/smtp-sink";

/// URLs of the running services (`scripts/services` starts them).
#[derive(Clone, Debug)]
pub struct Services {
    /// A database the bench can connect to in order to create and drop its own databases.
    pub admin_db_url: String,
    /// The same on MySQL/MariaDB (the relay rows of that engine).
    pub mysql_admin_url: String,
    pub amqp_url: String,
}

impl Services {
    /// `MAILROOM_BENCH_*`, else the services the tests use (`MAILROOM_TEST_*` or loopback).
    pub fn from_env() -> Services {
        let var = |name: &str, or: fn() -> String| std::env::var(name).unwrap_or_else(|_| or());
        Services {
            admin_db_url: var("MAILROOM_BENCH_DATABASE_URL", services::postgres_url),
            mysql_admin_url: var("MAILROOM_BENCH_MYSQL_URL", services::mysql_url),
            amqp_url: var("MAILROOM_BENCH_AMQP_URL", services::amqp_url),
        }
    }

    /// The admin URL of `engine`'s server.
    fn admin_url(&self, engine: Engine) -> &str {
        match engine {
            Engine::Postgres => &self.admin_db_url,
            Engine::MySql => &self.mysql_admin_url,
        }
    }
}

/// A fresh database and broker namespace.
pub struct World {
    pub label: String,
    pub db: Database,
    pub engine: Engine,
    pub db_url: String,
    /// The URL the mailroom processes get: `db_url`, or a counting proxy in front of it.
    pub process_db_url: String,
    pub db_name: String,
    pub namespace: String,
    pub topology: Topology,
    pub conn: Connection,
    /// A confirm-mode channel for publishing jobs.
    pub publisher: Channel,
    pub services: Services,
}

impl World {
    /// Creates database `mailroom_bench_<id>` (migrated) and namespace `mr-bench-<id>`.
    pub async fn create(services: &Services, label: &str, pool_size: u32) -> anyhow::Result<World> {
        World::create_on(services, Engine::Postgres, label, pool_size).await
    }

    /// [`World::create`] with the database on `engine`.
    pub async fn create_on(
        services: &Services,
        engine: Engine,
        label: &str,
        pool_size: u32,
    ) -> anyhow::Result<World> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("mailroom_bench_{}", &id[..12]);
        let db_url = database::create_database(services.admin_url(engine), &db_name).await?;
        let db = Database::connect_lazy(
            &db_url.parse::<SecretUrl>().map_err(anyhow::Error::msg)?,
            pool_size,
        )?;
        db.migrate().await?;
        let namespace = format!("mr-bench-{}", &id[..12]);
        let delays =
            mailroom::config::parse_delays(DEFAULT_RETRY_DELAYS).map_err(anyhow::Error::msg)?;
        let topology = Topology::new(&namespace, delays.0);
        let conn = Connection::connect(&services.amqp_url, Default::default())
            .await
            .context("connecting to RabbitMQ (is it running? scripts/services)")?;
        broker::declare_topology(&conn, &topology).await?;
        let publisher = broker::confirm_channel(&conn).await?;
        Ok(World {
            label: label.to_string(),
            db,
            engine,
            process_db_url: db_url.clone(),
            db_url,
            db_name,
            namespace,
            topology,
            conn,
            publisher,
            services: services.clone(),
        })
    }

    /// A plain connection to this world's database (for polling and reading results).
    /// The pool of the benchmark's database, which is always PostgreSQL.
    pub fn pg_pool(&self) -> &sqlx::PgPool {
        match &self.db {
            Database::Postgres(pool) => pool,
            Database::MySql(_) => unreachable!("the benchmark creates a PostgreSQL database"),
        }
    }

    pub async fn pg(&self) -> anyhow::Result<PgConnection> {
        Ok(PgConnection::connect(&self.db_url).await?)
    }

    /// Messages ready in the work queue (passive declare: exact).
    pub async fn ready_messages(&self) -> anyhow::Result<u32> {
        let ch = self.conn.create_channel().await?;
        let q = ch
            .queue_declare(
                self.topology.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await?;
        let _ = ch.close(200, "ok".into()).await;
        Ok(q.message_count())
    }

    /// Empties the work queue.
    pub async fn purge_work_queue(&self) -> anyhow::Result<()> {
        let ch = self.conn.create_channel().await?;
        ch.queue_purge(
            self.topology.queue.as_str().into(),
            QueuePurgeOptions::default(),
        )
        .await?;
        let _ = ch.close(200, "ok".into()).await;
        Ok(())
    }

    /// Deletes the queues, exchanges and the database.
    pub async fn cleanup(self) {
        self.db.close().await;
        let t = &self.topology;
        if let Ok(ch) = self.conn.create_channel().await {
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
        let _ = self.conn.close(200, "bench done".into()).await;
        database::drop_database(self.services.admin_url(self.engine), &self.db_name).await;
    }
}

/// PostgreSQL's WAL position in bytes: the difference of two readings is the WAL the server
/// wrote in between (every database's: the bench's own are the only busy ones).
pub async fn wal_position(pg: &mut PgConnection) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            .fetch_one(pg)
            .await?,
    )
}

/// The server's log position in bytes, on either engine: PostgreSQL's WAL; on MySQL/MariaDB
/// the binary log's bytes written plus InnoDB's redo log sequence number. The difference of
/// two readings is what the whole server logged in between.
pub async fn log_position(db: &Database) -> anyhow::Result<i64> {
    match db {
        Database::Postgres(pool) => Ok(sqlx::query_scalar(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
        )
        .fetch_one(pool)
        .await?),
        Database::MySql(pool) => {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT variable_name, variable_value FROM information_schema.global_status
                 WHERE variable_name IN ('BINLOG_BYTES_WRITTEN', 'INNODB_LSN_CURRENT')",
            )
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().filter_map(|(_, v)| v.parse::<i64>().ok()).sum())
        }
    }
}

/// Offset of PostgreSQL's clock from this process's clock (`pg - local`), measured as the
/// best of a few round trips. Both run on this host, so it is the read-out error only; it is
/// applied anyway so that client-side publish times and DB-side `sent_at` share one clock.
pub async fn pg_clock_offset(pg: &mut PgConnection) -> anyhow::Result<chrono::Duration> {
    let mut best: Option<(chrono::Duration, chrono::Duration)> = None;
    for _ in 0..7 {
        let before = Utc::now();
        let at: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut *pg)
            .await?;
        let after = Utc::now();
        let rtt = after - before;
        let offset = at - (before + rtt / 2);
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    Ok(best.map(|(_, o)| o).unwrap_or_default())
}

/// The SMTP server the workers send to: Postfix's `smtp-sink`, which accepts and discards, and
/// counts (`-c`) what it accepted; or the test suite's recorder in Python (aiosmtpd), which
/// writes and fsyncs each message before it answers, as a slow server in the wild does.
pub struct SmtpSink {
    pub port: u16,
    server: SmtpProcess,
    accepted: Arc<AtomicU64>,
    /// What the report calls it.
    pub name: &'static str,
}

enum SmtpProcess {
    Postfix(Child),
    Recorder(Box<mailroom_test_kit::smtp::SmtpServer>),
}

impl SmtpSink {
    /// `smtp-sink -u nobody -c -h sink.localdomain -m 1024 127.0.0.1:<free port> 1024`, with
    /// the options in `MAILROOM_BENCH_SINK_ARGS` before the address (`-p`: no PIPELINING).
    pub async fn start() -> anyhow::Result<SmtpSink> {
        anyhow::ensure!(
            Path::new(SMTP_SINK).exists(),
            "{SMTP_SINK} is missing: install Debian's postfix package (scripts/services does)"
        );
        let port = mailroom_test_kit::free_port();
        let mut child = Command::new(SMTP_SINK)
            .args(["-u", "nobody", "-c", "-h", "sink.localdomain", "-m", "1024"])
            .args(
                std::env::var("MAILROOM_BENCH_SINK_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .arg(format!("127.0.0.1:{port}"))
            .arg("1024")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting smtp-sink")?;
        let accepted = Arc::new(AtomicU64::new(0));
        let mut out = child.stdout.take().context("smtp-sink stdout")?;
        let counter = accepted.clone();
        // `-c` prints "\rsess=N quit=N mesg=N" after each message; keep the largest mesg.
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut tail = String::new();
            while let Ok(n) = out.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                tail.push_str(&String::from_utf8_lossy(&buf[..n]));
                if let Some(at) = tail.rfind("mesg=") {
                    let digits: String = tail[at + 5..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    // A number cut by the read is a prefix, so smaller: `fetch_max` ignores it.
                    if let Ok(v) = digits.parse::<u64>() {
                        counter.fetch_max(v, Ordering::Relaxed);
                    }
                    let keep = tail.len().saturating_sub(64);
                    tail.drain(..keep);
                }
            }
        });
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(SmtpSink {
                    port,
                    server: SmtpProcess::Postfix(child),
                    accepted,
                    name: "smtp-sink",
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::bail!("smtp-sink did not listen on 127.0.0.1:{port}")
    }

    /// The test suite's recording SMTP server (tests/support/smtp_recorder.py under Debian's
    /// python3), logging into `dir`.
    pub async fn python_recorder(dir: &Path) -> anyhow::Result<SmtpSink> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let server = mailroom_test_kit::smtp::SmtpServer::start(dir, &[]).await;
        Ok(SmtpSink {
            port: server.port,
            server: SmtpProcess::Recorder(Box::new(server)),
            accepted: Arc::default(),
            name: "the Python recorder",
        })
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        match &self.server {
            SmtpProcess::Postfix(child) => child.id(),
            SmtpProcess::Recorder(server) => server.pid(),
        }
    }

    /// Messages accepted since start (smtp-sink's own counter, which lags a message at most;
    /// the recorder's log).
    pub fn accepted(&self) -> u64 {
        match &self.server {
            SmtpProcess::Postfix(_) => self.accepted.load(Ordering::Relaxed),
            SmtpProcess::Recorder(server) => server.received().len() as u64,
        }
    }

    pub async fn stop(self) {
        match self.server {
            SmtpProcess::Postfix(mut child) => {
                let _ = child.kill().await;
            }
            // Killed on drop.
            SmtpProcess::Recorder(server) => drop(server),
        }
    }
}
