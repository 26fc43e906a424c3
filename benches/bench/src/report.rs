//! The one table: every mailroom figure next to the raw limit it runs into, and the ratio.

use std::fmt::Write as _;

use serde::Serialize;

use crate::Results;
use crate::latency::{Lat, ms};
use crate::procstat::{self, CpuShare};
use crate::relay::{EndToEnd, OutboxCommits};
use crate::relay_alone::RelayAlone;

/// The machine the figures come from.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub note: &'static str,
    /// CPU busy (% of one core) in the second before the run, and the load average then.
    pub busy_before_pct: f64,
    pub loadavg_before: String,
}

impl Machine {
    pub fn read(busy_before_pct: f64, loadavg_before: String) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or("unknown".into(), |s| s.trim().to_string());
        let memory_gib = procstat_mem_kib() as f64 / 1024.0 / 1024.0;
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        Machine {
            cores: procstat::cores(),
            cpu,
            memory_gib,
            kernel,
            note: "RabbitMQ, PostgreSQL, smtp-sink, the workers and the bench share these cores; everything on loopback",
            busy_before_pct,
            loadavg_before,
        }
    }
}

fn procstat_mem_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// `12,345`
pub fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The slowest raw part a job passes through with `workers` processes: the limit mailroom runs
/// into. The SMTP figure is mailroom's `Mailer` with one worker's connection pool, and each process brings
/// its own pool, so it scales with the process count (up to what the server takes).
pub fn slowest(r: &Results, workers: usize) -> (String, f64) {
    let smtp_server = r
        .raw_smtp
        .smtp_source_rate
        .into_iter()
        .chain(r.raw_smtp.nodelay_rate)
        .fold(f64::INFINITY, f64::min);
    let smtp = (r.raw_smtp.rate * workers as f64).min(smtp_server);
    let smtp_name = if workers == 1 {
        "SMTP (`Mailer` → smtp-sink)".to_string()
    } else {
        format!("SMTP (`Mailer` → smtp-sink, {workers} pools)")
    };
    [
        ("RabbitMQ".to_string(), r.raw_broker.rate),
        (
            "PostgreSQL claim+record (group commit)".to_string(),
            r.raw_db.grouped_rate,
        ),
        (smtp_name, smtp),
    ]
    .into_iter()
    .fold(("none".to_string(), f64::INFINITY), |a, b| {
        if b.1 < a.1 { b } else { a }
    })
}

/// The raw parts together: the CPU per email each server spent in its own raw run. The
/// servers share the machine's cores with the workers: what they spend per email at a rate is
/// taken from what the cores have for the workers.
pub struct Together {
    pub broker_us: f64,
    pub postgres_us: f64,
    pub smtp_us: f64,
}

impl Together {
    pub fn of(r: &Results) -> Together {
        let us = |pct: f64, c: &CpuShare, n: usize| pct / 100.0 * c.seconds / n.max(1) as f64 * 1e6;
        let b = &r.raw_broker;
        let d = &r.raw_db;
        let s = &r.raw_smtp;
        Together {
            broker_us: us(b.drain_cpu.broker, &b.drain_cpu, b.n),
            postgres_us: us(d.grouped_cpu.postgres, &d.grouped_cpu, d.n),
            smtp_us: us(s.cpu.smtp_sink, &s.cpu, s.n),
        }
    }

    pub fn servers_us(&self) -> f64 {
        self.broker_us + self.postgres_us + self.smtp_us
    }

    /// CPU per email the cores leave a worker at `rate` emails/s, the servers spending what
    /// they spent in their raw runs.
    pub fn left_at(&self, cores: usize, rate: f64) -> f64 {
        cores as f64 * 1e6 / rate.max(1.0) - self.servers_us()
    }
}

/// Unloaded floor of one job inside a worker: claim + SMTP send + record, p50 each.
pub fn inside_floor_ms(r: &Results) -> f64 {
    r.raw_db.floor.p50 + r.raw_smtp.floor.p50
}

/// Unloaded floor of one job from publish: broker hop + claim + SMTP + record.
pub fn path_floor_ms(r: &Results) -> f64 {
    r.raw_broker.floor.p50 + inside_floor_ms(r)
}

