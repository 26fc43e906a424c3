//! The SMTP server misbehaving at every stage of a session (scripted through
//! `tests/support/smtp_recorder.py`): each reply code at each stage, a reply lost after the
//! final dot, a greeting that never comes, a refused connection, a session cap. Every case ends
//! in the state the failure table of the README promises, with the emails counted at the server.

use std::sync::atomic::Ordering;

use crate::helpers::*;

/// What a case must end in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Refused once, retried through a tier, sent on the second claim.
    RetriedThenSent,
    /// Refused for good: row `dead`, dead-lettered as `rejected`, nothing sent.
    Rejected,
}

fn expected(code: u16) -> Expect {
    if code < 500 {
        Expect::RetriedThenSent
    } else {
        Expect::Rejected
    }
}

/// One worker and one job against a server that answers `code` once at `stage`.
async fn reply_code_case(stage: &str, code: u16) {
    let rule = format!("{stage}:{code}:1");
    let app = TestApp::spawn_with(&["--fail", &rule]).await;
    let worker = app.start_worker(&[]);
    let job_id = format!("{}-{code}", stage.to_lowercase());
    app.publish(&app.job(&job_id)).await;
    let mid = app.message_id(&job_id, "welcome");
    match expected(code) {
        Expect::RetriedThenSent => {
            let row = app
                .wait_for_row(&job_id, "welcome", "row sent", |n| {
                    n.status.as_str() == "sent"
                })
                .await;
            assert_eq!(row.attempts, 2, "{rule}: one refusal, one success");
            worker.stats.wait_until(|s| s.sent == 1).await;
            assert_eq!(worker.stats.snapshot().retried, 1, "{rule}");
            assert_eq!(app.smtp.count(&mid), 1, "{rule}: exactly one email");
        }
        Expect::Rejected => {
            let dead = app.dead_letters(1).await;
            assert_eq!(
                dead[0].header("x-mailroom-error-class").as_deref(),
                Some("rejected"),
                "{rule}"
            );
            let reason = dead[0].header("x-mailroom-error").unwrap();
            assert!(reason.contains(&code.to_string()), "{rule}: {reason}");
            let row = app.notification(&job_id, "welcome").await.unwrap();
            assert_eq!(row.status.as_str(), "dead", "{rule}");
            assert_eq!(
                row.attempts, 1,
                "{rule}: a permanent refusal is not retried"
            );
        }
    }
    worker.stop().await;
    let expected_emails = usize::from(expected(code) == Expect::RetriedThenSent);
    assert_eq!(app.smtp.received().len(), expected_emails, "{rule}");
    assert_eq!(
        app.ready_messages().await,
        0,
        "{rule}: every delivery settled"
    );
}

/// One test per stage and code, so a failure names its case and each runs on its own runtime.
macro_rules! reply_code_cases {
    ($($name:ident: $stage:literal $code:literal,)*) => {$(
        #[tokio::test]
        async fn $name() {
            reply_code_case($stage, $code).await;
        }
    )*};
}

reply_code_cases! {
    reply_421_to_mail_is_retried_and_sent_once: "MAIL" 421,
    reply_451_to_mail_is_retried_and_sent_once: "MAIL" 451,
    reply_452_to_mail_is_retried_and_sent_once: "MAIL" 452,
    reply_550_to_mail_is_dead_lettered_unsent: "MAIL" 550,
    reply_552_to_mail_is_dead_lettered_unsent: "MAIL" 552,
    reply_421_to_rcpt_is_retried_and_sent_once: "RCPT" 421,
    reply_451_to_rcpt_is_retried_and_sent_once: "RCPT" 451,
    reply_452_to_rcpt_is_retried_and_sent_once: "RCPT" 452,
    reply_550_to_rcpt_is_dead_lettered_unsent: "RCPT" 550,
    reply_552_to_rcpt_is_dead_lettered_unsent: "RCPT" 552,
    reply_421_to_data_is_retried_and_sent_once: "DATACMD" 421,
    reply_451_to_data_is_retried_and_sent_once: "DATACMD" 451,
    reply_452_to_data_is_retried_and_sent_once: "DATACMD" 452,
    reply_550_to_data_is_dead_lettered_unsent: "DATACMD" 550,
    reply_552_to_data_is_dead_lettered_unsent: "DATACMD" 552,
    reply_421_to_the_final_dot_is_retried_and_sent_once: "DOT" 421,
    reply_451_to_the_final_dot_is_retried_and_sent_once: "DOT" 451,
    reply_452_to_the_final_dot_is_retried_and_sent_once: "DOT" 452,
    reply_550_to_the_final_dot_is_dead_lettered_unsent: "DOT" 550,
    reply_552_to_the_final_dot_is_dead_lettered_unsent: "DOT" 552,
}

