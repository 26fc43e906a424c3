//! mailroom's benchmark: throughput and latency of real `mailroom worker` processes next to the
//! raw limits of the same machine, measured in the same run.
//!
//! ```text
//! cargo bench --bench bench -- [--quick] [--n 20000] [--out target/bench] [--workers 1,2,4]
//! ```
//! Needs the services of `scripts/services` (RabbitMQ, PostgreSQL, MariaDB, Postfix's
//! smtp-sink).
//! Prints one table (markdown) and writes `<out>/results.json` and `<out>/bench.svg`; worker
//! logs go to `<out>/logs/`.
//!
//! Order of a run:
//! 1. raw limits ([`raw`]): broker, database (the worker's claim and record statements), SMTP;
//! 2. worker only ([`workers::backlog`]): N jobs pre-published to a fresh namespace and
//!    database, then 1, 2, 4 worker processes drain them into smtp-sink;
//! 3. the worker path at offered rates ([`workers::paced`]): 500/s and 25/50/90 % of the
//!    1-process maximum, publish → SMTP accepted;
//! 4. the relay alone on PostgreSQL and on MySQL/MariaDB ([`relay_alone::both_engines`]):
//!    outbox → queue rows/s, the idle relay's transactions or commands per second, and the
//!    commit → published latency of single rows committed to an idle relay;
//! 5. end to end ([`relay::end_to_end`]): outbox commit → SMTP accepted through a relay and a
//!    worker process, at full speed and at 25/50/90 % of that maximum and at 500/s.
//!
//! The `bench` target of the mailroom package (benches/bench.rs) calls [`main`] with the
//! `mailroom` binary Cargo built for it. Under `cargo test --all-targets` (no `--bench`
//! argument) it does nothing, so the test suite never runs a benchmark.

mod chart;
mod delay;
mod dlq;
mod latency;
pub mod ledger_cost;
mod mysql;
pub mod pair;
pub mod procstat;
mod raw;
mod relay;
mod relay_alone;
mod report;
mod rounds;
mod workers;
pub mod workload;
mod world;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::world::{Services, SmtpSink};

/// One part of the bench run alone (`--only`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Only {
    Recorder,
    Backlog,
    Paced,
    EndToEnd,
    Dlq,
    Rounds,
    Smtp,
}

#[derive(Clone, Debug, Serialize)]
pub struct Opts {
    pub quick: bool,
    /// Jobs per worker-only run.
    pub n: usize,
    /// Operations per raw-limit run.
    pub raw_n: usize,
    /// Sequential operations for the unloaded latency floors.
    pub floor_n: usize,
    /// Worker process counts of the scaling runs.
    pub workers: Vec<usize>,
    /// Offered rates as fractions of the 1-process maximum.
    pub fractions: Vec<f64>,
    /// Fixed offered rate of the latency target (emails/s).
    pub target_rate: f64,
    /// Seconds of offered load per paced run.
    pub paced_secs: f64,
    /// Single outbox rows committed to an idle relay, per engine.
    pub wake_rows: usize,
    /// Single outbox rows committed at [`relay_alone::TRICKLE_RATE`] through relay and worker,
    /// per engine.
    pub trickle_rows: usize,
    pub out: PathBuf,
    /// Paired rounds of the two headline ratios ([`rounds`]); 0 leaves them out.
    pub rounds: usize,
    /// `--only recorder`: only the worker path at [`RECORDER_RATE`] into the Python SMTP
    /// recorder, for working on the cost of an email at low rates; `--only backlog`: only the
    /// worker-only runs into smtp-sink; `--only paced`: one worker-only run, then the worker
    /// path at the fractions of its maximum. Each prints its figures and CPU per email.
    /// `--only e2e`: the producers alone, end to end at full speed and at the target rate;
    /// `--only dlq`: N dead letters ingested, then replayed; `--only rounds`: the paired
    /// rounds alone.
    pub only: Option<Only>,
}

