//! Counters of what the worker did, shared by its tasks. Tests and `/metrics`
//! ([`crate::http::metrics`]) read them; every settled delivery bumps a generation number that can be
//! awaited.
//!
//! Sent, retried, dead-lettered and the SMTP duration are also counted per kind ([`KindStats`]).
//! The kind is a label value, so it must come from a bounded set: the worker passes the kind only
//! when a template of that name exists, and [`OTHER_KIND`] for anything else a publisher made up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use super::histogram::{END_TO_END_BUCKETS, Histogram, SMTP_BUCKETS, STEP_BUCKETS};
use super::throttle::Throttle;
use crate::db::group::LedgerStats;

/// Counts by label pair, for the few labelled counters.
pub type LabelCounts = BTreeMap<(String, String), u64>;

/// The kind label of a job whose kind names no template (or that is no job at all): one value
/// for all of them, so that whoever can publish cannot create unbounded series.
pub const OTHER_KIND: &str = "other";

/// What the worker did with the jobs of one kind.
#[derive(Debug)]
pub struct KindStats {
    pub sent: AtomicU64,
    pub retried: AtomicU64,
    /// Duration of each SMTP send of this kind, whatever its result.
    pub smtp_latency: Histogram,
}

impl Default for KindStats {
    fn default() -> Self {
        KindStats {
            sent: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            smtp_latency: Histogram::new(SMTP_BUCKETS),
        }
    }
}

/// Counts since the worker started.
#[derive(Debug)]
pub struct Stats {
    pub received: AtomicU64,
    pub sent: AtomicU64,
    pub duplicates: AtomicU64,
    pub retried: AtomicU64,
    /// Deliveries of jobs not due yet (`send_at`), parked in a delay tier unclaimed.
    pub deferred: AtomicU64,
    /// Deliveries held back by a sending limit, parked in a delay tier unclaimed.
    pub held: AtomicU64,
    /// Jobs not sent because every `to` address is suppressed.
    pub suppressed: AtomicU64,
    /// Addresses suppressed after a hard bounce.
    pub bounces_suppressed: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Settle actions the broker may not have seen (ack on a closed channel, failed republish).
    pub unsettled: AtomicU64,
    /// Claims given back unused because their lease could not cover a whole send.
    pub given_back: AtomicU64,
    /// Places in line for an SMTP session taken deeper than the line proper, while sends were
    /// fast (`smtp::line`).
    pub deeper_places: AtomicU64,
    /// Sends that may have reached the server without `sent` being recorded by this claim: a
    /// reply lost after the final dot (W2), a `sent` that could not be committed (W1), or an
    /// accepted send whose claim had been taken over. Each can explain one duplicate.
    pub open_windows: AtomicU64,
    /// Sends whose MAIL, RCPT and DATA went out behind the previous message's final dot, on the
    /// connection that message's send handed over.
    pub rode_along: AtomicU64,
    /// Settled ledger rows deleted past the retention.
    pub ledger_deleted: AtomicU64,
    /// Longest wait for a place in line for an SMTP session so far, in microseconds (before
    /// any claim).
    longest_session_wait_us: AtomicU64,
    /// Longest wait of a claimed delivery for its SMTP connection so far, in microseconds.
    longest_connection_wait_us: AtomicU64,
    /// Dead-lettered, by (kind, error class).
    dead_by: Mutex<LabelCounts>,
    /// Sent, retried and SMTP durations by kind label.
    by_kind: Mutex<BTreeMap<String, Arc<KindStats>>>,
    in_flight: AtomicI64,
    /// Whether the SMTP circuit breaker is open (set once the worker is built).
    circuit: OnceLock<watch::Receiver<bool>>,
    /// The sending limits and their per-domain counters (set once the worker is built).
    throttle: OnceLock<Arc<Throttle>>,
    /// Deliveries waiting now for a busy SMTP session (set once the worker is built).
    smtp_line: OnceLock<crate::smtp::WaitingGauge>,
    /// Job `created_at` → SMTP accepted.
    pub end_to_end: Histogram,
    /// Where deliveries spend their time around the send.
    pub steps: Steps,
    /// The claim ledger's group commits.
    pub ledger: Arc<LedgerStats>,
    settled: watch::Sender<u64>,
}

