//! Transient and permanent SMTP failures, and bad input: retried, dead-lettered with a reason,
//! never lost, never a crash loop.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn two_451_replies_then_acceptance_send_one_email_on_the_third_attempt() {
    let app = TestApp::spawn_with(&["--fail", "DATA:451:2"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("flaky-smtp")).await;

    let row = app
        .wait_for_row("flaky-smtp", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert_eq!(row.attempts, 3);
    worker.stats.wait_until(|s| s.sent == 1).await;
    // At least the two 451s were retried; RabbitMQ's at-least-once dead-lettering out of a
    // retry tier may hand back a second copy, which the claim turns away (retried or skipped).
    let snap = worker.stats.snapshot();
    assert!(snap.retried >= 2, "{snap:?}");
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("flaky-smtp", "welcome")), 1);
}

#[tokio::test]
async fn a_550_reply_dead_letters_with_the_reason_and_sends_nothing() {
    let app = TestApp::spawn_with(&["--fail", "RCPT:550"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("rejected")).await;

    let dead = app.dead_letters(1).await;
    assert_eq!(
        dead[0].header("x-mailroom-error-class").as_deref(),
        Some("rejected")
    );
    let reason = dead[0].header("x-mailroom-error").unwrap();
    assert!(reason.contains("550"), "{reason}");
    assert!(dead[0].header("x-mailroom-failed-at").is_some());
    assert_eq!(dead[0].header("x-mailroom-attempts").as_deref(), Some("1"));
    let body: serde_json::Value = serde_json::from_slice(&dead[0].body).unwrap();
    assert_eq!(body["job_id"], "rejected");

    let row = app.notification("rejected", "welcome").await.unwrap();
    assert_eq!(row.status.as_str(), "dead");
    assert!(row.last_error.unwrap().contains("550"));
    worker.stop().await;
    assert!(app.smtp.received().is_empty());
}

#[tokio::test]
async fn a_copy_of_a_dead_job_is_dead_lettered_again_with_its_reason_in_case_the_first_was_lost() {
    let app = TestApp::spawn_with(&["--fail", "RCPT:550"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("dead-twice")).await;
    let first = app.dead_letters(1).await;
    // The broker hands the job back, as it does when the first dead letter's publish broke.
    app.publish(&app.job("dead-twice")).await;
    let second = app.dead_letters(1).await;
    worker.stop().await;
    for letter in [&first[0], &second[0]] {
        assert_eq!(
            letter.header("x-mailroom-error-class").as_deref(),
            Some("rejected")
        );
        assert!(letter.header("x-mailroom-error").unwrap().contains("550"));
    }
    assert!(app.smtp.received().is_empty(), "nothing was sent");
    let row = app.notification("dead-twice", "welcome").await.unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("dead", 1));
}

#[tokio::test]
async fn bad_input_is_dead_lettered_with_a_precise_reason_while_good_jobs_flow() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    let good = app.job("good-before");
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not-json", b"this is not json".to_vec(), "not valid JSON"),
        (
            "wrong-shape",
            json!({"job_id": "x", "kind": "welcome", "to": "ada@example.com"})
                .to_string()
                .into_bytes(),
            "not valid JSON of the expected shape",
        ),
    ];
    let mut with = |id: &'static str, f: &dyn Fn(&mut serde_json::Value), expect: &'static str| {
        let mut j = app.job(id);
        f(&mut j);
        cases.push((id, j.to_string().into_bytes(), expect));
    };
    with(
        "unknown-kind",
        &|j| j["kind"] = "no_such_template".into(),
        "unknown kind",
    );
    with(
        "missing-variable",
        &|j| j["data"] = json!({"product_name": "Acme"}),
        "user",
    );
    with(
        "invalid-address",
        &|j| j["to"] = json!(["ada at example dot com"]),
        "to[0]",
    );
    with(
        "crlf-name",
        &|j| j["to"] = json!(["Ada\r\nBcc: evil@example.com <ada@example.com>"]),
        "header injection",
    );
    with(
        "crlf-subject",
        &|j| j["data"]["user"]["name"] = "Ada\r\nBcc: evil@example.com".into(),
        "subject",
    );
    with(
        "oversized",
        &|j| j["data"]["padding"] = "x".repeat(70 * 1024).into(),
        "bytes",
    );

    app.publish(&good).await;
    for (id, body, _) in &cases {
        app.publish_raw("welcome", id, body).await;
    }
    app.publish(&app.job("good-after")).await;

    let dead = app.dead_letters(cases.len()).await;
    for (id, _, expect) in &cases {
        let letter = dead
            .iter()
            .find(|d| d.properties.message_id().as_ref().map(|m| m.as_str()) == Some(*id))
            .unwrap_or_else(|| panic!("{id} was not dead-lettered"));
        let reason = letter.header("x-mailroom-error").unwrap();
        assert!(
            reason.contains(expect),
            "{id}: reason {reason:?} should mention {expect:?}"
        );
        let class = letter.header("x-mailroom-error-class").unwrap();
        assert!(
            class == "invalid" || class == "template",
            "{id}: class {class}"
        );
    }
    app.smtp.wait_for(2).await;
    worker
        .stats
        .wait_until(|s| s.sent == 2 && s.dead_lettered == cases.len() as u64)
        .await;
    worker.stop().await;
    let received = app.smtp.received();
    assert_eq!(received.len(), 2, "only the two good jobs were sent");
    assert!(
        received
            .iter()
            .all(|r| !r.data.contains("evil@example.com"))
    );
}