impl Opts {
    fn parse(args: &[String]) -> anyhow::Result<Opts> {
        let quick = args.iter().any(|a| a == "--quick");
        let mut opts = Opts {
            quick,
            n: if quick { 1_000 } else { 20_000 },
            raw_n: if quick { 5_000 } else { 20_000 },
            floor_n: if quick { 100 } else { 300 },
            workers: if quick { vec![1, 2] } else { vec![1, 2, 4] },
            fractions: if quick {
                vec![0.5]
            } else {
                vec![0.25, 0.5, 0.9]
            },
            target_rate: 500.0,
            paced_secs: if quick { 2.0 } else { 5.0 },
            wake_rows: if quick { 4 } else { 20 },
            trickle_rows: if quick { 50 } else { 300 },
            out: PathBuf::from("target/bench"),
            rounds: if quick { 0 } else { 3 },
            only: None,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--quick" | "--bench" => {}
                "--n" => opts.n = value("--n")?.parse().context("--n")?,
                "--rounds" => opts.rounds = value("--rounds")?.parse().context("--rounds")?,
                "--out" => opts.out = PathBuf::from(value("--out")?),
                "--paced-secs" => {
                    opts.paced_secs = value("--paced-secs")?.parse().context("--paced-secs")?
                }
                "--only" => match value("--only")?.as_str() {
                    "recorder" => opts.only = Some(Only::Recorder),
                    "backlog" => opts.only = Some(Only::Backlog),
                    "paced" => opts.only = Some(Only::Paced),
                    "e2e" => opts.only = Some(Only::EndToEnd),
                    "dlq" => opts.only = Some(Only::Dlq),
                    "rounds" => opts.only = Some(Only::Rounds),
                    "smtp" => opts.only = Some(Only::Smtp),
                    other => {
                        anyhow::bail!(
                            "--only {other:?}: `recorder`, `backlog`, `paced`, `e2e`, `dlq`, `rounds` or `smtp`"
                        )
                    }
                },
                "--workers" => {
                    opts.workers = value("--workers")?
                        .split(',')
                        .map(|w| w.trim().parse())
                        .collect::<Result<_, _>>()
                        .context("--workers: a list like 1,2,4")?
                }
                "--help" | "-h" => {
                    println!(
                        "cargo bench --bench bench -- [--quick] [--n 20000] [--out target/bench] [--workers 1,2,4] [--only recorder|backlog|paced|e2e|dlq|rounds] [--rounds 3] [--paced-secs 5]"
                    );
                    std::process::exit(0);
                }
                other => anyhow::bail!("unknown argument {other:?} (try --help)"),
            }
        }
        anyhow::ensure!(opts.n > 0, "--n must be positive");
        anyhow::ensure!(opts.paced_secs > 0.0, "--paced-secs must be positive");
        if opts.workers.is_empty() {
            opts.workers = vec![1];
        }
        Ok(opts)
    }
}

/// Everything one run measured (`results.json`).
#[derive(Debug, Serialize)]
pub struct Results {
    pub machine: report::Machine,
    pub opts: Opts,
    /// `MAILROOM_*` variables the workers inherited (tuning knobs); empty = mailroom defaults.
    pub worker_env: Vec<(String, String)>,
    pub started_at: String,
    pub duration_s: f64,
    pub raw_broker: raw::RawBroker,
    pub raw_db: raw::RawDb,
    pub raw_smtp: raw::RawSmtp,
    pub worker_runs: Vec<workers::BacklogRun>,
    pub paced_runs: Vec<workers::PacedRun>,
    /// One worker, one job at a time ([`workers::one_at_a_time`]).
    pub one_at_a_time: workers::PacedRun,
    pub relay: relay::RelayFigures,
    /// N dead letters ingested, then replayed ([`dlq::run`]).
    pub dlq: dlq::DlqRun,
    /// The headline ratios in paired rounds ([`rounds::run`]); `None` with `--rounds 0`.
    pub rounds: Option<rounds::Rounds>,
}

