//! Process shutdown: SIGINT and SIGTERM cancel one token that every long-running loop takes as
//! a parameter, so tests can stop the same loops with their own token. SIGHUP asks for a
//! template reload.

use tokio_util::sync::CancellationToken;

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
