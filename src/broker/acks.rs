//! Acks coalesced over a channel's settled delivery tags.
//!
//! A delivery's ack is still asked for one delivery at a time, only once its outcome is
//! recorded. What changes is the frame that carries it: when every delivery tag from the
//! lowest unsettled one up to an acked one is settled, one `basic.ack` with `multiple` set
//! carries all the acks of that run. The run is written once it holds [`AckPolicy::batch`]
//! acks, or once its oldest ack has waited [`AckPolicy::linger`]. An ack beyond a delivery that
//! is still being worked on waits for it at most the linger too, then goes out on its own.
//! Deliveries finish a little out of order (one SMTP reply is slower than the next), so
//! without the wait most acks would find a gap before them and go alone.
//!
//! An ack that waits holds no concurrency slot (the worker frees the slot once the outcome is
//! recorded), only one delivery of the channel's prefetch. So the batch is half the prefetch's
//! headroom over the concurrency, and acks waiting past a gap count towards it: the acks are
//! written while the other half still holds the next deliveries for the slots that free up,
//! and the waiting acks never keep a free slot from its next delivery.
//!
//! The broker applies a `multiple` ack to every unacked delivery at or below its tag, so it is
//! only ever written when each of those was settled here: acked (in this frame or an earlier
//! one) or rejected with the reject already written. A delivery that is still being processed,
//! one whose reject failed, and one that was never handed to the worker all leave a gap that no
//! `multiple` ack crosses. Delivery tags count up from 1 on each channel, so there is one
//! [`Acks`] per channel, and the channel must not be recovered under it (mailroom never turns
//! on lapin's automatic recovery, which would restart the tags).
//!
//! Why: with quorum queues every ack frame is a command through the queue's Raft log. At the
//! worker's full rate, one frame per group of acks instead of one per delivery costs RabbitMQ
//! and the worker less CPU per email (see docs/PERFORMANCE.md).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::Acker;
use lapin::options::BasicAckOptions;
use tokio::sync::{Notify, oneshot};

/// How long an ack may wait before it is written: for more acks to share its frame, or for a
/// delivery before it, still in flight, to be settled. An ack written 50 ms later delays
/// nothing a recipient or an operator sees (the outcome is recorded by then). At one worker's
/// full rate the batch fills long before; the linger is for a worker with a share of the
/// load (one of several processes, or a steady trickle), whose frames would otherwise carry a
/// few acks each, every frame a command through the quorum queue's log.
pub const ACK_LINGER: Duration = Duration::from_millis(50);

/// When the acks of a channel are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckPolicy {
    /// A run of this many acks is written at once.
    pub batch: usize,
    /// No ack waits longer than this.
    pub linger: Duration,
}

impl AckPolicy {
    /// The policy of a consuming channel with this prefetch, whose deliveries are worked on
    /// `concurrency` at a time: runs of half the prefetch's headroom over the concurrency (at
    /// least one: with no headroom each ack goes at once), each ack waiting [`ACK_LINGER`] at
    /// most.
    pub fn for_consumer(prefetch: u16, concurrency: usize) -> AckPolicy {
        AckPolicy {
            batch: (usize::from(prefetch).saturating_sub(concurrency) / 2).max(1),
            linger: ACK_LINGER,
        }
    }
}

/// The acks of one consuming channel. Cheap to share: clone the `Arc` it comes in.
pub struct Acks {
    shared: Arc<Shared>,
    flusher: tokio::task::JoinHandle<()>,
}

struct Shared {
    tags: Mutex<Tags<Waiter>>,
    policy: AckPolicy,
    wake: Notify,
    frames: AtomicU64,
    acks: AtomicU64,
}

/// Who asked for an ack: the delivery's acker (its channel) and where the result goes.
struct Waiter {
    acker: Acker,
    done: oneshot::Sender<lapin::Result<bool>>,
}

impl Acks {
    /// Acks for a channel that has delivered nothing yet. Must be called in a Tokio runtime: it
    /// spawns the task that writes the frames, which ends when the `Acks` is dropped.
    pub fn new(policy: AckPolicy) -> Arc<Acks> {
        let shared = Arc::new(Shared {
            tags: Mutex::new(Tags::new()),
            policy,
            wake: Notify::new(),
            frames: AtomicU64::new(0),
            acks: AtomicU64::new(0),
        });
        let flusher = tokio::spawn(flush(shared.clone()));
        Arc::new(Acks { shared, flusher })
    }

