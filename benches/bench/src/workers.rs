//! Real `mailroom worker` processes (the release binary `cargo bench` builds) against a fresh
//! world, measured from outside: rows in `sent_notifications`, smtp-sink's counter, `/proc`.
//!
//! Clocks: a job's submit time is this process's clock, shifted onto PostgreSQL's clock by the
//! offset measured at the start of the run (same host, so the shift is the read-out error only);
//! `created_at` (claim) and `sent_at` (record, after SMTP accepted) are PostgreSQL's `now()`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use tokio::process::{Child, Command};

use crate::latency::{Lat, Recorder};
use crate::procstat::{self, CpuShare, Roles, Snapshot};
use crate::raw::{FROM, PUBLISH_WINDOW};
use crate::workload::{self, BrokerProducer, Producer};
use crate::world::{Services, SmtpSink, World, pg_clock_offset, wal_position};

/// Worker-only: N jobs waiting in the queue, then `workers` processes drain it.
#[derive(Clone, Debug, Serialize)]
pub struct BacklogRun {
    pub label: String,
    pub workers: usize,
    pub n: usize,
    pub sent: i64,
    pub complete: bool,
    /// N / (first claim → last `sent_at`), PostgreSQL clock.
    pub emails_per_s: f64,
    /// Process spawn → N accepted by smtp-sink (includes start-up).
    pub wall_s: f64,
    /// Process spawn → first claim.
    pub startup_ms: f64,
    /// How fast the N jobs were pre-published (pipelined, confirmed).
    pub publish_rate: f64,
    /// Publish → `sent_at`. Dominated by the job's place in the backlog.
    pub queue_to_sent: Lat,
    /// Claim → `sent_at` (both PostgreSQL `now()`): the time a job spends inside a worker
    /// between claim and record (render, SMTP, waiting for a connection or an SMTP slot).
    pub claim_to_sent: Lat,
    /// VmHWM of each worker process, MiB.
    pub rss_mib: Vec<f64>,
    pub cpu: CpuShare,
    /// Worker CPU time per email, µs.
    pub worker_cpu_us_per_email: f64,
    /// PostgreSQL WAL written per email, bytes.
    pub wal_bytes_per_email: f64,
    /// Emails accepted per 1 s bucket, from process spawn.
    pub timeline: Vec<f64>,
    /// CPU shares per 1 s sample.
    pub cpu_timeline: Vec<CpuShare>,
    pub pg_clock_offset_ms: f64,
    /// The first worker's mean time per step around the send, from the line it logs when it
    /// stops (`place=… claim=… connection=… record=…`); `None` if it logged none.
    pub steps: Option<String>,
}

/// Worker at an offered rate: jobs published on a fixed schedule while the worker runs.
#[derive(Clone, Debug, Serialize)]
pub struct PacedRun {
    pub label: String,
    pub target_rate: f64,
    pub offered_rate: f64,
    pub n: usize,
    pub sent: i64,
    pub complete: bool,
    /// Publish start → `sent_at` (SMTP accepted and recorded).
    pub latency: Lat,
    /// Where that time went: before the claim and after it.
    pub split: Split,
    pub cpu: CpuShare,
    /// The first worker's group commits, from the line it logs when it stops
    /// ([`logged_ledger`]); `None` if it logged none.
    pub ledger: Option<String>,
    /// The SMTP server's name in the report.
    pub smtp: &'static str,
}

/// A paced run's latency in two parts, at the claim (the ledger's `created_at`, the claim
/// group's `now()`): publish → claim is the broker's hop, the wait for a slot and a place in
/// line, and the claim's group commit; claim → accepted+recorded is the rendering, the wait for
/// a connection, the send and the record's group commit.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Split {
    pub to_claim: Lat,
    pub after_claim: Lat,
    /// The slowest 1 % of jobs by their whole latency: mean ms before and after the claim.
    pub slowest_to_claim_ms: f64,
    pub slowest_after_claim_ms: f64,
}

impl Split {
    /// From each job's (publish → claim, claim → accepted+recorded) in ms.
    pub fn of(parts: &[(f64, f64)]) -> Split {
        if parts.is_empty() {
            return Split::default();
        }
        let (mut before, mut after) = (Recorder::default(), Recorder::default());
        for &(b, a) in parts {
            before.record_ms(b);
            after.record_ms(a);
        }
        let mut by_total: Vec<(f64, f64)> = parts.to_vec();
        by_total.sort_by(|x, y| (y.0 + y.1).total_cmp(&(x.0 + x.1)));
        let slowest = &by_total[..by_total.len().div_ceil(100)];
        let mean =
            |f: fn(&(f64, f64)) -> f64| slowest.iter().map(f).sum::<f64>() / slowest.len() as f64;
        Split {
            to_claim: before.summary(false),
            after_claim: after.summary(false),
            slowest_to_claim_ms: mean(|p| p.0),
            slowest_after_claim_ms: mean(|p| p.1),
        }
    }

