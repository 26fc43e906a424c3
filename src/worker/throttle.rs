//! Sending limits, enforced across the fleet without a database round trip per email: the
//! account's global rate (`MAILROOM_SMTP_RATE`) and each recipient domain's rate and
//! concurrency (`MAILROOM_DOMAIN_LIMITS`), with a domain slowed down (AIMD, [`pace`]) when the
//! server answers 4.7.x about it, and the whole server (the global rate) after a 421 that
//! closes the session ([`Throttle::slow_down_server`]).
//!
//! Each worker keeps its own buckets at its share of each limit: the limit divided by the live
//! workers of its namespace, which the heartbeat counts every beat ([`Throttle::set_workers`]).
//! The fleet's sum is the limit, up to one beat after a worker joins or leaves (a worker that
//! dies keeps its share until its row goes stale, 30 s, so the others then send below the
//! limit). Shares are equal, not by demand: a worker with nothing to send leaves its share
//! unused. A domain's concurrency is shared the same way, at least one per worker.
//!
//! A delivery asks before its claim ([`Throttle::admit`]): a send due within
//! [`WAIT_IN_PLACE`] waits for its slot, holding no claim; a later one is held back
//! ([`Admission::Hold`]): parked in a delay tier, unclaimed, no attempt spent, and the consumer
//! slot goes on to other domains.
//!
//! Counters per domain label (only listed domains have their own, the others are `other`) feed
//! `/metrics`.

pub mod pace;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::limits::{DomainLimits, Rate};
use pace::{Bucket, Slowdown};

/// A send due at most this far ahead waits for its slot in place; a later one is held back.
pub const WAIT_IN_PLACE: Duration = Duration::from_millis(200);
/// The rate a domain with no rate of its own is given when it answers a slow-down reply
/// (account-wide, shared by the workers), halved from there; the same for the whole server
/// after a 421 when `MAILROOM_SMTP_RATE` is not set.
pub const UNLIMITED_SLOWED_RATE: f64 = 10.0;
/// The metric label of every domain not listed in `MAILROOM_DOMAIN_LIMITS`.
pub const OTHER_DOMAIN: &str = "other";
/// Domains tracked before idle ones are forgotten.
const FORGET_ABOVE: usize = 4096;

/// What a delivery may do.
#[derive(Debug)]
pub enum Admission {
    /// Send after `wait` (at most [`WAIT_IN_PLACE`]); the pass holds the domains' concurrency.
    Go { wait: Duration, pass: Pass },
    /// Held back by `why` for about `wait`: park the job, unclaimed.
    Hold { wait: Duration, why: String },
}

/// The per-domain counters, by metric label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DomainCounts {
    /// Accepted by the SMTP server.
    pub sent: u64,
    /// Held back by a limit (the global rate or the domain's).
    pub held: u64,
    /// Slow-down replies that slowed the domain.
    pub slow_downs: u64,
}

/// The limits of one worker and its share of them.
#[derive(Debug)]
pub struct Throttle {
    global: Option<Rate>,
    limits: DomainLimits,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    workers: u32,
    global: Option<Bucket>,
    /// The server's slowdown after a 421 that closed the session (it slows the global rate).
    server: Option<Slowdown>,
    server_slow_downs: u64,
    domains: HashMap<String, Domain>,
    counts: BTreeMap<String, DomainCounts>,
}

#[derive(Debug, Default)]
struct Domain {
    bucket: Option<Bucket>,
    slowdown: Option<Slowdown>,
    in_flight: u32,
}

impl Throttle {
    pub fn new(global: Option<Rate>, limits: DomainLimits) -> Throttle {
        let mut counts = BTreeMap::new();
        for label in limits
            .domains
            .keys()
            .map(String::as_str)
            .chain([OTHER_DOMAIN])
        {
            counts.insert(label.to_owned(), DomainCounts::default());
        }
        let state = State {
            workers: 1,
            global: global.map(|r| Bucket::new(r.per_second())),
            counts,
            ..State::default()
        };
        Throttle {
            global,
            limits,
            state: Mutex::new(state),
        }
    }

