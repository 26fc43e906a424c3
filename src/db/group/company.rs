//! When a group of only records waits for company. At moderate rates a worker's deliveries
//! rarely overlap: each claim and each record is a group of its own, two commits per email,
//! and the commits are what the database spends its time on (two durable commits cost it
//! several times what a claim and a record cost inside a group of ten). A claim cannot wait:
//! its email waits with it. A record can, a little: its email is accepted already, only the
//! delivery's ack waits for it. So a group holding only records waits up to
//! [`RECORD_LINGER`] for the next write, and goes with it in one commit.
//!
//! It waits only when the next write is known to come on its own. A write that arrives while
//! a record is unanswered (waiting, or being written) did not wait for that record: the
//! deliveries arrive independently of each other's ends, and [`Company`] counts such writes as
//! evidence. One job at a time (a producer that publishes the next job once the last is
//! recorded) never shows one, so its records never wait and the floor (claim → accepted +
//! recorded, one job at a time) is kept. It waits only when the next claim is due within the
//! linger (the mean gap between claims says so), and a wait that ends alone halves the
//! evidence, so a workload that turns from independent arrivals to one at a time stops
//! waiting after a few records.

use std::time::Duration;

use tokio::time::Instant;

/// The longest a group of only records waits for company. Far below the time a lease leaves
/// for the record of a send (`worker::lease::RECORD_BUDGET`, which asserts it), and it widens
/// the window in which a crash leaves a sent email unrecorded by at most this much.
pub const RECORD_LINGER: Duration = Duration::from_millis(5);

/// The most evidence kept: a workload that stops showing independent arrivals stops waiting
/// after at most this many lone waits (each halves it).
const MAX_EVIDENCE: u8 = 4;

/// The group writer's view of how writes arrive.
#[derive(Debug, Default)]
pub struct Company {
    /// Writes seen arriving while a record was unanswered, less what lone waits took away.
    evidence: u8,
    /// When the last claim arrived.
    last_claim: Option<Instant>,
    /// The mean gap between claims (moving average, each new gap weighing an eighth).
    gap: Option<Duration>,
}

impl Company {
    /// A write arrived at `now`, a claim or not, with `unanswered` records of other writes
    /// waiting or being written.
    pub fn arrived(&mut self, now: Instant, claim: bool, unanswered: usize) {
        if unanswered > 0 {
            self.evidence = (self.evidence + 1).min(MAX_EVIDENCE);
        }
        if claim {
            if let Some(last) = self.last_claim {
                let gap = now.saturating_duration_since(last);
                self.gap = Some(match self.gap {
                    Some(mean) => (mean * 7 + gap) / 8,
                    None => gap,
                });
            }
            self.last_claim = Some(now);
        }
    }

    /// Until when a group of only records, ready at `now`, waits for company; `None`: it goes
    /// at once.
    pub fn wait_until(&self, now: Instant) -> Option<Instant> {
        let (last, gap) = (self.last_claim?, self.gap?);
        let due = last + gap;
        let until = now + RECORD_LINGER;
        (self.evidence > 0 && due <= until).then_some(until)
    }

    /// A wait ended without company.
    pub fn waited_alone(&mut self) {
        self.evidence /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Claims arriving `gap` apart from `start`, `unanswered` records at each.
    fn claims(company: &mut Company, start: Instant, gap: Duration, n: u32, unanswered: usize) {
        for i in 0..n {
            company.arrived(start + gap * i, true, unanswered);
        }
    }

    #[test]
    fn records_of_one_job_at_a_time_never_wait() {
        let t = Instant::now();
        let mut company = Company::default();
        // Claim, record, claim, record…: every write arrives with nothing unanswered, however
        // close together.
        for i in 0..50u32 {
            let at = t + ms(2) * i;
            company.arrived(at, true, 0);
            company.arrived(at + ms(1), false, 0);
            assert_eq!(company.wait_until(at + ms(1)), None, "record {i}");
        }
    }

    #[test]
    fn records_wait_once_writes_arrive_independently_and_a_claim_is_due() {
        let t = Instant::now();
        let mut company = Company::default();
        // No claim seen yet: nothing is due.
        assert_eq!(company.wait_until(t), None);
        // Claims every 5 ms, one of them while a record was unanswered.
        claims(&mut company, t, ms(5), 4, 0);
        assert_eq!(company.wait_until(t + ms(17)), None, "no evidence yet");
        company.arrived(t + ms(20), true, 1);
        // The record of the last claim, ready 2 ms after it: the next claim is due in 3 ms.
        let ready = t + ms(22);
        assert_eq!(company.wait_until(ready), Some(ready + RECORD_LINGER));
    }

    #[test]
    fn records_do_not_wait_when_the_next_claim_is_not_due_within_the_linger() {
        let t = Instant::now();
        let mut company = Company::default();
        // Claims every 20 ms with evidence: a record ready 2 ms after a claim would wait 18.
        claims(&mut company, t, ms(20), 8, 1);
        let last = t + ms(20) * 7;
        assert_eq!(company.wait_until(last + ms(2)), None);
        // Ready 16 ms after the claim, the next one is due within the linger.
        assert!(company.wait_until(last + ms(16)).is_some());
    }

    #[test]
    fn lone_waits_halve_the_evidence_until_records_go_at_once() {
        let t = Instant::now();
        let mut company = Company::default();
        claims(&mut company, t, ms(5), 10, 1);
        let ready = t + ms(47);
        let mut waits = 0;
        while company.wait_until(ready).is_some() {
            company.waited_alone();
            waits += 1;
        }
        // Evidence is capped at 4: 4 → 2 → 1 → 0.
        assert_eq!(waits, 3);
    }

    #[test]
    fn the_mean_gap_follows_the_rate() {
        let t = Instant::now();
        let mut company = Company::default();
        claims(&mut company, t, ms(100), 3, 1);
        // Then claims every 4 ms: the mean falls below the linger within a few dozen.
        let fast = t + ms(200);
        claims(&mut company, fast, ms(4), 40, 1);
        let ready = fast + ms(4) * 39 + ms(1);
        assert_eq!(company.wait_until(ready), Some(ready + RECORD_LINGER));
    }
}