    /// One line: both parts' p50 / p99 and the slowest 1 %'s means.
    pub fn line(&self) -> String {
        format!(
            "publish → claim p50 / p99 {:.2} / {:.2} ms, claim → accepted+recorded {:.2} / {:.2} ms; the slowest 1 %: {:.1} ms before the claim, {:.1} after",
            self.to_claim.p50,
            self.to_claim.p99,
            self.after_claim.p50,
            self.after_claim.p99,
            self.slowest_to_claim_ms,
            self.slowest_after_claim_ms
        )
    }
}

/// mailroom processes of one run (workers, and relays for the end-to-end runs).
#[derive(Default)]
pub struct Fleet {
    children: Vec<Child>,
    pub pids: Vec<u32>,
}

impl Fleet {
    pub fn spawn(world: &World, sink: &SmtpSink, k: usize, logs: &Path) -> anyhow::Result<Fleet> {
        let mut fleet = Fleet {
            children: vec![],
            pids: vec![],
        };
        for i in 0..k {
            fleet.add(world, "worker", i + 1, Some(sink), logs)?;
        }
        Ok(fleet)
    }

    /// Starts one more `mailroom <command>` (`worker` or `relay`) on this world; its log is
    /// `<logs>/<world>-<command><i>.log`.
    pub fn add(
        &mut self,
        world: &World,
        command: &str,
        i: usize,
        sink: Option<&SmtpSink>,
        logs: &Path,
    ) -> anyhow::Result<()> {
        self.add_with(world, command, i, sink, logs, &[])
    }

    /// [`Fleet::add`] with more arguments for the command.
    pub fn add_with(
        &mut self,
        world: &World,
        command: &str,
        i: usize,
        sink: Option<&SmtpSink>,
        logs: &Path,
        extra: &[&str],
    ) -> anyhow::Result<()> {
        std::fs::create_dir_all(logs)?;
        let templates = &crate::mailroom().templates;
        let log = std::fs::File::create(logs.join(format!("{}-{command}{i}.log", world.label)))?;
        let mut cmd = Command::new(&crate::mailroom().bin);
        cmd.arg(command)
            .args(["--database-url", &world.process_db_url])
            .args(["--amqp-url", &world.services.amqp_url])
            .args(["--namespace", &world.namespace])
            .args(extra);
        if let Some(sink) = sink {
            cmd.args(["--smtp-url", &sink.url()])
                .args(["--from", FROM])
                .arg("--templates")
                .arg(templates);
        }
        let child = cmd
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .env_remove("SMTP_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting mailroom {command}"))?;
        self.pids.push(child.id().context("process id")?);
        self.children.push(child);
        Ok(())
    }

    /// SIGTERM (graceful), then SIGKILL after the grace period.
    pub async fn stop(mut self) {
        for pid in &self.pids {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        for child in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(35), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

pub async fn count_sent(pg: &mut PgConnection, prefix: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM sent_notifications WHERE status = 'sent' AND job_id LIKE $1",
    )
    .bind(format!("{prefix}-%"))
    .fetch_one(pg)
    .await?)
}

/// (job_id, claimed at, sent at) of every sent job whose id starts with `prefix-`.
pub async fn sent_rows(
    pg: &mut PgConnection,
    prefix: &str,
) -> anyhow::Result<Vec<(String, DateTime<Utc>, DateTime<Utc>)>> {
    Ok(sqlx::query_as(
        "SELECT job_id, created_at, sent_at FROM sent_notifications
         WHERE status = 'sent' AND job_id LIKE $1",
    )
    .bind(format!("{prefix}-%"))
    .fetch_all(pg)
    .await?)
}

pub fn ms_between(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
}

/// How long to wait for a run before giving up (generous: a stuck run is reported, not hung).
pub fn patience(n: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(n as u64 * 10)
}

pub async fn backlog(
    services: &Services,
    sink: &SmtpSink,
    label: &str,
    workers: usize,
    n: usize,
    logs: &Path,
) -> anyhow::Result<BacklogRun> {
    let world = World::create(services, label, 2).await?;
    let result = backlog_in(&world, sink, workers, n, logs).await;
    world.cleanup().await;
    result
}

