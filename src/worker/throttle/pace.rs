//! The two pieces of pure logic the throttle is made of, on a clock passed in (tests use a fake
//! one): a [`Bucket`] that spaces sends by a rate, and a [`Slowdown`] that halves a domain's rate
//! on a slow-down reply and gives it back additively (AIMD).

use std::time::{Duration, Instant};

/// The lowest fraction of its rate a domain is slowed down to.
pub const MIN_FACTOR: f64 = 1.0 / 32.0;
/// What a slowed domain gets back per second, as a fraction of its rate: from half to all of
/// it in 150 s.
pub const RECOVERY_PER_SECOND: f64 = 1.0 / 300.0;
/// Slow-down replies this soon after a halving are the same burst (sends already in flight when
/// the first reply came): they do not halve again.
pub const SAME_BURST: Duration = Duration::from_secs(2);

/// Spaces sends `interval` apart (a token bucket of one token, in the GCRA form): the next send
/// may start at `next`, and each send taken pushes it one interval on. Idle time earns no burst:
/// after a pause the rate resumes, it does not catch up.
#[derive(Clone, Debug)]
pub struct Bucket {
    interval: Duration,
    next: Option<Instant>,
}

impl Bucket {
    pub fn new(per_second: f64) -> Bucket {
        Bucket {
            interval: interval_of(per_second),
            next: None,
        }
    }

    /// A new rate (the fleet changed, or a slow-down): the next slot already given stays.
    pub fn set_rate(&mut self, per_second: f64) {
        self.interval = interval_of(per_second);
    }

    /// When a send asked for `now` may start.
    pub fn earliest(&self, now: Instant) -> Instant {
        self.next.filter(|next| *next > now).unwrap_or(now)
    }

    /// Takes the slot at `at` (from [`Bucket::earliest`]): the next one is an interval later.
    pub fn take(&mut self, at: Instant) {
        let from = self.next.map_or(at, |next| next.max(at));
        self.next = Some(from + self.interval);
    }

    /// Pushes the next slot to at least one interval after `now` (after a slow-down reply).
    pub fn pause(&mut self, now: Instant) {
        let after = now + self.interval;
        self.next = Some(self.next.map_or(after, |next| next.max(after)));
    }

    /// Whether the bucket has been idle long enough to be forgotten (nothing reserved ahead).
    pub fn is_idle(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| next <= now)
    }
}

fn interval_of(per_second: f64) -> Duration {
    // A rate of 1 a day at the least, so the interval stays a sane duration.
    Duration::from_secs_f64(1.0 / per_second.max(1.0 / 86_400.0))
}

/// A domain slowed down by a slow-down reply: the fraction of its rate it may use, halved at
/// each slow-down (not below [`MIN_FACTOR`]) and growing back by [`RECOVERY_PER_SECOND`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slowdown {
    factor_then: f64,
    since: Instant,
}

impl Slowdown {
    /// The slowdown after a slow-down reply at `now`, given the one before (if any).
    pub fn after(before: Option<Slowdown>, now: Instant) -> Slowdown {
        match before {
            Some(s) if now.saturating_duration_since(s.since) < SAME_BURST => s,
            _ => {
                let factor = before.map_or(1.0, |s| s.factor(now));
                Slowdown {
                    factor_then: (factor / 2.0).max(MIN_FACTOR),
                    since: now,
                }
            }
        }
    }

    /// The fraction of the rate usable at `now`.
    pub fn factor(&self, now: Instant) -> f64 {
        let recovered =
            now.saturating_duration_since(self.since).as_secs_f64() * RECOVERY_PER_SECOND;
        (self.factor_then + recovered).min(1.0)
    }

    /// Whether the whole rate is back.
    pub fn is_over(&self, now: Instant) -> bool {
        self.factor(now) >= 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_bucket_spaces_sends_by_its_rate_and_earns_no_burst_when_idle() {
        let t0 = Instant::now();
        let mut b = Bucket::new(5.0);
        assert_eq!(b.earliest(t0), t0);
        b.take(t0);
        assert_eq!(b.earliest(t0), t0 + ms(200));
        b.take(b.earliest(t0));
        assert_eq!(b.earliest(t0 + ms(10)), t0 + ms(400));
        // Idle for a second: the next send goes at once, the one after is spaced again.
        let later = t0 + ms(1400);
        assert!(b.is_idle(later));
        assert_eq!(b.earliest(later), later);
        b.take(later);
        assert_eq!(b.earliest(later), later + ms(200));
    }

    #[test]
    fn a_bucket_never_gives_more_than_its_rate_over_any_second() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0);
        let mut sent = Vec::new();
        let mut now = t0;
        while now < t0 + Duration::from_secs(5) {
            let at = b.earliest(now);
            b.take(at);
            sent.push(at);
            now += ms(7);
        }
        for (i, start) in sent.iter().enumerate() {
            let in_window = sent[i..]
                .iter()
                .take_while(|t| **t < *start + Duration::from_secs(1))
                .count();
            assert!(in_window <= 10, "{in_window} sends within a second");
        }
        assert!(sent.len() >= 49, "{} sends in 5 s at 10/s", sent.len());
    }

    #[test]
    fn a_new_rate_applies_from_the_next_send() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0);
        b.take(t0);
        b.set_rate(2.0);
        assert_eq!(b.earliest(t0), t0 + ms(100));
        b.take(t0 + ms(100));
        assert_eq!(b.earliest(t0), t0 + ms(600));
    }

    #[test]
    fn a_pause_pushes_the_next_send_one_interval_out() {
        let t0 = Instant::now();
        let mut b = Bucket::new(4.0);
        b.pause(t0);
        assert_eq!(b.earliest(t0), t0 + ms(250));
    }

    #[test]
    fn a_slowdown_halves_then_recovers_additively() {
        let t0 = Instant::now();
        let s = Slowdown::after(None, t0);
        assert_eq!(s.factor(t0), 0.5);
        assert!((s.factor(t0 + Duration::from_secs(30)) - 0.6).abs() < 1e-9);
        assert!(!s.is_over(t0 + Duration::from_secs(149)));
        assert!(s.is_over(t0 + Duration::from_secs(150)));
        // A second slow-down later halves what had recovered.
        let again = Slowdown::after(Some(s), t0 + Duration::from_secs(30));
        assert!((again.factor(t0 + Duration::from_secs(30)) - 0.3).abs() < 1e-9);
    }

    #[test]
    fn replies_of_the_same_burst_halve_once() {
        let t0 = Instant::now();
        let s = Slowdown::after(None, t0);
        let same = Slowdown::after(Some(s), t0 + ms(500));
        assert_eq!(same, s);
        let next = Slowdown::after(Some(s), t0 + SAME_BURST);
        assert!(next.factor(t0 + SAME_BURST) < 0.26);
    }

    #[test]
    fn a_slowdown_never_goes_below_its_floor() {
        let t0 = Instant::now();
        let mut s = Slowdown::after(None, t0);
        for i in 1..20 {
            s = Slowdown::after(Some(s), t0 + SAME_BURST * i);
        }
        assert!(s.factor(s.since) >= MIN_FACTOR);
    }
}
