//! Workers SIGKILLed at the two crash points the claim protocol exists for.

use crate::helpers::*;

#[tokio::test]
async fn worker_killed_after_claiming_sends_exactly_once_after_the_lease_expires() {
    let app = TestApp::spawn().await;
    let mut crashing =
        app.spawn_worker_process(&[], &[("MAILROOM_FAILPOINTS", "worker.after_claim=pause")]);
    app.publish(&app.job("killed-after-claim")).await;
    app.wait_for_row("killed-after-claim", "welcome", "claimed row", |n| {
        n.status.as_str() == "sending"
    })
    .await;
    crashing.kill().await.unwrap();

    let worker = app.start_worker(&[]);
    let row = app
        .wait_for_row("killed-after-claim", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert_eq!(
        row.attempts, 2,
        "the second claim took over the expired lease"
    );
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(
        app.smtp
            .count(&app.message_id("killed-after-claim", "welcome")),
        1
    );
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn worker_killed_after_recording_sent_before_the_ack_sends_no_second_email() {
    let app = TestApp::spawn().await;
    let mut crashing =
        app.spawn_worker_process(&[], &[("MAILROOM_FAILPOINTS", "worker.after_record=pause")]);
    app.publish(&app.job("killed-before-ack")).await;
    app.wait_for_row("killed-before-ack", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    app.smtp.wait_for(1).await;
    crashing.kill().await.unwrap();

    let worker = app.start_worker(&[]);
    worker.stats.wait_until(|s| s.duplicates == 1).await;
    worker.stop().await;
    assert_eq!(
        app.smtp
            .count(&app.message_id("killed-before-ack", "welcome")),
        1
    );
    assert_eq!(app.ready_messages().await, 0);
}