async fn backlog_in(
    world: &World,
    sink: &SmtpSink,
    workers: usize,
    n: usize,
    logs: &Path,
) -> anyhow::Result<BacklogRun> {
    let producer = BrokerProducer {
        channel: world.publisher.clone(),
        exchange: world.topology.exchange.clone(),
        prefix: "job".into(),
    };
    let t = Instant::now();
    let published = workload::backlog(&producer, n, PUBLISH_WINDOW).await?;
    let publish_rate = n as f64 / t.elapsed().as_secs_f64();
    let ready = world.ready_messages().await?;
    anyhow::ensure!(ready as usize == n, "{ready} of {n} jobs in the queue");

    let mut pg = world.pg().await?;
    let offset = pg_clock_offset(&mut pg).await?;
    let sink_base = sink.accepted();
    let spawned_utc = Utc::now();
    let spawned = Instant::now();
    let fleet = Fleet::spawn(world, sink, workers, logs)?;
    let perf = start_perf(&fleet, logs, &world.label);
    let roles = Roles {
        workers: fleet.pids.clone(),
        smtp_sink: sink.pid(),
    };
    let first = Snapshot::take(&roles);
    let wal_first = wal_position(&mut pg).await?;
    let mut last = first.clone();
    let mut cpu_timeline = vec![];
    let mut next_sample = spawned + Duration::from_secs(1);
    let deadline = spawned + patience(n);
    let mut sent = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = Instant::now();
        if now >= next_sample {
            let snap = Snapshot::take(&roles);
            cpu_timeline.push(last.share_until(&snap));
            last = snap;
            next_sample += Duration::from_secs(1);
            sent = count_sent(&mut pg, "job").await?;
        }
        let accepted = sink.accepted().saturating_sub(sink_base) as usize;
        if accepted >= n || sent as usize >= n || now >= deadline {
            break;
        }
    }
    let wall_s = spawned.elapsed().as_secs_f64();
    // smtp-sink counts before the worker records: wait for the rows (briefly).
    let settle = Instant::now() + Duration::from_secs(10);
    loop {
        sent = count_sent(&mut pg, "job").await?;
        if sent as usize >= n || Instant::now() >= settle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let end = Snapshot::take(&roles);
    let cpu = first.share_until(&end);
    let wal = wal_position(&mut pg).await? - wal_first;
    let rss_mib = fleet
        .pids
        .iter()
        .map(|p| procstat::peak_rss_mib(*p).unwrap_or(f64::NAN))
        .collect();
    stop_perf(perf).await;
    fleet.stop().await;

    let rows = sent_rows(&mut pg, "job").await?;
    let spawned_db = spawned_utc + offset;
    let mut queue_to_sent = Recorder::default();
    let mut claim_to_sent = Recorder::default();
    let first_claim = rows.iter().map(|r| r.1).min().unwrap_or(spawned_db);
    let last_sent = rows.iter().map(|r| r.2).max().unwrap_or(spawned_db);
    let buckets = (ms_between(spawned_db, last_sent) / 1000.0)
        .floor()
        .max(0.0) as usize
        + 1;
    let mut timeline = vec![0.0; buckets];
    for (job_id, claimed, sent_at) in &rows {
        if let Some(i) = workload::index_of(job_id).filter(|i| *i < published.len()) {
            queue_to_sent.record_ms(ms_between(published[i] + offset, *sent_at));
        }
        claim_to_sent.record_ms(ms_between(*claimed, *sent_at));
        let b = (ms_between(spawned_db, *sent_at) / 1000.0).floor().max(0.0) as usize;
        timeline[b.min(buckets - 1)] += 1.0;
    }
    // The last bucket covers only part of a second: show it as a rate.
    let covered = (ms_between(spawned_db, last_sent) / 1000.0).fract();
    if covered > 0.05 {
        if let Some(b) = timeline.last_mut() {
            *b /= covered;
        }
    } else if timeline.len() > 1 {
        // A sliver of a second: too short to be a rate.
        timeline.pop();
    }
    let busy_s = ms_between(first_claim, last_sent) / 1000.0;
    Ok(BacklogRun {
        label: world.label.clone(),
        workers,
        n,
        sent,
        complete: sent as usize >= n,
        emails_per_s: sent as f64 / busy_s.max(1e-6),
        wall_s,
        startup_ms: ms_between(spawned_db, first_claim),
        publish_rate,
        queue_to_sent: queue_to_sent.summary(true),
        claim_to_sent: claim_to_sent.summary(true),
        rss_mib,
        worker_cpu_us_per_email: cpu.worker_cpu_s / (sent.max(1) as f64) * 1e6,
        wal_bytes_per_email: wal as f64 / sent.max(1) as f64,
        cpu,
        timeline,
        cpu_timeline,
        pg_clock_offset_ms: offset.num_microseconds().unwrap_or(0) as f64 / 1000.0,
        steps: logged_steps(&logs.join(format!("{}-worker1.log", world.label))),
    })
}

