//! A change stream followed by a task of its own (the WAL on PostgreSQL, the binary log on
//! MySQL/MariaDB): the wake-ups it sends, whether its stream is connected or paused, and the
//! token that stops it.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::wakeup::Woken;

/// Empty probes in a row after which a paused stream is opened again: the outbox has gone
/// quiet (about 50 ms with the default `poll_min` of 10 ms).
pub const QUIET_PROBES: u32 = 5;

/// What a follower's task is given: where to send wake-ups, the flags it keeps to whether its
/// stream is connected and whether it paused it, the signal that the outbox went quiet, and the
/// token that stops it.
pub(super) struct Feed {
    pub tx: mpsc::Sender<Woken>,
    pub live: Arc<AtomicBool>,
    pub paused: Arc<AtomicBool>,
    pub quiet: Arc<Notify>,
    pub stop: CancellationToken,
}

impl Feed {
    /// Pauses the stream: outbox commits came faster than `pause_above` a second
    /// ([`Ended::Busy`]). Marks it paused, so the relay probes at its fastest, closes it with
    /// `close`, wakes the relay (asleep on its long ceiling, it picks up the short one), waits
    /// until the relay's probes find the outbox quiet ([`Follower::probed`]) and opens a new
    /// stream with `open`, which wakes the relay once more. `None` once stopped; else the new
    /// stream, or why it could not be opened (the caller then reopens it as a lost one).
    pub async fn pause<T, E: Display>(
        &self,
        stream: &str,
        pause_above: u32,
        close: impl Future<Output = ()>,
        open: impl Future<Output = Result<T, E>>,
    ) -> Option<Result<T, String>> {
        self.paused.store(true, Ordering::Relaxed);
        close.await;
        let _ = self.tx.try_send(Woken::Event);
        tracing::info!(
            "outbox commits come faster than {pause_above}/s: {stream} closed, the relay probes \
             the outbox until it goes quiet"
        );
        tokio::select! {
            _ = self.stop.cancelled() => return None,
            _ = self.quiet.notified() => {}
        }
        let opened = open.await;
        self.paused.store(false, Ordering::Relaxed);
        Some(match opened {
            Ok(opened) => {
                tracing::info!("the outbox went quiet: {stream} open again");
                let _ = self.tx.try_send(Woken::Event);
                Ok(opened)
            }
            Err(e) => Err(e.to_string()),
        })
    }
}

/// A running follower: a task that reads the stream and reopens it, and the wake-ups it sends.
pub struct Follower {
    woken: mpsc::Receiver<Woken>,
    live: Arc<AtomicBool>,
    /// Set while the task has closed its stream because rows come faster than polling costs.
    paused: Arc<AtomicBool>,
    quiet: Arc<Notify>,
    /// Empty probes in a row while paused.
    empty_probes: u32,
    /// Cancelled on drop too: a session that ends with an error drops its follower, and the
    /// task then closes the stream itself.
    stop: DropGuard,
    task: tokio::task::JoinHandle<()>,
    /// The stream, as an error names it (`the WAL`, `the binary log`).
    stream: &'static str,
}

impl Follower {
    /// Starts `follow` on a task of its own, its stream connected and not paused. The task
    /// keeps `paused` to whether it has paused its stream, wherever the relay is meanwhile,
    /// and clears it when it stops.
    pub(super) fn spawn<F, Fut>(
        stream: &'static str,
        paused: Arc<AtomicBool>,
        follow: F,
    ) -> Follower
    where
        F: FnOnce(Feed) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, woken) = mpsc::channel(1);
        let live = Arc::new(AtomicBool::new(true));
        paused.store(false, Ordering::Relaxed);
        let quiet = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let feed = Feed {
            tx,
            live: live.clone(),
            paused: paused.clone(),
            quiet: quiet.clone(),
            stop: stop.clone(),
        };
        let (following, stopped) = (follow(feed), paused.clone());
        let task = tokio::spawn(async move {
            following.await;
            stopped.store(false, Ordering::Relaxed);
        });
        Follower {
            woken,
            live,
            paused,
            quiet,
            empty_probes: 0,
            stop: stop.drop_guard(),
            task,
            stream,
        }
    }

    /// The next wake-up; cancel-safe.
    pub async fn next(&mut self) -> anyhow::Result<Woken> {
        let stream = self.stream;
        self.woken
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("the follower of {stream} stopped"))
    }

    /// Whether the stream is connected (false while it reopens or is paused).
    pub fn live(&self) -> bool {
        self.live.load(Ordering::Relaxed) && !self.paused()
    }

    /// Whether the task closed its stream because rows come faster than polling costs: the
    /// relay then probes at its fastest until the outbox goes quiet.
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// What the relay's probe of an idle outbox found. [`QUIET_PROBES`] empty ones in a row
    /// while paused tell the task to open its stream again.
    pub fn probed(&mut self, found: bool) {
        if found || !self.paused() {
            self.empty_probes = 0;
            return;
        }
        self.empty_probes += 1;
        if self.empty_probes >= QUIET_PROBES {
            self.empty_probes = 0;
            // Only a task waiting now hears it: no permit is left over to reopen the next
            // pause at once. A task still closing its stream hears the next run of probes.
            self.quiet.notify_waiters();
        }
    }

    /// Closes the stream's connection and waits for the task.
    pub async fn close(self) {
        drop(self.stop);
        let _ = self.task.await;
    }
}