    /// Acks the delivery of `tag` (its `acker`): resolves once the frame that carries it is
    /// written (within the policy's linger), with what lapin said of that frame; `Ok(false)`
    /// when nothing was written for it: the channel is closed, or the delivery was settled
    /// already.
    pub async fn ack(&self, acker: &Acker, tag: u64) -> lapin::Result<bool> {
        let (done, result) = oneshot::channel();
        let waiter = Waiter {
            acker: acker.clone(),
            done,
        };
        let settled = self
            .shared
            .tags()
            .settle(tag, Some((waiter, Instant::now())));
        if settled.is_err() {
            return Ok(false);
        }
        self.shared.wake.notify_one();
        // The flusher ends only with the `Acks`, which `self` keeps alive.
        result.await.unwrap_or(Ok(false))
    }

    /// Counts the delivery of `tag` as settled by a reject that was written, so that a later
    /// `multiple` ack may cover it.
    pub fn rejected(&self, tag: u64) {
        let _ = self.shared.tags().settle(tag, None);
    }

    /// Ack frames written so far, and the acks they carried.
    pub fn written(&self) -> (u64, u64) {
        (
            self.shared.frames.load(Ordering::Relaxed),
            self.shared.acks.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Acks {
    fn drop(&mut self) {
        // Waiters left get `Ok(false)`, as on a closed channel.
        self.flusher.abort();
    }
}

impl Shared {
    fn tags(&self) -> std::sync::MutexGuard<'_, Tags<Waiter>> {
        self.tags.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Writes the frames each wake-up plans, one batch at a time: acks asked for while a batch is
/// being written go out together in the next one.
async fn flush(shared: Arc<Shared>) {
    let mut due = None;
    loop {
        match due {
            Some(due) => {
                tokio::select! {
                    _ = shared.wake.notified() => {}
                    _ = tokio::time::sleep_until(due) => {}
                }
            }
            None => shared.wake.notified().await,
        }
        let (frames, next) = shared.tags().plan(Instant::now(), shared.policy);
        due = next.map(tokio::time::Instant::from_std);
        let writes = frames.into_iter().map(|frame| {
            let shared = &shared;
            async move {
                let Some(top) = frame.waiters.last() else {
                    return;
                };
                let multiple = frame.waiters.len() > 1;
                let result = top.acker.ack(BasicAckOptions { multiple }).await;
                shared.frames.fetch_add(1, Ordering::Relaxed);
                shared
                    .acks
                    .fetch_add(frame.waiters.len() as u64, Ordering::Relaxed);
                for waiter in frame.waiters {
                    let _ = waiter.done.send(result.clone());
                }
            }
        });
        futures_util::future::join_all(writes).await;
    }
}

/// One ack frame to write: the acks it carries, the last one's tag being the frame's.
#[derive(Debug, PartialEq)]
pub(crate) struct Frame<W> {
    pub waiters: Vec<W>,
}

/// The settled delivery tags of a channel, and the acks still to write. Pure bookkeeping, kept
/// apart from the channel so it can be tested on its own.
#[derive(Debug)]
pub(crate) struct Tags<W> {
    /// Every tag below this one is settled and its frame planned.
    floor: u64,
    /// Settled tags at or above `floor`: `Some` for an ack not yet planned, `None` for a
    /// delivery already settled by a frame of its own (a reject, or an ack past a gap).
    above: BTreeMap<u64, Option<(W, Instant)>>,
}

impl<W> Tags<W> {
    pub fn new() -> Self {
        Tags {
            floor: 1,
            above: BTreeMap::new(),
        }
    }

    /// Records the delivery of `tag` as settled: by an ack still to write (`Some`), or by a
    /// frame already written (`None`). A tag already settled is refused, its ack handed back:
    /// a second ack would be a second frame for one delivery, which the broker answers by
    /// closing the channel. (The worker settles each delivery once.)
    pub fn settle(&mut self, tag: u64, ack: Option<(W, Instant)>) -> Result<(), Option<W>> {
        if tag < self.floor || self.above.contains_key(&tag) {
            return Err(ack.map(|(ack, _)| ack));
        }
        self.above.insert(tag, ack);
        Ok(())
    }

    /// The frames to write at `now`: one (`multiple` when it carries several) for the acks in
    /// the run of settled tags from the floor, once it holds `policy.batch` acks or its oldest
    /// has waited `policy.linger`, and one for each ack beyond a gap that has waited the linger
    /// for the gap to close; every waiting ack once the run and those past gaps together hold
    /// `policy.batch`; and when the next waiting ack is due.
    pub fn plan(&mut self, now: Instant, policy: AckPolicy) -> (Vec<Frame<W>>, Option<Instant>) {
        let linger = policy.linger;
        let mut next: Option<Instant> = None;
        let mut wait_until = |due: Instant| next = Some(next.map_or(due, |n: Instant| n.min(due)));
        // The run: settled tags from the floor up to the first one still in flight.
        let (mut end, mut acks, mut oldest) = (self.floor, 0, None::<Instant>);
        for (&tag, settled) in self.above.range(self.floor..) {
            if tag != end {
                break;
            }
            if let Some((_, since)) = settled {
                acks += 1;
                oldest = Some(oldest.map_or(*since, |o| o.min(*since)));
            }
            end += 1;
        }
        // Acks waiting past a gap hold the prefetch as the run's do: once they fill the batch
        // together, everything waiting goes, or the channel would run out of deliveries.
        let past_gap = self.above.range(end..).filter(|(_, held)| held.is_some());
        let full = acks + past_gap.count() >= policy.batch;
        let due = oldest.map(|oldest| oldest + linger);
        let mut frames = Vec::new();
        if full || due.is_none_or(|due| now >= due) {
            let mut run = Vec::with_capacity(acks);
            while self.floor < end {
                if let Some(Some((ack, _))) = self.above.remove(&self.floor) {
                    run.push(ack);
                }
                self.floor += 1;
            }
            if !run.is_empty() {
                frames.push(Frame { waiters: run });
            }
        } else if let Some(due) = due {
            wait_until(due);
        }
        for held in self.above.range_mut(end..).map(|(_, held)| held) {
            match held {
                Some((_, since)) if !full && now.saturating_duration_since(*since) < linger => {
                    wait_until(*since + linger);
                }
                Some(_) => {
                    if let Some((ack, _)) = held.take() {
                        frames.push(Frame { waiters: vec![ack] });
                    }
                }
                None => {}
            }
        }
        (frames, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plans with no wait: every run and every ack past a gap goes at once.
    fn plan(tags: &mut Tags<u64>) -> Vec<Vec<u64>> {
        plan_at(tags, Instant::now(), policy(1, Duration::ZERO)).0
    }

    fn policy(batch: usize, linger: Duration) -> AckPolicy {
        AckPolicy { batch, linger }
    }

    fn plan_at(
        tags: &mut Tags<u64>,
        now: Instant,
        policy: AckPolicy,
    ) -> (Vec<Vec<u64>>, Option<Instant>) {
        let (frames, next) = tags.plan(now, policy);
        (frames.into_iter().map(|f| f.waiters).collect(), next)
    }

    fn ack(tags: &mut Tags<u64>, tag: u64) {
        tags.settle(tag, Some((tag, Instant::now()))).unwrap();
    }

    #[test]
    fn a_run_of_acks_from_the_first_tag_is_one_frame() {
        let mut tags = Tags::new();
        for tag in [3, 1, 2] {
            ack(&mut tags, tag);
        }
        assert_eq!(plan(&mut tags), vec![vec![1, 2, 3]]);
        assert_eq!(tags.floor, 4);
        assert!(plan(&mut tags).is_empty());
    }

    #[test]
    fn an_ack_beyond_an_unsettled_delivery_goes_alone_and_the_gap_is_never_crossed() {
        let mut tags = Tags::new();
        ack(&mut tags, 1);
        ack(&mut tags, 3);
        ack(&mut tags, 4);
        // 2 is still being worked on: 3 and 4 may not ride on a `multiple` ack.
        assert_eq!(plan(&mut tags), vec![vec![1], vec![3], vec![4]]);
        assert_eq!(tags.floor, 2);
        // Once 2 is acked, the run 2..=4 is settled, but 3 and 4 were written already.
        ack(&mut tags, 2);
        ack(&mut tags, 5);
        assert_eq!(plan(&mut tags), vec![vec![2, 5]]);
        assert_eq!(tags.floor, 6);
    }

    #[test]
    fn an_ack_past_a_gap_waits_for_the_gap_to_close_up_to_the_linger() {
        // A run of three goes at once: only the acks past a gap wait.
        let hold = Duration::from_millis(5);
        let t0 = Instant::now();
        let mut tags = Tags::new();
        tags.settle(2, Some((2, t0))).unwrap();
        tags.settle(3, Some((3, t0 + Duration::from_millis(1))))
            .unwrap();
        // 1 is in flight: 2 and 3 wait, and the first is due when its hold is over.
        assert_eq!(
            plan_at(&mut tags, t0, policy(3, hold)),
            (vec![], Some(t0 + hold))
        );
        // 1 is acked within the hold: one frame carries all three.
        tags.settle(1, Some((1, t0 + Duration::from_millis(2))))
            .unwrap();
        let (frames, next) = plan_at(&mut tags, t0 + Duration::from_millis(2), policy(3, hold));
        assert_eq!(frames, vec![vec![1, 2, 3]]);
        assert_eq!(next, None);
        // 4 is in flight past the hold of 5: 5 goes alone when due, not before.
        tags.settle(5, Some((5, t0))).unwrap();
        let (frames, next) = plan_at(&mut tags, t0 + Duration::from_millis(4), policy(3, hold));
        assert!(frames.is_empty());
        assert_eq!(next, Some(t0 + hold));
        let (frames, next) = plan_at(&mut tags, t0 + hold, policy(3, hold));
        assert_eq!(frames, vec![vec![5]]);
        assert_eq!(next, None);
        assert_eq!(tags.floor, 4);
    }

    #[test]
    fn a_run_waits_for_the_batch_or_the_linger_whichever_comes_first() {
        let linger = Duration::from_millis(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut tags = Tags::new();
        tags.settle(1, Some((1, at(0)))).unwrap();
        tags.settle(2, Some((2, at(1)))).unwrap();
        // Two acks of a batch of three: the run waits for the oldest's linger.
        assert_eq!(
            plan_at(&mut tags, at(1), policy(3, linger)),
            (vec![], Some(at(5)))
        );
        assert_eq!(tags.floor, 1);
        // A third ack fills the batch: the run goes before the linger is over.
        tags.settle(3, Some((3, at(2)))).unwrap();
        assert_eq!(
            plan_at(&mut tags, at(2), policy(3, linger)),
            (vec![vec![1, 2, 3]], None)
        );
        // A lone ack goes once it has waited the linger, and not before.
        tags.settle(4, Some((4, at(3)))).unwrap();
        assert_eq!(
            plan_at(&mut tags, at(7), policy(3, linger)),
            (vec![], Some(at(8)))
        );
        assert_eq!(
            plan_at(&mut tags, at(8), policy(3, linger)),
            (vec![vec![4]], None)
        );
        // A written reject in the run neither counts towards the batch nor waits.
        tags.settle(5, None).unwrap();
        tags.settle(6, Some((6, at(9)))).unwrap();
        tags.settle(7, Some((7, at(9)))).unwrap();
        assert_eq!(
            plan_at(&mut tags, at(9), policy(3, linger)),
            (vec![], Some(at(14)))
        );
        tags.settle(8, Some((8, at(10)))).unwrap();
        assert_eq!(
            plan_at(&mut tags, at(10), policy(3, linger)),
            (vec![vec![6, 7, 8]], None)
        );
        assert_eq!(tags.floor, 9);
    }

    #[test]
    fn an_ack_past_a_gap_is_due_apart_from_the_run_before_the_gap() {
        let linger = Duration::from_millis(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut tags = Tags::new();
        tags.settle(3, Some((3, at(0)))).unwrap();
        tags.settle(1, Some((1, at(2)))).unwrap();
        // 2 is in flight: the run is 1 alone (due at 7), 3 past the gap is due at 5.
        assert_eq!(
            plan_at(&mut tags, at(2), policy(8, linger)),
            (vec![], Some(at(5)))
        );
        assert_eq!(
            plan_at(&mut tags, at(5), policy(8, linger)),
            (vec![vec![3]], Some(at(7)))
        );
        assert_eq!(
            plan_at(&mut tags, at(7), policy(8, linger)),
            (vec![vec![1]], None)
        );
        // 2 settles: 3 was written alone, so 2's run is 2 alone.
        tags.settle(2, Some((2, at(8)))).unwrap();
        assert_eq!(
            plan_at(&mut tags, at(13), policy(8, linger)),
            (vec![vec![2]], None)
        );
        assert_eq!(tags.floor, 4);
    }

    #[test]
    fn acks_past_a_gap_go_once_they_and_the_run_fill_the_batch() {
        // A slow delivery keeps a gap open far longer than the linger: the acks behind it
        // hold the prefetch as much as the run's do, so they may not wait past the batch.
        let linger = Duration::from_millis(50);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut tags = Tags::new();
        tags.settle(1, Some((1, at(0)))).unwrap();
        tags.settle(3, Some((3, at(1)))).unwrap();
        tags.settle(4, Some((4, at(2)))).unwrap();
        // 2 is in flight; three acks wait, one short of the batch: all wait for the linger.
        assert_eq!(
            plan_at(&mut tags, at(2), policy(4, linger)),
            (vec![], Some(at(50)))
        );
        // A fourth behind the gap fills the batch: the run goes as one frame, each ack past
        // the gap alone, well before the linger is over.
        tags.settle(5, Some((5, at(3)))).unwrap();
        assert_eq!(
            plan_at(&mut tags, at(3), policy(4, linger)),
            (vec![vec![1], vec![3], vec![4], vec![5]], None)
        );
        assert_eq!(tags.floor, 2);
        // The gap never crossed: once 2 is acked, its run is 2 alone (3 to 5 were written).
        tags.settle(2, Some((2, at(4)))).unwrap();
        assert_eq!(
            plan_at(&mut tags, at(54), policy(4, linger)),
            (vec![vec![2]], None)
        );
        assert_eq!(tags.floor, 6);
    }

    #[test]
    fn the_batch_is_half_the_prefetch_headroom_over_the_concurrency() {
        assert_eq!(AckPolicy::for_consumer(128, 64).batch, 32);
        assert_eq!(AckPolicy::for_consumer(40, 32).batch, 4);
        assert_eq!(AckPolicy::for_consumer(33, 32).batch, 1);
        // No headroom: every ack at once, or a free slot would wait for its delivery.
        assert_eq!(AckPolicy::for_consumer(32, 32).batch, 1);
        assert_eq!(AckPolicy::for_consumer(8, 32).batch, 1);
    }

    #[test]
    fn a_written_reject_lets_the_run_pass_it_without_acking_it() {
        let mut tags = Tags::new();
        ack(&mut tags, 1);
        tags.settle(2, None).unwrap();
        ack(&mut tags, 3);
        // The frame's tag is 3, an acked delivery's: the broker never sees the rejected 2 in it.
        assert_eq!(plan(&mut tags), vec![vec![1, 3]]);
        assert_eq!(tags.floor, 4);
    }

    #[test]
    fn a_reject_not_yet_written_is_a_gap() {
        let mut tags = Tags::new();
        ack(&mut tags, 1);
        ack(&mut tags, 3);
        assert_eq!(plan(&mut tags), vec![vec![1], vec![3]]);
        // Delivery 2's reject is written only now.
        tags.settle(2, None).unwrap();
        ack(&mut tags, 4);
        assert_eq!(plan(&mut tags), vec![vec![4]]);
        assert_eq!(tags.floor, 5);
    }

    #[test]
    fn a_delivery_settled_twice_is_refused_and_plans_no_second_frame() {
        let mut tags = Tags::new();
        ack(&mut tags, 1);
        ack(&mut tags, 3);
        assert_eq!(tags.settle(3, Some((3, Instant::now()))), Err(Some(3)));
        assert_eq!(tags.settle(3, None), Err(None));
        assert_eq!(plan(&mut tags), vec![vec![1], vec![3]]);
        assert_eq!(tags.settle(1, Some((1, Instant::now()))), Err(Some(1)));
        ack(&mut tags, 2);
        assert_eq!(plan(&mut tags), vec![vec![2]]);
        assert_eq!(tags.floor, 4);
    }

    #[test]
    fn a_run_of_rejects_alone_plans_no_frame() {
        let mut tags: Tags<u64> = Tags::new();
        tags.settle(1, None).unwrap();
        tags.settle(2, None).unwrap();
        assert!(plan(&mut tags).is_empty());
        assert_eq!(tags.floor, 3);
    }
}