/// The mean time per step a worker logged when it stopped: the text after `steps=` on its
/// "mean time of a delivery's steps" line.
fn logged_steps(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("mean time of a delivery's steps"))?;
    let (_, steps) = line.split_once("steps=")?;
    Some(
        steps
            .trim()
            .replace('=', " ")
            .replace("ms", " ms,")
            .trim_end_matches(',')
            .to_string(),
    )
}

/// The first worker's ledger, from the line it logs when it stops (warm-up included): its
/// commits, the claims and records in them, and the groups of only records that waited for a
/// claim to share their commit (and of those, the ones that went alone).
fn logged_ledger(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("ledger groups of this process written"))?;
    let field = |name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    let (groups, writes) = (field("groups")?, field("writes")?);
    let mut text = format!(
        "ledger: {groups} commits for {writes} claims and records ({:.2} per commit)",
        writes as f64 / groups.max(1) as f64
    );
    // A build from before records waited for company logs no such field.
    if let (Some(waits), Some(alone)) = (field("record_waits"), field("record_waits_alone")) {
        text.push_str(&format!(
            ", {waits} groups of records waited for company, {alone} of them in vain"
        ));
    }
    Some(text)
}

/// One worker process; `n` jobs offered at `rate`/s after a warm-up.
pub async fn paced(
    services: &Services,
    sink: &SmtpSink,
    label: &str,
    rate: f64,
    n: usize,
    logs: &Path,
) -> anyhow::Result<PacedRun> {
    let world = World::create(services, label, 2).await?;
    let result = paced_in(&world, sink, Offer::Rate(rate), n, logs).await;
    world.cleanup().await;
    result
}

/// The floor of one worker process: `n` jobs one at a time, each published only once the last
/// is recorded (the bench polls the ledger every millisecond). Nothing overlaps, so this is
/// what one job costs in time when it has the worker to itself; its latency is claim →
/// accepted+recorded (`split.after_claim`). The bench's polls run on PostgreSQL too, so the run
/// reports no CPU per email.
pub async fn one_at_a_time(
    services: &Services,
    sink: &SmtpSink,
    n: usize,
    logs: &Path,
) -> anyhow::Result<PacedRun> {
    let world = World::create(services, "one-at-a-time", 2).await?;
    let result = paced_in(&world, sink, Offer::OneAtATime, n, logs).await;
    world.cleanup().await;
    result.map(|run| PacedRun {
        label: "one job at a time".into(),
        ..run
    })
}

/// How a paced run offers its jobs.
#[derive(Clone, Copy)]
enum Offer {
    /// On a fixed schedule, this many per second.
    Rate(f64),
    /// Each once the last is recorded.
    OneAtATime,
}

async fn paced_in(
    world: &World,
    sink: &SmtpSink,
    offer: Offer,
    n: usize,
    logs: &Path,
) -> anyhow::Result<PacedRun> {
    let fleet = Fleet::spawn(world, sink, 1, logs)?;
    let mut pg = world.pg().await?;
    let result = async {
        let producer = |prefix: &str| BrokerProducer {
            channel: world.publisher.clone(),
            exchange: world.topology.exchange.clone(),
            prefix: prefix.into(),
        };
        // Warm-up: the worker is connected and its pools are open before the clock starts.
        // One at a time for the floor: a burst would leave the worker evidence of independent
        // arrivals, and its first records would wait for company that never comes.
        const WARM: usize = 50;
        match offer {
            Offer::Rate(_) => {
                workload::backlog(&producer("warm"), WARM, 16).await?;
                wait_for(&mut pg, "warm", WARM, patience(WARM)).await?;
            }
            Offer::OneAtATime => {
                one_by_one(&producer("warm"), &mut pg, "warm", WARM).await?;
            }
        }
        let offset = pg_clock_offset(&mut pg).await?;
        let roles = Roles {
            workers: fleet.pids.clone(),
            smtp_sink: sink.pid(),
        };
        let before = Snapshot::take(&roles);
        let jobs: Arc<dyn Producer> = Arc::new(producer("job"));
        let (published, offered_rate, target_rate) = match offer {
            Offer::Rate(rate) => {
                let (published, offered) = workload::paced(jobs, n, rate).await?;
                (published, offered, rate)
            }
            Offer::OneAtATime => {
                let started = Instant::now();
                let published = one_by_one(jobs.as_ref(), &mut pg, "job", n).await?;
                let offered = n as f64 / started.elapsed().as_secs_f64().max(1e-6);
                (published, offered, 0.0)
            }
        };
        let sent = wait_for(&mut pg, "job", n, patience(n)).await?;
        let cpu = match offer {
            Offer::Rate(_) => before.share_until(&Snapshot::take(&roles)),
            // The bench's polls ran on PostgreSQL: no figure would be the worker's alone.
            Offer::OneAtATime => CpuShare::default(),
        };
        let mut latency = Recorder::default();
        let mut parts = Vec::with_capacity(n);
        for (job_id, claimed_at, sent_at) in sent_rows(&mut pg, "job").await? {
            if let Some(i) = workload::index_of(&job_id).filter(|i| *i < published.len()) {
                let published = published[i] + offset;
                latency.record_ms(ms_between(published, sent_at));
                parts.push((
                    ms_between(published, claimed_at).max(0.0),
                    ms_between(claimed_at, sent_at).max(0.0),
                ));
            }
        }
        anyhow::Ok(PacedRun {
            label: world.label.clone(),
            target_rate,
            offered_rate,
            n,
            sent,
            complete: sent as usize >= n,
            latency: latency.summary(true),
            split: Split::of(&parts),
            cpu,
            ledger: None,
            smtp: sink.name,
        })
    }
    .await;
    fleet.stop().await;
    let ledger = logged_ledger(&logs.join(format!("{}-worker1.log", world.label)));
    result.map(|run| PacedRun { ledger, ..run })
}