fn cpu_line(c: &CpuShare) -> String {
    let ours = c.worker + c.broker + c.postgres + c.smtp_sink + c.bench;
    format!(
        "machine {:.0} % of {:.0} %: worker {:.0}, RabbitMQ {:.0}, PostgreSQL {:.0}, smtp-sink {:.0}, bench {:.0}, other processes {:.0}",
        c.machine_busy,
        c.machine_capacity,
        c.worker,
        c.broker,
        c.postgres,
        c.smtp_sink,
        c.bench,
        (c.machine_busy - ours).max(0.0)
    )
}

/// CPU per email of each process over a run that sent `emails`, µs: what each part costs,
/// beside [`cpu_line`]'s shares. The pipeline is mailroom + RabbitMQ + PostgreSQL (the SMTP
/// server and the bench left out). `mailroom` names the mailroom processes of the run.
fn cost_line(c: &CpuShare, emails: f64, mailroom: &str, wal: Option<f64>) -> String {
    cost_line_into(c, emails, mailroom, wal, "smtp-sink")
}

/// [`cost_line`] with the SMTP server's name.
fn cost_line_into(
    c: &CpuShare,
    emails: f64,
    mailroom: &str,
    wal: Option<f64>,
    smtp: &str,
) -> String {
    let us = |pct: f64| pct / 100.0 * c.seconds / emails.max(1.0) * 1e6;
    let wal = wal.map_or(String::new(), |b| {
        format!("; PostgreSQL WAL {b:.0} B/email")
    });
    format!(
        "{mailroom} {:.0}, RabbitMQ {:.0}, PostgreSQL {:.0}, {smtp} {:.0} µs/email; pipeline (mailroom + RabbitMQ + PostgreSQL) {:.0} µs/email{wal}",
        us(c.worker),
        us(c.broker),
        us(c.postgres),
        us(c.smtp_sink),
        us(c.worker + c.broker + c.postgres)
    )
}

/// The raw SMTP run through `Mailer` (`--only smtp`): messages/s and smtp-sink's and this
/// process's CPU per message, with messages riding behind sends in progress and without.
pub fn raw_smtp_lines(s: &crate::raw::RawSmtp) -> String {
    let line = |how: &str, rate: f64, c: &CpuShare| {
        let us = |pct: f64| pct / 100.0 * c.seconds / s.n.max(1) as f64 * 1e6;
        format!(
            "raw SMTP through Mailer, {how}: {rate:.0} msg/s; smtp-sink {:.1}, Mailer (the bench process) {:.1} µs/message; machine busy {:.0} %",
            us(c.smtp_sink),
            us(c.bench),
            c.machine_busy / c.machine_capacity * 100.0
        )
    };
    format!(
        "{}\n{}",
        line("riding behind sends in progress", s.rate, &s.cpu),
        line("each on its own round trips", s.alone_rate, &s.alone_cpu)
    )
}

/// One run of `Mailer` against smtp-sink behind a delaying proxy (`--only smtp`).
pub fn far_smtp_line(f: &crate::raw::FarSmtp) -> String {
    format!(
        "raw SMTP through Mailer, smtp-sink {} ms away (round trip, a delaying proxy), {} messages: riding along {:.0} msg/s (p50 {:.1} / p99 {:.1} ms), each on its own round trips {:.0} msg/s (p50 {:.1} / p99 {:.1} ms)",
        f.rtt_ms,
        f.n,
        f.along,
        f.along_lat.p50,
        f.along_lat.p99,
        f.alone,
        f.alone_lat.p50,
        f.alone_lat.p99
    )
}

/// [`cost_line`] of a worker-only run, with its WAL, and the means of the steps around the send
/// on a second line (`--only backlog` prints both).
pub fn backlog_cost(w: &crate::workers::BacklogRun) -> String {
    let cost = backlog_cpu_cost(w);
    match &w.steps {
        Some(steps) => format!("{cost}\nsteps around the send (first process, means): {steps}"),
        None => cost,
    }
}

/// [`cost_line`] of a worker-only run, with its WAL: one line, for the table (whose steps have
/// their own row).
fn backlog_cpu_cost(w: &crate::workers::BacklogRun) -> String {
    cost_line(&w.cpu, w.sent as f64, "worker", Some(w.wal_bytes_per_email))
}