#[tokio::test]
async fn a_retry_lands_in_exactly_one_tier_and_comes_back_once() {
    // A headers exchange with `x-match: all` ignores `x-` headers: the tier bindings matched
    // every message, and each retry came back once per tier.
    let app = TestApp::spawn().await;
    let delay = *app.topology.retry_delays.last().unwrap();
    let props = mailroom::broker::with_headers(
        &mailroom::broker::job_properties("one-tier", "welcome", 1),
        &[(
            mailroom::broker::DELAY_HEADER,
            mailroom::broker::text_value(&mailroom::broker::Topology::delay_label(delay)),
        )],
    );
    let conn = lapin::Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = mailroom::broker::confirm_channel(&conn).await.unwrap();
    mailroom::broker::publish_confirmed(
        &ch,
        &app.topology.retry_exchange,
        "welcome",
        app.job("one-tier").to_string().as_bytes(),
        props,
    )
    .await
    .unwrap();
    eventually("the retry back in the work queue", || async {
        (app.ready_messages().await >= 1).then_some(())
    })
    .await;
    // Longer than every tier: any extra copy would be back by now.
    tokio::time::sleep(delay * 3).await;
    assert_eq!(app.ready_messages().await, 1, "one copy, not one per tier");
}

/// A dead letter whose publish meets a closed publisher connection is published once more on a
/// connection of its own, with its class and reason. Before, it was rejected to the work
/// queue's own dead-letter exchange and reached the dead-letter queue without them (seen in the
/// chaos soak).
#[tokio::test]
async fn a_dead_letter_whose_publisher_connection_closed_keeps_its_reason() {
    let vhost = Vhost::create().await;
    let app = TestApp::spawn_on(vhost.url.clone(), &["--fail", "RCPT:550"]).await;
    // The dead letter waits at its failpoint until the connection is closed, however long
    // rabbitmqctl takes to close it.
    let release = app.dir.path().join("release");
    let _worker = app.spawn_worker_process(
        &[],
        &[(
            "MAILROOM_FAILPOINTS",
            &format!(
                "worker.before_dead_letter@refused=until:{}",
                release.display()
            ),
        )],
    );
    app.publish(&app.job("refused")).await;
    let log = app.dir.path().join("worker.log");
    eventually(
        "the worker to hold the dead letter at its failpoint",
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            text.contains("failpoint: holding this delivery")
                .then_some(())
        },
    )
    .await;
    close_connections_named(&vhost, " publisher").await;
    std::fs::write(&release, "").unwrap();

    let dead = app.dead_letters(1).await;
    assert_eq!(
        dead[0].header("x-mailroom-error-class").as_deref(),
        Some("rejected")
    );
    assert!(dead[0].header("x-mailroom-error").unwrap().contains("550"));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("publishing it on a connection of its own"),
        "the closed connection hit the dead letter's publish"
    );
    // dead_letters took (and purged) the one letter: nothing else is dead, in the queue or the
    // table, and nothing reached the SMTP server.
    assert_eq!(
        app.dead_count().await,
        0,
        "one letter, not a second without reason"
    );
    assert!(app.smtp.received().is_empty());
    drop(app);
    vhost.delete().await;
}

/// Closes the connections of `vhost` whose client-given name (`connection_name` in its client
/// properties: RabbitMQ 3.10's `list_connections` has no `user_provided_name`) ends with
/// `suffix`.
async fn close_connections_named(vhost: &Vhost, suffix: &str) {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "-p", &vhost.name])
        .args(["pid", "client_properties"])
        .output()
        .await
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut closed = 0;
    for (pid, properties) in listing.lines().filter_map(|l| l.split_once('\t')) {
        if properties.contains(&format!("{suffix}\"}}")) {
            let status = tokio::process::Command::new("rabbitmqctl")
                .args(["-q", "close_connection", pid, "mailroom test: closed"])
                .status()
                .await
                .unwrap();
            assert!(status.success());
            closed += 1;
        }
    }
    assert!(closed > 0, "no connection named *{suffix} in {listing}");
}
