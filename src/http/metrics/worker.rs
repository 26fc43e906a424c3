//! The worker's section of `/metrics`: deliveries by result (sent and retried by kind), dead
//! letters by kind and class, the gauges (in flight, session wait, the SMTP circuit), the claim
//! ledger's group commits and the two latency histograms.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::text::{counter, gauge, header, histogram_samples, sample};
use crate::worker::throttle::DomainCounts;
use crate::worker::{KindStats, Stats};

/// Writes the worker's section. `kinds` are the template kinds: each gets its `sent` and
/// `retried` series at 0 before its first job, so a rate over them starts at the first scrape.
pub fn write(out: &mut String, w: &Stats, kinds: &[String]) {
    counter(
        out,
        "mailroom_received_total",
        "Deliveries taken from the work queue.",
        w.received.load(Ordering::Relaxed),
    );
    by_kind(out, w, kinds);
    counter(
        out,
        "mailroom_duplicates_skipped_total",
        "Deliveries of jobs already sent or dead, acknowledged without sending.",
        w.duplicates.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_deferred_total",
        "Deliveries of jobs not due yet (send_at), parked in a delay tier without a claim.",
        w.deferred.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_suppressed_total",
        "Jobs not sent because every to address is on the suppression list.",
        w.suppressed.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_bounces_suppressed_total",
        "Addresses added to the suppression list after a hard bounce (5.1.1, 5.1.2, 5.1.10).",
        w.bounces_suppressed.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_held_total",
        "Deliveries held back by a sending limit (MAILROOM_SMTP_RATE, MAILROOM_DOMAIN_LIMITS, a slowed-down domain), parked in a delay tier without spending an attempt.",
        w.held.load(Ordering::Relaxed),
    );
    domains(out, w);
    dead_lettered(out, w);
    unsettled(out, w);
    gauges(out, w);
    ledger(out, w);
    latencies(out, w);
}

/// `mailroom_sent_total` and `mailroom_retried_total`, by kind.
fn by_kind(out: &mut String, w: &Stats, kinds: &[String]) {
    let mut all: BTreeMap<String, Arc<KindStats>> = w.kinds().into_iter().collect();
    for kind in kinds {
        all.entry(kind.clone()).or_default();
    }
    type Pick = fn(&KindStats) -> &AtomicU64;
    let families: [(&str, &str, Pick); 2] = [
        (
            "mailroom_sent_total",
            "Emails the SMTP server accepted and the ledger recorded, by kind.",
            |s| &s.sent,
        ),
        (
            "mailroom_retried_total",
            "Deliveries republished to a retry tier, by kind.",
            |s| &s.retried,
        ),
    ];
    for (name, help, pick) in families {
        header(out, name, "counter", help);
        for (kind, s) in &all {
            sample(
                out,
                name,
                &[("kind", kind)],
                pick(s).load(Ordering::Relaxed),
            );
        }
    }
}

/// The sending limits: the live workers sharing them, and per domain label (listed domains,
/// the rest as `other`) the emails sent, held back, the slow-downs and whether one is slowed.
fn domains(out: &mut String, w: &Stats) {
    let Some(throttle) = w.throttle().filter(|t| t.is_active()) else {
        return;
    };
    gauge(
        out,
        "mailroom_throttle_workers",
        "Live workers sharing the sending limits, as this worker last counted them.",
        throttle.workers(),
    );
    let counts = throttle.counts();
    type Pick = fn(&DomainCounts) -> u64;
    let families: [(&str, &str, Pick); 3] = [
        (
            "mailroom_domain_sent_total",
            "Emails the SMTP server accepted, by recipient domain (listed domains; the rest are other).",
            |c| c.sent,
        ),
        (
            "mailroom_domain_held_total",
            "Deliveries held back by a sending limit, by recipient domain.",
            |c| c.held,
        ),
        (
            "mailroom_domain_slow_downs_total",
            "Slow-down replies (421, 4.7.x) that halved the domain's rate.",
            |c| c.slow_downs,
        ),
    ];
    for (name, help, pick) in families {
        header(out, name, "counter", help);
        for (label, c, _) in &counts {
            sample(out, name, &[("domain", label)], pick(c));
        }
    }
    let name = "mailroom_domain_slowed";
    header(
        out,
        name,
        "gauge",
        "1 while the domain (or, for other, any unlisted domain) sends below its rate after a slow-down reply.",
    );
    for (label, _, slowed) in &counts {
        sample(out, name, &[("domain", label)], u64::from(*slowed));
    }
}