/// [`cost_line`] of an end-to-end run (relay + worker), with its WAL.
pub fn end_to_end_cost(e: &crate::relay::EndToEnd) -> String {
    let mut text = format!(
        "{}\n{}\n{}",
        cpu_line(&e.cpu),
        cost_line(
            &e.cpu,
            e.sent as f64,
            "relay + worker",
            Some(e.wal_bytes_per_email),
        ),
        crate::procstat::pg_clients_line(&e.pg_clients)
    );
    text.push_str(&relay_suffix(e));
    text
}

/// What an email costs the whole machine end to end against what the producers' commit costs it
/// alone, and how busy each run kept the machine: the rates stand as (busy / cost) do, so the
/// ratio these figures give, the pipeline's share (everything beyond the commit), and what 0.6 of
/// the producers' rate would leave that share at the same busy shares.
pub fn budget_line(alone: &crate::relay::CommitRate, e: &crate::relay::EndToEnd) -> String {
    let commit = alone.machine_us_per_commit;
    let email = e.cpu.machine_busy / 100.0 * e.cpu.seconds / (e.sent.max(1) as f64) * 1e6;
    let capacity = e.cpu.machine_capacity.max(1.0);
    let busy_e2e = e.cpu.machine_busy / capacity;
    let busy_alone = commit * alone.per_s / 1e6 / (capacity / 100.0);
    if commit <= 0.0 || email <= 0.0 || busy_alone <= 0.0 {
        return "–".into();
    }
    let email_at_target = busy_e2e / busy_alone * commit / 0.6;
    format!(
        "an email {email:.0} µs of the machine's CPU end to end (machine {:.0} % busy), a commit alone {commit:.0} µs (machine {:.0} % busy; PostgreSQL {:.0}, the producers' client {:.0}): rates in the ratio {:.2}; the pipeline adds {:.0} µs per email, where 0.6 would leave it {:.0}",
        busy_e2e * 100.0,
        busy_alone * 100.0,
        alone.server_us_per_commit,
        alone.client_us_per_commit,
        (busy_e2e / email) / (busy_alone / commit),
        email - commit,
        email_at_target - commit,
    )
}

/// [`cost_line`] of a paced worker run, with its SMTP server.
pub fn paced_cost(p: &crate::workers::PacedRun) -> String {
    cost_line_into(&p.cpu, p.sent as f64, "worker", None, p.smtp)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}", a / b)
    } else {
        "–".into()
    }
}

fn lat_ratio(l: &Lat, floor: f64) -> String {
    if l.count == 0 || floor <= 0.0 {
        return "–".into();
    }
    format!("p50 ×{:.1}", l.p50 / floor)
}

