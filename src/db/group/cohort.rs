//! Records that wait for the rest of their cohort. Deliveries that arrive together (a relay's
//! batch, a burst of publishes) are claimed in a group or two and send side by side, and their
//! records come back within a millisecond or two of each other. Each went as soon as the group
//! writer was free, so a batch of seven took one or two commits for its claims and three or
//! four for its records. A [`Cohort`] is the claims granted within [`COHORT_SPAN`] of each other (the
//! first delivery of a batch is claimed alone, as no claim waits, and the rest in the next
//! group a millisecond later); a group of only records, one of whose cohorts still has sends
//! out, waits up to [`super::RECORD_LINGER`] for them and takes them all in one commit. Like
//! any record's wait, it delays only the ack and `sent_at`: the emails are accepted already.
//!
//! A claim granted alone is a cohort of one, whose record has no one to wait for, so one job at
//! a time, and lone deliveries at moderate rates (200/s is one every 5 ms), never wait here. A
//! delivery that never records (its claim given back, its worker gone) leaves its cohort
//! waiting in vain at most one linger, and is forgotten after [`FORGET_AFTER`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

/// Claims granted together, by the group that granted them.
pub type Cohort = u64;

/// Claims granted this close to a cohort's first are in it: a batch's claims take a group or two
/// a millisecond or so apart; deliveries arriving on their own at 200/s are 5 ms apart.
pub const COHORT_SPAN: Duration = Duration::from_millis(2);

/// How long a claim granted in a cohort is remembered without its record: far beyond any send
/// the record's wait could still be for (the linger is milliseconds).
pub const FORGET_AFTER: Duration = Duration::from_secs(60);

/// The claims granted in cohorts whose records have not arrived.
#[derive(Debug, Default)]
pub struct Cohorts {
    /// Each such claim's cohort, by its token.
    of: HashMap<Uuid, Cohort>,
    /// Records still to come, per cohort.
    pending: HashMap<Cohort, usize>,
    /// Grants in the order they were made, to forget the claims that never record.
    granted: VecDeque<(Instant, Vec<Uuid>)>,
    /// The latest cohort and when its first claims were granted.
    open: Option<(Instant, Cohort)>,
    next: Cohort,
}

impl Cohorts {
    /// One group granted the claims of `tokens` at `now`: they join the latest cohort if it
    /// began within [`COHORT_SPAN`], else begin one.
    pub fn granted(&mut self, tokens: Vec<Uuid>, now: Instant) {
        self.forget_before(now.checked_sub(FORGET_AFTER));
        if tokens.is_empty() {
            return;
        }
        let cohort = match self.open {
            Some((began, cohort)) if now.saturating_duration_since(began) <= COHORT_SPAN => cohort,
            _ => {
                let cohort = self.next;
                self.next += 1;
                self.open = Some((now, cohort));
                cohort
            }
        };
        for token in &tokens {
            self.of.insert(*token, cohort);
        }
        *self.pending.entry(cohort).or_default() += tokens.len();
        self.granted.push_back((now, tokens));
    }

    /// The record of the claim with `token` arrived: its cohort, if it has one.
    pub fn recorded(&mut self, token: Uuid) -> Option<Cohort> {
        let cohort = self.of.remove(&token)?;
        self.one_less(cohort);
        Some(cohort)
    }

    fn one_less(&mut self, cohort: Cohort) {
        if let Some(left) = self.pending.get_mut(&cohort) {
            *left -= 1;
            if *left == 0 {
                self.pending.remove(&cohort);
            }
        }
    }

    /// Whether any of `cohorts` still has records to come.
    pub fn awaited(&self, mut cohorts: impl Iterator<Item = Cohort>) -> bool {
        cohorts.any(|c| self.pending.contains_key(&c))
    }

    fn forget_before(&mut self, cutoff: Option<Instant>) {
        let Some(cutoff) = cutoff else { return };
        while let Some((at, _)) = self.granted.front() {
            if *at >= cutoff {
                break;
            }
            let Some((_, tokens)) = self.granted.pop_front() else {
                break;
            };
            for token in tokens {
                if let Some(cohort) = self.of.remove(&token) {
                    self.one_less(cohort);
                }
            }
        }
    }

    /// Claims remembered (for tests).
    #[cfg(test)]
    pub fn remembered(&self) -> usize {
        self.of.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cohort_is_awaited_until_its_last_record() {
        let mut cohorts = Cohorts::default();
        let now = Instant::now();
        let tokens: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
        cohorts.granted(tokens.clone(), now);
        let first = cohorts.recorded(tokens[0]).expect("in a cohort");
        assert!(cohorts.awaited([first].into_iter()));
        assert_eq!(cohorts.recorded(tokens[1]), Some(first));
        assert!(cohorts.awaited([first].into_iter()));
        assert_eq!(cohorts.recorded(tokens[2]), Some(first));
        assert!(!cohorts.awaited([first].into_iter()), "all recorded");
        assert_eq!(cohorts.recorded(tokens[2]), None, "recorded once");
        assert_eq!(cohorts.remembered(), 0);
    }

    #[test]
    fn a_claim_granted_alone_has_no_one_to_wait_for() {
        let mut cohorts = Cohorts::default();
        let token = Uuid::new_v4();
        cohorts.granted(vec![token], Instant::now());
        let cohort = cohorts.recorded(token).unwrap();
        assert!(!cohorts.awaited([cohort].into_iter()));
    }

    #[test]
    fn claims_granted_within_the_span_are_one_cohort_and_later_ones_another() {
        let mut cohorts = Cohorts::default();
        let now = Instant::now();
        let ms = Duration::from_millis;
        let t: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        // A batch's first delivery claimed alone, the rest a millisecond later.
        cohorts.granted(vec![t[0]], now);
        cohorts.granted(vec![t[1], t[2]], now + ms(1));
        // Past the span from the cohort's first grant: the next one.
        cohorts.granted(vec![t[3]], now + COHORT_SPAN + ms(1));
        let first = cohorts.recorded(t[0]).unwrap();
        assert!(cohorts.awaited([first].into_iter()), "two more to come");
        assert_eq!(cohorts.recorded(t[1]), Some(first));
        assert_eq!(cohorts.recorded(t[2]), Some(first));
        assert!(!cohorts.awaited([first].into_iter()));
        let next = cohorts.recorded(t[3]).unwrap();
        assert_ne!(next, first);
        assert!(!cohorts.awaited([next].into_iter()));
    }

    #[test]
    fn claims_that_never_record_are_forgotten() {
        let mut cohorts = Cohorts::default();
        let now = Instant::now();
        let stale: Vec<Uuid> = (0..2).map(|_| Uuid::new_v4()).collect();
        cohorts.granted(stale.clone(), now);
        let cohort = cohorts.recorded(stale[0]).unwrap();
        // Its other delivery never records; a later group's grant forgets it.
        let fresh: Vec<Uuid> = (0..2).map(|_| Uuid::new_v4()).collect();
        cohorts.granted(fresh.clone(), now + FORGET_AFTER + Duration::from_secs(1));
        assert!(!cohorts.awaited([cohort].into_iter()));
        assert_eq!(cohorts.recorded(stale[1]), None);
        assert_eq!(cohorts.remembered(), 2, "only the fresh cohort");
    }
}