/// The durations of a delivery's steps around its SMTP send (the send itself is each kind's
/// `smtp_latency`): what a worker's deliveries wait for, from its own side.
#[derive(Debug)]
pub struct Steps {
    /// Waiting for a place in line for an SMTP session, before the claim.
    pub place: Histogram,
    /// Asking for the claim until it is committed (the group commit's wait included).
    pub claim: Histogram,
    /// Claimed, waiting for an SMTP connection.
    pub connection: Histogram,
    /// Recording a result until it is committed (retries of a `sent` record included).
    pub record: Histogram,
}

impl Default for Steps {
    fn default() -> Self {
        Steps {
            place: Histogram::new(STEP_BUCKETS),
            claim: Histogram::new(STEP_BUCKETS),
            connection: Histogram::new(STEP_BUCKETS),
            record: Histogram::new(STEP_BUCKETS),
        }
    }
}

impl Steps {
    /// Each step's name (as `/metrics` labels it) with its histogram, in a delivery's order.
    pub fn named(&self) -> [(&'static str, &Histogram); 4] {
        [
            ("place", &self.place),
            ("claim", &self.claim),
            ("connection", &self.connection),
            ("record", &self.record),
        ]
    }

    /// The mean of each step, in a delivery's order with the SMTP send's mean (`send`) after
    /// `connection`, for a log line: `place=1.80ms claim=2.55ms … send=1.60ms record=2.43ms`.
    pub fn means(&self, send: Duration) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut parts: Vec<String> = self
            .named()
            .iter()
            .map(|(name, h)| format!("{name}={:.2}ms", ms(h.mean())))
            .collect();
        parts.insert(3, format!("send={:.2}ms", ms(send)));
        parts.join(" ")
    }
}

/// A snapshot of [`Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub received: u64,
    pub sent: u64,
    pub duplicates: u64,
    pub retried: u64,
    pub deferred: u64,
    pub held: u64,
    pub suppressed: u64,
    pub dead_lettered: u64,
    pub unsettled: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            held: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            bounces_suppressed: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            unsettled: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
            deeper_places: AtomicU64::new(0),
            open_windows: AtomicU64::new(0),
            rode_along: AtomicU64::new(0),
            ledger_deleted: AtomicU64::new(0),
            longest_session_wait_us: AtomicU64::new(0),
            longest_connection_wait_us: AtomicU64::new(0),
            dead_by: Mutex::default(),
            by_kind: Mutex::default(),
            in_flight: AtomicI64::new(0),
            circuit: OnceLock::new(),
            throttle: OnceLock::new(),
            smtp_line: OnceLock::new(),
            end_to_end: Histogram::new(END_TO_END_BUCKETS),
            steps: Steps::default(),
            ledger: Arc::default(),
            settled: watch::channel(0).0,
        }
    }
}

impl Stats {
    /// How long [`Stats::wait_until`] waits: longer than any test's honest wait (retry tiers,
    /// an expired lease), short enough that a stuck test fails instead of hanging CI.
    pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one dead letter of `kind` and `class` (also in the total).
    pub(crate) fn dead_lettered(&self, kind: &str, class: &str) {
        Stats::bump(&self.dead_lettered);
        let mut by = self.dead_by.lock().unwrap_or_else(|e| e.into_inner());
        *by.entry((kind.to_owned(), class.to_owned())).or_default() += 1;
    }