/// The `mailroom` under test: its binary (Cargo builds it for the `bench` target of the
/// mailroom package, benches/bench.rs, which calls [`main`]) and the shipped templates.
#[derive(Clone, Debug)]
pub struct Mailroom {
    pub bin: PathBuf,
    pub templates: PathBuf,
}

static MAILROOM: OnceLock<Mailroom> = OnceLock::new();

/// The `mailroom` that [`main`] was given.
fn mailroom() -> &'static Mailroom {
    MAILROOM.get().expect("mailroom_bench::main sets it first")
}

/// Runs the benchmark with the command line's arguments against `mailroom`, or against the
/// binary `MAILROOM_BENCH_BIN` names (another build, to compare two in the same hour).
pub fn main(mut mailroom: Mailroom) -> anyhow::Result<()> {
    if let Some(bin) = std::env::var_os("MAILROOM_BENCH_BIN") {
        mailroom.bin = bin.into();
    }
    MAILROOM.get_or_init(|| mailroom);
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "bench: skipped outside `cargo bench` (run `cargo bench --bench bench -- --quick`)"
        );
        return Ok(());
    }
    let opts = Opts::parse(&args)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(opts))
}

/// The rate offered to a worker that sends to the test suite's Python SMTP recorder: one that
/// server keeps up with (it writes and fsyncs every message).
const RECORDER_RATE: f64 = 200.0;

/// One worker process at [`RECORDER_RATE`] into the test suite's Python SMTP recorder.
async fn recorder_run(
    services: &Services,
    opts: &Opts,
    logs: &std::path::Path,
) -> anyhow::Result<workers::PacedRun> {
    let n = ((RECORDER_RATE * opts.paced_secs).round() as usize).max(10);
    step(&format!(
        "worker path at {RECORDER_RATE:.0}/s into the test suite's Python SMTP recorder ({n} jobs)"
    ));
    let recorder = SmtpSink::python_recorder(&logs.join("smtp-recorder")).await?;
    let run = workers::paced(
        services,
        &recorder,
        "paced-recorder",
        RECORDER_RATE,
        n,
        logs,
    )
    .await;
    recorder.stop().await;
    let mut run = run?;
    run.label = format!(
        "{RECORDER_RATE:.0}/s into the Python SMTP recorder (aiosmtpd, an fsync per message)"
    );
    Ok(run)
}

/// One worker process, one job at a time into smtp-sink: the floor a worker's groups and
/// waits must not raise.
async fn one_at_a_time_run(
    services: &Services,
    sink: &SmtpSink,
    opts: &Opts,
    logs: &std::path::Path,
) -> anyhow::Result<workers::PacedRun> {
    step(&format!(
        "worker, one job at a time ({} jobs, each published once the last is recorded)",
        opts.floor_n
    ));
    workers::one_at_a_time(services, sink, opts.floor_n, logs).await
}

/// The paired rounds ([`rounds::run`]) with this run's sizes.
async fn rounds_run(
    services: &Services,
    sink: &SmtpSink,
    opts: &Opts,
    logs: &std::path::Path,
) -> anyhow::Result<rounds::Rounds> {
    rounds::run(services, sink, opts.rounds.max(1), opts, logs).await
}

fn step(what: &str) {
    eprintln!("bench: {what}");
}

