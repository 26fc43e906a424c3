//! The measurements that need the outbox and `mailroom relay` (issue 3). Until the relay
//! exists they are reported as [`NEEDS_RELAY`]; the table, `results.json` and the chart already
//! have their places.
//!
//! How each one plugs in once `mailroom relay` and the `mailroom_outbox` table exist:
//! - **end to end** (`end_to_end`): a `Producer` (see `workload.rs`) that inserts job `i` into
//!   `mailroom_outbox (job_id, kind, payload)` in its own transaction from a pool of concurrent
//!   producers and returns the time its COMMIT returned; spawn `mailroom relay` next to the
//!   worker(s) (`workers.rs` spawns processes the same way); drive it with
//!   `workload::backlog` for the maximum rate and `workload::paced` at 25/50/90 % of that
//!   maximum (and at 500/s, the latency target) for commit → `sent_at` latency.
//! - **relay only** (`relay_only`): commit N outbox rows with no relay running, start the relay
//!   alone, time until `count(*) WHERE published_at IS NULL` is 0 and the queue holds N.
//! - **relay idle** (`relay_idle`): an empty outbox and a running relay; the difference of
//!   `xact_commit + xact_rollback` in `pg_stat_database` for the bench database over ~10 s,
//!   minus the bench's own two reads, is the relay's idle queries per second.

use serde::Serialize;

/// What the rows print until the relay exists.
pub const NEEDS_RELAY: &str = "needs relay (issue 3)";

/// A figure that could be measured, or why not.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Measured<T> {
    Done(T),
    Pending { pending: &'static str },
}

impl<T> Measured<T> {
    fn pending() -> Measured<T> {
        Measured::Pending {
            pending: NEEDS_RELAY,
        }
    }
}

/// End to end at one offered rate: outbox commit → SMTP accepted.
#[derive(Clone, Debug, Serialize)]
pub struct EndToEnd {
    /// Fraction of the measured maximum offered (None: the maximum itself).
    pub offered_fraction: Option<f64>,
    pub emails_per_s: f64,
    pub latency: crate::latency::Lat,
}

#[derive(Clone, Debug, Serialize)]
pub struct RelayFigures {
    /// Maximum rate, then the offered-rate points.
    pub end_to_end: Vec<(String, Measured<EndToEnd>)>,
    pub relay_rows_per_s: Measured<f64>,
    pub relay_idle_queries_per_s: Measured<f64>,
}

/// Whether this build of mailroom has a relay: `mailroom relay --help` succeeds.
pub fn relay_available() -> bool {
    std::process::Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .args(["relay", "--help"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The relay measurements. Today: the rows exist, the figures are pending.
pub fn measure(fractions: &[f64]) -> RelayFigures {
    // When the relay lands, replace the pending values with `end_to_end(...)`,
    // `relay_only(...)` and `relay_idle(...)` as described in this module's documentation,
    // gated on `relay_available()`.
    let mut end_to_end = vec![("max".to_string(), Measured::pending())];
    for f in fractions {
        end_to_end.push((format!("{:.0} % of max", f * 100.0), Measured::pending()));
    }
    end_to_end.push(("500/s offered".to_string(), Measured::pending()));
    RelayFigures {
        end_to_end,
        relay_rows_per_s: Measured::pending(),
        relay_idle_queries_per_s: Measured::pending(),
    }
}