/// The markdown table and, under it, what saturates first.
pub fn table(r: &Results) -> String {
    let mut t = String::new();
    let limit_for = |workers: usize| {
        let (name, limit) = slowest(r, workers);
        (
            format!("{name} {}/s (slowest raw part)", thousands(limit)),
            limit,
        )
    };
    let (limit_text, _) = limit_for(1);
    let _ = writeln!(
        t,
        "mailroom bench: N = {} jobs per worker run, {} cores ({}), RabbitMQ + PostgreSQL + smtp-sink + workers on one machine, loopback",
        thousands(r.opts.n as f64),
        r.machine.cores,
        r.machine.cpu
    );
    if cfg!(debug_assertions) {
        let _ = writeln!(
            t,
            "WARNING: a debug build (`--profile dev`, as CI runs it to check that the benchmark works): mailroom runs unoptimised and its figures are not its speed; `cargo bench` builds the release profile."
        );
    }
    if r.machine.busy_before_pct > 20.0 {
        let _ = writeln!(
            t,
            "WARNING: the machine was busy before the run ({:.0} % CPU, load {}): other work shares the cores and every figure is pessimistic.",
            r.machine.busy_before_pct, r.machine.loadavg_before
        );
    }
    if !r.worker_env.is_empty() {
        let _ = writeln!(t, "worker environment: {:?}", r.worker_env);
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "| measurement | mailroom | raw limit it runs into | ratio |"
    );
    let _ = writeln!(t, "| --- | ---: | --- | ---: |");
    let b = &r.raw_broker;
    let d = &r.raw_db;
    let s = &r.raw_smtp;
    let _ = writeln!(
        t,
        "| **raw** RabbitMQ: persistent publish + confirm (window {}) + consume (prefetch {}) + ack, quorum queue | – | {} msg/s; 1 at a time p50 {} ms | – |",
        b.window,
        b.prefetch,
        thousands(b.rate),
        ms(b.floor.p50)
    );
    let _ = writeln!(
        t,
        "| **raw** PostgreSQL: `Database::claim` + `Database::record(sent)`, {} clients: own commits / the worker's group commit (groups ≤ {}, mean {:.1}) | – | {} / {} pairs/s; 1 at a time p50 {} ms | – |",
        d.concurrency,
        d.group,
        d.mean_group,
        thousands(d.rate),
        thousands(d.grouped_rate),
        ms(d.floor.p50)
    );
    let _ = writeln!(
        t,
        "| **raw** SMTP: smtp-sink driven by mailroom's `Mailer` (its pool: lettre's protocol client on TCP_NODELAY sockets, {} connections, {} senders, {} B email; each message on its own round trips: {} msg/s) | – | {} msg/s; 1 at a time p50 {} ms | – |",
        s.connections,
        s.concurrency,
        s.message_bytes,
        thousands(s.alone_rate),
        thousands(s.rate),
        ms(s.floor.p50)
    );
    if let Some(src) = s.smtp_source_rate {
        let _ = writeln!(
            t,
            "| **raw** SMTP: smtp-sink driven by Postfix `smtp-source` (16 sessions) | – | {} msg/s | – |",
            thousands(src)
        );
    }
    if let (Some(rate), Some(floor)) = (s.nodelay_rate, &s.nodelay_floor) {
        let _ = writeln!(
            t,
            "| **raw** SMTP: smtp-sink driven by bare lettre `AsyncSmtpConnection`s on TCP_NODELAY sockets ({} connections, no pool, no timeout) | – | {} msg/s; 1 at a time p50 {} ms | – |",
            s.connections,
            thousands(rate),
            ms(floor.p50)
        );
    }
    let parts = Together::of(r);
    let target = 0.7 * d.grouped_rate;
    let _ = writeln!(
        t,
        "| **raw** parts together on these {} cores: the CPU each server spent per email in its own raw run: RabbitMQ consuming + acking a backlog {:.0} µs (alone {}/s), PostgreSQL grouped claim + record {:.0} µs, smtp-sink {:.0} µs | – | servers {:.0} µs/email: at 0.7 of the grouped limit ({}/s) the cores leave a worker {:.0} µs/email | – |",
        r.machine.cores,
        parts.broker_us,
        thousands(b.drain_rate),
        parts.postgres_us,
        parts.smtp_us,
        parts.servers_us(),
        thousands(target),
        parts.left_at(r.machine.cores, target)
    );
    for w in &r.worker_runs {
        let name = if w.workers == 1 {
            "**worker only**, 1 process".to_string()
        } else {
            format!("scaling: {} worker processes", w.workers)
        };
        let done = if w.complete {
            String::new()
        } else {
            format!(" (INCOMPLETE: {} of {})", w.sent, w.n)
        };
        let (limit_text, limit) = limit_for(w.workers);
        let _ = writeln!(
            t,
            "| {name}: emails/s (first claim → last accepted){done} | {} | {limit_text} | {} |",
            thousands(w.emails_per_s),
            ratio(w.emails_per_s, limit)
        );
        if let Some(steps) = &w.steps {
            let _ = writeln!(
                t,
                "| {name}: a delivery's steps around its send, means in the first process (`mailroom_delivery_step_seconds`) | {steps} | | |"
            );
        }
        if w.workers == 1 {
            let _ = writeln!(
                t,
                "| {name}: claim → accepted+recorded p50 / p95 / p99 | {} | claim + send + record, 1 at a time: {} ms | {} |",
                w.claim_to_sent.triple(),
                ms(inside_floor_ms(r)),
                lat_ratio(&w.claim_to_sent, inside_floor_ms(r))
            );
            let _ = writeln!(
                t,
                "| {name}: publish → accepted+recorded p50 / p95 / p99 (backlog: mostly queue position) | {} | drain time {:.1} s | – |",
                w.queue_to_sent.triple(),
                w.n as f64 / w.emails_per_s.max(1e-6)
            );
        }
        let rss = w.rss_mib.iter().cloned().fold(0.0, f64::max);
        let _ = writeln!(
            t,
            "| {name}: peak RSS (VmHWM) per process | {:.1} MiB | target ≤ 64 MiB | {} |",
            rss,
            ratio(rss, 64.0)
        );
        let _ = writeln!(
            t,
            "| {name}: worker CPU (all processes) | {:.0} % of a core, {:.0} µs/email | {:.0} % (all cores) | {} |",
            w.cpu.worker,
            w.worker_cpu_us_per_email,
            w.cpu.machine_capacity,
            ratio(w.cpu.worker, w.cpu.machine_capacity)
        );
        let _ = writeln!(t, "| {name}: CPU by process | {} | | |", cpu_line(&w.cpu));
        let _ = writeln!(
            t,
            "| {name}: CPU per email by process | {} | | |",
            backlog_cpu_cost(w)
        );
    }
    let floor = path_floor_ms(r);
    for p in &r.paced_runs {
        let done = if p.complete {
            String::new()
        } else {
            format!(" (INCOMPLETE: {} of {})", p.sent, p.n)
        };
        let _ = writeln!(
            t,
            "| worker path at {} ({:.0}/s offered): publish → accepted+recorded p50 / p95 / p99{done} | {} | broker hop + claim + send + record, 1 at a time: {} ms | {} |",
            p.label,
            p.offered_rate,
            p.latency.triple(),
            ms(floor),
            lat_ratio(&p.latency, floor)
        );
        let _ = writeln!(
            t,
            "| worker path at {}: where the time went | {} | | |",
            p.label,
            p.split.line()
        );
        let ledger = ledger_suffix(p);
        let _ = writeln!(
            t,
            "| worker path at {}: CPU per email by process | {}{ledger} | | |",
            p.label,
            paced_cost(p)
        );
    }
    let one = &r.one_at_a_time;
    let ledger = ledger_suffix(one);
    let _ = writeln!(
        t,
        "| {} | {}{ledger} | claim + send + record, 1 at a time (the raw parts): {} ms | {} |",
        one_at_a_time_label(one),
        one.split.after_claim.triple(),
        ms(inside_floor_ms(r)),
        lat_ratio(&one.split.after_claim, inside_floor_ms(r))
    );
    relay_rows(&mut t, r, &limit_text);
    let _ = writeln!(
        t,
        "| **dead letters**: {} letters ingested from the dead-letter queue, then all replayed (republished with confirms, marked): rows/s | ingest {} / replay {} | RabbitMQ {}/s | {:.2} |",
        thousands(r.dlq.n as f64),
        thousands(r.dlq.ingest_rows_per_s),
        thousands(r.dlq.replay_rows_per_s),
        thousands(r.raw_broker.rate),
        r.dlq.replay_rows_per_s / r.raw_broker.rate
    );
    if let Some(rounds) = &r.rounds {
        rounds_rows(&mut t, rounds);
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "{}", saturation(r));
    let _ = writeln!(
        t,
        "Latency clocks: claim and accepted+recorded are PostgreSQL `now()` (`created_at`, `sent_at`); publish is the bench's clock, shifted onto PostgreSQL's by the offset measured per run (same host, |offset| < 1 ms). End to end, a job counts from the moment its producer's COMMIT returned."
    );
    t
}

