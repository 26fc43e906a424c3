//! The measurements that go through the outbox and a real `mailroom relay` process:
//! - **relay only**: an idle relay, then N outbox rows committed in one transaction; the time
//!   from that commit until no row is unpublished gives rows/s (outbox → confirmed in the
//!   queue, marked published);
//! - **relay idle**: the same relay with nothing to do; the transactions it runs on its
//!   database per second, as `pg_stat_database` counts them (`xact_commit + xact_rollback` of
//!   the world's own database over [`IDLE_WINDOW`], read through another database so that the
//!   reads do not count; the bench's own connections to it are closed and autovacuum is off
//!   for the outbox table). An idle scan is one transaction (BEGIN, claim, COMMIT) every
//!   `MAILROOM_RELAY_POLL` (5 s), plus sqlx's check of the pooled connection before reuse (an
//!   empty query, which PostgreSQL counts as a transaction too);
//! - **end to end**: 1 relay + 1 worker process; [`PRODUCERS`] concurrent producers each
//!   commit one outbox row per transaction ([`OutboxProducer`]). At full speed (a backlog of N
//!   jobs) this gives emails/s from the first commit to the last SMTP acceptance; at offered
//!   rates (fractions of that maximum, and the fixed latency target) the commit → accepted
//!   latency, the commit being when the producer's COMMIT returned.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use mailroom::db::outbox;
use serde::Serialize;
use sqlx::{Connection as _, PgConnection, PgPool};

use crate::latency::{Lat, Recorder};
use crate::procstat::{CpuShare, Roles, Snapshot};
use crate::workers::{Fleet, ms_between, patience, sent_rows, wait_for};
use crate::workload::{self, Producer};
use crate::world::{Services, SmtpSink, World, pg_clock_offset};

/// Producers committing outbox rows at once in the end-to-end runs (a web application's
/// request handlers).
pub const PRODUCERS: usize = 32;
/// How long the idle relay is watched.
pub const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Wait before the idle window: the relay's pool alternates between its two connections, each
/// scanning every other poll (5 s), and a backend reports its statistics when it goes idle (at
/// most once a second, else 10 s later): after 12 s the busy phase is fully reported.
const IDLE_SETTLE: Duration = Duration::from_secs(12);
/// Jobs sent through the whole path before the clock starts (connections and pools open).
const WARM: usize = 50;

/// Commits job `i` into `mailroom_outbox` in a transaction of its own, as an application
/// would (`mailroom::db::outbox::enqueue`); submitted = when COMMIT returned.
pub struct OutboxProducer {
    pub pool: PgPool,
    pub prefix: String,
}

impl Producer for OutboxProducer {
    fn submit(&self, i: usize) -> BoxFuture<'static, anyhow::Result<DateTime<Utc>>> {
        let pool = self.pool.clone();
        let job = workload::email_job(&self.prefix, i, Utc::now());
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            outbox::enqueue(&mut tx, &job).await?;
            tx.commit().await?;
            Ok(Utc::now())
        })
    }
}

/// One end-to-end run.
#[derive(Clone, Debug, Serialize)]
pub struct EndToEnd {
    pub label: String,
    /// None: the maximum (a backlog as fast as the producers commit).
    pub offered_rate: Option<f64>,
    pub n: usize,
    pub sent: i64,
    pub complete: bool,
    /// Sent / (first commit → last `sent_at`).
    pub emails_per_s: f64,
    /// How fast the producers committed the N rows.
    pub commit_rate: f64,
    /// COMMIT returned → SMTP accepted and recorded (`sent_at`).
    pub latency: Lat,
    /// CPU during the run; `worker` = the mailroom processes (relay + worker).
    pub cpu: CpuShare,
}

