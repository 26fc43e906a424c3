//! Scheduled and expiring jobs: `send_at` holds a job back without a claim or an attempt, and a
//! job still unsent at its `expires_at` is never sent and says `expired`.

use chrono::{Duration as Span, Utc};

use crate::helpers::*;

#[tokio::test]
async fn a_job_scheduled_5s_ahead_is_sent_after_its_time_and_not_before() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    let send_at = Utc::now() + Span::seconds(5);
    let mut job = app.job("later");
    job["send_at"] = send_at.to_rfc3339().into();
    app.publish(&job).await;
    app.publish(&app.job("now")).await;

    // The worker has seen the job and parked it: no email, no claim, no attempt.
    worker.stats.wait_until(|s| s.deferred >= 1).await;
    app.smtp.wait_for(1).await;
    assert!(
        Utc::now() < send_at,
        "the check ran too late to mean anything"
    );
    assert_eq!(app.smtp.count(&app.message_id("later", "welcome")), 0);
    assert!(app.notification("later", "welcome").await.is_none());

    let row = app
        .wait_for_row("later", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    // The claim is the first the ledger saw of it, on the database's clock.
    assert!(
        row.created_at >= send_at,
        "claimed {} before {send_at}",
        row.created_at
    );
    assert_eq!(row.attempts, 1, "parking counted no attempt");
    let s = worker.stats.snapshot();
    assert_eq!(s.retried, 0, "parking is not a retry: {s:?}");
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("later", "welcome")), 1);
}

#[tokio::test]
async fn a_job_that_expires_while_the_smtp_server_is_down_is_never_sent_and_reported_expired() {
    let app = TestApp::spawn().await;
    let port = free_port();
    let url = format!("smtp://127.0.0.1:{port}");
    let worker = app.start_worker(&["--smtp-url", &url, "--max-attempts", "100"]);
    // Long enough for a first attempt on a loaded machine, which the test must see before
    // the job expires.
    let expires_at = Utc::now() + Span::seconds(6);
    let mut job = app.job("perishable");
    job["expires_at"] = expires_at.to_rfc3339().into();
    app.publish(&job).await;
    app.publish(&app.job("durable")).await;
    // The outage hit the job: an attempt failed against the closed port.
    let row = app
        .wait_for_row("perishable", "welcome", "a refused attempt", |n| {
            matches!(n.status.as_str(), "failed" | "dead")
        })
        .await;
    assert_eq!(
        row.status.as_str(),
        "failed",
        "the job expired before any attempt met the outage: {:?}",
        row.last_error
    );

    // The job's time runs out while the server is down (the worker's circuit opens and it takes
    // no deliveries); then the server comes back, and the job must still not go out.
    eventually("the job's expiry", || async {
        (Utc::now() >= expires_at).then_some(())
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let back = SmtpServer::start(dir.path(), &["--port", &port.to_string()]).await;
    app.wait_for_row("durable", "welcome", "the other job sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    let row = app
        .wait_for_row("perishable", "welcome", "row dead", |n| {
            n.status.as_str() == "dead"
        })
        .await;
    let reason = row.last_error.unwrap_or_default();
    assert!(reason.contains("expired at"), "{reason}");
    let dead = app.dead_letters(1).await;
    assert_eq!(
        dead[0].header("x-mailroom-error-class").as_deref(),
        Some("expired")
    );
    let out = app.cli(&["status", "perishable", "welcome"]).await;
    assert!(out.contains("dead") && out.contains("expired"), "{out}");
    worker.stop().await;
    assert_eq!(back.count(&app.message_id("perishable", "welcome")), 0);
    assert_eq!(back.count(&app.message_id("durable", "welcome")), 1);
}

#[tokio::test]
async fn the_outbox_door_refuses_an_expired_job_and_schedules_a_later_one() {
    let app = TestApp::spawn().await;
    let data = app.job("x")["data"].to_string();
    let base = [
        "enqueue",
        "--kind",
        "welcome",
        "--to",
        "ada@example.com",
        "--data",
        &data,
    ];
    let mut past = base.to_vec();
    past.extend(["--job-id", "stale", "--expires-at", "2020-01-01T00:00:00Z"]);
    let out = app.cli_output(&past).await;
    assert_ne!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("expires_at"), "{}", out.stderr);
    assert_eq!(app.count("SELECT count(*) FROM mailroom_outbox").await, 0);

    let mut later = base.to_vec();
    later.extend(["--job-id", "scheduled", "--send-at", "+3s"]);
    let enqueued = Utc::now();
    let out = app.cli(&later).await;
    assert!(out.contains("scheduled queued"), "{out}");
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    let row = app
        .wait_for_row("scheduled", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert!(
        row.created_at >= enqueued + Span::seconds(3),
        "claimed at {}",
        row.created_at
    );
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("scheduled", "welcome")), 1);
}
