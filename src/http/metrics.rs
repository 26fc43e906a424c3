//! `/metrics` in the Prometheus text format (version 0.0.4), rendered at scrape time from the
//! counters the worker ([`Stats`]), the relay ([`RelayStats`]) and the template watcher
//! ([`LiveTemplates`]) already keep, plus the relay lag read from the outbox.
//!
//! Hand-rolled rather than the `prometheus-client` crate: about twenty series, two of them
//! histograms with fixed buckets, and counters that already exist as atomics. A registry would
//! mean counting everything a second time or wrapping every atomic; the exposition format is a
//! few lines of text, and one test parses what we print. The counting lives with the counters'
//! owners ([`Histogram`] with the worker); this module only reads and writes text.
//!
//! | name | type | labels |
//! | --- | --- | --- |
//! | `mailroom_received_total` | counter | |
//! | `mailroom_sent_total` | counter | |
//! | `mailroom_duplicates_skipped_total` | counter | |
//! | `mailroom_retried_total` | counter | |
//! | `mailroom_dead_lettered_total` | counter | `kind`, `class` |
//! | `mailroom_unsettled_total` | counter | |
//! | `mailroom_claims_given_back_total` | counter | (lease too short for a whole send) |
//! | `mailroom_smtp_session_wait_max_seconds` | gauge | (longest wait for an SMTP session) |
//! | `mailroom_in_flight` | gauge | |
//! | `mailroom_smtp_duration_seconds` | histogram | |
//! | `mailroom_end_to_end_seconds` | histogram | (job `created_at` → SMTP accepted) |
//! | `mailroom_ledger_groups_total`, `_writes_total`, `_split_total` | counter | (group commits) |
//! | `mailroom_relay_published_total`, `_refused_total`, `_parked_total`, `_blocked_total` | counter | |
//! | `mailroom_relay_lag_seconds` | gauge | (age of the oldest unpublished outbox row) |
//! | `mailroom_relay_woken_total` | counter | (wake-ups by a notification or the binary log) |
//! | `mailroom_relay_wakeup_mode` | gauge (1) | `mode` = `binlog` / `notify` / `poll` |
//! | `mailroom_template_reloads_total` | counter | `result` = `ok` / `failed` |
//! | `mailroom_template_revision` | gauge (1) | `revision` |

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::db::Database;
use crate::relay::{RelayStats, WakeupMode};
use crate::render::LiveTemplates;
use crate::worker::Stats;
use crate::worker::histogram::Histogram;

/// What a process can report; each part is present when the process runs it.
#[derive(Clone, Default)]
pub struct Metrics {
    pub worker: Option<Arc<Stats>>,
    pub relay: Option<Arc<RelayStats>>,
    pub templates: Option<Arc<LiveTemplates>>,
    /// For the relay lag, read at scrape time.
    pub db: Option<Database>,
}

impl Metrics {
    /// The exposition text.
    pub async fn render(&self) -> String {
        let mut out = String::new();
        if let Some(w) = &self.worker {
            worker(&mut out, w);
        }
        if let Some(r) = &self.relay {
            relay(&mut out, r);
        }
        if let Some(db) = &self.db {
            relay_lag(&mut out, db).await;
        }
        if let Some(t) = &self.templates {
            templates(&mut out, t);
        }
        out
    }
}

/// The worker's section: deliveries by result, the gauges, the ledger's group commits and the
/// two latency histograms.
fn worker(out: &mut String, w: &Stats) {
    deliveries(out, w);
    dead_lettered(out, w);
    unsettled(out, w);
    gauges(out, w);
    ledger(out, w);
    histogram(
        out,
        "mailroom_smtp_duration_seconds",
        "Duration of one SMTP send, whatever its result.",
        &w.smtp_latency,
    );
    histogram(
        out,
        "mailroom_end_to_end_seconds",
        "From the job's created_at (outbox commit) to SMTP accepted.",
        &w.end_to_end,
    );
}

/// What became of the deliveries: one counter per result.
fn deliveries(out: &mut String, w: &Stats) {
    let s = w.snapshot();
    for (name, help, value) in [
        (
            "mailroom_received_total",
            "Deliveries taken from the work queue.",
            s.received,
        ),
        (
            "mailroom_sent_total",
            "Emails the SMTP server accepted and the ledger recorded.",
            s.sent,
        ),
        (
            "mailroom_duplicates_skipped_total",
            "Deliveries of jobs already sent or dead, acknowledged without sending.",
            s.duplicates,
        ),
        (
            "mailroom_retried_total",
            "Deliveries republished to a retry tier.",
            s.retried,
        ),
    ] {
        counter(out, name, help, value);
    }
}

/// Dead letters by kind and error class.
fn dead_lettered(out: &mut String, w: &Stats) {
    header(
        out,
        "mailroom_dead_lettered_total",
        "counter",
        "Jobs dead-lettered, by kind and error class.",
    );
    for ((kind, class), n) in w.dead_lettered_by() {
        let _ = writeln!(
            out,
            "mailroom_dead_lettered_total{{kind=\"{}\",class=\"{}\"}} {n}",
            escape(&kind),
            escape(&class)
        );
    }
}

