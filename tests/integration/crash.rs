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

/// The crash-point matrix: a worker process aborted (a real crash: no destructors, no acks) at
/// each failpoint, under each `MAILROOM_ON_UNCERTAIN` policy, then a fresh worker. What the
/// SMTP server holds afterwards is what the README's "Guarantees" promise. The relay's crash
/// point (`relay.after_confirm`) is `outbox::relay_killed_between_confirm_and_mark_publishes_again_and_sends_once`.
struct CrashCase {
    point: &'static str,
    policy: &'static str,
    /// Emails the server holds in the end (all with the job's one Message-ID).
    emails: usize,
    /// The row's final status.
    status: &'static str,
    /// Dead-lettered as `uncertain` for a human to decide.
    dead_letter: bool,
}

async fn crash_case(c: CrashCase) {
    let app = TestApp::spawn().await;
    let job_id = format!("crash-{}-{}", c.point, c.policy).replace('.', "-");
    let failpoint = format!("{}=abort", c.point);
    let policy = ["--on-uncertain", c.policy];
    let mut crashing = app.spawn_worker_process(&policy, &[("MAILROOM_FAILPOINTS", &failpoint)]);
    app.publish(&app.job(&job_id)).await;
    let status = tokio::time::timeout(PATIENCE, crashing.wait())
        .await
        .unwrap_or_else(|_| panic!("{failpoint}: the worker did not abort"))
        .unwrap();
    assert!(!status.success(), "{failpoint}: aborted");

    let worker = app.start_worker(&policy);
    let what = format!("{failpoint} / {}: row {}", c.policy, c.status);
    app.wait_for_row(&job_id, "welcome", &what, |n| n.status.as_str() == c.status)
        .await;
    if c.dead_letter {
        let dead = app.dead_letters(1).await;
        assert_eq!(
            dead[0].header("x-mailroom-error-class").as_deref(),
            Some("uncertain"),
            "{what}"
        );
    }
    // Let any copy still in a retry tier come back and be judged.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    worker.stop().await;
    app.drain_duplicates().await;
    let mid = app.message_id(&job_id, "welcome");
    assert_eq!(app.smtp.count(&mid), c.emails, "{what}: emails");
    assert_eq!(app.smtp.received().len(), c.emails, "{what}: nothing else");
}

macro_rules! crash_matrix {
    ($($name:ident: $point:literal, $policy:literal => $emails:literal emails, $status:literal, dlq $dlq:literal;)*) => {$(
        #[tokio::test]
        async fn $name() {
            crash_case(CrashCase {
                point: $point,
                policy: $policy,
                emails: $emails,
                status: $status,
                dead_letter: $dlq,
            })
            .await;
        }
    )*};
}

crash_matrix! {
    // Died before sending: resend sends once after the lease; dead-letter cannot tell it from
    // a death after sending, so a human gets it (README: at-most-once).
    crash_after_claim_resend_sends_once: "worker.after_claim", "resend" => 1 emails, "sent", dlq false;
    crash_after_claim_dead_letter_sends_nothing_and_dead_letters: "worker.after_claim", "dead-letter" => 0 emails, "uncertain", dlq true;
    // The window no design closes: accepted by SMTP, not recorded.
    crash_after_smtp_ok_resend_sends_the_same_email_twice: "worker.after_smtp_ok", "resend" => 2 emails, "sent", dlq false;
    crash_after_smtp_ok_dead_letter_sends_once_and_dead_letters: "worker.after_smtp_ok", "dead-letter" => 1 emails, "uncertain", dlq true;
    // Recorded: every later copy is a duplicate, under either policy.
    crash_after_record_resend_sends_once: "worker.after_record", "resend" => 1 emails, "sent", dlq false;
    crash_after_record_dead_letter_sends_once: "worker.after_record", "dead-letter" => 1 emails, "sent", dlq false;
    crash_before_ack_resend_sends_once: "worker.before_ack", "resend" => 1 emails, "sent", dlq false;
    crash_before_ack_dead_letter_sends_once: "worker.before_ack", "dead-letter" => 1 emails, "sent", dlq false;
}
