//! What one email costs the database: claim + record pairs through the worker's own group
//! commit (`Ledger::grouped`, groups ≤ 64, 32 clients as the worker's concurrency) on a fresh,
//! migrated database, at full speed or paced at a fixed rate. For each engine it reports pairs/s,
//! the server's CPU per pair, the log it wrote per pair (PostgreSQL's WAL, MariaDB's binary log
//! plus InnoDB's redo log), the commits per pair, and on PostgreSQL the share of
//! records that were HOT updates (a new row version on the same page, no index entry written).
//!
//! ```text
//! cargo run --release -p mailroom-bench --bin ledger_cost -- [--pairs 20000] [--rate 200] [--engine postgres|mysql]
//! ```
//! The services are those of the bench (`MAILROOM_BENCH_*`, else the tests' `MAILROOM_TEST_*`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailroom::db::group::Ledger;
use mailroom::db::{Database, Engine, LedgerStatus};
use sqlx::Row;

use crate::procstat;
use crate::world::{Services, World, log_position};

const KIND: &str = "receipt";
/// The worker's default `MAILROOM_LEDGER_GROUP` and `--concurrency`.
const GROUP: usize = 64;
const CLIENTS: usize = 32;
/// Pairs before the measurement: the pool's connections, the statements' plans, the table's
/// first pages.
const WARM_UP: usize = 2000;

/// What one run measured.
#[derive(Debug)]
pub struct Cost {
    pub engine: &'static str,
    pub offered: Option<f64>,
    pub pairs: usize,
    pub pairs_per_s: f64,
    /// The database server's CPU (every process of it) per pair, µs.
    pub server_us: f64,
    /// Log bytes per pair: WAL (PostgreSQL), binary log + redo log (MariaDB).
    pub log_bytes: f64,
    /// Transactions committed per pair: the database's on PostgreSQL, the whole server's on
    /// MariaDB.
    pub commits: f64,
    /// Records that were HOT updates, in % (PostgreSQL).
    pub hot: Option<f64>,
    pub mean_group: f64,
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let offered = self
            .offered
            .map_or("full speed".to_string(), |r| format!("{r:.0}/s offered"));
        write!(
            f,
            "{} {offered}: {:.0} pairs/s, server CPU {:.0} µs/pair, log {:.0} B/pair, {:.2} commits/pair, mean group {:.1}",
            self.engine,
            self.pairs_per_s,
            self.server_us,
            self.log_bytes,
            self.commits,
            self.mean_group
        )?;
        if let Some(hot) = self.hot {
            write!(f, ", HOT records {hot:.0} %")?;
        }
        Ok(())
    }
}

/// `ledger_cost [--pairs N] [--rate R] [--engine postgres|mysql]`: prints one line per engine.
pub async fn cli(args: &[String]) -> anyhow::Result<()> {
    let (mut pairs, mut rate, mut engines) = (20_000, None, vec![Engine::Postgres, Engine::MySql]);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--pairs" => pairs = value()?.parse().context("--pairs")?,
            "--rate" => rate = Some(value()?.parse::<f64>().context("--rate")?),
            "--engine" => {
                engines = match value()?.as_str() {
                    "postgres" => vec![Engine::Postgres],
                    "mysql" | "mariadb" => vec![Engine::MySql],
                    other => anyhow::bail!("--engine {other:?}: postgres or mysql"),
                }
            }
            other => anyhow::bail!(
                "unknown argument {other:?}: ledger_cost [--pairs N] [--rate R] [--engine postgres|mysql]"
            ),
        }
    }
    let services = Services::from_env();
    for engine in engines {
        let cost = measure(&services, engine, pairs, rate).await?;
        println!("{cost}");
    }
    Ok(())
}

/// Runs `pairs` claim + record pairs on a fresh database of `engine`, at full speed or paced at
/// `rate` per second.
pub async fn measure(
    services: &Services,
    engine: Engine,
    pairs: usize,
    rate: Option<f64>,
) -> anyhow::Result<Cost> {
    let world = World::create_on(services, engine, "ledger-cost", CLIENTS as u32 + 2).await?;
    let result = measure_in(&world.db, engine, pairs, rate).await;
    world.cleanup().await;
    result
}