/// The server accepts and logs the message, then its reply to the final dot is lost (`mode`:
/// `close` drops the connection, `silent` never answers). The documented window: the worker
/// cannot know, and `MAILROOM_ON_UNCERTAIN` decides.
async fn lost_reply_case(mode: &str, policy: &str) {
    let app = TestApp::spawn_with(&["--lose-reply", &format!("{mode}:1")]).await;
    let worker = app.start_worker(&["--on-uncertain", policy]);
    let worker_stats = worker.stats.clone();
    let job_id = format!("lost-{mode}-{policy}");
    let mid = app.message_id(&job_id, "welcome");
    app.publish(&app.job(&job_id)).await;
    match policy {
        "resend" => {
            let row = app
                .wait_for_row(&job_id, "welcome", "row sent", |n| {
                    n.status.as_str() == "sent"
                })
                .await;
            // Usually 2; a silent session can also eat the next attempt's pooled check.
            assert!(
                row.attempts >= 2,
                "{mode}: resent, attempts {}",
                row.attempts
            );
            worker.stats.wait_until(|s| s.sent == 1).await;
            worker.stop().await;
            // At-least-once: the same email twice, with the same Message-ID.
            assert_eq!(app.smtp.count(&mid), 2, "{mode}/{policy}");
        }
        "dead-letter" => {
            let dead = app.dead_letters(1).await;
            assert_eq!(
                dead[0].header("x-mailroom-error-class").as_deref(),
                Some("uncertain"),
                "{mode}"
            );
            let row = app.notification(&job_id, "welcome").await.unwrap();
            assert_eq!(row.status.as_str(), "uncertain", "{mode}");
            worker.stop().await;
            // At-most-once: the server has it once, a human decides the rest.
            assert_eq!(app.smtp.count(&mid), 1, "{mode}/{policy}");
        }
        other => unreachable!("{other}"),
    }
    // The lost reply is a window the worker counts (`mailroom_open_windows_total`).
    assert_eq!(
        worker_stats.open_windows.load(Ordering::Relaxed),
        1,
        "{mode}/{policy}"
    );
    app.drain_duplicates().await;
    assert_eq!(app.smtp.received().len(), app.smtp.count(&mid));
}

#[tokio::test]
async fn connection_closed_after_the_final_dot_resends_under_the_resend_policy() {
    lost_reply_case("close", "resend").await;
}

#[tokio::test]
async fn silence_after_the_final_dot_resends_under_the_resend_policy() {
    lost_reply_case("silent", "resend").await;
}

#[tokio::test]
async fn connection_closed_after_the_final_dot_dead_letters_under_the_dead_letter_policy() {
    lost_reply_case("close", "dead-letter").await;
}

#[tokio::test]
async fn silence_after_the_final_dot_dead_letters_under_the_dead_letter_policy() {
    lost_reply_case("silent", "dead-letter").await;
}

