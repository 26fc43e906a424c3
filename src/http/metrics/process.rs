//! What every mailroom process reports about itself: `mailroom_build_info` and the standard
//! process metrics (`process_*`, the names every Prometheus client library uses), read from
//! `/proc/self` at scrape time. On a system without `/proc` the process metrics are left out.

use std::time::Duration;

use super::text::{gauge, header, sample};

/// The kernel reports CPU times and the start time in clock ticks of `USER_HZ`, which Linux
/// fixes at 100 for user space on every architecture (`sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: f64 = 100.0;

/// The version of this build and the commit it was built from (`unknown` outside a git
/// checkout, unless `MAILROOM_GIT_COMMIT` was set at build time).
pub fn build_info(out: &mut String) {
    let name = "mailroom_build_info";
    header(
        out,
        name,
        "gauge",
        "The running build (1): version and git commit.",
    );
    let labels = [
        ("version", env!("CARGO_PKG_VERSION")),
        ("git", env!("MAILROOM_GIT_COMMIT")),
    ];
    sample(out, name, &labels, 1);
}

/// `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds` and
/// `process_start_time_seconds`, each when it can be read.
pub fn write(out: &mut String) {
    let Some(stat) = Stat::read() else {
        return;
    };
    let name = "process_cpu_seconds_total";
    header(
        out,
        name,
        "counter",
        "User and system CPU time spent, in seconds.",
    );
    sample(out, name, &[], stat.cpu.as_secs_f64());
    if let Some(rss) = resident_bytes() {
        let help = "Resident memory size in bytes.";
        gauge(out, "process_resident_memory_bytes", help, rss);
    }
    let help = "Virtual memory size in bytes.";
    gauge(
        out,
        "process_virtual_memory_bytes",
        help,
        stat.virtual_bytes,
    );
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        gauge(
            out,
            "process_open_fds",
            "Open file descriptors.",
            fds.count(),
        );
    }
    if let Some(max) = max_fds() {
        gauge(
            out,
            "process_max_fds",
            "Limit of open file descriptors.",
            max,
        );
    }
    if let Some(start) = stat.start_time() {
        let help = "Start time of the process since the Unix epoch, in seconds.";
        gauge(out, "process_start_time_seconds", help, start);
    }
}

/// The fields of `/proc/self/stat` we report.
struct Stat {
    cpu: Duration,
    /// Clock ticks from boot to the process start.
    start_ticks: u64,
    virtual_bytes: u64,
}

impl Stat {
    fn read() -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string("/proc/self/stat").ok()?)
    }

    /// Parses `/proc/<pid>/stat` (proc(5)): the command name, field 2, is in parentheses and
    /// may hold spaces or parentheses itself, so fields are counted after the last `)`.
    fn parse(text: &str) -> Option<Stat> {
        let after = &text[text.rfind(')')? + 1..];
        // Field 3 (state) is index 0 here.
        let fields: Vec<&str> = after.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let ticks = field(14)? + field(15)?;
        Some(Stat {
            cpu: Duration::from_secs_f64(ticks as f64 / TICKS_PER_SECOND),
            start_ticks: field(22)?,
            virtual_bytes: field(23)?,
        })
    }

    /// The start time in Unix seconds: the boot time (`btime` in `/proc/stat`) plus the ticks.
    fn start_time(&self) -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let boot: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
        Some(boot as f64 + self.start_ticks as f64 / TICKS_PER_SECOND)
    }
}

/// `VmRSS` of `/proc/self/status`, in bytes (the file gives kB, whatever the page size).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The soft limit on open files, from `/proc/self/limits` (`unlimited` is left out).
fn max_fds() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        // Fields 3..=23 of a real line, behind a name built to confuse a naive split.
        let line = "4242 (a b) (c)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 8 0 \
                    123456 987654321 2048 18446744073709551615";
        let stat = Stat::parse(line).unwrap();
        assert_eq!(stat.cpu, Duration::from_secs(3));
        assert_eq!(stat.start_ticks, 123_456);
        assert_eq!(stat.virtual_bytes, 987_654_321);
    }

    #[test]
    fn this_process_reports_its_cpu_memory_and_descriptors() {
        let mut out = String::new();
        write(&mut out);
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(out.contains(&format!("\n{name}")), "{name} in\n{out}");
        }
        let rss: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1e6, "{rss}");
    }
}
