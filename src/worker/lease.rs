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

/// Kept free at the end of every lease: scheduling delays between the fence and the first byte
/// on the wire, and clock rate differences between this host and the database's.
pub const LEASE_SAFETY: Duration = Duration::from_millis(500);
/// Time allowed to commit the result of a send (`sent`, or the failure) before the lease ends.
/// A record that takes longer (the database is down) is the documented window W2.
pub const RECORD_BUDGET: Duration = Duration::from_secs(1);
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
