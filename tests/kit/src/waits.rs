//! Waiting for a condition by polling it, with one patience for the whole suite: no test
//! sleeps to synchronise.

use std::time::Duration;

/// How long any awaited condition may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `check` until it returns `Some`, failing the test after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(PATIENCE, what, check).await
}

/// [`eventually`] with a patience of its own, for the few tests that move thousands of jobs.
pub async fn eventually_within<T, F, Fut>(patience: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
