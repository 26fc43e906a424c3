//! The happy path and deduplication, counted at the SMTP server.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn one_job_sends_one_email_with_the_right_headers_and_parts() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("order-1042-confirmation")).await;

    let got = app.smtp.wait_for(1).await;
    let mail = &got[0];
    assert_eq!(mail.rcpt_tos, vec!["ada@example.com"]);
    assert_eq!(mail.mail_from, "noreply@mailroom.test");
    let expected_id = app.message_id("order-1042-confirmation", "welcome");
    assert_eq!(mail.message_id.as_deref(), Some(expected_id.as_str()));
    assert_eq!(
        expected_id,
        "<order-1042-confirmation.welcome@mailroom.test>"
    );
    let data = &mail.data;
    assert!(
        data.contains("Subject: Welcome to Acme Cloud, Ada!"),
        "{data}"
    );
    assert!(
        data.contains("To: \"Ada Lovelace\" <ada@example.com>"),
        "{data}"
    );
    assert!(data.contains("multipart/alternative"), "{data}");
    assert!(data.contains("Content-Type: text/plain"), "{data}");
    assert!(data.contains("Content-Type: text/html"), "{data}");

    let row = app
        .wait_for_row("order-1042-confirmation", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert_eq!(row.attempts, 1);
    assert_eq!(row.message_id, expected_id);
    assert!(row.smtp_reply.unwrap().starts_with("250"));
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn commands_are_pipelined_to_a_server_that_offers_it_and_sent_one_by_one_to_one_that_does_not()
 {
    for offers in [true, false] {
        let app = if offers {
            TestApp::spawn().await
        } else {
            TestApp::spawn_with(&["--no-pipelining"]).await
        };
        let worker = app.start_worker(&[]);
        let mut two = app.job("pipelined-two-recipients");
        two["to"] = json!(["ada@example.com", "Grace <grace@example.com>"]);
        app.publish(&two).await;
        app.publish(&app.job("pipelined-one-recipient")).await;
        let got = app.smtp.wait_for(2).await;
        worker.stats.wait_until(|s| s.sent == 2).await;
        worker.stop().await;
        let mut rcpts: Vec<_> = got.iter().map(|m| m.rcpt_tos.len()).collect();
        rcpts.sort();
        assert_eq!(rcpts, [1, 2]);
        for m in &got {
            assert_eq!(
                m.pipelined, offers,
                "PIPELINING offered: {offers}; {:?}",
                m.rcpt_tos
            );
        }
    }
}

#[tokio::test]
async fn a_refusal_of_the_second_recipient_is_blamed_on_its_domain_whether_pipelined_or_not() {
    // Pipelined, the replies to both RCPTs come back together: the refusal must be matched to
    // the recipient it answers, not to the first one (a slow-down reply throttles that domain).
    for pipelining in [true, false] {
        let mut args = vec!["--fail", "RCPT:550::refused.test"];
        if !pipelining {
            args.push("--no-pipelining");
        }
        let app = TestApp::spawn_with(&args).await;
        let worker = app.start_worker(&[]);
        let mut job = app.job("second-refused");
        job["to"] = json!(["ada@example.com", "bob@refused.test"]);
        app.publish(&job).await;
        let row = app
            .wait_for_row("second-refused", "welcome", "dead", |n| {
                n.status.as_str() == "dead"
            })
            .await;
        worker.stop().await;
        let reason = row.last_error.unwrap_or_default();
        assert!(
            reason.contains("RCPT TO for domain refused.test"),
            "pipelining {pipelining}: {reason}"
        );
        assert!(
            !reason.contains("example.com"),
            "pipelining {pipelining}: {reason}"
        );
        assert!(app.smtp.received().is_empty(), "nothing was accepted");
    }
}

#[tokio::test]
async fn the_same_job_published_three_times_sends_one_email() {
    let app = TestApp::spawn().await;
    let job = app.job("dup-sequential");
    for _ in 0..3 {
        app.publish(&job).await;
    }
    let worker = app.start_worker(&[]);
    worker
        .stats
        .wait_until(|s| s.sent == 1 && s.duplicates == 2)
        .await;
    worker.stop().await;
    assert_eq!(
        app.smtp.count(&app.message_id("dup-sequential", "welcome")),
        1
    );
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn three_copies_consumed_by_two_workers_at_once_send_one_email() {
    // A slow SMTP server keeps the first claim's lease live while the other copies arrive.
    let app = TestApp::spawn_with(&["--data-delay", "0.5"]).await;
    let a = app.start_worker(&[]);
    let b = app.start_worker(&[]);
    let job = app.job("dup-concurrent");
    for _ in 0..3 {
        app.publish(&job).await;
    }
    // Copies that met the live lease go to a retry tier; RabbitMQ's at-least-once
    // dead-lettering out of a tier may hand one back more than once, so "at least two".
    eventually(
        "one send and the two other copies turned away across both workers",
        || async {
            let (sa, sb) = (a.stats.snapshot(), b.stats.snapshot());
            (sa.sent + sb.sent == 1 && sa.duplicates + sb.duplicates >= 2).then_some(())
        },
    )
    .await;
    a.stop().await;
    b.stop().await;
    assert_eq!(
        app.smtp.count(&app.message_id("dup-concurrent", "welcome")),
        1
    );
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn an_internationalised_domain_reaches_a_server_without_smtputf8_and_a_unicode_mailbox_is_dead_lettered()
 {
    // Many SMTP servers do not offer SMTPUTF8. A domain has an ASCII form that any server
    // takes; a non-ASCII local part has none.
    let app = TestApp::spawn_with(&["--no-smtputf8"]).await;
    let worker = app.start_worker(&[]);
    let mut idn = app.job("to-muller");
    idn["to"] = json!(["Jürgen Müller <jm@Müller.de>"]);
    app.publish(&idn).await;
    let mut unicode = app.job("to-unicode-mailbox");
    unicode["to"] = json!(["用户@例子.广告"]);
    app.publish(&unicode).await;

    let got = app.smtp.wait_for(1).await;
    assert_eq!(got[0].rcpt_tos, ["jm@xn--mller-kva.de"]);
    assert!(
        got[0].data.contains("<jm@xn--mller-kva.de>"),
        "{}",
        got[0].data
    );
    let row = app
        .wait_for_row("to-unicode-mailbox", "welcome", "dead", |n| {
            n.status.as_str() == "dead"
        })
        .await;
    let reason = row.last_error.unwrap_or_default();
    assert!(reason.contains("does not offer SMTPUTF8"), "{reason}");
    let dead = app.dead_letters(1).await;
    assert_eq!(
        dead[0].header("x-mailroom-error-class").as_deref(),
        Some("rejected")
    );
    app.wait_for_row("to-muller", "welcome", "sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 1);
}