    /// Whether any limit is configured (else every admission is an immediate go, and the
    /// heartbeat need not count the fleet).
    pub fn is_active(&self) -> bool {
        self.global.is_some() || self.limits.is_set()
    }

    /// Whether a slow-down reply slows its domain instead of counting as a failed attempt:
    /// when domain limits are configured.
    pub fn adapts(&self) -> bool {
        self.limits.is_set()
    }

    /// The live workers sharing the limits, as last counted.
    pub fn workers(&self) -> u32 {
        self.lock().workers
    }

    /// The fleet now counts `n` live workers (this one included): every share changes.
    pub fn set_workers(&self, n: u32) {
        let mut state = self.lock();
        state.workers = n.max(1);
        self.global_bucket(&mut state, Instant::now());
    }

    /// Asks to send to `domains` (lower case) at `now`.
    pub fn admit(self: &Arc<Self>, domains: &[String], now: Instant) -> Admission {
        let mut state = self.lock();
        if let Some(why) = self.concurrency_full(&state, domains) {
            self.count_held(&mut state, domains);
            return Admission::Hold {
                wait: Duration::ZERO,
                why,
            };
        }
        let mut at = self
            .global_bucket(&mut state, now)
            .map_or(now, |b| b.earliest(now));
        let mut why = "the global send rate (MAILROOM_SMTP_RATE)".to_owned();
        for domain in domains {
            if let Some(bucket) = self.domain_bucket(&mut state, domain, now) {
                let earliest = bucket.earliest(now);
                if earliest > at {
                    at = earliest;
                    why = format!("the send rate of {domain}");
                }
            }
        }
        let wait = at - now;
        if wait > WAIT_IN_PLACE {
            self.count_held(&mut state, domains);
            return Admission::Hold { wait, why };
        }
        if let Some(b) = state.global.as_mut() {
            b.take(at);
        }
        for domain in domains {
            let d = state.domains.entry(domain.clone()).or_default();
            if let Some(b) = d.bucket.as_mut() {
                b.take(at);
            }
            d.in_flight += 1;
        }
        if state.domains.len() > FORGET_ABOVE {
            forget_idle(&mut state, now);
        }
        let pass = Pass {
            throttle: self.clone(),
            domains: domains.to_vec(),
        };
        Admission::Go { wait, pass }
    }

    /// A slow-down reply (421, 4.7.x) from `domains` at `now`: halves their rate.
    pub fn slow_down(&self, domains: &[String], now: Instant) {
        let mut state = self.lock();
        for domain in domains {
            let d = state.domains.entry(domain.clone()).or_default();
            d.slowdown = Some(Slowdown::after(d.slowdown, now));
            if let Some(b) = self.domain_bucket(&mut state, domain, now) {
                b.pause(now);
            }
            let label = self.label(domain);
            state.counts.entry(label).or_default().slow_downs += 1;
        }
    }

    /// A 421 that is not about one domain (the server closes the session) at `now`: halves the
    /// global rate ([`UNLIMITED_SLOWED_RATE`] when there is none), AIMD like a domain's.
    pub fn slow_down_server(&self, now: Instant) {
        let mut state = self.lock();
        state.server = Some(Slowdown::after(state.server, now));
        state.server_slow_downs += 1;
        if let Some(b) = self.global_bucket(&mut state, now) {
            b.pause(now);
        }
    }

    /// The server's slow-downs (421s that closed the session) and whether it is slowed now.
    pub fn server(&self) -> (u64, bool) {
        let state = self.lock();
        let slowed = state.server.is_some_and(|s| !s.is_over(Instant::now()));
        (state.server_slow_downs, slowed)
    }

    /// One email to `domains` accepted by the SMTP server.
    pub fn count_sent(&self, domains: &[String]) {
        let mut state = self.lock();
        for domain in domains {
            let label = self.label(domain);
            state.counts.entry(label).or_default().sent += 1;
        }
    }