/// `; ledger: …` after a run's figures, when its worker logged its groups.
fn ledger_suffix(run: &crate::workers::PacedRun) -> String {
    run.ledger
        .as_deref()
        .map(|l| format!("; {l}"))
        .unwrap_or_default()
}

fn one_at_a_time_label(run: &crate::workers::PacedRun) -> String {
    format!(
        "worker, one job at a time ({} jobs, each published once the last is recorded: {:.0}/s): claim → accepted+recorded p50 / p95 / p99{}",
        run.n,
        run.offered_rate,
        incomplete(run.sent, run.n, run.complete)
    )
}

/// The one-at-a-time run in one line, for `--only recorder`.
pub fn one_at_a_time_line(run: &crate::workers::PacedRun) -> String {
    format!(
        "{} {}",
        one_at_a_time_label(run),
        run.split.after_claim.triple()
    )
}

pub fn incomplete(sent: i64, n: usize, complete: bool) -> String {
    if complete {
        String::new()
    } else {
        format!(" (INCOMPLETE: {sent} of {n})")
    }
}

/// What a wake-up mode of the producers' row puts in their way.
fn commit_mode_text(mode: &str) -> &'static str {
    match mode {
        "none" => "the producers alone (no relay, no trigger, no slot)",
        "poll" => "beside a relay that only probes (`--relay-wakeup poll`)",
        "trigger" => "beside a relay woken by the NOTIFY trigger in every transaction",
        "wal" => "beside a relay woken by the WAL from a temporary logical slot (no trigger)",
        "binlog" => "beside a relay woken by the binary log (followed as a replica)",
        _ => "",
    }
}

