//! The claim's deadline, enforced in code. A claim is exclusive until its lease ends; after that
//! another copy of the job may take it over and send. So a worker must never send on a claim it
//! cannot finish in time: it takes its place in line for an SMTP session *before* claiming
//! (waiting in line holds no lease), and after claiming it waits for a connection only while the
//! whole send (the SMTP timeout) and the record of its result still fit before the
//! [`Deadline`], and starts a send only if they do. Otherwise it gives the claim back unused.
//!
//! The line ([`reserved_ahead`]) lets up to one connection's worth of deliveries claim while
//! every connection is busy, so claims and their commits overlap the sends in progress instead
//! of holding a connection idle. Such a delivery has its connection within one whole send (the
//! line is fair and no longer than the connections), so it is allowed only when the lease
//! covers that wait on top of a whole send: with a shorter lease a slow server would make
//! claims be given back, and the worker waits for the connection before it claims, as before.
//!
//! The deadline is counted from the moment the worker *asked* for the claim, so it ends before
//! the lease the database wrote (`now() + lease` at commit, which is later), whatever the
//! database's clock says: no clock comparison between the worker and the database is needed.

use std::time::Duration;

use tokio::time::Instant;

use crate::smtp::line::Deeper;

/// Kept free at the end of every lease: scheduling delays between the fence and the first byte
/// on the wire, and clock rate differences between this host and the database's.
pub const LEASE_SAFETY: Duration = Duration::from_millis(500);
/// Time allowed to commit the result of a send (`sent`, or the failure) before the lease ends.
/// A record that takes longer (the database is down) is the documented window W1.
pub const RECORD_BUDGET: Duration = Duration::from_secs(1);
// A record may wait for company before its commit (`db::group::company`): that wait must be a
// small part of what the lease leaves the record.
const _: () =
    assert!(crate::db::group::RECORD_LINGER.as_millis() * 100 <= RECORD_BUDGET.as_millis());
/// Time allowed between asking for the claim and starting the send: the claim's commit (a
/// group commit may wait for the group ahead of it) and rendering.
pub const CLAIM_BUDGET: Duration = Duration::from_millis(500);

/// The last instant at which a claim may still be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(Instant);

