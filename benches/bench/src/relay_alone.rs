//! The relay by itself, one `mailroom relay` process per engine (PostgreSQL, then
//! MySQL/MariaDB), no worker:
//! - **relay only**: N outbox rows committed in one transaction; the time from that commit
//!   until no row is unpublished gives rows/s (outbox → confirmed in the queue, marked
//!   published);
//! - **relay idle**: the same relay with nothing to do, over [`IDLE_WINDOW`]. PostgreSQL: the
//!   transactions on the world's database as `pg_stat_database` counts them (read through
//!   another database; the bench's own connections are closed, autovacuum is off for the
//!   outbox). MySQL: the commands the relay sends, counted by a proxy between it and the server
//!   ([`crate::mysql`]), with the server-wide `Questions` delta beside it as a cross-check.
//!   The MySQL relay runs behind that proxy throughout (its sockets have TCP_NODELAY, so it
//!   adds one loopback hop and no delayed-ACK stall);
//! - **wake-up latency**: single rows committed while the relay is idle, [`WAKE_GAP`] + a
//!   phase apart; commit → published from the outbox's own `published_at - created_at` (both
//!   the database's clock), beside the wake-up mode the relay reports in `/metrics`
//!   (NOTIFY, the binary log, or probes only).
//!
//! The two engines' relay-only runs are sequential; their idle windows and wake-ups run at the
//! same time (each counts only its own database or its own relay, and idle relays hardly load
//! the machine), which keeps `--quick` short.

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use mailroom::config::SecretUrl;
use mailroom::db::{Database, Engine, outbox};
use serde::Serialize;
use sqlx::{Connection as _, MySqlConnection, PgConnection};

use crate::latency::{Lat, Recorder};
use crate::mysql::{self, Commands, CountingProxy};
use crate::workers::{Fleet, patience};
use crate::workload::{self, KIND};
use crate::world::{Services, SmtpSink, World, log_position};

/// How long the idle relay is watched.
pub const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// PostgreSQL, before the idle window: a backend reports its statistics when it goes idle (at
/// most once a second, else 10 s later), so after 12 s the busy phase is fully reported.
const PG_IDLE_SETTLE: Duration = Duration::from_secs(12);
/// MySQL, before the idle window: the probes back off from 10 ms to the 1 s ceiling within
/// 1.27 s of the last busy scan.
const MYSQL_IDLE_SETTLE: Duration = Duration::from_secs(3);
/// Between a row's publication and the next commit: longer than the MySQL relay takes to back
/// off to its ceiling (1.27 s), so every row meets a relay polling at most once a second. A
/// phase of 0–1 s is added (golden-ratio steps) so the commits fall evenly across that second.
const WAKE_GAP: Duration = Duration::from_millis(2500);
/// Longest wait for one wake-up row to be published.
const WAKE_PATIENCE: Duration = Duration::from_secs(15);
/// Commits per second of the trickle.
pub const TRICKLE_RATE: f64 = 10.0;

