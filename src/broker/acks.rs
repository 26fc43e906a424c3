//! Acks coalesced over a channel's settled delivery tags.
//!
//! A delivery's ack is still asked for one delivery at a time, only once its outcome is
//! recorded. What changes is the frame that carries it: when every delivery tag from the
//! lowest unsettled one up to an acked one is settled, one `basic.ack` with `multiple` set
//! carries all the acks of that run. An ack beyond a delivery that is still being worked on
//! goes out on its own at once, as it always did: no ack waits for another delivery.
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

use lapin::Acker;
use lapin::options::BasicAckOptions;
use tokio::sync::{Notify, oneshot};

/// The acks of one consuming channel. Cheap to share: clone the `Arc` it comes in.
pub struct Acks {
    shared: Arc<Shared>,
    flusher: tokio::task::JoinHandle<()>,
}

struct Shared {
    tags: Mutex<Tags<Waiter>>,
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
    pub fn new() -> Arc<Acks> {
        let shared = Arc::new(Shared {
            tags: Mutex::new(Tags::new()),
            wake: Notify::new(),
            frames: AtomicU64::new(0),
            acks: AtomicU64::new(0),
        });
        let flusher = tokio::spawn(flush(shared.clone()));
        Arc::new(Acks { shared, flusher })
    }

    /// Acks the delivery of `tag` (its `acker`): resolves once the frame that carries it is
    /// written, with what lapin said of that frame (`Ok(false)`: the channel is closed).
    pub async fn ack(&self, acker: &Acker, tag: u64) -> lapin::Result<bool> {
        let (done, result) = oneshot::channel();
        let waiter = Waiter {
            acker: acker.clone(),
            done,
        };
        self.shared.tags().settle(tag, Some(waiter));
        self.shared.wake.notify_one();
        // The flusher ends only with the `Acks`, which `self` keeps alive.
        result.await.unwrap_or(Ok(false))
    }

    /// Counts the delivery of `tag` as settled by a reject that was written, so that a later
    /// `multiple` ack may cover it.
    pub fn rejected(&self, tag: u64) {
        self.shared.tags().settle(tag, None);
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
    loop {
        shared.wake.notified().await;
        let frames = shared.tags().plan();
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
    above: BTreeMap<u64, Option<W>>,
}

impl<W> Tags<W> {
    pub fn new() -> Self {
        Tags {
            floor: 1,
            above: BTreeMap::new(),
        }
    }

    /// Records the delivery of `tag` as settled: by an ack still to write (`Some`), or by a
    /// frame already written (`None`).
    pub fn settle(&mut self, tag: u64, ack: Option<W>) {
        debug_assert!(tag >= self.floor, "delivery tag {tag} settled twice");
        self.above.insert(tag, ack);
    }

    /// The frames that write every ack asked for: one (`multiple` when it carries several) for
    /// the acks in the run of settled tags from the floor, then one for each ack beyond a gap.
    pub fn plan(&mut self) -> Vec<Frame<W>> {
        let mut run = Vec::new();
        while let Some(entry) = self.above.first_entry() {
            if *entry.key() != self.floor {
                break;
            }
            if let Some(ack) = entry.remove() {
                run.push(ack);
            }
            self.floor += 1;
        }
        let mut frames = Vec::new();
        if !run.is_empty() {
            frames.push(Frame { waiters: run });
        }
        for ack in self.above.values_mut() {
            if let Some(ack) = ack.take() {
                frames.push(Frame { waiters: vec![ack] });
            }
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(tags: &mut Tags<u64>) -> Vec<Vec<u64>> {
        tags.plan().into_iter().map(|f| f.waiters).collect()
    }

    #[test]
    fn a_run_of_acks_from_the_first_tag_is_one_frame() {
        let mut tags = Tags::new();
        for tag in [3, 1, 2] {
            tags.settle(tag, Some(tag));
        }
        assert_eq!(plan(&mut tags), vec![vec![1, 2, 3]]);
        assert_eq!(tags.floor, 4);
        assert!(plan(&mut tags).is_empty());
    }

    #[test]
    fn an_ack_beyond_an_unsettled_delivery_goes_alone_and_the_gap_is_never_crossed() {
        let mut tags = Tags::new();
        tags.settle(1, Some(1));
        tags.settle(3, Some(3));
        tags.settle(4, Some(4));
        // 2 is still being worked on: 3 and 4 may not ride on a `multiple` ack.
        assert_eq!(plan(&mut tags), vec![vec![1], vec![3], vec![4]]);
        assert_eq!(tags.floor, 2);
        // Once 2 is acked, the run 2..=4 is settled, but 3 and 4 were written already.
        tags.settle(2, Some(2));
        tags.settle(5, Some(5));
        assert_eq!(plan(&mut tags), vec![vec![2, 5]]);
        assert_eq!(tags.floor, 6);
    }

    #[test]
    fn a_written_reject_lets_the_run_pass_it_without_acking_it() {
        let mut tags = Tags::new();
        tags.settle(1, Some(1));
        tags.settle(2, None);
        tags.settle(3, Some(3));
        // The frame's tag is 3, an acked delivery's: the broker never sees the rejected 2 in it.
        assert_eq!(plan(&mut tags), vec![vec![1, 3]]);
        assert_eq!(tags.floor, 4);
    }

    #[test]
    fn a_reject_not_yet_written_is_a_gap() {
        let mut tags = Tags::new();
        tags.settle(1, Some(1));
        tags.settle(3, Some(3));
        assert_eq!(plan(&mut tags), vec![vec![1], vec![3]]);
        // Delivery 2's reject is written only now.
        tags.settle(2, None);
        tags.settle(4, Some(4));
        assert_eq!(plan(&mut tags), vec![vec![4]]);
        assert_eq!(tags.floor, 5);
    }

    #[test]
    fn a_run_of_rejects_alone_plans_no_frame() {
        let mut tags: Tags<u64> = Tags::new();
        tags.settle(1, None);
        tags.settle(2, None);
        assert!(plan(&mut tags).is_empty());
        assert_eq!(tags.floor, 3);
    }
}