#[tokio::test]
async fn a_greeting_that_never_comes_times_out_and_the_job_is_sent_once_later() {
    let app = TestApp::spawn_with(&["--stall-greeting", "1"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("stalled-greeting")).await;
    let row = app
        .wait_for_row("stalled-greeting", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert_eq!(
        row.attempts, 2,
        "the stalled session timed out, the next one sent"
    );
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(
        app.smtp
            .count(&app.message_id("stalled-greeting", "welcome")),
        1
    );
    assert_eq!(app.smtp.received().len(), 1);
}

/// Nothing was sent when the greeting never came, so even the at-most-once policy should retry.
/// The transport knows the SMTP phase when the whole-send timeout fires: a greeting that never
/// came means nothing was sent, so even the `dead-letter` policy retries it.
#[tokio::test]
async fn a_greeting_that_never_comes_is_retried_even_under_the_dead_letter_policy() {
    let app = TestApp::spawn_with(&["--stall-greeting", "1"]).await;
    let worker = app.start_worker(&["--on-uncertain", "dead-letter"]);
    app.publish(&app.job("stalled-greeting-dl")).await;
    app.wait_for_row("stalled-greeting-dl", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn a_refused_connection_is_retried_until_the_server_listens() {
    let app = TestApp::spawn().await;
    // Refused until the recorder listens on it, and taken by no one else meanwhile.
    let closed = ClosedPort::new();
    let port = closed.port();
    let url = format!("smtp://127.0.0.1:{port}");
    let worker = app.start_worker(&["--smtp-url", &url]);
    app.publish(&app.job("refused")).await;
    app.wait_for_row("refused", "welcome", "a refused attempt recorded", |n| {
        n.status.as_str() == "failed"
    })
    .await;
    worker.stats.wait_until(|s| s.retried >= 2).await;

    let dir = tempfile::tempdir().unwrap();
    let late = SmtpServer::start(dir.path(), &["--port", &port.to_string()]).await;
    drop(closed);
    let row = app
        .wait_for_row("refused", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert!(row.attempts >= 3, "attempts {}", row.attempts);
    worker.stop().await;
    assert_eq!(late.count(&app.message_id("refused", "welcome")), 1);
    assert_eq!(late.received().len(), 1);
}

#[tokio::test]
async fn the_worker_never_opens_more_smtp_sessions_than_configured() {
    // The server answers 421 beyond 3 sessions; a worker that respects --smtp-connections 3
    // never meets that refusal, so every job is sent on its first claim.
    let app = TestApp::spawn_with(&["--max-sessions", "3"]).await;
    let worker = app.start_worker(&["--smtp-connections", "3", "--concurrency", "16"]);
    let n = 40;
    for i in 0..n {
        app.publish(&app.job(&format!("capped-{i}"))).await;
    }
    app.smtp.wait_for(n).await;
    worker.stats.wait_until(|s| s.sent == n as u64).await;
    worker.stop().await;
    assert_eq!(app.count_status("sent").await, n as i64);
    let retried = app
        .count("SELECT count(*) FROM sent_notifications WHERE attempts > 1")
        .await;
    assert_eq!(retried, 0, "no session was refused");
    for i in 0..n {
        assert_eq!(
            app.smtp
                .count(&app.message_id(&format!("capped-{i}"), "welcome")),
            1
        );
    }
}

#[tokio::test]
async fn a_server_refusing_sessions_over_its_cap_still_gets_every_job_once() {
    // The worker opens up to 4 sessions; the server takes 2 and answers 421 to the others:
    // those attempts are retried (with attempts to spare: each refusal counts), nothing is
    // lost, nothing is sent twice.
    let app = TestApp::spawn_with(&["--max-sessions", "2"]).await;
    let worker = app.start_worker(&[
        "--smtp-connections",
        "4",
        "--concurrency",
        "16",
        "--max-attempts",
        "100",
    ]);
    let n = 40;
    for i in 0..n {
        app.publish(&app.job(&format!("over-cap-{i}"))).await;
    }
    app.smtp.wait_for(n).await;
    worker.stats.wait_until(|s| s.sent == n as u64).await;
    worker.stop().await;
    assert_eq!(app.count_status("sent").await, n as i64);
    assert_eq!(app.smtp.received().len(), n);
    for i in 0..n {
        assert_eq!(
            app.smtp
                .count(&app.message_id(&format!("over-cap-{i}"), "welcome")),
            1
        );
    }
}

#[tokio::test]
async fn a_long_smtp_outage_under_load_pauses_the_worker_and_dead_letters_nothing() {
    // 200 jobs queued, the SMTP server down for far longer than the retry tiers and attempts
    // would last (200ms..1s, 8 attempts): without the circuit breaker the backlog would be
    // exhausted into the dead-letter queue within seconds.
    let app = TestApp::spawn().await;
    // Refused until the recorder listens on it, and taken by no one else meanwhile.
    let closed = ClosedPort::new();
    let port = closed.port();
    let url = format!("smtp://127.0.0.1:{port}");
    let n = 200;
    for i in 0..n {
        app.publish(&app.job(&format!("outage-{i}"))).await;
    }
    let worker = app.start_worker(&["--smtp-url", &url]);
    worker.stats.wait_until(|s| s.retried >= 5).await;
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let during = worker.stats.snapshot();
    assert_eq!(
        during.dead_lettered, 0,
        "nothing dead-lettered during the outage"
    );
    assert!(
        during.received < 60,
        "the worker stopped taking deliveries: {during:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let server = SmtpServer::start(dir.path(), &["--port", &port.to_string()]).await;
    drop(closed);
    server
        .wait_for_within(n, std::time::Duration::from_secs(120))
        .await;
    worker.stats.wait_until(|s| s.sent == n as u64).await;
    worker.stop().await;
    assert_eq!(app.count_status("sent").await, n as i64);
    assert_eq!(app.dead_count().await, 0, "none dead-lettered");
    for i in 0..n {
        let mid = app.message_id(&format!("outage-{i}"), "welcome");
        assert_eq!(server.count(&mid), 1, "outage-{i}");
    }
    assert_eq!(server.received().len(), n);
}