#[derive(Clone, Debug, Serialize)]
pub struct RelayOnly {
    pub n: usize,
    /// From the commit of the N rows to the last one published: includes the wake-up (a few
    /// ms). The marks' own timestamps give no sound rate: a batch's rows share one
    /// `published_at`, taken by the claim that marks them (on both engines), and overlapping
    /// batches put those far closer together than a batch's work.
    pub rows_per_s: f64,
    pub complete: bool,
    /// Messages ready in the work queue afterwards (N + the warm-up row).
    pub queued: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct RelayIdle {
    pub window_s: f64,
    /// What was counted in the window: `transactions` or `commands`.
    pub unit: &'static str,
    pub count: u64,
    pub per_s: f64,
    pub method: &'static str,
    /// MySQL: the relay's commands by type.
    #[serde(skip_serializing_if = "Commands::is_empty")]
    pub commands: Commands,
    /// MySQL: server-wide `Questions` per second in the same window (every client of the server).
    pub server_questions_per_s: Option<f64>,
}

/// Commit → published of single rows committed to an idle relay.
#[derive(Clone, Debug, Serialize)]
pub struct WakeLatency {
    pub rows: usize,
    pub published: usize,
    /// Commits were `gap_s` + 0–1 s after the previous row's publication.
    pub gap_s: f64,
    /// `published_at - created_at`, ms.
    pub latency: Lat,
}

/// Commit → accepted of single rows committed at a steady low rate, through the same relay and
/// one worker: the path a web application's emails take when it is not busy.
#[derive(Clone, Debug, Serialize)]
pub struct Trickle {
    /// Commits per second offered.
    pub rate: f64,
    pub rows: usize,
    pub sent: usize,
    /// The ledger's `sent_at` (recorded once the SMTP server accepted) minus the outbox row's
    /// `created_at`, both the database's clock, ms.
    pub latency: Lat,
    /// What the server logged per email over the trickle (PostgreSQL's WAL; MariaDB's binary
    /// log + redo log): the producer's commit, the relay's mark, the worker's claim and record.
    pub log_bytes_per_email: f64,
}

/// Everything measured on one engine.
#[derive(Clone, Debug, Serialize)]
pub struct RelayAlone {
    /// `PostgreSQL 15.x` or `MariaDB 10.11.x`.
    pub engine: String,
    pub relay_only: RelayOnly,
    pub relay_idle: RelayIdle,
    pub wake: WakeLatency,
    pub trickle: Trickle,
    /// What woke the relay (`binlog`, `notify` or `poll`), from its `/metrics`.
    pub wakeup: String,
}

/// Both engines: relay only one after the other, then idle and wake-ups side by side, then
/// the trickle (a worker joins each relay) side by side.
pub async fn both_engines(
    services: &Services,
    sink: &SmtpSink,
    n: usize,
    wake_rows: usize,
    trickle_rows: usize,
    logs: &Path,
) -> anyhow::Result<Vec<RelayAlone>> {
    let mut pg = Rig::start(services, Engine::Postgres, logs).await?;
    let mut my = match Rig::start(services, Engine::MySql, logs).await {
        Ok(my) => my,
        Err(e) => {
            pg.stop().await;
            return Err(e);
        }
    };
    let result = async {
        let pg_only = pg.relay_only(n).await?;
        let my_only = my.relay_only(n).await?;
        let (pg_rest, my_rest) = tokio::join!(
            pg.idle_then_wake(services, wake_rows),
            my.idle_then_wake(services, wake_rows)
        );
        let ((pg_idle, pg_wake), (my_idle, my_wake)) = (pg_rest?, my_rest?);
        let (pg_mode, my_mode) = (pg.wakeup_mode().await, my.wakeup_mode().await);
        pg.add_worker(sink, logs)?;
        my.add_worker(sink, logs)?;
        let (pg_trickle, my_trickle) = tokio::join!(
            pg.trickle(TRICKLE_RATE, trickle_rows),
            my.trickle(TRICKLE_RATE, trickle_rows)
        );
        anyhow::Ok(vec![
            pg.figures(pg_only, pg_idle, pg_wake, pg_trickle?, pg_mode),
            my.figures(my_only, my_idle, my_wake, my_trickle?, my_mode),
        ])
    }
    .await;
    pg.stop().await;
    my.stop().await;
    result
}

/// One world and its relay process (behind the counting proxy on MySQL).
struct Rig {
    world: World,
    fleet: Fleet,
    proxy: Option<CountingProxy>,
    engine: String,
    /// The relay's `--metrics-addr`.
    metrics: String,
}

impl Rig {
    async fn start(services: &Services, engine: Engine, logs: &Path) -> anyhow::Result<Rig> {
        let label = match engine {
            Engine::Postgres => "relay-only",
            Engine::MySql => "relay-only-mysql",
        };
        let mut world = World::create_on(services, engine, label, 4).await?;
        let mut fleet = Fleet::default();
        let metrics = format!("127.0.0.1:{}", mailroom_test_kit::free_port());
        let setup = async {
            let (name, proxy) = match engine {
                Engine::Postgres => {
                    let mut pg = world.pg().await?;
                    let v: String = sqlx::query_scalar("SHOW server_version")
                        .fetch_one(&mut pg)
                        .await?;
                    let _ = pg.close().await;
                    let number = v.split_whitespace().next().unwrap_or(&v);
                    (format!("PostgreSQL {number}"), None)
                }
                Engine::MySql => {
                    let v = mysql::version(&services.mysql_admin_url).await?;
                    let proxy = CountingProxy::start(host_port(&world.db_url)?).await?;
                    world.process_db_url = proxy.url_for(&world.db_url)?;
                    (engine_name(&v), Some(proxy))
                }
            };
            fleet.add_with(
                &world,
                "relay",
                1,
                None,
                logs,
                &["--metrics-addr", &metrics],
            )?;
            anyhow::Ok((name, proxy))
        }
        .await;
        match setup {
            Ok((engine, proxy)) => Ok(Rig {
                world,
                fleet,
                proxy,
                engine,
                metrics,
            }),
            Err(e) => {
                fleet.stop().await;
                world.cleanup().await;
                Err(e)
            }
        }
    }