    /// The counters and, per label, whether a domain of it is slowed down now.
    pub fn counts(&self) -> Vec<(String, DomainCounts, bool)> {
        let state = self.lock();
        let now = Instant::now();
        let slowed = |label: &str| {
            state.domains.iter().any(|(domain, d)| {
                self.label(domain) == label && d.slowdown.is_some_and(|s| !s.is_over(now))
            })
        };
        state
            .counts
            .iter()
            .map(|(label, c)| (label.clone(), *c, slowed(label)))
            .collect()
    }

    /// The metric label of `domain`: itself when listed, else [`OTHER_DOMAIN`].
    pub fn label(&self, domain: &str) -> String {
        if self.limits.lists(domain) {
            domain.to_owned()
        } else {
            OTHER_DOMAIN.to_owned()
        }
    }

    /// Why a send to `domains` would exceed a domain's share of its concurrency, if it would.
    fn concurrency_full(&self, state: &State, domains: &[String]) -> Option<String> {
        domains.iter().find_map(|domain| {
            let limit = self.limits.of(domain).concurrency?;
            let share = (limit / state.workers).max(1);
            let in_flight = state.domains.get(domain).map_or(0, |d| d.in_flight);
            (in_flight >= share).then(|| {
                format!("{domain} has {in_flight} sends in flight, its share of max {limit}")
            })
        })
    }

    /// The global bucket at its current rate (this worker's share, slowed down), if there is a
    /// global rate or the server is slowed down.
    fn global_bucket<'s>(&self, state: &'s mut State, now: Instant) -> Option<&'s mut Bucket> {
        if state.server.is_some_and(|s| s.is_over(now)) {
            state.server = None;
        }
        let base = match (self.global, state.server) {
            (Some(rate), _) => rate.per_second(),
            (None, Some(_)) => UNLIMITED_SLOWED_RATE,
            (None, None) => {
                state.global = None;
                return None;
            }
        };
        let factor = state.server.map_or(1.0, |s| s.factor(now));
        let rate = base * factor / f64::from(state.workers);
        let bucket = state.global.get_or_insert_with(|| Bucket::new(rate));
        bucket.set_rate(rate);
        Some(bucket)
    }

    /// The bucket of `domain` at its current rate (its share, slowed down), if it has a rate.
    fn domain_bucket<'s>(
        &self,
        state: &'s mut State,
        domain: &str,
        now: Instant,
    ) -> Option<&'s mut Bucket> {
        let workers = f64::from(state.workers);
        let d = state.domains.entry(domain.to_owned()).or_default();
        if d.slowdown.is_some_and(|s| s.is_over(now)) {
            d.slowdown = None;
        }
        let base = match self.limits.of(domain).rate {
            Some(rate) => rate.per_second(),
            None if d.slowdown.is_some() => UNLIMITED_SLOWED_RATE,
            None => {
                d.bucket = None;
                return None;
            }
        };
        let factor = d.slowdown.map_or(1.0, |s| s.factor(now));
        let rate = base * factor / workers;
        let bucket = d.bucket.get_or_insert_with(|| Bucket::new(rate));
        bucket.set_rate(rate);
        Some(bucket)
    }

    fn count_held(&self, state: &mut State, domains: &[String]) {
        for domain in domains {
            let label = self.label(domain);
            state.counts.entry(label).or_default().held += 1;
        }
    }

    fn release(&self, domains: &[String]) {
        let mut state = self.lock();
        for domain in domains {
            if let Some(d) = state.domains.get_mut(domain) {
                d.in_flight = d.in_flight.saturating_sub(1);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Drops the domains with nothing in flight, nothing reserved and no slowdown.
fn forget_idle(state: &mut State, now: Instant) {
    state.domains.retain(|_, d| {
        d.in_flight > 0
            || d.slowdown.is_some_and(|s| !s.is_over(now))
            || d.bucket.as_ref().is_some_and(|b| !b.is_idle(now))
    });
}

/// A send admitted: holds its domains' concurrency until dropped.
#[derive(Debug)]
pub struct Pass {
    throttle: Arc<Throttle>,
    domains: Vec<String>,
}

impl Pass {
    /// The recipient domains of the send.
    pub fn domains(&self) -> &[String] {
        &self.domains
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.throttle.release(&self.domains);
    }
}

#[cfg(test)]
mod tests;
