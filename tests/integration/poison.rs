//! Poison jobs: a job that kills its worker every time it is handled (`std::process::abort`
//! through a failpoint armed for that job id only), with the worker process restarted after
//! each crash as a supervisor would. The poison job ends in the dead-letter queue; every
//! other job of the run is sent exactly once.

use std::time::Duration;

use crate::helpers::*;

/// Restarts the worker process each time it dies, until `done`; returns the number of crashes.
async fn crash_looping_worker<F, Fut>(
    app: &TestApp,
    extra: &[&str],
    failpoint: &str,
    done: F,
) -> u32
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut crashes = 0;
    loop {
        let mut child = app.spawn_worker_process(extra, &[("MAILROOM_FAILPOINTS", failpoint)]);
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the run never finished ({crashes} crashes)"
            );
            tokio::select! {
                status = child.wait() => {
                    assert!(!status.unwrap().success(), "the worker only exits by crashing here");
                    crashes += 1;
                    break;
                }
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if done().await {
                        child.kill().await.unwrap();
                        return crashes;
                    }
                }
            }
        }
    }
}

async fn publish_around_poison(app: &TestApp, innocents: usize, poison: &str) -> Vec<String> {
    let ids: Vec<String> = (0..innocents).map(|i| format!("innocent-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        if i == innocents / 2 {
            app.publish(&app.job(poison)).await;
        }
        app.publish(&app.job(id)).await;
    }
    ids
}

fn assert_each_once(app: &TestApp, ids: &[String], poison: &str) {
    for id in ids {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
    }
    assert_eq!(app.smtp.count(&app.message_id(poison, "welcome")), 0);
    assert_eq!(app.smtp.received().len(), ids.len());
}

#[tokio::test]
async fn a_job_that_crashes_the_worker_before_its_claim_hits_the_delivery_limit() {
    // A crash on receipt (before any claim) is only stopped by the quorum queue's delivery
    // limit (10). One delivery at a time, so no innocent job shares the poison's returns: on
    // RabbitMQ 3.x every return counts, co-delivered innocents included.
    let app = TestApp::spawn().await;
    let ids = publish_around_poison(&app, 10, "poison-on-receipt").await;
    let crashes = crash_looping_worker(
        &app,
        &["--concurrency", "1", "--prefetch", "1"],
        "worker.before_claim@poison-on-receipt=abort",
        || async { app.dead_count().await >= 1 && app.count_status("sent").await == 10 },
    )
    .await;
    assert!(
        crashes >= 10,
        "dead-lettered by the limit after {crashes} crashes"
    );
    let dead = app.dead_letters(1).await;
    let body: serde_json::Value = serde_json::from_slice(&dead[0].body).unwrap();
    assert_eq!(body["job_id"], "poison-on-receipt");
    let death = dead[0].header("x-death").unwrap();
    // Header strings print as their bytes.
    assert!(
        death.contains(&format!("{:?}", b"delivery_limit")),
        "{death}"
    );
    assert!(
        app.notification("poison-on-receipt", "welcome")
            .await
            .is_none()
    );
    assert_each_once(&app, &ids, "poison-on-receipt");
}

#[tokio::test]
async fn a_job_that_crashes_the_worker_after_its_claim_is_dead_lettered_by_its_claim_count() {
    // A crash after the claim leaves a live lease; the next copy meets it and goes through a
    // retry tier (a fresh delivery count), so the delivery limit never stops this loop. The
    // claim count does: after --max-attempts claims without an outcome, it is dead-lettered.
    // One delivery at a time: jobs claimed beside the poison share its crashes, its leases and
    // so its claim count (README: a crash-looping job takes its co-delivered jobs along).
    let app = TestApp::spawn().await;
    let ids = publish_around_poison(&app, 10, "poison-after-claim").await;
    let crashes = crash_looping_worker(
        &app,
        &[
            "--max-attempts",
            "3",
            "--concurrency",
            "1",
            "--prefetch",
            "1",
        ],
        "worker.after_claim@poison-after-claim=abort",
        || async { app.dead_count().await >= 1 && app.count_status("sent").await == 10 },
    )
    .await;
    assert_eq!(crashes, 3, "one crash per allowed claim");
    let dead = app.dead_letters(1).await;
    assert_eq!(
        dead[0].header("x-mailroom-error-class").as_deref(),
        Some("exhausted")
    );
    let reason = dead[0].header("x-mailroom-error").unwrap();
    assert!(reason.contains("died each time"), "{reason}");
    let row = app
        .notification("poison-after-claim", "welcome")
        .await
        .unwrap();
    assert_eq!(row.status.as_str(), "dead");
    assert_each_once(&app, &ids, "poison-after-claim");
}
