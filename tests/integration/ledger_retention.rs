//! The ledger's retention (`MAILROOM_LEDGER_RETENTION`): a worker deletes `sent` and `dead` rows
//! past it, never a row whose job is in flight or undecided; and a copy that arrives after its
//! row is gone is sent again, which is why the retention is the dedup horizon.

use std::sync::atomic::Ordering;

use mailroom::db::Engine;
use mailroom_test_kit::waits::eventually;

use crate::helpers::*;

/// `days` ago, in the engine's SQL.
fn days_ago(days: u32) -> String {
    match engine() {
        Engine::Postgres => format!("now() - interval '{days} days'"),
        Engine::MySql => format!("UTC_TIMESTAMP(6) - INTERVAL {days} DAY"),
    }
}

/// Inserts a ledger row of `status` created `days` ago and last updated then too.
async fn aged_row(app: &TestApp, job_id: &str, status: &str, days: u32) {
    aged_row_updated(app, job_id, status, days, days).await;
}

/// Inserts a ledger row of `status` created `created` days ago and last updated `updated` days
/// ago.
async fn aged_row_updated(app: &TestApp, job_id: &str, status: &str, created: u32, updated: u32) {
    let (created, updated) = (days_ago(created), days_ago(updated));
    app.execute(&format!(
        "INSERT INTO sent_notifications \
           (job_id, kind, status, attempts, message_id, created_at, updated_at) \
         VALUES ('{job_id}', 'welcome', '{status}', 1, '<{job_id}.welcome@mailroom.test>', \
           {created}, {updated})"
    ))
    .await;
}

async fn rows_of(app: &TestApp, job_id: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM sent_notifications WHERE job_id = '{job_id}'"
    ))
    .await
}

/// The worker's count of deleted rows once it has reached `at_least`: the worker adds a
/// batch to it after the batch's DELETE has returned, so the rows can be seen gone before the
/// count has them. A count that never gets there fails the wait.
async fn deleted_count(worker: &RunningWorker, at_least: u64) -> u64 {
    eventually("the worker counted the deleted rows", || async {
        let n = worker.stats.ledger_deleted.load(Ordering::Relaxed);
        (n >= at_least).then_some(n)
    })
    .await
}

#[tokio::test]
async fn settled_rows_past_the_retention_are_deleted_and_undecided_ones_kept() {
    let app = TestApp::spawn().await;
    for status in ["sent", "dead", "sending", "failed", "uncertain"] {
        aged_row(&app, &format!("old-{status}"), status, 50).await;
    }
    aged_row(&app, "young-sent", "sent", 10).await;
    // Created before the horizon, settled after it (a long retry, a replay): kept.
    aged_row_updated(&app, "old-replayed", "sent", 50, 10).await;
    let worker = app.start_worker(&["--ledger-retention", "45d"]);
    eventually("the old settled rows deleted", || async {
        (rows_of(&app, "old-sent").await + rows_of(&app, "old-dead").await == 0).then_some(())
    })
    .await;
    let kept = [
        "old-sending",
        "old-failed",
        "old-uncertain",
        "young-sent",
        "old-replayed",
    ];
    for kept in kept {
        assert_eq!(rows_of(&app, kept).await, 1, "{kept} was deleted");
    }
    assert_eq!(deleted_count(&worker, 2).await, 2);
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
    let ago = days_ago(50);
    app.execute(&format!(
        "UPDATE sent_notifications SET created_at = {ago}, updated_at = {ago}"
    ))
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

/// More old rows than one batch holds, among rows that must stay: every batch finds the next
/// old rows (on MySQL/MariaDB a walk of the primary key up to the newest old row), none is left
/// behind, and nothing younger goes.
#[tokio::test]
async fn old_rows_of_many_batches_are_all_deleted_and_nothing_younger() {
    let app = TestApp::spawn().await;
    let old = 2 * mailroom::worker::retention::BATCH + 500;
    let numbers = match engine() {
        Engine::Postgres => format!("SELECT g AS n FROM generate_series(1, {old}) g"),
        // Digits crossed (MySQL 8 stops recursive CTEs at 1,000 rows by default).
        Engine::MySql => {
            let digit = (0..10)
                .map(|d| format!("SELECT {d} AS d"))
                .collect::<Vec<_>>()
                .join(" UNION ALL ");
            format!(
                "SELECT a.d * 1000 + b.d * 100 + c.d * 10 + e.d + 1 AS n \
                 FROM ({digit}) a, ({digit}) b, ({digit}) c, ({digit}) e \
                 WHERE a.d * 1000 + b.d * 100 + c.d * 10 + e.d < {old}"
            )
        }
    };
    let id = match engine() {
        Engine::Postgres => "'bulk-' || n",
        Engine::MySql => "CONCAT('bulk-', n)",
    };
    let ago = days_ago(50);
    app.execute(&format!(
        "INSERT INTO sent_notifications \
           (job_id, kind, status, attempts, message_id, created_at, updated_at) \
         SELECT {id}, 'welcome', 'sent', 1, {id}, {ago}, {ago} FROM ({numbers}) AS numbers"
    ))
    .await;
    // Rows written after the old ones: the newest rows of the table, which stay.
    aged_row(&app, "young-after", "sent", 10).await;
    aged_row(&app, "old-failed", "failed", 50).await;
    let worker = app.start_worker(&["--ledger-retention", "45d"]);
    eventually("every old settled row deleted", || async {
        (app.count("SELECT count(*) FROM sent_notifications WHERE job_id LIKE 'bulk-%'")
            .await
            == 0)
            .then_some(())
    })
    .await;
    assert_eq!(rows_of(&app, "young-after").await, 1);
    assert_eq!(rows_of(&app, "old-failed").await, 1);
    let old = u64::try_from(old).unwrap();
    assert_eq!(deleted_count(&worker, old).await, old);
    worker.stop().await;
}
