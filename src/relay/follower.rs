//! A change stream followed by a task of its own (the WAL on PostgreSQL, the binary log on
//! MySQL/MariaDB): the wake-ups it sends, whether its stream is connected or paused, and the
//! token that stops it.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Starts `follow` on a task of its own, its stream connected.
    pub(super) fn spawn<F, Fut>(stream: &'static str, follow: F) -> Follower
    where
        F: FnOnce(Feed) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, woken) = mpsc::channel(1);
        let live = Arc::new(AtomicBool::new(true));
        let paused = Arc::new(AtomicBool::new(false));
        let quiet = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow(Feed {
            tx,
            live: live.clone(),
            paused: paused.clone(),
            quiet: quiet.clone(),
            stop: stop.clone(),
        }));
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
        let follower = Follower::spawn("a test stream", |feed: Feed| async move {
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
}