/// One engine's outbox commits: alone, and each wake-up's cost beside a relay.
fn commit_rows(t: &mut String, c: &OutboxCommits) {
    for m in &c.modes {
        let figure = match &m.unavailable {
            Some(why) => format!("unavailable: {why}"),
            None if m.server_us_per_commit > 0.0 => format!(
                "{}/s; PostgreSQL {:.0} µs of CPU per commit",
                thousands(m.per_s),
                m.server_us_per_commit
            ),
            None => format!("{}/s", thousands(m.per_s)),
        };
        let paused = if matches!(m.mode, "wal" | "binlog") {
            format!(
                " (stream paused at the end of {} of {} rounds)",
                m.paused_rounds,
                m.rounds.len()
            )
        } else {
            String::new()
        };
        let cost = c.cost_percent(m.mode).map_or("–".to_string(), |p| {
            format!("{p:+.1} % of the commit rate beside a probing relay{paused}; target ≤ 5 %")
        });
        let _ = writeln!(
            t,
            "| **{}** {}: `outbox::enqueue` + COMMIT, one row per transaction, {} producers, {}: {} | – | {figure} | {cost} |",
            if m.mode == "none" {
                "raw"
            } else {
                "wake-up cost"
            },
            c.engine,
            c.producers,
            m.mode,
            commit_mode_text(m.mode),
        );
    }
}

/// End to end (outbox commit → SMTP accepted), relay only, relay idle.
fn relay_rows(t: &mut String, r: &Results, limit_text: &str) {
    let rel = &r.relay;
    let max = &rel.end_to_end_max;
    for c in [&rel.outbox_commits, &rel.outbox_commits_mysql] {
        commit_rows(t, c);
    }
    let c = &rel.outbox_commits;
    let (mut limit_text, mut limit) = (limit_text.to_string(), slowest(r, 1).1);
    let commits = c.rate("none");
    if commits > 0.0 && commits < limit {
        limit = commits;
        limit_text = format!(
            "outbox commits, the producers alone {}/s (slowest raw part)",
            thousands(limit)
        );
    }
    let _ = writeln!(
        t,
        "| **end to end**, 1 relay + 1 worker, {} producers committing one outbox row each: emails/s (first commit → last accepted){} | {} | {limit_text} | {} |",
        rel.producers,
        incomplete(max.sent, max.n, max.complete),
        thousands(max.emails_per_s),
        ratio(max.emails_per_s, limit)
    );
    let _ = writeln!(
        t,
        "| end to end at full speed: commit → accepted+recorded p50 / p95 / p99 (backlog: mostly queue position; producers committed {}/s) | {} | – | – |",
        thousands(max.commit_rate),
        max.latency.triple()
    );
    let _ = writeln!(
        t,
        "| end to end at full speed: CPU per email by process (producers' commits included in PostgreSQL's) | {}; {}{} | | |",
        cost_line(
            &max.cpu,
            max.sent as f64,
            "relay + worker",
            Some(max.wal_bytes_per_email)
        ),
        crate::procstat::pg_clients_line(&max.pg_clients),
        relay_suffix(max)
    );
    if let Some(alone) = c.modes.iter().find(|m| m.mode == "none") {
        let _ = writeln!(
            t,
            "| end to end at full speed: the machine's CPU per email against a commit's alone | {} | | |",
            budget_line(alone, max)
        );
    }
    let floor = path_floor_ms(r);
    for p in &rel.end_to_end_paced {
        e2e_paced_row(t, p, floor);
    }
    for a in &rel.alone {
        relay_alone_rows(t, r, a);
    }
}

