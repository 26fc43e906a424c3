//! Replaying dead rows: exactly the selection moves, each replayed job is then sent once (never
//! again if it was sent before, once more after a 554), a dry run changes nothing, and a poison
//! job dead-lettered by the broker lists as `poison` and replays.

use lapin::{Connection, options::*};
use serde_json::{Value, json};

use super::{job_of_kind, letter, listed, publish_dead, table};
use crate::helpers::*;
use mailroom::dlq::Filter;

#[tokio::test]
async fn replay_by_kind_moves_exactly_the_matching_ones_and_each_is_then_sent_once() {
    let app = TestApp::spawn().await;
    let mut letters = vec![];
    for i in 0..3 {
        letters.push(letter(&app.job(&format!("w-{i}")), "rejected", "550"));
        let other = job_of_kind(&app, &format!("p-{i}"), "password_reset");
        letters.push(letter(&other, "template", "missing variable"));
    }
    publish_dead(&app, &letters).await;

    let out = app
        .cli_output(&["dlq", "replay", "--kind", "welcome"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("examined 3: moved 3"), "{}", out.stdout);
    assert_eq!(listed(&app).await, ["p-0", "p-1", "p-2"]);

    let worker = app.start_worker(&[]);
    worker.stats.wait_until(|s| s.sent == 3).await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 3);
    for i in 0..3 {
        let id = format!("w-{i}");
        assert_eq!(app.smtp.count(&app.message_id(&id, "welcome")), 1, "{id}");
        let row = app.notification(&id, "welcome").await.unwrap();
        assert_eq!((row.status.as_str(), row.attempts), ("sent", 1));
    }
    assert_eq!(listed(&app).await, ["p-0", "p-1", "p-2"]);
}

#[tokio::test]
async fn replaying_a_job_already_sent_sends_nothing_more() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("sent-once")).await;
    worker.stats.wait_until(|s| s.sent == 1).await;
    // A copy of the same job dead-lettered meanwhile (an uncertain duplicate, say).
    publish_dead(
        &app,
        &[letter(&app.job("sent-once"), "uncertain", "reply lost")],
    )
    .await;

    let out = app.cli_output(&["dlq", "replay", "sent-once"]).await;
    assert!(out.status.success(), "{}", out.stderr);
    worker.stats.wait_until(|s| s.duplicates == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("sent-once", "welcome")), 1);
    assert!(listed(&app).await.is_empty());
}

#[tokio::test]
async fn a_job_dead_after_a_554_gets_one_more_claim_when_replayed_and_is_sent_once() {
    // 554 (5.0.0), not an unknown address: a 5.1.1 would suppress the address, and the replay
    // would be recorded suppressed (suppression::a_replay_honours_the_suppression_list).
    let app = TestApp::spawn_with(&["--fail", "RCPT:554:1"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("bounced-once")).await;
    worker.stats.wait_until(|s| s.dead_lettered == 1).await;
    let out = app.cli(&["dlq", "ingest"]).await;
    assert!(out.contains("ingested 1 dead letters"), "{out}");

    let out = app
        .cli_output(&["dlq", "show", "bounced-once", "--json"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    let shown: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(shown[0]["entry"]["class"], "rejected");
    assert_eq!(shown[0]["job"]["job_id"], "bounced-once");
    assert_eq!(shown[0]["notification"]["status"], "dead");
    let reason = shown[0]["headers"]["x-mailroom-error"].as_str().unwrap();
    assert!(reason.contains("554"), "{reason}");
    let human = app.cli_output(&["dlq", "show", "bounced-once"]).await;
    assert!(
        human.stdout.contains("status      dead (attempts: 1)"),
        "{}",
        human.stdout
    );

    let out = app.cli_output(&["dlq", "replay", "bounced-once"]).await;
    assert!(out.status.success(), "{}", out.stderr);
    let row = app
        .wait_for_row("bounced-once", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert_eq!(row.attempts, 2);
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(
        app.smtp.count(&app.message_id("bounced-once", "welcome")),
        1
    );
    assert!(listed(&app).await.is_empty());
}

#[tokio::test]
async fn a_dry_run_changes_nothing_and_reports_the_render_error_of_a_job_missing_a_variable() {
    let app = TestApp::spawn().await;
    let mut broken = app.job("dry-broken");
    broken["data"] = json!({"product_name": "Acme"});
    publish_dead(
        &app,
        &[
            letter(&app.job("dry-good"), "rejected", "550"),
            letter(&broken, "template", "missing variable"),
        ],
    )
    .await;

    let out = app
        .cli_output(&["dlq", "replay", "--all", "--dry-run", "--json"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    let previews: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
    let of = |id: &str| previews.iter().find(|p| p["job_id"] == id).unwrap().clone();
    assert_eq!(previews.len(), 2);
    assert_eq!(of("dry-good")["subject"], "Welcome to Acme Cloud, Ada!");
    assert_eq!(of("dry-good")["recipients"], json!(["a***@example.com"]));
    assert!(of("dry-good")["error"].is_null());
    let error = of("dry-broken")["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("user.name") && error.contains("line"),
        "{error}"
    );
    let human = app
        .cli_output(&["dlq", "replay", "--all", "--dry-run"])
        .await;
    assert!(human.stdout.contains("nothing changed"), "{}", human.stdout);

    assert_eq!(listed(&app).await, ["dry-good", "dry-broken"]);
    assert_eq!(app.ready_messages().await, 0, "nothing was published");
    let states = app
        .count("SELECT count(*) FROM mailroom_dead_letters WHERE state = 'dead' AND replay_result IS NULL")
        .await;
    assert_eq!(states, 2, "no row was marked");
}

#[tokio::test]
async fn a_job_over_the_delivery_limit_is_listed_as_poison_and_a_replay_sends_it_once() {
    let app = TestApp::spawn().await;
    app.publish(&app.job("crashes-workers")).await;
    // Each return to the queue counts as a delivery, as a crashing worker's would.
    let conn = Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = app.topology.queue.as_str();
    let entries = eventually("the poison message in the dead-letter queue", || async {
        let got = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap();
        if let Some(m) = got {
            let requeue = BasicRejectOptions { requeue: true };
            m.delivery.reject(requeue).await.unwrap();
            return None;
        }
        app.ingest_dead().await;
        let page = table(&app)
            .list(&Filter::default(), None, 10)
            .await
            .unwrap();
        (!page.letters.is_empty()).then_some(page.letters)
    })
    .await;
    assert_eq!(entries[0].class, "poison");
    assert!(
        entries[0].reason.contains("delivery_limit"),
        "{}",
        entries[0].reason
    );

    let out = app
        .cli_output(&["dlq", "replay", "--class", "poison"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    let worker = app.start_worker(&[]);
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(
        app.smtp
            .count(&app.message_id("crashes-workers", "welcome")),
        1
    );
}
