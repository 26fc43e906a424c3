//! The ledger's retention (`MAILROOM_LEDGER_RETENTION`): a worker deletes `sent` and `dead` rows
//! past it, never a row whose job is in flight or undecided; and a copy that arrives after its
//! row is gone is sent again, which is why the retention is the dedup horizon.

use std::sync::atomic::Ordering;

use mailroom::db::Engine;
use mailroom_test_kit::waits::eventually;

use crate::helpers::*;

/// Inserts a ledger row of `status` last updated `days` ago.
async fn aged_row(app: &TestApp, job_id: &str, status: &str, days: u32) {
    let ago = match engine() {
        Engine::Postgres => format!("now() - interval '{days} days'"),
        Engine::MySql => format!("UTC_TIMESTAMP(6) - INTERVAL {days} DAY"),
    };
    app.execute(&format!(
        "INSERT INTO sent_notifications (job_id, kind, status, attempts, message_id, updated_at) \
         VALUES ('{job_id}', 'welcome', '{status}', 1, '<{job_id}.welcome@mailroom.test>', {ago})"
    ))
    .await;
}

async fn rows_of(app: &TestApp, job_id: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM sent_notifications WHERE job_id = '{job_id}'"
    ))
    .await
}

#[tokio::test]
async fn settled_rows_past_the_retention_are_deleted_and_undecided_ones_kept() {
    let app = TestApp::spawn().await;
    for status in ["sent", "dead", "sending", "failed", "uncertain"] {
        aged_row(&app, &format!("old-{status}"), status, 50).await;
    }
    aged_row(&app, "young-sent", "sent", 10).await;
    let worker = app.start_worker(&["--ledger-retention", "45d"]);
    eventually("the old settled rows deleted", || async {
        (rows_of(&app, "old-sent").await + rows_of(&app, "old-dead").await == 0).then_some(())
    })
    .await;
    for kept in ["old-sending", "old-failed", "old-uncertain", "young-sent"] {
        assert_eq!(rows_of(&app, kept).await, 1, "{kept} was deleted");
    }
    assert_eq!(worker.stats.ledger_deleted.load(Ordering::Relaxed), 2);
    worker.stop().await;
}

#[tokio::test]
async fn a_copy_arriving_after_its_row_is_deleted_is_sent_again_as_the_horizon_says() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&["--ledger-retention", "0s"]);
    let job = app.job("horizon-1");
    app.publish(&job).await;
    app.smtp.wait_for(1).await;
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    // Within the horizon a copy is a duplicate.
    app.publish(&job).await;
    let worker = app.start_worker(&["--ledger-retention", "0s"]);
    worker.stats.wait_until(|s| s.duplicates == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 1);
    // Age the row past a 45-day retention; a worker with that retention deletes it, and the
    // next copy is claimed as new.
    app.execute(&match engine() {
        Engine::Postgres => {
            "UPDATE sent_notifications SET updated_at = now() - interval '50 days'".to_string()
        }
        Engine::MySql => {
            "UPDATE sent_notifications SET updated_at = UTC_TIMESTAMP(6) - INTERVAL 50 DAY"
                .to_string()
        }
    })
    .await;
    let worker = app.start_worker(&["--ledger-retention", "45d"]);
    eventually("the row deleted", || async {
        (rows_of(&app, "horizon-1").await == 0).then_some(())
    })
    .await;
    app.publish(&job).await;
    app.smtp.wait_for(2).await;
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
}
