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
    /// The row's claims in the end: 2 where the fresh worker took the crashed claim over.
    attempts: i32,
    /// What the fresh worker did with the redelivered copy.
    then: Then,
}

/// The fresh worker's verdict on the copy the crashed worker never acked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// Took the expired claim over and sent.
    Sent,
    /// Found `sent` and acked the copy as a duplicate.
    Duplicate,
    /// Found an expired claim under `dead-letter` and dead-lettered it.
    DeadLettered,
}

/// The signal `std::process::abort` raises (Linux).
const SIGABRT: i32 = 6;

/// The crashing worker died of the failpoint's abort, at that point: SIGABRT, and its log's
/// last words name the failpoint (not a startup error, not a panic elsewhere).
async fn assert_aborted_at(app: &TestApp, mut crashing: tokio::process::Child, point: &str) {
    use std::os::unix::process::ExitStatusExt;
    let status = tokio::time::timeout(PATIENCE, crashing.wait())
        .await
        .unwrap_or_else(|_| panic!("{point}: the worker did not abort"))
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "{point}: aborted ({status})"
    );
    if std::env::var_os("TEST_LOG").is_none() {
        let log = std::fs::read_to_string(app.dir.path().join("worker.log")).unwrap();
        let marker = "failpoint: aborting the process";
        assert!(
            log.lines().any(|l| l.contains(marker) && l.contains(point)),
            "{point}: no `{marker}` line naming it in\n{log}"
        );
    }
}

async fn crash_case(c: CrashCase) {
    let app = TestApp::spawn().await;
    let job_id = format!("crash-{}-{}", c.point, c.policy).replace('.', "-");
    let failpoint = format!("{}=abort", c.point);
    let policy = ["--on-uncertain", c.policy];
    let crashing = app.spawn_worker_process(&policy, &[("MAILROOM_FAILPOINTS", &failpoint)]);
    app.publish(&app.job(&job_id)).await;
    assert_aborted_at(&app, crashing, c.point).await;

    let worker = app.start_worker(&policy);
    let what = format!("{failpoint} / {}: row {}", c.policy, c.status);
    let row = app
        .wait_for_row(&job_id, "welcome", &what, |n| n.status.as_str() == c.status)
        .await;
    if c.dead_letter {
        let dead = app.dead_letters(1).await;
        assert_eq!(
            dead[0].header("x-mailroom-error-class").as_deref(),
            Some("uncertain"),
            "{what}"
        );
    }
    worker
        .stats
        .wait_until(|s| s.sent + s.duplicates + s.dead_lettered >= 1)
        .await;
    // Let any copy still in a retry tier come back and be judged.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let snap = worker.stats.snapshot();
    worker.stop().await;
    app.drain_duplicates().await;
    assert_eq!(row.attempts, c.attempts, "{what}: attempts");
    let judged = (snap.sent, snap.duplicates, snap.dead_lettered);
    let expected = match c.then {
        Then::Sent => (1, 0, 0),
        Then::Duplicate => (0, 1, 0),
        Then::DeadLettered => (0, 0, 1),
    };
    assert_eq!(
        judged, expected,
        "{what}: the fresh worker {:?}: {snap:?}",
        c.then
    );
    let mid = app.message_id(&job_id, "welcome");
    assert_eq!(app.smtp.count(&mid), c.emails, "{what}: emails");
    assert_eq!(app.smtp.received().len(), c.emails, "{what}: nothing else");
}

macro_rules! crash_matrix {
    ($($name:ident: $point:literal, $policy:literal => $emails:literal emails, $status:literal,
        dlq $dlq:literal, attempts $attempts:literal, then $then:ident;)*) => {$(
        #[tokio::test]
        async fn $name() {
            crash_case(CrashCase {
                point: $point,
                policy: $policy,
                emails: $emails,
                status: $status,
                dead_letter: $dlq,
                attempts: $attempts,
                then: Then::$then,
            })
            .await;
        }
    )*};
}

crash_matrix! {
    // Died before sending: resend takes the claim over after the lease and sends once;
    // dead-letter cannot tell it from a death after sending, so a human gets it (README:
    // at-most-once).
    crash_after_claim_resend_sends_once: "worker.after_claim", "resend"
        => 1 emails, "sent", dlq false, attempts 2, then Sent;
    crash_after_claim_dead_letter_sends_nothing_and_dead_letters: "worker.after_claim", "dead-letter"
        => 0 emails, "uncertain", dlq true, attempts 1, then DeadLettered;
    // The window no design closes: accepted by SMTP, not recorded.
    crash_after_smtp_ok_resend_sends_the_same_email_twice: "worker.after_smtp_ok", "resend"
        => 2 emails, "sent", dlq false, attempts 2, then Sent;
    crash_after_smtp_ok_dead_letter_sends_once_and_dead_letters: "worker.after_smtp_ok", "dead-letter"
        => 1 emails, "uncertain", dlq true, attempts 1, then DeadLettered;
    // Recorded: every later copy is a duplicate, under either policy.
    crash_after_record_resend_sends_once: "worker.after_record", "resend"
        => 1 emails, "sent", dlq false, attempts 1, then Duplicate;
    crash_after_record_dead_letter_sends_once: "worker.after_record", "dead-letter"
        => 1 emails, "sent", dlq false, attempts 1, then Duplicate;
    crash_before_ack_resend_sends_once: "worker.before_ack", "resend"
        => 1 emails, "sent", dlq false, attempts 1, then Duplicate;
    crash_before_ack_dead_letter_sends_once: "worker.before_ack", "dead-letter"
        => 1 emails, "sent", dlq false, attempts 1, then Duplicate;
}