async fn measure_in(
    db: &Database,
    engine: Engine,
    pairs: usize,
    rate: Option<f64>,
) -> anyhow::Result<Cost> {
    let ledger = Ledger::direct(db.clone(), Default::default()).grouped(GROUP);
    run(&ledger, 0, WARM_UP, None).await?;
    let groups_before = group_counts(&ledger);
    // Statistics reach the views a moment after each transaction: settle before reading them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = Counters::read(db).await?;
    let cpu_before = server_cpu(engine);
    let t0 = Instant::now();
    run(&ledger, WARM_UP, pairs, rate).await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let server = server_cpu(engine) - cpu_before;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = Counters::read(db).await?;
    let groups_after = group_counts(&ledger);
    let n = pairs as f64;
    let last = format!("cost-{}", WARM_UP + pairs - 1);
    let sent = db.notification(&last, KIND).await?.map(|r| r.status);
    anyhow::ensure!(sent == Some(LedgerStatus::Sent), "the run left {sent:?}");
    Ok(Cost {
        engine: match engine {
            Engine::Postgres => "PostgreSQL",
            Engine::MySql => "MariaDB",
        },
        offered: rate,
        pairs,
        pairs_per_s: n / elapsed,
        server_us: server * 1e6 / n,
        log_bytes: (after.log_bytes - before.log_bytes) as f64 / n,
        commits: (after.commits - before.commits) as f64 / n,
        hot: (after.updates > before.updates).then(|| {
            (after.hot_updates - before.hot_updates) as f64
                / (after.updates - before.updates) as f64
                * 100.0
        }),
        mean_group: (groups_after.0 - groups_before.0) as f64
            / (groups_after.1 - groups_before.1).max(1) as f64,
    })
}

/// (claims and records written, groups committed) so far.
fn group_counts(ledger: &Ledger) -> (u64, u64) {
    let stats = ledger.stats();
    (
        stats.writes.load(Ordering::Relaxed),
        stats.groups.load(Ordering::Relaxed),
    )
}

/// Pairs `first..first + n`: by [`CLIENTS`] clients as fast as they go, or one started every
/// `1 / rate` seconds (each on a task of its own, as a worker's deliveries are).
async fn run(ledger: &Ledger, first: usize, n: usize, rate: Option<f64>) -> anyhow::Result<()> {
    match rate {
        None => {
            let next = Arc::new(AtomicUsize::new(first));
            let tasks = (0..CLIENTS).map(|_| {
                let (ledger, next) = (ledger.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= first + n {
                            return anyhow::Ok(());
                        }
                        pair(&ledger, i).await?;
                    }
                })
            });
            for t in futures_util::future::join_all(tasks).await {
                t??;
            }
        }
        Some(rate) => {
            let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut tasks = Vec::with_capacity(n);
            for i in first..first + n {
                ticks.tick().await;
                let ledger = ledger.clone();
                tasks.push(tokio::spawn(async move { pair(&ledger, i).await }));
            }
            for t in futures_util::future::join_all(tasks).await {
                t??;
            }
        }
    }
    Ok(())
}

/// The worker's statements for one email: claim a new job, record it sent.
async fn pair(ledger: &Ledger, i: usize) -> anyhow::Result<()> {
    crate::pair::claim_and_record(ledger, &format!("cost-{i}"), KIND).await?;
    Ok(())
}

/// CPU seconds of every process of the database server so far.
fn server_cpu(engine: Engine) -> f64 {
    let names: &[&str] = match engine {
        Engine::Postgres => &["postgres"],
        Engine::MySql => &["mariadbd", "mysqld"],
    };
    procstat::pids_with_names(names)
        .into_iter()
        .filter_map(procstat::cpu_seconds)
        .sum()
}

/// The server's counters the costs are differences of.
struct Counters {
    log_bytes: i64,
    commits: i64,
    updates: i64,
    hot_updates: i64,
}

impl Counters {
    async fn read(db: &Database) -> anyhow::Result<Counters> {
        match db {
            Database::Postgres(pool) => {
                let row = sqlx::query(
                    "SELECT (SELECT xact_commit FROM pg_stat_database
                              WHERE datname = current_database()) AS commits,
                            n_tup_upd, n_tup_hot_upd
                     FROM pg_stat_user_tables WHERE relname = 'sent_notifications'",
                )
                .fetch_one(pool)
                .await?;
                Ok(Counters {
                    log_bytes: log_position(db).await?,
                    commits: row.try_get("commits")?,
                    updates: row.try_get("n_tup_upd")?,
                    hot_updates: row.try_get("n_tup_hot_upd")?,
                })
            }
            Database::MySql(pool) => {
                let commits: (String, String) = sqlx::query_as(
                    "SELECT variable_name, variable_value FROM information_schema.global_status
                     WHERE variable_name = 'COM_COMMIT'",
                )
                .fetch_one(pool)
                .await?;
                Ok(Counters {
                    log_bytes: log_position(db).await?,
                    commits: commits.1.parse()?,
                    updates: 0,
                    hot_updates: 0,
                })
            }
        }
    }
}