/// Submits jobs `0..n` of `producer` (ids `prefix-i`), each once the last is recorded (the
/// ledger polled every millisecond); their submit times, by index.
async fn one_by_one(
    producer: &dyn Producer,
    pg: &mut PgConnection,
    prefix: &str,
    n: usize,
) -> anyhow::Result<Vec<DateTime<Utc>>> {
    let mut published = Vec::with_capacity(n);
    for i in 0..n {
        published.push(producer.submit(i).await?);
        let deadline = Instant::now() + patience(1);
        while count_sent(pg, prefix).await? <= i as i64 {
            anyhow::ensure!(Instant::now() < deadline, "{prefix}-{i} was not recorded");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(published)
}

pub async fn wait_for(
    pg: &mut PgConnection,
    prefix: &str,
    n: usize,
    patience: Duration,
) -> anyhow::Result<i64> {
    let deadline = Instant::now() + patience;
    loop {
        let sent = count_sent(pg, prefix).await?;
        if sent as usize >= n || Instant::now() >= deadline {
            return Ok(sent);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With `MAILROOM_BENCH_PERF=1`, `perf record` samples the first worker process of each
/// worker-only run (DWARF call graphs; the release profile keeps line tables) into
/// `<out>/logs/<run>.perf.data`; read it with `perf report -i <file> --no-children`.
fn start_perf(fleet: &Fleet, logs: &Path, label: &str) -> Option<Child> {
    std::env::var_os("MAILROOM_BENCH_PERF")?;
    let pid = fleet.pids.first()?;
    Command::new("perf")
        .args([
            "record",
            "-F",
            "499",
            "--call-graph",
            "dwarf,16384",
            "-p",
            &pid.to_string(),
        ])
        .arg("-o")
        .arg(logs.join(format!("{label}.perf.data")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| eprintln!("bench: cannot start perf: {e}"))
        .ok()
}

async fn stop_perf(perf: Option<Child>) {
    let Some(mut perf) = perf else { return };
    if let Some(pid) = perf.id() {
        let _ = Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(60), perf.wait()).await;
}

/// Where worker logs go.
pub fn logs_dir(out: &Path) -> PathBuf {
    out.join("logs")
}

#[cfg(test)]
mod tests {
    use super::Split;

    #[test]
    fn the_split_puts_the_slowest_jobs_wait_where_it_was() {
        // 198 jobs of 1 ms before and 2 ms after the claim; the two slowest (the top 1 % of
        // 200) waited 40 and 60 ms before their claim and 3 ms after.
        let mut parts = vec![(1.0, 2.0); 198];
        parts.push((40.0, 3.0));
        parts.push((60.0, 3.0));
        let split = Split::of(&parts);
        assert_eq!(split.slowest_to_claim_ms, 50.0);
        assert_eq!(split.slowest_after_claim_ms, 3.0);
        assert!(
            (split.to_claim.p50 - 1.0).abs() < 0.01,
            "{}",
            split.to_claim.p50
        );
        assert!((split.after_claim.p50 - 2.0).abs() < 0.01);
        assert_eq!(Split::of(&[]).slowest_to_claim_ms, 0.0);
    }
}