/// Relay only, idle and wake-up latency on one engine.
fn relay_alone_rows(t: &mut String, r: &Results, a: &RelayAlone) {
    let only = &a.relay_only;
    let _ = writeln!(
        t,
        "| **relay only** on {}: outbox → queue rows/s ({} rows committed at once, 1 relay): from the commit to the last published (includes waking up){} | {} | RabbitMQ {}/s | {} |",
        a.engine,
        thousands(only.n as f64),
        if only.complete { "" } else { " (INCOMPLETE)" },
        thousands(only.rows_per_s),
        thousands(r.raw_broker.rate),
        ratio(only.rows_per_s, r.raw_broker.rate)
    );
    let idle = &a.relay_idle;
    let mut detail = String::new();
    if !idle.commands.is_empty() {
        let by_kind: Vec<String> = idle
            .commands
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        let _ = write!(detail, "; {}", by_kind.join(", "));
    }
    if let Some(q) = idle.server_questions_per_s {
        let _ = write!(
            detail,
            "; server-wide `Questions` {q:.2}/s (every client of the server)"
        );
    }
    let _ = writeln!(
        t,
        "| **relay idle** on {}: {}/s ({}, {:.0} s: {} {}{detail}) | {:.2} | target ≤ 1/s | {} |",
        a.engine,
        idle.unit,
        idle.method,
        idle.window_s,
        idle.count,
        idle.unit,
        idle.per_s,
        ratio(idle.per_s, 1.0)
    );
    let w = &a.wake;
    let l = &w.latency;
    let (value, ratio_text) = if l.count == 0 {
        ("–".to_string(), "–".to_string())
    } else {
        (
            format!(
                "{} / {} / {} / {} ms",
                ms(l.p50),
                ms(l.p95),
                ms(l.p99),
                ms(l.max)
            ),
            format!(
                "p50 / max {:.2} / {:.2} of 1 s",
                l.p50 / 1000.0,
                l.max / 1000.0
            ),
        )
    };
    let _ = writeln!(
        t,
        "| **relay wake-up** on {}: commit → published p50 / p95 / p99 / max (`published_at - created_at`, {} of {} single rows committed to an idle relay, {:.1}–{:.1} s apart) | {value} | woken by: {} | {ratio_text} |",
        a.engine,
        w.published,
        w.rows,
        w.gap_s,
        w.gap_s + 1.0,
        wakeup_source(&a.wakeup)
    );
    let tr = &a.trickle;
    let l = &tr.latency;
    let value = if l.count == 0 {
        "–".to_string()
    } else {
        format!(
            "{} / {} / {} / {} ms",
            ms(l.p50),
            ms(l.p95),
            ms(l.p99),
            ms(l.max)
        )
    };
    let _ = writeln!(
        t,
        "| **end to end at {:.0} commits/s** on {}: commit → accepted+recorded p50 / p95 / p99 / max (the ledger's `sent_at` - the outbox's `created_at`, {} of {} single rows, 1 relay + 1 worker; the server logged {} B per email){} | {value} | woken by: {}; broker hop + claim + send + record, 1 at a time: {} ms (+ the relay's hop) | target p99 ≤ 50 ms: {} |",
        tr.rate,
        a.engine,
        tr.sent,
        tr.rows,
        thousands(tr.log_bytes_per_email),
        if tr.sent < tr.rows {
            " (INCOMPLETE)"
        } else {
            ""
        },
        wakeup_source(&a.wakeup),
        ms(path_floor_ms(r)),
        if l.count > 0 && l.p99 <= 50.0 {
            "✓"
        } else {
            "✗"
        }
    );
}

/// What a relay's wake-up mode means, for the table.
fn wakeup_source(mode: &str) -> String {
    match mode {
        "notify" => "NOTIFY from the outbox trigger".to_string(),
        "binlog" => "the binary log (the relay follows it as a replica)".to_string(),
        "poll" => "its own probes only (backing off to `--relay-poll-max`, 1 s)".to_string(),
        other => other.to_string(),
    }
}