    async fn stop(self) {
        self.fleet.stop().await;
        drop(self.proxy);
        self.world.cleanup().await;
    }

    fn figures(
        &self,
        relay_only: RelayOnly,
        relay_idle: RelayIdle,
        wake: WakeLatency,
        trickle: Trickle,
        wakeup: String,
    ) -> RelayAlone {
        RelayAlone {
            engine: self.engine.clone(),
            relay_only,
            relay_idle,
            wake,
            trickle,
            wakeup,
        }
    }

    /// One worker process on this world, into `sink`, connected to the database directly (not
    /// through the MySQL relay's counting proxy).
    fn add_worker(&mut self, sink: &SmtpSink, logs: &Path) -> anyhow::Result<()> {
        self.world.process_db_url = self.world.db_url.clone();
        self.fleet.add(&self.world, "worker", 1, Some(sink), logs)
    }

    /// A warm-up job through relay and worker, then `rows` single rows committed `rate` a
    /// second, each in its own transaction; commit → accepted from the database's own clock.
    async fn trickle(&self, rate: f64, rows: usize) -> anyhow::Result<Trickle> {
        let url = self
            .world
            .db_url
            .parse::<SecretUrl>()
            .map_err(anyhow::Error::msg)?;
        let db = Database::connect_lazy(&url, 2)?;
        let measured = async {
            db.enqueue(&workload::email_job("tricklewarm", 0, Utc::now()))
                .await?;
            let warm = wait_sent(&db, "tricklewarm", 1, patience(1)).await?;
            anyhow::ensure!(
                warm == 1,
                "the {} trickle's warm-up job was not sent",
                self.engine
            );
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let log_before = log_position(&db).await?;
            for i in 0..rows {
                tick.tick().await;
                db.enqueue(&workload::email_job("trickle", i, Utc::now()))
                    .await?;
            }
            let sent = wait_sent(&db, "trickle", rows, patience(rows)).await?;
            let logged = log_position(&db).await? - log_before;
            let mut latency = Recorder::default();
            for ms in commit_to_sent_ms(&db, "trickle").await? {
                latency.record_ms(ms);
            }
            anyhow::Ok(Trickle {
                rate,
                rows,
                sent,
                latency: latency.summary(false),
                log_bytes_per_email: logged as f64 / sent.max(1) as f64,
            })
        }
        .await;
        db.close().await;
        measured
    }

    /// The wake-up mode the relay reports in `/metrics`
    /// (`mailroom_relay_wakeup_mode{mode="…"} 1`), or `unknown`.
    async fn wakeup_mode(&self) -> String {
        wakeup_mode_at(&self.metrics).await
    }
}

/// The wake-up mode the relay at `metrics` reports (`mailroom_relay_wakeup_mode{mode="…"} 1`),
/// or `unknown`.
pub(crate) async fn wakeup_mode_at(metrics: &str) -> String {
    let page = match scrape(metrics).await {
        Ok(page) => page,
        Err(e) => return format!("unknown ({e})"),
    };
    page.lines()
        .filter_map(|l| l.strip_prefix("mailroom_relay_wakeup_mode{mode=\""))
        .find_map(|rest| rest.strip_suffix("\"} 1"))
        .unwrap_or("unknown")
        .to_owned()
}

impl Rig {
    /// N rows committed at once → all published.
    async fn relay_only(&self, n: usize) -> anyhow::Result<RelayOnly> {
        let db = &self.world.db;
        if let Engine::Postgres = self.world.engine {
            // Autovacuum's transactions would count as the relay's in the idle window.
            sqlx::query("ALTER TABLE mailroom_outbox SET (autovacuum_enabled = false)")
                .execute(self.world.pg_pool())
                .await?;
        }
        db.enqueue(&workload::email_job("warm", 0, Utc::now()))
            .await?;
        anyhow::ensure!(
            wait_published(db, patience(1)).await?,
            "the {} relay did not publish the warm-up row",
            self.engine
        );
        enqueue_in_one_transaction(db, "job", n).await?;
        let t0 = Instant::now();
        let complete = wait_published(db, patience(n)).await?;
        let rows_per_s = n as f64 / t0.elapsed().as_secs_f64();
        Ok(RelayOnly {
            n,
            rows_per_s,
            complete,
            queued: self.world.ready_messages().await?,
        })
    }