/// Dead letters by kind and error class.
fn dead_lettered(out: &mut String, w: &Stats) {
    let name = "mailroom_dead_lettered_total";
    header(
        out,
        name,
        "counter",
        "Jobs dead-lettered, by kind and error class.",
    );
    for ((kind, class), n) in w.dead_lettered_by() {
        sample(out, name, &[("kind", &kind), ("class", &class)], n);
    }
}

/// Settles the broker may have missed, claims given back unused, and windows left open.
fn unsettled(out: &mut String, w: &Stats) {
    counter(
        out,
        "mailroom_unsettled_total",
        "Acks or rejects the broker may not have seen (it redelivers them).",
        w.unsettled.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_claims_given_back_total",
        "Claims given back unused: their lease could no longer cover a whole send and its record.",
        w.given_back.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_deeper_places_total",
        "Places in line for an SMTP session taken deeper than the line proper, while sends were fast; a slow-down gives back at most one claim per deeper place.",
        w.deeper_places.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_open_windows_total",
        "Sends that may have reached the SMTP server without sent being recorded (a lost reply after the final dot, a record that failed, a claim taken over): each may explain one duplicate.",
        w.open_windows.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_smtp_rode_along_total",
        "Sends whose MAIL, RCPT and DATA went out behind the previous message's final dot on a busy connection (the server offers PIPELINING), saving their own round trip.",
        w.rode_along.load(Ordering::Relaxed),
    );
    counter(
        out,
        "mailroom_ledger_deleted_total",
        "Settled (sent or dead) ledger rows deleted past MAILROOM_LEDGER_RETENTION.",
        w.ledger_deleted.load(Ordering::Relaxed),
    );
}

/// The longest waits for an SMTP session (in line, and for the connection), the deliveries in
/// flight and the SMTP circuit.
fn gauges(out: &mut String, w: &Stats) {
    gauge(
        out,
        "mailroom_smtp_session_wait_max_seconds",
        "Longest wait of a delivery for its place in line for an SMTP session, before its claim.",
        w.longest_session_wait().as_secs_f64(),
    );
    gauge(
        out,
        "mailroom_smtp_connection_wait_max_seconds",
        "Longest wait of a claimed delivery for its SMTP connection (bounded by its lease).",
        w.longest_connection_wait().as_secs_f64(),
    );
    gauge(
        out,
        "mailroom_smtp_waiting",
        "Claimed deliveries waiting now for an SMTP session, every one in use; a send in progress takes the first along behind its final dot when the server offers PIPELINING.",
        w.smtp_waiting(),
    );
    gauge(
        out,
        "mailroom_in_flight",
        "Deliveries being processed now.",
        w.in_flight(),
    );
    if let Some(open) = w.circuit_open() {
        gauge(
            out,
            "mailroom_smtp_circuit_open",
            "1 while the SMTP circuit breaker is open (the server unreachable; consumption paused).",
            u8::from(open),
        );
    }
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
        (
            "mailroom_ledger_record_waits_total",
            "Groups of only records that waited (at most 5 ms) to share their commit: for a claim that was due, or for the records of claims granted with theirs.",
            &l.waits,
        ),
        (
            "mailroom_ledger_record_waits_alone_total",
            "Of those waits, the ones that ended without company (the records went alone).",
            &l.waits_alone,
        ),
    ] {
        counter(out, name, help, value.load(Ordering::Relaxed));
    }
}

/// SMTP durations by kind, a delivery's steps around the send, and the end-to-end latency.
fn latencies(out: &mut String, w: &Stats) {
    let name = "mailroom_smtp_duration_seconds";
    let help = "Duration of one SMTP send, whatever its result, by kind.";
    header(out, name, "histogram", help);
    for (kind, s) in w.kinds() {
        histogram_samples(out, name, &[("kind", &kind)], &s.smtp_latency);
    }
    let name = "mailroom_delivery_step_seconds";
    let help = "Time of a delivery's steps around its send: waiting for a place in line for an \
                SMTP session (place), its claim until committed (claim), claimed, waiting for a \
                connection (connection), its result until committed (record).";
    header(out, name, "histogram", help);
    for (step, h) in w.steps.named() {
        histogram_samples(out, name, &[("step", step)], h);
    }
    let name = "mailroom_end_to_end_seconds";
    let help = "From the job's created_at (outbox commit) to SMTP accepted.";
    header(out, name, "histogram", help);
    histogram_samples(out, name, &[], &w.end_to_end);
}