/// Outbox commits a second from which the relay closes its stream and probes instead
/// (`--relay-stream-pause-above`). A stream is not free: PostgreSQL decodes each transaction
/// of the database for the slot (about 140 µs of server CPU per email end to end on this
/// project's bench machine), and MariaDB's dump thread reads and sends every event of the
/// binary log. Worse, it wakes the relay for each commit: every row then travels alone, a
/// claim, a publish, a delivery and a claim in the ledger of its own. Above 200 commits a
/// second a probe every `poll_min` (10 ms) finds two rows or more, and rows that travel
/// together cost the whole pipeline far less (at 500/s: 1,316–1,440 µs of CPU per email
/// against 2,216–2,484 with the stream, docs/PERFORMANCE.md) for some 8 ms of latency; below
/// it, the stream keeps commit → published at a few milliseconds.
pub const PAUSE_ABOVE: u32 = 200;
/// The window the threshold is counted in.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// Counts outbox commits in windows of [`RATE_WINDOW`], each starting at its first commit.
#[derive(Clone, Copy)]
pub(super) struct CommitRate {
    /// Commits within one window that pause the stream; 0: never.
    pub pause_above: u32,
    since: Option<Instant>,
    commits: u32,
}

impl CommitRate {
    pub fn new(pause_above: u32) -> CommitRate {
        CommitRate {
            pause_above,
            since: None,
            commits: 0,
        }
    }

    /// The same threshold, counting from zero (a new stream).
    pub fn restart(self) -> CommitRate {
        CommitRate::new(self.pause_above)
    }

    /// One outbox commit seen at `now`; true once the threshold came within one window.
    pub fn commit(&mut self, now: Instant) -> bool {
        if self.pause_above == 0 {
            return false;
        }
        match self.since {
            Some(since) if now.saturating_duration_since(since) < RATE_WINDOW => {}
            _ => {
                self.since = Some(now);
                self.commits = 0;
            }
        }
        self.commits += 1;
        self.commits >= self.pause_above
    }
}

/// Why the stream was left.
pub(super) enum Ended {
    /// Outbox commits came faster than the pause threshold.
    Busy,
    Lost(String),
}

