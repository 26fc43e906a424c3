//! CPU and memory from `/proc`: who uses the two cores during a measurement. Processes are
//! grouped by role: the mailroom workers (by pid), RabbitMQ (`beam.smp`), PostgreSQL (every
//! `postgres` process, backends included), `smtp-sink`, and this bench process (the producer).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;

/// The roles CPU time is attributed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Worker,
    Broker,
    Postgres,
    SmtpSink,
    Bench,
}

/// Which pids play which role (the service roles are found by process name).
#[derive(Clone, Debug, Default)]
pub struct Roles {
    pub workers: Vec<u32>,
    pub smtp_sink: Option<u32>,
}

/// CPU seconds per pid and of the whole machine at one instant.
#[derive(Clone, Debug)]
pub struct Snapshot {
    at: Instant,
    pids: HashMap<u32, (Role, f64)>,
    /// (busy, total) jiffies of all cores, from the first line of /proc/stat.
    machine: (u64, u64),
}

/// Average CPU use over an interval, in % of one core (200 % = both cores of this machine).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuShare {
    pub worker: f64,
    pub broker: f64,
    pub postgres: f64,
    pub smtp_sink: f64,
    pub bench: f64,
    /// Everything busy on the machine (all processes, kernel included).
    pub machine_busy: f64,
    /// Cores of the machine × 100.
    pub machine_capacity: f64,
    /// CPU seconds the workers used in the interval.
    pub worker_cpu_s: f64,
    pub seconds: f64,
}

impl CpuShare {
    /// The role using the most CPU, with its share.
    pub fn top(&self) -> (&'static str, f64) {
        [
            ("mailroom worker", self.worker),
            ("RabbitMQ", self.broker),
            ("PostgreSQL", self.postgres),
            ("smtp-sink", self.smtp_sink),
            ("bench (producer)", self.bench),
        ]
        .into_iter()
        .fold(("none", 0.0), |a, b| if b.1 > a.1 { b } else { a })
    }
}

fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after its closing ')' are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clk_tck())
}

/// A `VmXxx:` line of /proc/<pid>/status, in KiB.
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Peak resident set (VmHWM) in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    status_kib(pid, "VmHWM:").map(|k| k as f64 / 1024.0)
}

/// How busy the whole machine is over `d` (% of one core; cores × 100 = fully busy): other
/// work on the box (a build, another benchmark) makes every figure pessimistic.
pub async fn machine_busy(d: std::time::Duration) -> f64 {
    let a = machine();
    tokio::time::sleep(d).await;
    let b = machine();
    let (busy, total) = (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1));
    if total == 0 {
        return 0.0;
    }
    busy as f64 / total as f64 * cores() as f64 * 100.0
}

fn machine() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is already in user)
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn pids_named(names: &[(&str, Role)]) -> Vec<(u32, Role)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let comm = comm.trim();
            names
                .iter()
                .find(|(n, _)| *n == comm)
                .map(|(_, role)| (pid, *role))
        })
        .collect()
}

/// The pids of the processes named one of `names` (their `comm`).
pub fn pids_with_names(names: &[&str]) -> Vec<u32> {
    let named: Vec<(&str, Role)> = names.iter().map(|n| (*n, Role::Bench)).collect();
    pids_named(&named).into_iter().map(|(pid, _)| pid).collect()
}

impl Snapshot {
    pub fn take(roles: &Roles) -> Snapshot {
        let mut list = pids_named(&[("beam.smp", Role::Broker), ("postgres", Role::Postgres)]);
        list.extend(roles.workers.iter().map(|p| (*p, Role::Worker)));
        list.extend(roles.smtp_sink.map(|p| (p, Role::SmtpSink)));
        list.push((std::process::id(), Role::Bench));
        let pids = list
            .into_iter()
            .filter_map(|(pid, role)| Some((pid, (role, cpu_seconds(pid)?))))
            .collect();
        Snapshot {
            at: Instant::now(),
            pids,
            machine: machine(),
        }
    }

    /// CPU use between `self` (earlier) and `later`. A process that appeared in between (a new
    /// PostgreSQL backend) counts from zero; one that exited in between loses its last part.
    pub fn share_until(&self, later: &Snapshot) -> CpuShare {
        let secs = later.at.duration_since(self.at).as_secs_f64().max(1e-6);
        let mut used: HashMap<Role, f64> = HashMap::new();
        for (pid, (role, cpu)) in &later.pids {
            let before = self.pids.get(pid).map_or(0.0, |(_, c)| *c);
            *used.entry(*role).or_default() += (cpu - before).max(0.0);
        }
        let pct = |r: Role| used.get(&r).copied().unwrap_or(0.0) / secs * 100.0;
        let (busy, total) = (
            later.machine.0.saturating_sub(self.machine.0),
            later.machine.1.saturating_sub(self.machine.1),
        );
        let capacity = cores() as f64 * 100.0;
        CpuShare {
            worker: pct(Role::Worker),
            broker: pct(Role::Broker),
            postgres: pct(Role::Postgres),
            smtp_sink: pct(Role::SmtpSink),
            bench: pct(Role::Bench),
            machine_busy: if total == 0 {
                0.0
            } else {
                busy as f64 / total as f64 * capacity
            },
            machine_capacity: capacity,
            worker_cpu_s: used.get(&Role::Worker).copied().unwrap_or(0.0),
            seconds: secs,
        }
    }
}