fn e2e_paced_row(t: &mut String, p: &EndToEnd, floor: f64) {
    let _ = writeln!(
        t,
        "| end to end at {} ({:.0}/s offered): commit → accepted+recorded p50 / p95 / p99{} | {} | broker hop + claim + send + record, 1 at a time: {} ms (+ the relay's hop) | {} |",
        p.label,
        p.offered_rate.unwrap_or(0.0),
        incomplete(p.sent, p.n, p.complete),
        p.latency.triple(),
        ms(floor),
        lat_ratio(&p.latency, floor)
    );
    let _ = writeln!(
        t,
        "| end to end at {}: CPU per email by process | {}; {}{} | | |",
        p.label,
        cost_line(
            &p.cpu,
            p.sent as f64,
            "relay + worker",
            Some(p.wal_bytes_per_email)
        ),
        crate::procstat::pg_clients_line(&p.pg_clients),
        relay_suffix(p)
    );
}

/// `; relay: … commits for … batches` when the run's relay logged them.
fn relay_suffix(e: &crate::relay::EndToEnd) -> String {
    e.relay
        .as_ref()
        .map_or_else(String::new, |relay| format!("; {relay}"))
}

/// Which part saturates first, from the CPU shares of the worker runs.
pub fn saturation(r: &Results) -> String {
    let mut out = String::from("What saturates first:");
    for w in &r.worker_runs {
        let c = &w.cpu;
        let (top, share) = c.top();
        let full = c.machine_busy >= 0.9 * c.machine_capacity;
        let _ = write!(
            out,
            "\n- {} process(es): {} emails/s; the machine's CPU is {} ({:.0} % of {:.0} %), the largest user is {top} ({share:.0} %); {}.",
            w.workers,
            thousands(w.emails_per_s),
            if full { "saturated" } else { "not saturated" },
            c.machine_busy,
            c.machine_capacity,
            cpu_line(c)
        );
    }
    if let (Some(one), Some(last)) = (r.worker_runs.first(), r.worker_runs.last())
        && last.workers > one.workers
    {
        let _ = write!(
            out,
            "\n- {} → {} processes: throughput ×{:.2}.",
            one.workers,
            last.workers,
            last.emails_per_s / one.emails_per_s.max(1e-6)
        );
    }
    out
}

/// The line `--only dlq` prints.
pub fn dlq_line(d: &crate::dlq::DlqRun) -> String {
    format!(
        "dead letters: {} ingested at {} rows/s, then {} replayed at {} rows/s",
        d.n,
        thousands(d.ingest_rows_per_s),
        d.moved,
        thousands(d.replay_rows_per_s)
    )
}

/// The rows of the paired rounds: each round's figures, raw limit (or one process) and ratio,
/// and the median.
fn rounds_rows(t: &mut String, r: &crate::rounds::Rounds) {
    let scaling = r.scaling.as_ref().map(|(k, p)| {
        (
            format!(
                "scaling: {k} worker processes, each run right after the 1 process of its round: emails/s"
            ),
            p,
            "1 process, emails/s".to_string(),
        )
    });
    let rows = [
        (
            "worker only, 1 process, each run right after its own grouped claim + record limit: emails/s".to_string(),
            &r.worker,
            "PostgreSQL claim+record (group commit), pairs/s".to_string(),
        ),
        (
            "end to end, 1 relay + 1 worker behind 32 producers, each run right after the producers alone: emails/s".to_string(),
            &r.end_to_end,
            "outbox commits, the producers alone, /s".to_string(),
        ),
    ];
    for (what, p, limit) in rows.into_iter().chain(scaling) {
        let _ = writeln!(
            t,
            "| **paired rounds**: {what} | {} | {limit}: {} | {}; median **{}** |",
            joined(&p.ours, thousands),
            joined(&p.raw, thousands),
            joined(&p.ratios(), |v| format!("{v:.2}")),
            p.median().map_or("–".into(), |m| format!("{m:.2}"))
        );
    }
}

fn joined(v: &[f64], f: impl Fn(f64) -> String) -> String {
    v.iter().map(|&x| f(x)).collect::<Vec<_>>().join(" / ")
}

/// What `--only rounds` prints.
pub fn rounds_lines(r: &crate::rounds::Rounds) -> String {
    let mut t = String::new();
    rounds_rows(&mut t, r);
    t
}