async fn run(opts: Opts) -> anyhow::Result<()> {
    // The producers' and the bench's own sessions, told apart from the relay's and the worker's.
    mailroom::db::name_sessions("bench");
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339();
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let logs = workers::logs_dir(&opts.out);
    let loadavg_before = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let busy_before = procstat::machine_busy(std::time::Duration::from_secs(1)).await;
    if busy_before > 20.0 {
        step(&format!(
            "WARNING: the machine is busy ({busy_before:.0} % CPU, load {loadavg_before}); figures will be pessimistic"
        ));
    }
    let services = Services::from_env();
    let sink = SmtpSink::start().await?;
    if opts.only == Some(Only::Recorder) {
        let run = recorder_run(&services, &opts, &logs).await?;
        println!(
            "{}: publish → accepted+recorded p50 / p95 / p99 {}{}\n{}\n{}",
            run.label,
            run.latency.triple(),
            report::incomplete(run.sent, run.n, run.complete),
            run.split.line(),
            report::paced_cost(&run)
        );
        if let Some(ledger) = &run.ledger {
            println!("{ledger}");
        }
        let floor = one_at_a_time_run(&services, &sink, &opts, &logs).await?;
        println!("{}", report::one_at_a_time_line(&floor));
        if let Some(ledger) = &floor.ledger {
            println!("{ledger}");
        }
        return Ok(());
    }
    if opts.only == Some(Only::Smtp) {
        let s = raw::smtp(&sink, opts.raw_n, opts.floor_n).await?;
        println!("{}", report::raw_smtp_lines(&s));
        for far in raw::smtp_far(&sink, opts.raw_n / 10).await? {
            println!("{}", report::far_smtp_line(&far));
        }
        return Ok(());
    }
    if opts.only == Some(Only::Backlog) {
        for &k in &opts.workers {
            let run =
                workers::backlog(&services, &sink, &format!("backlog-{k}w"), k, opts.n, &logs)
                    .await?;
            println!(
                "worker only, {k} process(es), {} jobs: {:.0} emails/s{}\n{}",
                opts.n,
                run.emails_per_s,
                report::incomplete(run.sent, run.n, run.complete),
                report::backlog_cost(&run)
            );
        }
        return Ok(());
    }
    if opts.only == Some(Only::Paced) {
        let max = workers::backlog(&services, &sink, "backlog-1w", 1, opts.n, &logs).await?;
        println!(
            "worker only, 1 process, {} jobs: {:.0} emails/s{}",
            opts.n,
            max.emails_per_s,
            report::incomplete(max.sent, max.n, max.complete)
        );
        for f in &opts.fractions {
            let rate = max.emails_per_s * f;
            let n = ((rate * opts.paced_secs).round() as usize).max(10);
            let label = format!("paced-{}", rate.round());
            let run = workers::paced(&services, &sink, &label, rate, n, &logs).await?;
            println!(
                "{:.0} % of max ({rate:.0}/s, {n} jobs): publish → accepted+recorded p50 / p95 / p99 {}{}\n{}\n{}",
                f * 100.0,
                run.latency.triple(),
                report::incomplete(run.sent, run.n, run.complete),
                run.split.line(),
                report::paced_cost(&run)
            );
        }
        return Ok(());
    }
    if opts.only == Some(Only::Rounds) {
        let rounds = rounds_run(&services, &sink, &opts, &logs).await?;
        println!("{}", report::rounds_lines(&rounds));
        return Ok(());
    }
    if opts.only == Some(Only::Dlq) {
        let run = dlq::run(&services, opts.n).await?;
        println!("{}", report::dlq_line(&run));
        return Ok(());
    }
    if opts.only == Some(Only::EndToEnd) {
        let alone = relay::outbox_commits_in(
            &services,
            mailroom::db::Engine::Postgres,
            &["none"],
            opts.floor_n * 30,
            &logs,
        )
        .await?;
        let run = relay::end_to_end(&services, &sink, "e2e-max", None, opts.n, &logs).await?;
        println!(
            "end to end, {} jobs: {:.0} emails/s (producers committed {:.0}/s; alone {:.0}/s, PostgreSQL {:.0} µs per commit: ratio {:.2}){}\n{}",
            opts.n,
            run.emails_per_s,
            run.commit_rate,
            alone.rate("none"),
            alone.modes.first().map_or(0.0, |m| m.server_us_per_commit),
            run.emails_per_s / alone.rate("none").max(1.0),
            report::incomplete(run.sent, run.n, run.complete),
            report::end_to_end_cost(&run)
        );
        if let Some(commits) = alone.modes.first() {
            println!("{}", report::budget_line(commits, &run));
        }
        let rate = opts.target_rate;
        let n = ((rate * opts.paced_secs).round() as usize).max(10);
        let run = relay::end_to_end(
            &services,
            &sink,
            &format!("e2e-{}", rate.round()),
            Some(rate),
            n,
            &logs,
        )
        .await?;
        println!(
            "end to end at {rate:.0}/s ({n} jobs): commit → accepted+recorded p50 / p95 / p99 {}{}\n{}",
            run.latency.triple(),
            report::incomplete(run.sent, run.n, run.complete),
            report::end_to_end_cost(&run)
        );
        return Ok(());
    }
    step(&format!(
        "smtp-sink on 127.0.0.1:{}; N = {}, raw N = {}, workers {:?}",
        sink.port, opts.n, opts.raw_n, opts.workers
    ));

    step("raw limit: SMTP (smtp-sink via lettre, then via smtp-source)");
    let raw_smtp = raw::smtp(&sink, opts.raw_n, opts.floor_n).await?;
    step("raw limit: PostgreSQL claim + record");
    let raw_db =
        raw::database(&services, opts.raw_n, opts.floor_n, raw::WORKER_CONCURRENCY).await?;
    step("raw limit: RabbitMQ publish + confirm + consume + ack");
    let raw_broker = raw::broker(&services, opts.raw_n, opts.floor_n).await?;

    let mut worker_runs = vec![];
    for &k in &opts.workers {
        step(&format!(
            "worker only: {} jobs, {k} worker process(es)",
            opts.n
        ));
        let run =
            workers::backlog(&services, &sink, &format!("backlog-{k}w"), k, opts.n, &logs).await?;
        step(&format!(
            "  {:.0} emails/s, {} sent",
            run.emails_per_s, run.sent
        ));
        worker_runs.push(run);
    }

    let max_1w = worker_runs
        .iter()
        .find(|r| r.workers == 1)
        .map_or(1000.0, |r| r.emails_per_s);
    let mut rates: Vec<(String, f64)> =
        vec![(format!("{:.0}/s", opts.target_rate), opts.target_rate)];
    for f in &opts.fractions {
        rates.push((format!("{:.0} % of max", f * 100.0), max_1w * f));
    }
    let mut paced_runs = vec![];
    for (label, rate) in rates {
        let n = ((rate * opts.paced_secs).round() as usize).max(10);
        step(&format!(
            "worker path at {label} ({rate:.0}/s offered, {n} jobs)"
        ));
        let mut run = workers::paced(
            &services,
            &sink,
            &format!("paced-{}", rate.round()),
            rate,
            n,
            &logs,
        )
        .await?;
        run.label = label;
        paced_runs.push(run);
    }
    paced_runs.push(recorder_run(&services, &opts, &logs).await?);
    let one_at_a_time = one_at_a_time_run(&services, &sink, &opts, &logs).await?;

    let commits_n = opts.floor_n * 30;
    step(&format!(
        "raw limit: outbox commits, {} producers, {commits_n} rows per mode (alone; beside a relay woken by probes, the NOTIFY trigger, the WAL)",
        relay::PRODUCERS
    ));
    let outbox_commits =
        relay::outbox_commits(&services, mailroom::db::Engine::Postgres, commits_n, &logs).await?;
    step("the same on MariaDB/MySQL (alone; beside a relay woken by probes, the binary log)");
    let outbox_commits_mysql =
        relay::outbox_commits(&services, mailroom::db::Engine::MySql, commits_n, &logs).await?;
    for (engine, m) in [&outbox_commits, &outbox_commits_mysql]
        .iter()
        .flat_map(|c| c.modes.iter().map(move |m| (c.engine, m)))
    {
        step(&format!(
            "  {engine} {}: {:.0} commits/s {:?}{}",
            m.mode,
            m.per_s,
            m.rounds.iter().map(|r| r.round()).collect::<Vec<_>>(),
            m.unavailable
                .as_ref()
                .map_or(String::new(), |why| format!(" (unavailable: {why})"))
        ));
    }
    step(&format!(
        "relay alone on PostgreSQL, then MariaDB/MySQL: {} outbox rows committed at once; then {} s idle and {} single rows, then {} rows at {}/s through relay and worker, both engines side by side",
        opts.n,
        relay_alone::IDLE_WINDOW.as_secs(),
        opts.wake_rows,
        opts.trickle_rows,
        relay_alone::TRICKLE_RATE
    ));
    let alone = relay_alone::both_engines(
        &services,
        &sink,
        opts.n,
        opts.wake_rows,
        opts.trickle_rows,
        &logs,
    )
    .await?;
    for a in &alone {
        step(&format!(
            "  {}: {:.0} rows/s from the commit to the last published; idle: {:.2} {}/s; commit → published p50 {:.1} ms, max {:.1} ms; at {}/s commit → accepted p50 {:.1} ms, p99 {:.1} ms ({} of {} sent)",
            a.engine,
            a.relay_only.rows_per_s,
            a.relay_idle.per_s,
            a.relay_idle.unit,
            a.wake.latency.p50,
            a.wake.latency.max,
            a.trickle.rate,
            a.trickle.latency.p50,
            a.trickle.latency.p99,
            a.trickle.sent,
            a.trickle.rows
        ));
    }
    step(&format!(
        "end to end: {} jobs committed by {} producers, 1 relay + 1 worker",
        opts.n,
        relay::PRODUCERS
    ));
    let end_to_end_max =
        relay::end_to_end(&services, &sink, "e2e-max", None, opts.n, &logs).await?;
    step(&format!(
        "  {:.0} emails/s, {} sent",
        end_to_end_max.emails_per_s, end_to_end_max.sent
    ));
    let mut e2e_rates: Vec<(String, f64)> = opts
        .fractions
        .iter()
        .map(|f| {
            (
                format!("{:.0} % of max", f * 100.0),
                end_to_end_max.emails_per_s * f,
            )
        })
        .collect();
    e2e_rates.push((format!("{:.0}/s", opts.target_rate), opts.target_rate));
    let mut end_to_end_paced = vec![];
    for (label, rate) in e2e_rates {
        let n = ((rate * opts.paced_secs).round() as usize).max(10);
        step(&format!(
            "end to end at {label} ({rate:.0}/s offered, {n} jobs)"
        ));
        let world_label = format!("e2e-{}", rate.round());
        let mut run =
            relay::end_to_end(&services, &sink, &world_label, Some(rate), n, &logs).await?;
        run.label = label;
        end_to_end_paced.push(run);
    }
    let rounds = if opts.rounds > 0 {
        Some(rounds_run(&services, &sink, &opts, &logs).await?)
    } else {
        None
    };
    step(&format!("dead letters: {} ingested, then replayed", opts.n));
    let dlq = dlq::run(&services, opts.n).await?;
    step(&format!("  {}", report::dlq_line(&dlq)));
    let relay = relay::RelayFigures {
        producers: relay::PRODUCERS,
        outbox_commits,
        outbox_commits_mysql,
        alone,
        end_to_end_max,
        end_to_end_paced,
    };
    sink.stop().await;

    let results = Results {
        machine: report::Machine::read(busy_before, loadavg_before),
        worker_env: std::env::vars()
            .filter(|(k, _)| k.starts_with("MAILROOM_") && !k.starts_with("MAILROOM_BENCH_"))
            .filter(|(k, _)| !k.starts_with("MAILROOM_TEST_"))
            .collect(),
        opts: opts.clone(),
        started_at,
        duration_s: started.elapsed().as_secs_f64(),
        raw_broker,
        raw_db,
        raw_smtp,
        worker_runs,
        paced_runs,
        one_at_a_time,
        relay,
        dlq,
        rounds,
    };
    let table = report::table(&results);
    println!("{table}");
    let json = opts.out.join("results.json");
    std::fs::write(&json, serde_json::to_vec_pretty(&results)?)?;
    std::fs::write(opts.out.join("table.md"), &table)?;
    let svg = opts.out.join("bench.svg");
    chart::draw(&results, &svg)?;
    println!(
        "wrote {}, {} and {} in {:.0} s",
        json.display(),
        opts.out.join("table.md").display(),
        svg.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