    /// Dead letters by (kind, class).
    pub fn dead_lettered_by(&self) -> LabelCounts {
        self.dead_by
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The counters of kind label `kind` (a template's name or [`OTHER_KIND`]).
    pub fn kind(&self, kind: &str) -> Arc<KindStats> {
        let mut by = self.by_kind.lock().unwrap_or_else(|e| e.into_inner());
        match by.get(kind) {
            Some(k) => k.clone(),
            None => by.entry(kind.to_owned()).or_default().clone(),
        }
    }

    /// Every kind label counted so far, with its counters, in label order.
    pub fn kinds(&self) -> Vec<(String, Arc<KindStats>)> {
        let by = self.by_kind.lock().unwrap_or_else(|e| e.into_inner());
        by.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The mean SMTP send over every kind; zero before the first.
    pub fn mean_send(&self) -> Duration {
        let (sum, count) = self.kinds().iter().fold((0.0, 0), |(sum, count), (_, k)| {
            (
                sum + k.smtp_latency.sum_seconds(),
                count + k.smtp_latency.count(),
            )
        });
        if count == 0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(sum / count as f64)
    }

    /// Follows the SMTP circuit breaker's state (`true`: open).
    pub(crate) fn follow_circuit(&self, open: watch::Receiver<bool>) {
        let _ = self.circuit.set(open);
    }

    pub(crate) fn follow_throttle(&self, throttle: Arc<Throttle>) {
        let _ = self.throttle.set(throttle);
    }

    pub(crate) fn follow_smtp_line(&self, line: crate::smtp::WaitingGauge) {
        let _ = self.smtp_line.set(line);
    }

    /// Claimed deliveries waiting now for an SMTP session, every one in use: a send in progress
    /// takes the first along behind its final dot (0 before a worker is built).
    pub fn smtp_waiting(&self) -> usize {
        self.smtp_line
            .get()
            .map_or(0, crate::smtp::WaitingGauge::get)
    }

    /// The worker's sending limits; `None` before a worker is built.
    pub fn throttle(&self) -> Option<&Arc<Throttle>> {
        self.throttle.get()
    }

    /// Whether the SMTP circuit is open; `None` before a worker follows it.
    pub fn circuit_open(&self) -> Option<bool> {
        self.circuit.get().map(|rx| *rx.borrow())
    }

    /// A delivery waited `wait` for its place in line for an SMTP session.
    pub(crate) fn observe_session_wait(&self, wait: std::time::Duration) {
        self.steps.place.observe(wait);
        longest(&self.longest_session_wait_us, wait);
    }

    /// The longest any delivery waited for its place in line for an SMTP session (it held no
    /// claim meanwhile).
    pub fn longest_session_wait(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.longest_session_wait_us.load(Ordering::Relaxed))
    }

    /// A claimed delivery waited `wait` for its SMTP connection.
    pub(crate) fn observe_connection_wait(&self, wait: std::time::Duration) {
        self.steps.connection.observe(wait);
        longest(&self.longest_connection_wait_us, wait);
    }

    /// The longest any claimed delivery waited for its SMTP connection (bounded by its lease).
    pub fn longest_connection_wait(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.longest_connection_wait_us.load(Ordering::Relaxed))
    }

    /// A delivery started (`+1`) or settled (`-1`).
    pub(crate) fn in_flight_add(&self, n: i64) {
        self.in_flight.fetch_add(n, Ordering::Relaxed);
    }

    /// Deliveries being processed now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Marks one delivery as settled and wakes whoever waits on [`Stats::wait_until`].
    pub(crate) fn settled(&self) {
        self.settled.send_modify(|n| *n += 1);
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            received: get(&self.received),
            sent: get(&self.sent),
            duplicates: get(&self.duplicates),
            retried: get(&self.retried),
            deferred: get(&self.deferred),
            held: get(&self.held),
            suppressed: get(&self.suppressed),
            dead_lettered: get(&self.dead_lettered),
            unsettled: get(&self.unsettled),
        }
    }

    /// Waits until `done` holds for a snapshot taken after a settle (or right away), for at
    /// most [`Stats::WAIT_LIMIT`].
    ///
    /// # Panics
    /// When `done` does not hold within the limit (a stuck job, or a count that jumped past
    /// an exact target, e.g. a duplicate): the message shows the last snapshot. A test helper:
    /// production code has nothing to wait for.
    pub async fn wait_until(&self, done: impl FnMut(&Snapshot) -> bool) {
        if let Err(e) = self.wait_until_within(Stats::WAIT_LIMIT, done).await {
            panic!("Stats::wait_until: {e}");
        }
    }