/// Settles the broker may have missed, and claims given back unused.
fn unsettled(out: &mut String, w: &Stats) {
    for (name, help, value) in [
        (
            "mailroom_unsettled_total",
            "Acks or rejects the broker may not have seen (it redelivers them).",
            w.unsettled.load(Ordering::Relaxed),
        ),
        (
            "mailroom_claims_given_back_total",
            "Claims given back unused: their lease could no longer cover a whole send and its record.",
            w.given_back.load(Ordering::Relaxed),
        ),
    ] {
        counter(out, name, help, value);
    }
}

/// The longest wait for an SMTP session, and the deliveries in flight.
fn gauges(out: &mut String, w: &Stats) {
    header(
        out,
        "mailroom_smtp_session_wait_max_seconds",
        "gauge",
        "Longest wait of a delivery for an SMTP session (the pool's cap), before its claim.",
    );
    let _ = writeln!(
        out,
        "mailroom_smtp_session_wait_max_seconds {}",
        w.longest_session_wait().as_secs_f64()
    );
    header(
        out,
        "mailroom_in_flight",
        "gauge",
        "Deliveries being processed now.",
    );
    let _ = writeln!(out, "mailroom_in_flight {}", w.in_flight());
}

/// The claim ledger's group commits.
fn ledger(out: &mut String, w: &Stats) {
    let l = &w.ledger;
    for (name, help, value) in [
        (
            "mailroom_ledger_groups_total",
            "Group commits of the claim ledger (claims and records of concurrent deliveries).",
            &l.groups,
        ),
        (
            "mailroom_ledger_writes_total",
            "Claims and records written in group commits; divided by groups, the mean group size.",
            &l.writes,
        ),
        (
            "mailroom_ledger_split_total",
            "Groups that failed on a statement and were written one by one.",
            &l.split,
        ),
    ] {
        counter(out, name, help, value.load(Ordering::Relaxed));
    }
}

/// The relay's section: what became of the outbox rows it published.
fn relay(out: &mut String, r: &RelayStats) {
    for (name, help, value) in [
        (
            "mailroom_relay_published_total",
            "Outbox rows published and confirmed.",
            &r.published,
        ),
        (
            "mailroom_relay_refused_total",
            "Publishes the broker refused (unroutable or nacked).",
            &r.refused,
        ),
        (
            "mailroom_relay_parked_total",
            "Outbox rows parked after repeated refusals.",
            &r.parked,
        ),
        (
            "mailroom_relay_blocked_total",
            "Batches rolled back because RabbitMQ blocked publishing (resource alarm).",
            &r.blocked,
        ),
        (
            "mailroom_relay_woken_total",
            "Wake-ups by the database: a notification or a binary log event.",
            &r.woken,
        ),
    ] {
        counter(out, name, help, value.load(Ordering::Relaxed));
    }
    relay_wakeup_mode(out, r.wakeup_mode());
}

/// `mailroom_relay_wakeup_mode{mode="…"}`: 1 on the source that wakes the relay, 0 on the others.
fn relay_wakeup_mode(out: &mut String, mode: WakeupMode) {
    let help = "Which source wakes the idle relay (1): binlog, notify or poll.";
    header(out, "mailroom_relay_wakeup_mode", "gauge", help);
    for m in WakeupMode::ALL {
        let on = u8::from(m == mode);
        let _ = writeln!(
            out,
            "mailroom_relay_wakeup_mode{{mode=\"{}\"}} {on}",
            m.as_str()
        );
    }
}

/// The age of the oldest unpublished row, read from the outbox now; left out (and logged) when
/// the database does not answer, so a scrape still shows the counters.
async fn relay_lag(out: &mut String, db: &Database) {
    match db.oldest_unpublished_age().await {
        Ok(age) => {
            header(
                out,
                "mailroom_relay_lag_seconds",
                "gauge",
                "Age of the oldest unpublished, unparked outbox row (0 when none).",
            );
            let _ = writeln!(out, "mailroom_relay_lag_seconds {}", age.unwrap_or(0.0));
        }
        Err(e) => tracing::warn!(error = %e, "metrics: cannot read the relay lag"),
    }
}

/// The template watcher's section: reloads by result, and the revision in use.
fn templates(out: &mut String, t: &LiveTemplates) {
    header(
        out,
        "mailroom_template_reloads_total",
        "counter",
        "Template directory reloads, by result.",
    );
    for (result, n) in [("ok", &t.reloads_ok), ("failed", &t.reloads_failed)] {
        let _ = writeln!(
            out,
            "mailroom_template_reloads_total{{result=\"{result}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    header(
        out,
        "mailroom_template_revision",
        "gauge",
        "The template revision in use (content hash), as a label.",
    );
    let revision = t.current().revision().to_owned();
    let _ = writeln!(
        out,
        "mailroom_template_revision{{revision=\"{}\"}} 1",
        escape(&revision)
    );
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    header(out, name, "histogram", help);
    for (bound, cumulative) in h.cumulative() {
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let count = h.count();
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {}", h.sum_seconds());
    let _ = writeln!(out, "{name}_count {count}");
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, "counter", help);
    let _ = writeln!(out, "{name} {value}");
}

/// Escapes a label value: backslash, double quote and line feed.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_inf() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        histogram(&mut out, "x_seconds", "test", &h);
        assert!(out.contains("x_seconds_bucket{le=\"0.1\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_sum 5.55\n"), "{out}");
        assert!(out.contains("x_seconds_count 3\n"), "{out}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
