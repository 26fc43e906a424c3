//! Process shutdown: SIGINT and SIGTERM cancel one token that every long-running loop takes as
//! a parameter, so tests can stop the same loops with their own token. SIGHUP asks for a
//! template reload.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Runs `work` to its end, but for no longer than `patience` after `shutdown` is cancelled:
/// `None` when the patience ran out and `work` was dropped unfinished. The bound of every
/// long-running loop's stop, so that a peer that never answers cannot keep a process alive.
pub async fn within_patience<T>(
    shutdown: &CancellationToken,
    patience: Duration,
    work: impl Future<Output = T>,
) -> Option<T> {
    let overdue = async {
        shutdown.cancelled().await;
        tokio::time::sleep(patience).await;
    };
    tokio::select! {
        done = work => Some(done),
        () = overdue => None,
    }
}

/// Returns a token cancelled on the first SIGINT or SIGTERM.
pub fn on_signals() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received; shutting down"),
        }
        cancel.cancel();
    });
    Ok(token)
}

/// Calls `reload` on every SIGHUP until `shutdown` is cancelled.
pub fn on_hangup(
    reload: impl Fn() + Send + 'static,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hup.recv() => match got {
                    Some(()) => {
                        tracing::info!("SIGHUP received; reloading templates");
                        reload();
                    }
                    None => return,
                },
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_that_never_ends_is_dropped_a_patience_after_the_shutdown() {
        let shutdown = CancellationToken::new();
        let patience = Duration::from_secs(7);
        let started = tokio::time::Instant::now();
        let stopper = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(100)).await;
            stopper.cancel();
        });
        let ended = within_patience(&shutdown, patience, std::future::pending::<()>()).await;
        assert_eq!(ended, None);
        assert_eq!(started.elapsed(), Duration::from_secs(107));
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_ends_within_the_patience_keeps_its_result() {
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let work = async {
            tokio::time::sleep(Duration::from_secs(6)).await;
            42
        };
        let ended = within_patience(&shutdown, Duration::from_secs(7), work).await;
        assert_eq!(ended, Some(42));
    }
}
