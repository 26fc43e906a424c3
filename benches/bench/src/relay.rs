//! The measurements that go through the outbox and a real `mailroom relay` process (the relay
//! by itself, on both engines, is in [`crate::relay_alone`]):
//! - **end to end**: 1 relay + 1 worker process; [`PRODUCERS`] concurrent producers each
//!   commit one outbox row per transaction ([`OutboxProducer`]). At full speed (a backlog of N
//!   jobs) this gives emails/s from the first commit to the last SMTP acceptance; at offered
//!   rates (fractions of that maximum, and the fixed latency target) the commit → accepted
//!   latency, the commit being when the producer's COMMIT returned.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use mailroom::config::SecretUrl;
use mailroom::db::outbox;
use mailroom::relay::follower::Follower as WalFollower;
use mailroom::relay::wal;
use serde::Serialize;
use sqlx::PgPool;

use crate::latency::{Lat, Recorder};
use crate::procstat::{CpuShare, Roles, Snapshot};
use crate::workers::{Fleet, ms_between, patience, sent_rows, wait_for};
use crate::workload::{self, Producer};
use crate::world::{Services, SmtpSink, World, pg_clock_offset, wal_position};

/// Producers committing outbox rows at once in the end-to-end runs (a web application's
/// request handlers).
pub const PRODUCERS: usize = 32;
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
    /// PostgreSQL WAL written per email (the producers' commits included), bytes.
    pub wal_bytes_per_email: f64,
}

/// Producers' commit rate into the outbox, which bounds the end-to-end rate, once per
/// wake-up mode: what each mode costs the producers' own commits.
#[derive(Clone, Debug, Serialize)]
pub struct OutboxCommits {
    pub n: usize,
    pub producers: usize,
    /// One per mode, in [`COMMIT_MODES`] order.
    pub modes: Vec<CommitRate>,
}

/// Commits/s with one wake-up mode in place (no relay running).
#[derive(Clone, Debug, Serialize)]
pub struct CommitRate {
    pub mode: &'static str,
    /// The mean of the rounds; 0 when the mode is unavailable.
    pub per_s: f64,
    /// Each round's rate (the modes take turns, so drift hits them alike).
    pub rounds: Vec<f64>,
    /// Why the mode could not be measured, if it could not.
    pub unavailable: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RelayFigures {
    pub producers: usize,
    pub outbox_commits: OutboxCommits,
    /// Relay only, idle and wake-up latency: PostgreSQL, then MySQL/MariaDB.
    pub alone: Vec<crate::relay_alone::RelayAlone>,
    pub end_to_end_max: EndToEnd,
    pub end_to_end_paced: Vec<EndToEnd>,
}

/// The modes measured: no wake-up at all (the baseline), the NOTIFY trigger in every
/// producer's transaction, and the WAL followed from a temporary logical slot (no trigger).
pub const COMMIT_MODES: [&str; 3] = ["none", "trigger", "wal"];
/// Rounds of the three modes, taking turns.
const COMMIT_ROUNDS: usize = 2;

impl OutboxCommits {
    /// Commits/s in `mode` (0 if it was not measured).
    pub fn rate(&self, mode: &str) -> f64 {
        self.modes
            .iter()
            .find(|m| m.mode == mode)
            .map_or(0.0, |m| m.per_s)
    }

    /// `mode`'s cost against no wake-up at all, in percent of the commit rate.
    pub fn cost_percent(&self, mode: &str) -> Option<f64> {
        let (base, rate) = (self.rate("none"), self.rate(mode));
        (base > 0.0 && rate > 0.0).then(|| (1.0 - rate / base) * 100.0)
    }
}

/// Outbox commits per second from [`PRODUCERS`] producers in each of [`COMMIT_MODES`], no
/// relay running. A NOTIFY serialises the commits of the transactions that send one (a lock on
/// the notification queue is held through the commit's WAL flush); the trigger also runs its
/// check in every producer's transaction. The WAL follower runs in another process (the
/// server's WAL sender decodes the log); on this machine it competes for the same cores.
pub async fn outbox_commits(services: &Services, n: usize) -> anyhow::Result<OutboxCommits> {
    let world = World::create(services, "raw-outbox", PRODUCERS as u32 + 2).await?;
    let result = async {
        let producer = |prefix: String| OutboxProducer {
            pool: world.pg_pool().clone(),
            prefix,
        };
        workload::backlog(&producer("warm".into()), PRODUCERS, PRODUCERS).await?;
        let mut modes: Vec<CommitRate> = COMMIT_MODES
            .iter()
            .map(|&mode| CommitRate {
                mode,
                per_s: 0.0,
                rounds: vec![],
                unavailable: None,
            })
            .collect();
        for round in 0..COMMIT_ROUNDS {
            for m in modes.iter_mut().filter(|m| m.unavailable.is_none()) {
                let follower = match set_mode(&world, m.mode).await? {
                    Ok(follower) => follower,
                    Err(why) => {
                        m.unavailable = Some(why);
                        continue;
                    }
                };
                let p = producer(format!("{}-{round}", m.mode));
                let t = Instant::now();
                workload::backlog(&p, n, PRODUCERS).await?;
                m.rounds.push(n as f64 / t.elapsed().as_secs_f64());
                if let Some(follower) = follower {
                    follower.close().await;
                }
            }
        }
        for m in &mut modes {
            m.per_s = m.rounds.iter().sum::<f64>() / m.rounds.len().max(1) as f64;
        }
        anyhow::Ok(OutboxCommits {
            n,
            producers: PRODUCERS,
            modes,
        })
    }
    .await;
    world.cleanup().await;
    result
}

/// Puts `mode` in place: the trigger on or off, and for `wal` a follower streaming the world's
/// database (returned; closing it drops its slot). `Err` inside: the mode is unavailable here.
async fn set_mode(
    world: &World,
    mode: &str,
) -> anyhow::Result<Result<Option<WalFollower>, String>> {
    let trigger = if mode == "trigger" {
        "ENABLE"
    } else {
        "DISABLE"
    };
    let sql = format!("ALTER TABLE mailroom_outbox {trigger} TRIGGER mailroom_outbox_notify");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(world.pg_pool())
        .await?;
    if mode != "wal" {
        return Ok(Ok(None));
    }
    let url: SecretUrl = world.db_url.parse().map_err(anyhow::Error::msg)?;
    Ok(wal::start(world.pg_pool(), &url)
        .await
        .map(Some)
        .map_err(|e| e.to_string()))
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
    let wal_before = wal_position(&mut pg).await?;
    let committed = match rate {
        None => workload::backlog(&producer("job"), n, PRODUCERS).await?,
        Some(rate) => workload::paced(Arc::new(producer("job")), n, rate).await?.0,
    };
    let sent = wait_for(&mut pg, "job", n, patience(n)).await?;
    let cpu = before.share_until(&Snapshot::take(&roles));
    let wal = wal_position(&mut pg).await? - wal_before;
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
        wal_bytes_per_email: wal as f64 / sent.max(1) as f64,
    })
}