/// PostgreSQL's processes at one instant, each with who it works for and its CPU seconds:
/// client sessions by their `application_name` (a mailroom process names its own after its
/// subcommand, `mailroom worker`, `mailroom relay`; the bench's producers leave it empty), the
/// server's own processes (WAL writer, checkpointer, autovacuum) by their `backend_type`.
#[derive(Clone, Debug, Default)]
pub struct PgSessions(HashMap<u32, (String, f64)>);

/// Who a PostgreSQL process works for, for [`PgSessions::per_email`].
fn pg_client(application_name: &str, backend_type: &str) -> &'static str {
    if application_name.starts_with("mailroom worker") {
        "worker"
    } else if application_name.starts_with("mailroom relay") && backend_type == "walsender" {
        "relay's WAL stream"
    } else if application_name.starts_with("mailroom relay") {
        "relay"
    } else if application_name == "mailroom bench"
        || (application_name.is_empty() && matches!(backend_type, "client backend" | "walsender"))
    {
        "producers and bench"
    } else if matches!(backend_type, "client backend" | "walsender") {
        "other clients"
    } else {
        "server processes"
    }
}

impl PgSessions {
    pub async fn take(pg: &mut sqlx::PgConnection) -> anyhow::Result<PgSessions> {
        let rows: Vec<(i32, Option<String>, Option<String>)> =
            sqlx::query_as("SELECT pid, application_name, backend_type FROM pg_stat_activity")
                .fetch_all(pg)
                .await?;
        Ok(PgSessions(
            rows.into_iter()
                .filter_map(|(pid, name, kind)| {
                    let pid = u32::try_from(pid).ok()?;
                    let client =
                        pg_client(name.as_deref().unwrap_or(""), kind.as_deref().unwrap_or(""));
                    Some((pid, (client.to_string(), cpu_seconds(pid)?)))
                })
                .collect(),
        ))
    }

    /// CPU µs per email by client between `self` (earlier) and `later`, largest first. A
    /// session opened in between counts from zero; one closed in between is missing.
    pub fn per_email(&self, later: &PgSessions, emails: f64) -> Vec<(String, f64)> {
        let mut used: HashMap<&str, f64> = HashMap::new();
        for (pid, (client, cpu)) in &later.0 {
            let before = self.0.get(pid).map_or(0.0, |(_, c)| *c);
            *used.entry(client).or_default() += (cpu - before).max(0.0);
        }
        let mut out: Vec<(String, f64)> = used
            .into_iter()
            .map(|(c, s)| (c.to_string(), s / emails.max(1.0) * 1e6))
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out
    }
}

/// `PostgreSQL by client: worker 120, server processes 9 µs/email`.
pub fn pg_clients_line(clients: &[(String, f64)]) -> String {
    let parts: Vec<String> = clients
        .iter()
        .map(|(c, us)| format!("{c} {us:.0}"))
        .collect();
    format!("PostgreSQL by client: {} µs/email", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_attributed_to_the_process_that_named_them() {
        assert_eq!(pg_client("mailroom worker", "client backend"), "worker");
        assert_eq!(pg_client("mailroom relay", "client backend"), "relay");
        assert_eq!(
            pg_client("mailroom relay (WAL wake-up)", "walsender"),
            "relay's WAL stream"
        );
        assert_eq!(pg_client("", "client backend"), "producers and bench");
        assert_eq!(
            pg_client("mailroom bench", "client backend"),
            "producers and bench"
        );
        assert_eq!(pg_client("mailroom run", "client backend"), "other clients");
        assert_eq!(pg_client("", "walwriter"), "server processes");
        let before = PgSessions(HashMap::from([
            (1, ("worker".to_string(), 1.0)),
            (2, ("relay".to_string(), 0.5)),
        ]));
        let later = PgSessions(HashMap::from([
            (1, ("worker".to_string(), 1.3)),
            (2, ("relay".to_string(), 0.6)),
            (3, ("relay".to_string(), 0.1)),
        ]));
        let per = before.per_email(&later, 1000.0);
        assert_eq!(per[0].0, "worker");
        assert!((per[0].1 - 300.0).abs() < 1e-6, "{per:?}");
        assert_eq!(per[1].0, "relay");
        assert!((per[1].1 - 200.0).abs() < 1e-6, "{per:?}");
    }
}