    /// The idle window, then the wake-up rows on a pool of its own.
    async fn idle_then_wake(
        &self,
        services: &Services,
        wake_rows: usize,
    ) -> anyhow::Result<(RelayIdle, WakeLatency)> {
        // Only the relay stays connected to its database.
        self.world.db.close().await;
        let idle = match &self.proxy {
            None => pg_idle(services, &self.world.db_name).await?,
            Some(proxy) => mysql_idle(services, proxy).await?,
        };
        let url = self
            .world
            .db_url
            .parse::<SecretUrl>()
            .map_err(anyhow::Error::msg)?;
        let db = Database::connect_lazy(&url, 2)?;
        let wake = wake_latency(&db, wake_rows).await;
        db.close().await;
        Ok((idle, wake?))
    }
}

async fn pg_idle(services: &Services, db_name: &str) -> anyhow::Result<RelayIdle> {
    tokio::time::sleep(PG_IDLE_SETTLE).await;
    let mut admin = PgConnection::connect(&services.admin_db_url).await?;
    let before = pg_transactions(&mut admin, db_name).await?;
    let t = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = pg_transactions(&mut admin, db_name).await?;
    let window_s = t.elapsed().as_secs_f64();
    let _ = admin.close().await;
    let count = (after - before).max(0) as u64;
    Ok(RelayIdle {
        window_s,
        unit: "transactions",
        count,
        per_s: count as f64 / window_s,
        method: "pg_stat_database xact_commit + xact_rollback of the relay's database",
        commands: Commands::new(),
        server_questions_per_s: None,
    })
}

async fn pg_transactions(admin: &mut PgConnection, db: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
    )
    .bind(db)
    .fetch_one(admin)
    .await?)
}

async fn mysql_idle(services: &Services, proxy: &CountingProxy) -> anyhow::Result<RelayIdle> {
    tokio::time::sleep(MYSQL_IDLE_SETTLE).await;
    let mut admin = MySqlConnection::connect(&services.mysql_admin_url).await?;
    let (q0, c0) = (mysql::global_questions(&mut admin).await?, proxy.snapshot());
    let t = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let (q1, c1) = (mysql::global_questions(&mut admin).await?, proxy.snapshot());
    let window_s = t.elapsed().as_secs_f64();
    let _ = admin.close().await;
    let (commands, count) = mysql::delta(&c0, &c1);
    Ok(RelayIdle {
        window_s,
        unit: "commands",
        count,
        per_s: count as f64 / window_s,
        method: "commands the relay sent, counted by a proxy in front of the server",
        commands,
        server_questions_per_s: Some((q1 - q0) as f64 / window_s),
    })
}