#[derive(Clone, Debug, Serialize)]
pub struct RelayOnly {
    pub n: usize,
    pub rows_per_s: f64,
    pub complete: bool,
    /// Messages ready in the work queue afterwards (N + the warm-up row).
    pub queued: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct RelayIdle {
    pub window_s: f64,
    /// `xact_commit + xact_rollback` of the relay's database during the window.
    pub transactions: i64,
    pub per_s: f64,
    pub method: &'static str,
}

/// Producers' commit rate into the outbox, which bounds the end-to-end rate.
#[derive(Clone, Debug, Serialize)]
pub struct OutboxCommits {
    pub n: usize,
    pub producers: usize,
    /// `outbox::enqueue` + COMMIT per row, the outbox trigger (`pg_notify`) on.
    pub with_notify: f64,
    /// The same with the trigger disabled: what the NOTIFY costs.
    pub without_notify: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RelayFigures {
    pub producers: usize,
    pub outbox_commits: OutboxCommits,
    pub relay_only: RelayOnly,
    pub relay_idle: RelayIdle,
    pub end_to_end_max: EndToEnd,
    pub end_to_end_paced: Vec<EndToEnd>,
}

/// Outbox commits per second from [`PRODUCERS`] producers, with and without the NOTIFY
/// trigger, no relay running. PostgreSQL serialises the commits of transactions that NOTIFY
/// (a lock on the notification queue is held through the commit's WAL flush), so group commit
/// cannot help them.
pub async fn outbox_commits(services: &Services, n: usize) -> anyhow::Result<OutboxCommits> {
    let world = World::create(services, "raw-outbox", PRODUCERS as u32 + 2).await?;
    let result = async {
        let producer = |prefix: &str| OutboxProducer {
            pool: world.pg_pool().clone(),
            prefix: prefix.into(),
        };
        let rate = |prefix: &'static str| {
            let p = producer(prefix);
            async move {
                let t = Instant::now();
                workload::backlog(&p, n, PRODUCERS).await?;
                anyhow::Ok(n as f64 / t.elapsed().as_secs_f64())
            }
        };
        workload::backlog(&producer("warm"), PRODUCERS, PRODUCERS).await?;
        let with_notify = rate("notify").await?;
        sqlx::query("ALTER TABLE mailroom_outbox DISABLE TRIGGER mailroom_outbox_notify")
            .execute(world.pg_pool())
            .await?;
        let without_notify = rate("quiet").await?;
        anyhow::Ok(OutboxCommits {
            n,
            producers: PRODUCERS,
            with_notify,
            without_notify,
        })
    }
    .await;
    world.cleanup().await;
    result
}

/// Relay only, then relay idle, on one world with one relay process.
pub async fn relay_alone(
    services: &Services,
    n: usize,
    logs: &Path,
) -> anyhow::Result<(RelayOnly, RelayIdle)> {
    let world = World::create(services, "relay-only", 4).await?;
    let mut fleet = Fleet::default();
    let result = async {
        fleet.add(&world, "relay", 1, None, logs)?;
        relay_alone_in(&world, services, n).await
    }
    .await;
    fleet.stop().await;
    world.cleanup().await;
    result
}

async fn relay_alone_in(
    world: &World,
    services: &Services,
    n: usize,
) -> anyhow::Result<(RelayOnly, RelayIdle)> {
    let pool = world.pg_pool().clone();
    let mut pg = world.pg().await?;
    // Autovacuum's transactions would count as the relay's in the idle window.
    sqlx::query("ALTER TABLE mailroom_outbox SET (autovacuum_enabled = false)")
        .execute(&mut pg)
        .await?;
    let warm = OutboxProducer {
        pool: pool.clone(),
        prefix: "warm".into(),
    };
    warm.submit(0).await?;
    anyhow::ensure!(
        wait_published(&mut pg, patience(1)).await?,
        "the relay did not publish the warm-up row"
    );
    let mut tx = pool.begin().await?;
    for i in 0..n {
        outbox::enqueue(&mut tx, &workload::email_job("job", i, Utc::now())).await?;
    }
    tx.commit().await?;
    let t0 = Instant::now();
    let complete = wait_published(&mut pg, patience(n)).await?;
    let rows_per_s = n as f64 / t0.elapsed().as_secs_f64();
    let queued = world.ready_messages().await?;

    // Idle: only the relay stays connected to its database (a closing backend reports its
    // statistics at once); its last busy transactions are reported within `IDLE_SETTLE`.
    let _ = pg.close().await;
    world.db.close().await;
    tokio::time::sleep(IDLE_SETTLE).await;
    let mut admin = PgConnection::connect(&services.admin_db_url).await?;
    let before = transactions(&mut admin, &world.db_name).await?;
    let t = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = transactions(&mut admin, &world.db_name).await?;
    let window_s = t.elapsed().as_secs_f64();
    let _ = admin.close().await;
    Ok((
        RelayOnly {
            n,
            rows_per_s,
            complete,
            queued,
        },
        RelayIdle {
            window_s,
            transactions: after - before,
            per_s: (after - before) as f64 / window_s,
            method: "pg_stat_database xact_commit + xact_rollback of the relay's database",
        },
    ))
}

/// Waits until no outbox row is unpublished; false if `patience` ran out first.
async fn wait_published(pg: &mut PgConnection, patience: Duration) -> anyhow::Result<bool> {
    let deadline = Instant::now() + patience;
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM mailroom_outbox WHERE published_at IS NULL")
                .fetch_one(&mut *pg)
                .await?;
        if pending == 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn transactions(admin: &mut PgConnection, db: &str) -> anyhow::Result<i64> {
    sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
    )
    .bind(db)
    .fetch_one(admin)
    .await
    .context("reading pg_stat_database")
}

/// End to end with a relay and a worker process: `rate` None = as fast as possible.
pub async fn end_to_end(
    services: &Services,
    sink: &SmtpSink,
    label: &str,
    rate: Option<f64>,
    n: usize,
    logs: &Path,
) -> anyhow::Result<EndToEnd> {
    let world = World::create(services, label, PRODUCERS as u32 + 2).await?;
    let mut fleet = Fleet::default();
    let result = async {
        fleet.add(&world, "relay", 1, None, logs)?;
        fleet.add(&world, "worker", 1, Some(sink), logs)?;
        end_to_end_in(&world, sink, &fleet, label, rate, n).await
    }
    .await;
    fleet.stop().await;
    world.cleanup().await;
    result
}

async fn end_to_end_in(
    world: &World,
    sink: &SmtpSink,
    fleet: &Fleet,
    label: &str,
    rate: Option<f64>,
    n: usize,
) -> anyhow::Result<EndToEnd> {
    let producer = |prefix: &str| OutboxProducer {
        pool: world.pg_pool().clone(),
        prefix: prefix.into(),
    };
    let mut pg = world.pg().await?;
    workload::backlog(&producer("warm"), WARM, PRODUCERS).await?;
    let warmed = wait_for(&mut pg, "warm", WARM, patience(WARM)).await?;
    anyhow::ensure!(warmed as usize >= WARM, "warm-up: {warmed} of {WARM} sent");
    let offset = pg_clock_offset(&mut pg).await?;
    let roles = Roles {
        workers: fleet.pids.clone(),
        smtp_sink: sink.pid(),
    };
    let before = Snapshot::take(&roles);
    let committed = match rate {
        None => workload::backlog(&producer("job"), n, PRODUCERS).await?,
        Some(rate) => workload::paced(Arc::new(producer("job")), n, rate).await?.0,
    };
    let sent = wait_for(&mut pg, "job", n, patience(n)).await?;
    let cpu = before.share_until(&Snapshot::take(&roles));
    let first_commit = committed.iter().min().copied().unwrap_or_default() + offset;
    let last_commit = committed.iter().max().copied().unwrap_or_default() + offset;
    let mut latency = Recorder::default();
    let mut last_sent = first_commit;
    for (job_id, _, sent_at) in sent_rows(&mut pg, "job").await? {
        if let Some(i) = workload::index_of(&job_id).filter(|i| *i < committed.len()) {
            latency.record_ms(ms_between(committed[i] + offset, sent_at));
        }
        last_sent = last_sent.max(sent_at);
    }
    let busy_s = ms_between(first_commit, last_sent) / 1000.0;
    Ok(EndToEnd {
        label: label.to_string(),
        offered_rate: rate,
        n,
        sent,
        complete: sent as usize >= n,
        emails_per_s: sent as f64 / busy_s.max(1e-6),
        commit_rate: n as f64 / (ms_between(first_commit, last_commit) / 1000.0).max(1e-6),
        latency: latency.summary(true),
        cpu,
    })
}