    /// Waits until `done` holds for a snapshot taken after a settle (or right away); gives up
    /// after `limit` with the last snapshot.
    pub async fn wait_until_within(
        &self,
        limit: Duration,
        mut done: impl FnMut(&Snapshot) -> bool,
    ) -> Result<Snapshot, WaitTimedOut> {
        let mut rx = self.settled.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let now = self.snapshot();
            if done(&now) {
                return Ok(now);
            }
            // `changed` cannot fail (`self` owns the sender); the deadline can pass.
            if !matches!(
                tokio::time::timeout_at(deadline, rx.changed()).await,
                Ok(Ok(()))
            ) {
                let last = self.snapshot();
                return match done(&last) {
                    true => Ok(last),
                    false => Err(WaitTimedOut { limit, last }),
                };
            }
        }
    }
}

/// [`Stats::wait_until_within`] ran out of time.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the condition did not hold within {limit:?}; last snapshot: {last:?}")]
pub struct WaitTimedOut {
    pub limit: Duration,
    pub last: Snapshot,
}

/// Raises `max_us` to `wait` in microseconds if it is longer.
fn longest(max_us: &AtomicU64, wait: std::time::Duration) {
    let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
    max_us.fetch_max(us, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_label_has_its_own_counters_listed_in_label_order() {
        let stats = Stats::default();
        Stats::bump(&stats.kind("welcome").sent);
        Stats::bump(&stats.kind(OTHER_KIND).retried);
        Stats::bump(&stats.kind("welcome").sent);
        let kinds: Vec<_> = stats
            .kinds()
            .into_iter()
            .map(|(k, s)| {
                (
                    k,
                    s.sent.load(Ordering::Relaxed),
                    s.retried.load(Ordering::Relaxed),
                )
            })
            .collect();
        assert_eq!(kinds, [("other".into(), 0, 1), ("welcome".into(), 2, 0)]);
    }

    #[test]
    fn the_steps_line_lists_each_mean_in_a_deliverys_order_with_the_send_over_every_kind() {
        let stats = Stats::default();
        stats.observe_session_wait(Duration::from_millis(1));
        stats.observe_session_wait(Duration::from_millis(3));
        stats.steps.claim.observe(Duration::from_micros(2500));
        stats.observe_connection_wait(Duration::from_micros(300));
        stats.steps.record.observe(Duration::from_millis(4));
        stats
            .kind("welcome")
            .smtp_latency
            .observe(Duration::from_millis(1));
        stats
            .kind("reset")
            .smtp_latency
            .observe(Duration::from_millis(2));
        stats
            .kind("reset")
            .smtp_latency
            .observe(Duration::from_millis(3));
        assert_eq!(stats.mean_send(), Duration::from_millis(2));
        assert_eq!(
            stats.steps.means(stats.mean_send()),
            "place=2.00ms claim=2.50ms connection=0.30ms send=2.00ms record=4.00ms"
        );
        assert_eq!(
            Stats::default().steps.means(Duration::ZERO),
            "place=0.00ms claim=0.00ms connection=0.00ms send=0.00ms record=0.00ms"
        );
    }

    #[tokio::test]
    async fn a_wait_whose_condition_never_holds_times_out_with_the_last_snapshot() {
        let stats = Stats::default();
        Stats::bump(&stats.sent);
        Stats::bump(&stats.sent);
        stats.settled();
        // Overshot: an exact target that a duplicate jumped past never holds.
        let e = stats
            .wait_until_within(Duration::from_millis(50), |s| s.sent == 1)
            .await
            .unwrap_err();
        assert_eq!(e.last.sent, 2);
        assert!(e.to_string().contains("sent: 2"), "{e}");
    }

    #[tokio::test]
    async fn a_wait_returns_once_a_settle_makes_the_condition_hold() {
        let stats = Arc::new(Stats::default());
        let settler = stats.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Stats::bump(&settler.sent);
            settler.settled();
        });
        let snap = stats
            .wait_until_within(Duration::from_secs(10), |s| s.sent == 1)
            .await
            .unwrap();
        assert_eq!(snap.sent, 1);
    }
}