impl Deadline {
    /// The deadline of a claim of `lease` asked for at `asked`.
    pub fn of_claim(asked: Instant, lease: Duration) -> Deadline {
        Deadline(asked + lease.saturating_sub(LEASE_SAFETY))
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether a send bounded by `smtp_timeout`, started now, and the record of its result
    /// both end before the deadline.
    pub fn covers_send(&self, smtp_timeout: Duration) -> bool {
        self.remaining() >= smtp_timeout + RECORD_BUDGET
    }

    /// How long a claimed delivery may still wait for its SMTP connection: until the whole send
    /// and its record would no longer fit (zero once they do not).
    pub fn wait_budget(&self, smtp_timeout: Duration) -> Duration {
        self.remaining()
            .saturating_sub(smtp_timeout + RECORD_BUDGET)
    }
}

/// Deliveries beyond the `connections` that may claim while every connection is busy:
/// `connections` when the lease covers a claim's longest wait for a connection (one whole send)
/// on top of a whole send ([`minimum_lease`]), else none.
pub fn reserved_ahead(lease: Duration, smtp_timeout: Duration, connections: u32) -> u32 {
    if lease >= minimum_lease(smtp_timeout) + smtp_timeout {
        connections
    } else {
        0
    }
}

/// The deeper line of a worker with `concurrency` deliveries: up to two connections' worth of
/// places beyond the line proper, as many as the deliveries can fill, and sends count as fast
/// while a claim at the back of the line, behind that many sends, waits at most half of what
/// its lease leaves for waiting (the lease beyond [`minimum_lease`]). `None` when no place is
/// left or the lease leaves no time to wait.
pub fn deeper_line(
    lease: Duration,
    smtp_timeout: Duration,
    connections: u32,
    concurrency: usize,
) -> Option<Deeper> {
    let connections = connections.max(1);
    let proper = connections + reserved_ahead(lease, smtp_timeout, connections);
    let free = u32::try_from(concurrency)
        .unwrap_or(u32::MAX)
        .saturating_sub(proper);
    let places = free.min(2 * connections);
    // Sends ahead of the last claim, in rounds of `connections` sends at once.
    let rounds = (proper - connections + places).div_ceil(connections);
    let waiting = lease.saturating_sub(minimum_lease(smtp_timeout));
    let fast = waiting / (2 * rounds.max(1));
    (places > 0 && !fast.is_zero()).then_some(Deeper { places, fast })
}

/// The shortest lease that covers a whole send: the claim, the send, the record, the margin.
pub fn minimum_lease(smtp_timeout: Duration) -> Duration {
    CLAIM_BUDGET + smtp_timeout + RECORD_BUDGET + LEASE_SAFETY
}

/// Checks the configuration's worst case at startup: a lease too short for one whole send would
/// make every claim be given back, and the job never sent. The message names both variables.
pub fn check(lease: Duration, smtp_timeout: Duration) -> Result<(), String> {
    let needed = minimum_lease(smtp_timeout);
    if lease >= needed {
        return Ok(());
    }
    let overhead = needed - smtp_timeout;
    let fitting = lease.saturating_sub(overhead);
    let fix = if fitting.is_zero() {
        format!("raise MAILROOM_LEASE to at least {}", human(needed))
    } else {
        format!(
            "raise MAILROOM_LEASE to at least {} or lower MAILROOM_SMTP_TIMEOUT to at most {}",
            human(needed),
            human(fitting)
        )
    };
    Err(format!(
        "MAILROOM_LEASE ({}) cannot cover one whole send: MAILROOM_SMTP_TIMEOUT ({}) plus {} to \
         claim, record and keep a margin; {fix}",
        human(lease),
        human(smtp_timeout),
        human(overhead)
    ))
}

fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_configuration_is_the_tightest_that_fits() {
        // MAILROOM_LEASE=5s with MAILROOM_SMTP_TIMEOUT=3s: 0.5 + 3 + 1 + 0.5.
        assert_eq!(
            minimum_lease(Duration::from_secs(3)),
            Duration::from_secs(5)
        );
        assert!(check(Duration::from_secs(5), Duration::from_secs(3)).is_ok());
        assert!(check(Duration::from_secs(120), Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn a_short_lease_names_both_variables_and_the_values_that_fit() {
        let e = check(Duration::from_secs(4), Duration::from_secs(3)).unwrap_err();
        assert!(e.contains("MAILROOM_LEASE (4s)"), "{e}");
        assert!(e.contains("MAILROOM_SMTP_TIMEOUT (3s)"), "{e}");
        assert!(e.contains("at least 5s"), "{e}");
        assert!(e.contains("at most 2s"), "{e}");
        let e = check(Duration::from_secs(1), Duration::from_secs(3)).unwrap_err();
        assert!(!e.contains("at most"), "{e}");
    }

    #[test]
    fn claims_go_ahead_of_the_connections_only_when_the_lease_covers_one_more_send() {
        let timeout = Duration::from_secs(3);
        // 5 s is the tightest lease for a 3 s send; waiting for another send needs 3 s more.
        assert_eq!(reserved_ahead(Duration::from_secs(5), timeout, 16), 0);
        assert_eq!(reserved_ahead(Duration::from_millis(7999), timeout, 16), 0);
        assert_eq!(reserved_ahead(Duration::from_secs(8), timeout, 16), 16);
        // The defaults: a 3 minute lease and a 60 s send.
        let (lease, timeout) = (Duration::from_secs(180), Duration::from_secs(60));
        assert_eq!(reserved_ahead(lease, timeout, 16), 16);
        assert_eq!(reserved_ahead(Duration::from_secs(120), timeout, 16), 0);
    }

    #[test]
    fn the_deeper_line_fills_the_deliveries_and_counts_sends_fast_within_half_the_wait() {
        let (lease, timeout) = (Duration::from_secs(180), Duration::from_secs(60));
        // The defaults: 16 connections, 16 ahead, 32 deeper places for 64 deliveries; a claim
        // at the back waits for 3 rounds of sends within half of 118 s.
        let deeper = deeper_line(lease, timeout, 16, 64).unwrap();
        assert_eq!(deeper.places, 32);
        assert_eq!(deeper.fast, Duration::from_secs(118) / 6);
        // No more places than the deliveries can take, none when they are all in line already.
        assert_eq!(deeper_line(lease, timeout, 16, 40).unwrap().places, 8);
        assert_eq!(deeper_line(lease, timeout, 16, 32), None);
        // Without the line ahead (a lease of 65 s leaves 3 s to wait): 2 rounds within 1.5 s.
        let short = deeper_line(Duration::from_secs(65), timeout, 16, 64).unwrap();
        assert_eq!((short.places, short.fast), (32, Duration::from_millis(750)));
        // The tightest lease leaves no time to wait in line.
        assert_eq!(deeper_line(Duration::from_secs(62), timeout, 16, 64), None);
    }

    #[test]
    fn the_wait_for_a_connection_ends_where_the_send_would_no_longer_fit() {
        let lease = Duration::from_secs(8);
        let timeout = Duration::from_secs(3);
        let fresh = Deadline::of_claim(Instant::now(), lease);
        // 7.5 s to the deadline, 4 s of them for the send and its record.
        let budget = fresh.wait_budget(timeout);
        assert!(budget <= Duration::from_millis(3500), "{budget:?}");
        assert!(budget > Duration::from_millis(3400), "{budget:?}");
        let late = Deadline::of_claim(Instant::now() - Duration::from_secs(4), lease);
        assert_eq!(late.wait_budget(timeout), Duration::ZERO);
    }

    #[test]
    fn a_deadline_covers_a_send_only_while_the_send_and_record_fit() {
        let lease = Duration::from_secs(5);
        let timeout = Duration::from_secs(3);
        let fresh = Deadline::of_claim(Instant::now(), lease);
        assert!(fresh.covers_send(timeout), "4.5 s left covers 3 s + 1 s");
        let late = Deadline::of_claim(Instant::now() - Duration::from_millis(600), lease);
        assert!(!late.covers_send(timeout), "3.9 s left does not");
        assert!(late.covers_send(Duration::from_secs(2)));
        let gone = Deadline::of_claim(Instant::now() - Duration::from_secs(10), lease);
        assert_eq!(gone.remaining(), Duration::ZERO);
    }
}
