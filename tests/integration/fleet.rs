//! The fleet table: each worker's heartbeat row and its per-minute counts, as the console's
//! overview reads them.

use chrono::{TimeDelta, Utc};
use serde_json::json;

use mailroom_test_kit::waits::eventually;

use crate::helpers::*;

#[tokio::test]
async fn a_running_worker_is_seen_and_a_stopped_one_is_marked_with_what_it_did() {
    let app = TestApp::spawn().await;
    let since = Utc::now() - TimeDelta::minutes(5);
    let worker = app.start_worker(&[]);
    // The first beat is written as the worker starts, before any traffic.
    let seen = eventually("the worker's row", || async {
        let rows = app.db.workers_seen(&app.namespace, since).await.unwrap();
        (rows.len() == 1).then_some(rows)
    })
    .await;
    assert_eq!(seen[0].pid, i32::try_from(std::process::id()).unwrap());
    assert!(seen[0].stopped_at.is_none(), "{seen:?}");
    assert_eq!(seen[0].sent, 0);

    app.publish(&app.job("fleet-1")).await;
    app.publish(&app.job("fleet-2")).await;
    let mut refused = app.job("fleet-3");
    refused["kind"] = json!("no_such_template");
    app.publish(&refused).await;
    worker
        .stats
        .wait_until(|s| s.sent == 2 && s.dead_lettered == 1)
        .await;
    worker.stop().await;

    let rows = app.db.workers_seen(&app.namespace, since).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let w = &rows[0];
    assert_eq!((w.sent, w.retried, w.dead), (2, 0, 1), "{w:?}");
    assert!(
        w.stopped_at.is_some(),
        "the last beat marks the worker stopped: {w:?}"
    );
    assert_eq!(w.in_flight, 0);
    assert!(!w.circuit_open);

    let minutes = app.db.fleet_minutes(&app.namespace, since).await.unwrap();
    let sum = |f: fn(&mailroom::db::fleet::Minute) -> i64| minutes.iter().map(f).sum::<i64>();
    assert_eq!(
        (sum(|m| m.sent), sum(|m| m.retried), sum(|m| m.dead)),
        (2, 0, 1),
        "{minutes:?}"
    );
}

#[tokio::test]
async fn two_workers_are_two_rows_and_their_minutes_add_up() {
    let app = TestApp::spawn().await;
    let since = Utc::now() - TimeDelta::minutes(5);
    let (a, b) = (app.start_worker(&[]), app.start_worker(&[]));
    for i in 0..10 {
        app.publish(&app.job(&format!("fleet-two-{i}"))).await;
    }
    app.smtp.wait_for(10).await;
    a.stop().await;
    b.stop().await;
    let rows = app.db.workers_seen(&app.namespace, since).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_ne!(rows[0].worker_id, rows[1].worker_id);
    assert_eq!(rows.iter().map(|w| w.sent).sum::<i64>(), 10, "{rows:?}");
    let minutes = app.db.fleet_minutes(&app.namespace, since).await.unwrap();
    assert_eq!(
        minutes.iter().map(|m| m.sent).sum::<i64>(),
        10,
        "{minutes:?}"
    );
    // Another namespace's console sees none of them.
    let other = app
        .db
        .workers_seen("no-such-namespace", since)
        .await
        .unwrap();
    assert!(other.is_empty(), "{other:?}");
}
