//! The relay's section of `/metrics`: what became of the outbox rows it published, its wake-up
//! source, and the outbox backlog read from the database at scrape time.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::text::{counter, gauge, header, sample};
use crate::db::Database;
use crate::relay::{RelayStats, WakeupMode};

/// How long a scrape waits for the outbox queries: a scrape answers in bounded time, without
/// the backlog when the database is slow or down.
const DB_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes the relay's counters and wake-up mode.
pub fn write(out: &mut String, r: &RelayStats) {
    for (name, help, value) in [
        (
            "mailroom_relay_published_total",
            "Outbox rows published and confirmed.",
            &r.published,
        ),
        (
            "mailroom_relay_batches_total",
            "Claims of outbox rows that found some.",
            &r.batches,
        ),
        (
            "mailroom_relay_commits_total",
            "Commits of published marks; several batches share one at moderate rates.",
            &r.commits,
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
            "Wake-ups by the database: a notification, a WAL or binary log commit.",
            &r.woken,
        ),
    ] {
        counter(out, name, help, value.load(Ordering::Relaxed));
    }
    wakeup_mode(out, r.wakeup_mode());
    gauge(
        out,
        "mailroom_relay_wakeup_paused",
        "1 while the relay's WAL stream is paused because outbox rows come faster than it pays: \
         the relay probes the outbox instead.",
        u8::from(r.wakeup_paused.load(Ordering::Relaxed)),
    );
}

/// `mailroom_relay_wakeup_mode{mode="…"}`: 1 on the source that wakes the relay, 0 on the others.
fn wakeup_mode(out: &mut String, mode: WakeupMode) {
    let name = "mailroom_relay_wakeup_mode";
    let help = "Which source wakes the idle relay (1): wal, binlog, notify or poll.";
    header(out, name, "gauge", help);
    for m in WakeupMode::ALL {
        sample(out, name, &[("mode", m.as_str())], u8::from(m == mode));
    }
}

/// The outbox as the database sees it now: the age of the oldest pending row (the relay lag),
/// pending and parked rows. Left out (and logged) when the database does not answer in time,
/// so a scrape still shows everything else.
pub async fn outbox(out: &mut String, db: &Database) {
    let read = async { tokio::try_join!(db.oldest_unpublished_age(), db.outbox_backlog()) };
    let (age, (pending, parked)) = match tokio::time::timeout(DB_TIMEOUT, read).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return tracing::warn!(error = %e, "metrics: cannot read the outbox"),
        Err(_) => {
            return tracing::warn!(timeout = ?DB_TIMEOUT, "metrics: the outbox did not answer in time");
        }
    };
    gauge(
        out,
        "mailroom_relay_lag_seconds",
        "Age of the oldest pending (unpublished, unparked) outbox row (0 when none).",
        age.unwrap_or(0.0),
    );
    gauge(
        out,
        "mailroom_outbox_pending_rows",
        "Outbox rows waiting for the relay (unpublished, unparked).",
        pending,
    );
    gauge(
        out,
        "mailroom_outbox_parked_rows",
        "Outbox rows parked after repeated refusals by the broker: an operator's to look at.",
        parked,
    );
}
