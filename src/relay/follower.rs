//! A change stream followed by a task of its own (the WAL on PostgreSQL, the binary log on
//! MySQL/MariaDB): the wake-ups it sends, whether its stream is connected, and the token that
//! stops it.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::wakeup::Woken;

/// What a follower's task is given: where to send wake-ups, the flag it keeps to whether its
/// stream is connected, and the token that stops it.
pub(super) struct Feed {
    pub tx: mpsc::Sender<Woken>,
    pub live: Arc<AtomicBool>,
    pub stop: CancellationToken,
}

/// A running follower: a task that reads the stream and reopens it, and the wake-ups it sends.
pub struct Follower {
    woken: mpsc::Receiver<Woken>,
    live: Arc<AtomicBool>,
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
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow(Feed {
            tx,
            live: live.clone(),
            stop: stop.clone(),
        }));
        Follower {
            woken,
            live,
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

    /// Whether the stream is connected (false while it reopens).
    pub fn live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
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