/// Commits `rows` single rows to an idle relay and waits for each to be published.
async fn wake_latency(db: &Database, rows: usize) -> anyhow::Result<WakeLatency> {
    let mut latency = Recorder::default();
    let mut published = 0;
    for i in 0..rows {
        if i > 0 {
            let phase = (i as f64 * 0.618_034).fract();
            tokio::time::sleep(WAKE_GAP + Duration::from_secs_f64(phase)).await;
        }
        let job = workload::email_job("wake", i, Utc::now());
        db.enqueue(&job).await?;
        let deadline = Instant::now() + WAKE_PATIENCE;
        while Instant::now() < deadline {
            let status = db.outbox_status(&job.job_id, KIND).await?;
            if let Some(s) = status
                && let Some(at) = s.published_at
            {
                latency.record_ms((at - s.created_at).as_seconds_f64() * 1000.0);
                published += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(WakeLatency {
        rows,
        published,
        gap_s: WAKE_GAP.as_secs_f64(),
        latency: latency.summary(false),
    })
}

/// Waits until no outbox row is unpublished; false if `patience` ran out first.
pub(crate) async fn wait_published(db: &Database, patience: Duration) -> anyhow::Result<bool> {
    let deadline = Instant::now() + patience;
    loop {
        if db.oldest_unpublished_age().await?.is_none() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `want` jobs whose ids start with `prefix-` are recorded sent (or `patience` ran
/// out); returns how many are.
async fn wait_sent(
    db: &Database,
    prefix: &str,
    want: usize,
    patience: Duration,
) -> anyhow::Result<usize> {
    const SQL: &str =
        "SELECT count(*) FROM sent_notifications WHERE status = 'sent' AND job_id LIKE ";
    let pattern = prefix_pattern(prefix);
    let deadline = Instant::now() + patience;
    loop {
        let sent: i64 = match db {
            Database::Postgres(pool) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("{SQL}$1")))
                    .bind(&pattern)
                    .fetch_one(pool)
                    .await?
            }
            Database::MySql(pool) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("{SQL}?")))
                    .bind(&pattern)
                    .fetch_one(pool)
                    .await?
            }
        };
        let sent = usize::try_from(sent)?;
        if sent >= want || Instant::now() >= deadline {
            return Ok(sent);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Commit → accepted+recorded of every sent job whose id starts with `prefix-`: the ledger's
/// `sent_at` minus the outbox row's `created_at`, in ms, both from the database's clock.
async fn commit_to_sent_ms(db: &Database, prefix: &str) -> anyhow::Result<Vec<f64>> {
    const JOIN: &str = "FROM mailroom_outbox o JOIN sent_notifications s
         ON s.job_id = o.job_id AND s.kind = o.kind
         WHERE s.status = 'sent' AND o.job_id LIKE ";
    let pattern = prefix_pattern(prefix);
    Ok(match db {
        Database::Postgres(pool) => {
            let sql = format!(
                "SELECT (EXTRACT(EPOCH FROM (s.sent_at - o.created_at)) * 1000)::float8 {JOIN}$1"
            );
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(pattern)
                .fetch_all(pool)
                .await?
        }
        Database::MySql(pool) => {
            let sql = format!(
                "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, o.created_at, s.sent_at) / 1000 AS DOUBLE) {JOIN}?"
            );
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(pattern)
                .fetch_all(pool)
                .await?
        }
    })
}

/// The `LIKE` pattern of the job ids [`workload::job`] makes with `prefix`.
fn prefix_pattern(prefix: &str) -> String {
    format!("{prefix}-%")
}

/// N outbox rows in one transaction, as a bulk import would commit them.
async fn enqueue_in_one_transaction(db: &Database, prefix: &str, n: usize) -> anyhow::Result<()> {
    let jobs = (0..n).map(|i| workload::email_job(prefix, i, Utc::now()));
    match db {
        Database::Postgres(pool) => {
            let mut tx = pool.begin().await?;
            for job in jobs {
                outbox::enqueue(&mut tx, &job).await?;
            }
            tx.commit().await?;
        }
        Database::MySql(pool) => {
            let mut tx = pool.begin().await?;
            for job in jobs {
                outbox::enqueue(&mut tx, &job).await?;
            }
            tx.commit().await?;
        }
    }
    Ok(())
}

/// `MariaDB 10.11.19` from `10.11.19-MariaDB-0+deb12u1`; `MySQL 8.0.40` otherwise.
fn engine_name(version: &str) -> String {
    let number = version.split('-').next().unwrap_or(version);
    if version.contains("MariaDB") {
        format!("MariaDB {number}")
    } else {
        format!("MySQL {number}")
    }
}

fn host_port(url: &str) -> anyhow::Result<String> {
    let url = url::Url::parse(url)?;
    Ok(format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(3306)
    ))
}

/// `GET /metrics` from `addr` over HTTP/1.0 (the body follows the headers; the server closes).
pub(crate) async fn scrape(addr: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut page = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut page)).await??;
    Ok(page)
}
