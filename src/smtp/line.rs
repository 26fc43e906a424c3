//! A line for SMTP sessions that deepens while sends are fast. The places of the line proper
//! (the connections and one connection's worth ahead, see `worker::lease`) are safe whatever
//! the server does: a claimed delivery waits for at most one whole send. A worker may also
//! hold *deeper* places: claims made further back in line, which overlap more commits with the
//! sends in progress. Such a claim waits for several sends, so it is safe only while sends are
//! short; [`Depth`] tells whether they are, from the sends it has seen:
//!
//! - the line starts shallow, and deepens only after `needed` sends in a row each ended within
//!   `fast` (a send that took longer starts the count again);
//! - it is shallow again at once, without waiting for any send to end, while a send in progress
//!   has been running longer than `fast`.
//!
//! `fast` is chosen (`worker::lease::deeper_line`) so that a claim at the back of the deeper
//! line, behind sends that each take at most `fast`, still has its connection in half the time
//! its lease leaves for waiting. When the server slows down suddenly, the claims already made in
//! the deeper places may wait longer: the fence in `worker::lease` then gives them back
//! unused. While the line is shallow no claim is made in a deeper place, nor behind one (a
//! place of the line proper waits until the deeper places are empty), so a slow-down costs at
//! most one give-back per deeper place.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// The deeper places of a line for SMTP sessions: how many, and how long a send may take for
/// the line to count as fast (`worker::lease::deeper_line` chooses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deeper {
    /// Places beyond the line proper, taken only while sends are fast.
    pub places: u32,
    /// A send that ends within this is fast.
    pub fast: Duration,
}

/// The deeper places of a line, and what decides whether they may be taken.
#[derive(Debug)]
pub struct DeeperLine {
    places: Semaphore,
    count: u32,
    pub depth: Depth,
}

impl DeeperLine {
    /// The deeper places of `deeper`, open after `needed` sends in a row within its `fast`.
    pub fn new(deeper: Deeper, needed: u32) -> DeeperLine {
        DeeperLine {
            places: Semaphore::new(deeper.places as usize),
            count: deeper.places,
            depth: Depth::new(deeper.fast, needed),
        }
    }

    /// A place of the line `proper`, or one of the deeper places while the line is deep,
    /// whichever comes first; `true` with a deeper one. A deeper place that comes free after the
    /// line went shallow is given back, and the wait goes on for the line proper. While the
    /// line is shallow, a place of the line proper is usable only once no deeper place is held:
    /// a claim made then is never further back in line than the line proper allows, behind
    /// claims made deeper before a slow-down. `None` once a semaphore is closed.
    pub async fn place<'s>(&'s self, proper: &'s Semaphore) -> Option<(SemaphorePermit<'s>, bool)> {
        while self.depth.is_deep() {
            tokio::select! {
                biased;
                place = proper.acquire() => return Some((place.ok()?, false)),
                place = self.places.acquire() => {
                    let place = place.ok()?;
                    if self.depth.is_deep() {
                        return Some((place, true));
                    }
                }
            }
        }
        let place = proper.acquire().await.ok()?;
        if !self.depth.is_deep() {
            drop(self.places.acquire_many(self.count).await.ok()?);
        }
        Some((place, false))
    }
}

/// What the deeper places know about the sends.
#[derive(Debug)]
pub struct Depth {
    fast: Duration,
    needed: u32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Sends in a row that each ended within `fast`.
    fast_in_a_row: u32,
    /// When each send in progress started (`None`: a free slot).
    running: Vec<Option<Instant>>,
}

impl Depth {
    /// A line that deepens after `needed` sends in a row within `fast`.
    pub fn new(fast: Duration, needed: u32) -> Depth {
        Depth {
            fast,
            needed: needed.max(1),
            state: Mutex::new(State::default()),
        }
    }

    /// Whether a delivery may take a deeper place now.
    pub fn is_deep(&self) -> bool {
        let now = Instant::now();
        let state = self.lock();
        state.fast_in_a_row >= self.needed
            && state
                .running
                .iter()
                .flatten()
                .all(|started| now.saturating_duration_since(*started) <= self.fast)
    }

    /// Notes a send starting now; the send ends when the returned guard is dropped.
    pub fn start(&self) -> Running<'_> {
        let started = Instant::now();
        let mut state = self.lock();
        let slot = match state.running.iter().position(Option::is_none) {
            Some(free) => {
                state.running[free] = Some(started);
                free
            }
            None => {
                state.running.push(Some(started));
                state.running.len() - 1
            }
        };
        Running {
            depth: self,
            slot,
            started,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing in this module panics while holding the lock: a poisoned state is whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A send in progress, as [`Depth`] sees it.
#[derive(Debug)]
pub struct Running<'a> {
    depth: &'a Depth,
    slot: usize,
    started: Instant,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        let mut state = self.depth.lock();
        state.running[self.slot] = None;
        state.fast_in_a_row = if took <= self.depth.fast {
            state.fast_in_a_row.saturating_add(1)
        } else {
            0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_millis(500);

    async fn send(depth: &Depth, takes: Duration) {
        let _running = depth.start();
        tokio::time::sleep(takes).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_line_starts_shallow_and_deepens_after_enough_fast_sends_in_a_row() {
        let depth = Depth::new(FAST, 3);
        assert!(!depth.is_deep(), "no send seen yet");
        for _ in 0..2 {
            send(&depth, Duration::from_millis(100)).await;
        }
        assert!(!depth.is_deep(), "two fast sends of the three needed");
        send(&depth, FAST).await;
        assert!(depth.is_deep(), "a send of exactly `fast` is fast");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_send_starts_the_count_again() {
        let depth = Depth::new(FAST, 2);
        send(&depth, Duration::from_millis(10)).await;
        send(&depth, FAST + Duration::from_millis(1)).await;
        send(&depth, Duration::from_millis(10)).await;
        assert!(!depth.is_deep(), "one fast send since the slow one");
        send(&depth, Duration::from_millis(10)).await;
        assert!(depth.is_deep());
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_running_long_makes_the_line_shallow_before_it_ends() {
        let depth = Depth::new(FAST, 1);
        send(&depth, Duration::from_millis(10)).await;
        let quick = depth.start();
        let stuck = depth.start();
        assert!(depth.is_deep(), "sends in progress, none long yet");
        tokio::time::advance(FAST).await;
        assert!(depth.is_deep(), "at `fast` a send is still fast");
        drop(quick);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!depth.is_deep(), "one send in progress passed `fast`");
        drop(stuck);
        assert!(
            !depth.is_deep(),
            "and it ended slow: the count starts again"
        );
        send(&depth, Duration::from_millis(10)).await;
        assert!(depth.is_deep());
    }

    #[tokio::test(start_paused = true)]
    async fn slots_of_ended_sends_are_reused() {
        let depth = Depth::new(FAST, 1);
        for _ in 0..100 {
            let a = depth.start();
            let b = depth.start();
            drop(a);
            drop(b);
        }
        assert_eq!(depth.lock().running.len(), 2);
    }
}