/// Reopens a follower's stream with `open`, with capped exponential backoff between tries;
/// `None` once `stop` is cancelled. `stream` names it in the log (`the WAL`).
pub(super) async fn reopen<T, E, F, Fut>(
    stream: &str,
    stop: &CancellationToken,
    mut open: F,
) -> Option<T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = crate::broker::reconnect_backoff();
    loop {
        let wait = backoff.next().unwrap_or(crate::broker::RECONNECT_MAX);
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        match open().await {
            Ok(opened) => return Some(opened),
            Err(e) => tracing::warn!(error = %e, retry_in = ?wait, "cannot reopen {stream}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A follower whose task pauses at once and reports when it was told the outbox is quiet.
    fn paused_follower() -> (Follower, mpsc::Receiver<()>) {
        let (told, heard) = mpsc::channel(1);
        let paused = Arc::new(AtomicBool::new(false));
        let follower = Follower::spawn("a test stream", paused, |feed: Feed| async move {
            feed.paused.store(true, Ordering::Relaxed);
            feed.quiet.notified().await;
            let _ = told.send(()).await;
        });
        (follower, heard)
    }

    #[tokio::test]
    async fn a_paused_stream_reopens_after_quiet_probes_in_a_row_only() {
        let (mut follower, mut heard) = paused_follower();
        while !follower.paused() {
            tokio::task::yield_now().await;
        }
        // A probe that finds rows starts the count again.
        for _ in 0..QUIET_PROBES - 1 {
            follower.probed(false);
        }
        follower.probed(true);
        for _ in 0..QUIET_PROBES - 1 {
            follower.probed(false);
        }
        let early = tokio::time::timeout(Duration::from_millis(50), heard.recv()).await;
        assert!(
            early.is_err(),
            "told after fewer than {QUIET_PROBES} quiet probes in a row"
        );
        follower.probed(false);
        assert_eq!(heard.recv().await, Some(()));
        follower.close().await;
    }

    /// The relay's gauge is the flag the stream's task keeps: it reads paused from the moment
    /// the task closes its stream, with no call from the relay (which may be draining a
    /// backlog the whole time), reads open once the task has reopened it, and is cleared when
    /// the follower stops mid-pause.
    #[tokio::test]
    async fn the_paused_flag_follows_the_task_not_the_relay_loop() {
        let gauge = Arc::new(AtomicBool::new(true));
        let (closed_tx, mut closed) = mpsc::channel(1);
        let (again_tx, again) = tokio::sync::oneshot::channel::<()>();
        let mut follower = Follower::spawn("a test stream", gauge.clone(), |feed: Feed| {
            async move {
                let close = || async {
                    let _ = closed_tx.send(()).await;
                };
                let open = async { Ok::<(), String>(()) };
                assert!(
                    feed.pause("a test stream", 1, close(), open)
                        .await
                        .is_some()
                );
                // Paused a second time, and stopped while paused.
                let _ = again.await;
                let never = std::future::pending::<Result<(), String>>();
                assert!(
                    feed.pause("a test stream", 1, close(), never)
                        .await
                        .is_none()
                );
            }
        });
        assert!(
            !gauge.load(Ordering::Relaxed),
            "a new follower starts open whatever the gauge held"
        );
        closed.recv().await.unwrap();
        assert!(gauge.load(Ordering::Relaxed), "paused as the stream closes");
        // The pause's wake-up, then the reopen's.
        assert!(matches!(follower.next().await, Ok(Woken::Event)));
        for _ in 0..QUIET_PROBES {
            follower.probed(false);
        }
        assert!(matches!(follower.next().await, Ok(Woken::Event)));
        assert!(!gauge.load(Ordering::Relaxed), "open again once reopened");
        again_tx.send(()).unwrap();
        closed.recv().await.unwrap();
        assert!(gauge.load(Ordering::Relaxed), "paused again");
        follower.close().await;
        assert!(
            !gauge.load(Ordering::Relaxed),
            "a follower stopped while paused leaves the gauge open"
        );
    }

    #[test]
    fn the_stream_pauses_at_the_commit_that_makes_the_rate_within_one_window() {
        let t0 = Instant::now();
        let mut rate = CommitRate::new(PAUSE_ABOVE);
        let step = RATE_WINDOW / PAUSE_ABOVE;
        for i in 0..PAUSE_ABOVE - 1 {
            assert!(!rate.commit(t0 + step * i), "commit {i} of one window");
        }
        assert!(rate.commit(t0 + step * (PAUSE_ABOVE - 1)));
    }

    #[test]
    fn commits_spread_over_more_than_a_window_do_not_pause_the_stream() {
        let t0 = Instant::now();
        let mut rate = CommitRate::new(PAUSE_ABOVE);
        // Just under the rate, for ten windows in a row.
        let step = RATE_WINDOW / (PAUSE_ABOVE - 1) + Duration::from_micros(1);
        for i in 0..PAUSE_ABOVE * 10 {
            assert!(!rate.commit(t0 + step * i), "commit {i}");
        }
    }

    #[test]
    fn a_threshold_of_zero_never_pauses_the_stream() {
        let t0 = Instant::now();
        let mut rate = CommitRate::new(0);
        for i in 0..100_000 {
            assert!(!rate.commit(t0 + Duration::from_nanos(i)));
        }
    }
}
