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
use mailroom::db::{Database, Engine, outbox};
use serde::Serialize;

use crate::latency::{Lat, Recorder};
use crate::procstat::{CpuShare, PgSessions, Roles, Snapshot};
use crate::workers::{Fleet, ms_between, patience, sent_rows, wait_for};
use crate::workload::{self, Producer};
use crate::world::{Services, SmtpSink, World, pg_clock_offset, wal_position};

/// Producers committing outbox rows at once in the end-to-end runs (a web application's
/// request handlers).
pub const PRODUCERS: usize = 32;
/// Jobs sent through the whole path before the clock starts (connections and pools open).
const WARM: usize = 50;

/// Commits job `i` into `mailroom_outbox` in a transaction of its own, as an application
/// would (`mailroom::db::outbox::enqueue`), on either engine; submitted = when COMMIT returned.
pub struct OutboxProducer {
    pub db: Database,
    pub prefix: String,
}

impl Producer for OutboxProducer {
    fn submit(&self, i: usize) -> BoxFuture<'static, anyhow::Result<DateTime<Utc>>> {
        let db = self.db.clone();
        let job = workload::email_job(&self.prefix, i, Utc::now());
        Box::pin(async move {
            match db {
                Database::Postgres(pool) => {
                    let mut tx = pool.begin().await?;
                    outbox::enqueue(&mut tx, &job).await?;
                    tx.commit().await?;
                }
                Database::MySql(pool) => {
                    let mut tx = pool.begin().await?;
                    outbox::enqueue(&mut tx, &job).await?;
                    tx.commit().await?;
                }
            }
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
    /// PostgreSQL's CPU µs per email by client ([`crate::procstat::PgSessions`]).
    pub pg_clients: Vec<(String, f64)>,
    /// The relay's batches and commits ([`logged_relay`]), warm-up included; `None` if it
    /// logged none.
    pub relay: Option<String>,
}

/// Producers' commit rate into the outbox, which bounds the end-to-end rate, once per
/// wake-up mode: what each mode costs the producers' own commits.
#[derive(Clone, Debug, Serialize)]
pub struct OutboxCommits {
    /// `PostgreSQL` or `MariaDB`.
    pub engine: &'static str,
    pub n: usize,
    pub producers: usize,
    /// One per mode, in [`COMMIT_MODES`] or [`MYSQL_COMMIT_MODES`] order.
    pub modes: Vec<CommitRate>,
}

/// Commits/s in one mode: the producers alone, or beside a relay woken one way.
#[derive(Clone, Debug, Serialize)]
pub struct CommitRate {
    pub mode: &'static str,
    /// The mean of the rounds; 0 when the mode is unavailable.
    pub per_s: f64,
    /// Each round's rate (the modes take turns, so drift hits them alike).
    pub rounds: Vec<f64>,
    /// Why the mode could not be measured, if it could not.
    pub unavailable: Option<String>,
    /// `wal`, `binlog`: in how many rounds the relay had paused its stream when the producers were done
    /// (`mailroom_relay_wakeup_paused`).
    pub paused_rounds: usize,
    /// PostgreSQL's CPU per commit, µs, the mean of the rounds (every `postgres` process: the
    /// producers' backends and the relay's); 0 on MySQL/MariaDB.
    pub server_us_per_commit: f64,
    /// The whole machine's CPU per commit, µs (every process and the kernel), the mean of the
    /// rounds: what one commit costs these cores, to set against what an email costs them end
    /// to end.
    pub machine_us_per_commit: f64,
    /// The producers' own process (the bench) per commit, µs, the mean of the rounds.
    pub client_us_per_commit: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RelayFigures {
    pub producers: usize,
    pub outbox_commits: OutboxCommits,
    /// The same on MySQL/MariaDB: alone, beside a probing relay, beside one that follows the
    /// binary log.
    pub outbox_commits_mysql: OutboxCommits,
    /// Relay only, idle and wake-up latency: PostgreSQL, then MySQL/MariaDB.
    pub alone: Vec<crate::relay_alone::RelayAlone>,
    pub end_to_end_max: EndToEnd,
    pub end_to_end_paced: Vec<EndToEnd>,
}

/// The modes measured: the producers alone (`none`: no relay, no trigger, no slot: the raw
/// commit limit), then beside a relay process publishing their rows, woken by its probes only
/// (`poll`: the baseline a wake-up's cost is measured from), by the NOTIFY trigger in every
/// producer's transaction (`trigger`), or by the WAL from a temporary logical slot (`wal`).
pub const COMMIT_MODES: [&str; 4] = ["none", "poll", "trigger", "wal"];
/// The modes on MySQL/MariaDB: alone, a probing relay, a relay following the binary log.
pub const MYSQL_COMMIT_MODES: [&str; 3] = ["none", "poll", "binlog"];
/// Rounds of the modes, taking turns.
const COMMIT_ROUNDS: usize = 2;

impl OutboxCommits {
    /// Commits/s in `mode` (0 if it was not measured).
    pub fn rate(&self, mode: &str) -> f64 {
        self.modes
            .iter()
            .find(|m| m.mode == mode)
            .map_or(0.0, |m| m.per_s)
    }

    /// A wake-up `mode`'s cost against a relay that only probes, in percent of the commit
    /// rate; `None` for the modes without a wake-up.
    pub fn cost_percent(&self, mode: &str) -> Option<f64> {
        if matches!(mode, "none" | "poll") {
            return None;
        }
        let (base, rate) = (self.rate("poll"), self.rate(mode));
        (base > 0.0 && rate > 0.0).then(|| (1.0 - rate / base) * 100.0)
    }
}

/// Outbox commits per second from [`PRODUCERS`] producers in each of [`COMMIT_MODES`]. A
/// NOTIFY serialises the commits of the transactions that send one (a lock on the notification
/// queue is held through the commit's WAL flush); the trigger also runs its check in every
/// producer's transaction. The WAL follower makes the server decode every transaction on the
/// cores the producers use, until the relay pauses its stream. The relay publishes the rows as
/// they come in every mode but `none`, so its own work weighs on each alike.
pub async fn outbox_commits(
    services: &Services,
    engine: Engine,
    n: usize,
    logs: &Path,
) -> anyhow::Result<OutboxCommits> {
    let names: &[&'static str] = match engine {
        Engine::Postgres => &COMMIT_MODES,
        Engine::MySql => &MYSQL_COMMIT_MODES,
    };
    outbox_commits_in(services, engine, names, n, logs).await
}

/// [`outbox_commits`] in the given `names` of modes only.
pub async fn outbox_commits_in(
    services: &Services,
    engine: Engine,
    names: &[&'static str],
    n: usize,
    logs: &Path,
) -> anyhow::Result<OutboxCommits> {
    let label = match engine {
        Engine::Postgres => "raw-outbox",
        Engine::MySql => "raw-outbox-mysql",
    };
    let world = World::create_on(services, engine, label, PRODUCERS as u32 + 2).await?;
    let result = async {
        let producer = |prefix: String| OutboxProducer {
            db: world.db.clone(),
            prefix,
        };
        workload::backlog(&producer("warm".into()), PRODUCERS, PRODUCERS).await?;
        let mut modes: Vec<CommitRate> = names
            .iter()
            .map(|&mode| CommitRate {
                mode,
                per_s: 0.0,
                rounds: vec![],
                unavailable: None,
                paused_rounds: 0,
                server_us_per_commit: 0.0,
                machine_us_per_commit: 0.0,
                client_us_per_commit: 0.0,
            })
            .collect();
        for round in 0..COMMIT_ROUNDS {
            for m in modes.iter_mut().filter(|m| m.unavailable.is_none()) {
                let relay = match ModeRelay::start(&world, m.mode, round, logs).await? {
                    Ok(relay) => relay,
                    Err(why) => {
                        m.unavailable = Some(why);
                        continue;
                    }
                };
                let p = producer(format!("{}-{round}", m.mode));
                let before = Snapshot::take(&Roles::default());
                let t = Instant::now();
                workload::backlog(&p, n, PRODUCERS).await?;
                m.rounds.push(n as f64 / t.elapsed().as_secs_f64());
                let cpu = before.share_until(&Snapshot::take(&Roles::default()));
                let per_commit = |share: f64| share / 100.0 * cpu.seconds / n as f64 * 1e6;
                if engine == Engine::Postgres {
                    m.server_us_per_commit += per_commit(cpu.postgres);
                }
                m.machine_us_per_commit += per_commit(cpu.machine_busy);
                m.client_us_per_commit += per_commit(cpu.bench);
                if let Some(relay) = relay {
                    m.paused_rounds += usize::from(relay.paused().await);
                    relay.stop(&world).await?;
                }
            }
        }
        for m in &mut modes {
            let rounds = m.rounds.len().max(1) as f64;
            m.per_s = m.rounds.iter().sum::<f64>() / rounds;
            m.server_us_per_commit /= rounds;
            m.machine_us_per_commit /= rounds;
            m.client_us_per_commit /= rounds;
        }
        anyhow::Ok(OutboxCommits {
            engine: match engine {
                Engine::Postgres => "PostgreSQL",
                Engine::MySql => "MariaDB",
            },
            n,
            producers: PRODUCERS,
            modes,
        })
    }
    .await;
    world.cleanup().await;
    result
}

/// The relay process of one mode's round, and its `--metrics-addr`.
struct ModeRelay {
    fleet: Fleet,
    metrics: String,
}

impl ModeRelay {
    /// Puts `mode` in place: the trigger on for `trigger` only, and for every mode but `none` a
    /// relay woken that way, started and checked by publishing one row. `Err` inside: the mode
    /// is unavailable here (the relay fell back to another wake-up).
    async fn start(
        world: &World,
        mode: &str,
        round: usize,
        logs: &Path,
    ) -> anyhow::Result<Result<Option<ModeRelay>, String>> {
        if let Database::Postgres(pool) = &world.db {
            let trigger = if mode == "trigger" {
                "ENABLE"
            } else {
                "DISABLE"
            };
            let sql =
                format!("ALTER TABLE mailroom_outbox {trigger} TRIGGER mailroom_outbox_notify");
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
        }
        let (choice, reports) = match mode {
            "poll" => ("poll", "poll"),
            "trigger" => ("notify", "notify"),
            "wal" => ("auto", "wal"),
            "binlog" => ("auto", "binlog"),
            _ => return Ok(Ok(None)),
        };
        let metrics = format!("127.0.0.1:{}", mailroom_test_kit::free_port());
        let mut fleet = Fleet::default();
        fleet.add_with(
            world,
            "relay",
            round + 1,
            None,
            &logs.join(mode),
            &["--relay-wakeup", choice, "--metrics-addr", &metrics],
        )?;
        let relay = ModeRelay { fleet, metrics };
        world
            .db
            .enqueue(&workload::email_job(
                &format!("{mode}-start"),
                round,
                Utc::now(),
            ))
            .await?;
        if !crate::relay_alone::wait_published(&world.db, patience(1)).await? {
            relay.fleet.stop().await;
            anyhow::bail!("the {mode} relay did not publish its first row");
        }
        let woken_by = crate::relay_alone::wakeup_mode_at(&relay.metrics).await;
        if woken_by != reports {
            relay.fleet.stop().await;
            return Ok(Err(format!(
                "the relay is woken by {woken_by}, not {reports} (see its log)"
            )));
        }
        Ok(Ok(Some(relay)))
    }

    /// Whether the relay's stream is paused (`mailroom_relay_wakeup_paused 1`).
    async fn paused(&self) -> bool {
        crate::relay_alone::scrape(&self.metrics)
            .await
            .is_ok_and(|page| page.lines().any(|l| l == "mailroom_relay_wakeup_paused 1"))
    }

    /// Waits until the relay published every row (the next mode starts from an empty outbox
    /// and an idle relay), stops it and empties the work queue.
    async fn stop(self, world: &World) -> anyhow::Result<()> {
        let drained = crate::relay_alone::wait_published(&world.db, patience(10_000)).await;
        self.fleet.stop().await;
        anyhow::ensure!(drained?, "the relay did not publish the producers' rows");
        world.purge_work_queue().await
    }
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
    let relay_log = logs.join(format!("{}-relay1.log", world.label));
    world.cleanup().await;
    result.map(|run| EndToEnd {
        relay: logged_relay(&relay_log),
        ..run
    })
}

/// The relay's batches and commits, from the line it logs when it stops (warm-up included):
/// how many wake-ups' batches shared a commit (`--relay-commit-hold`).
fn logged_relay(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|l| l.contains("relay stopped"))?;
    let field = |name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    // A build from before shared commits logs no such fields.
    let (published, batches, commits) = (field("published")?, field("batches")?, field("commits")?);
    Some(format!(
        "relay: {commits} commits for {batches} batches of {published} rows ({:.2} batches, {:.2} rows per commit)",
        batches as f64 / commits.max(1) as f64,
        published as f64 / commits.max(1) as f64
    ))
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
        db: world.db.clone(),
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
    let sessions_before = PgSessions::take(&mut pg).await?;
    let wal_before = wal_position(&mut pg).await?;
    let committed = match rate {
        None => workload::backlog(&producer("job"), n, PRODUCERS).await?,
        Some(rate) => workload::paced(Arc::new(producer("job")), n, rate).await?.0,
    };
    let sent = wait_for(&mut pg, "job", n, patience(n)).await?;
    let cpu = before.share_until(&Snapshot::take(&roles));
    let pg_clients = sessions_before.per_email(&PgSessions::take(&mut pg).await?, sent as f64);
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
        pg_clients,
        relay: None,
    })
}
