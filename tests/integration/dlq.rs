//! Dead letters (`mailroom dlq`): the dead-letter queue is ingested into the table, browsing
//! reads the table and changes nothing, replay moves exactly the selection and each replayed
//! job is then sent once (never again if it was sent before), dry runs change nothing, purge
//! takes only what it names.

use lapin::{BasicProperties, Connection, options::*, types::AMQPValue};
use mailroom::broker;
use mailroom::dlq::{DeadLetters, Entry, Filter};
use serde_json::{Value, json};

use crate::helpers::*;

mod browse;
mod filters;
mod ingest;
mod retention;
mod show;

/// A dead letter as the worker publishes it to `<ns>.dlx`.
struct Letter {
    kind: String,
    body: Vec<u8>,
    props: BasicProperties,
}

fn letter(job: &Value, class: &str, reason: &str) -> Letter {
    let id = job["job_id"].as_str().unwrap();
    let kind = job["kind"].as_str().unwrap().to_string();
    let props = broker::with_headers(
        &broker::job_properties(id, &kind, 1),
        &[
            ("x-mailroom-error", broker::text_value(reason)),
            ("x-mailroom-error-class", broker::text_value(class)),
            ("x-mailroom-attempts", AMQPValue::LongLongInt(1)),
            (
                "x-mailroom-failed-at",
                broker::text_value("2026-11-30T12:00:00.000Z"),
            ),
        ],
    );
    Letter {
        kind,
        body: job.to_string().into_bytes(),
        props,
    }
}

/// A welcome job of this app with another kind (its data does not matter: never rendered).
fn job_of_kind(app: &TestApp, id: &str, kind: &str) -> Value {
    let mut job = app.job(id);
    job["kind"] = kind.into();
    job
}

/// Publishes `letters` to the dead-letter exchange, then ingests them into the table.
async fn publish_dead(app: &TestApp, letters: &[Letter]) {
    publish_to_dlx(app, letters).await;
    let drained = app.ingest_dead().await;
    assert_eq!(drained.ingested, letters.len(), "{drained:?}");
}

/// Publishes `letters` to the dead-letter exchange, pipelined, then waits for every confirm.
async fn publish_to_dlx(app: &TestApp, letters: &[Letter]) {
    let conn = Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = broker::confirm_channel(&conn).await.unwrap();
    let mut confirms = Vec::with_capacity(letters.len());
    for l in letters {
        let confirm = ch
            .basic_publish(
                app.topology.dlx.as_str().into(),
                l.kind.as_str().into(),
                BasicPublishOptions::default(),
                &l.body,
                l.props.clone(),
            )
            .await
            .unwrap();
        confirms.push(confirm);
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
    let _ = conn.close(200, "published".into()).await;
}

fn table(app: &TestApp) -> DeadLetters {
    DeadLetters::new(app.db.clone())
}

fn ids(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.job_id.clone()).collect()
}

/// Every dead row's job id, oldest first, after ingesting what is in the queue.
async fn listed(app: &TestApp) -> Vec<String> {
    app.ingest_dead().await;
    let page = table(app)
        .list(&Filter::default(), None, 1000)
        .await
        .unwrap();
    assert!(page.next.is_none());
    let mut listed = ids(&page.letters);
    listed.reverse();
    listed
}

#[tokio::test]
async fn a_thousand_dead_letters_become_a_thousand_rows_listed_the_same_by_every_reader() {
    let app = TestApp::spawn().await;
    let expected: Vec<String> = (0..1000).map(|i| format!("dead-{i:04}")).collect();
    let letters: Vec<Letter> = expected
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let kind = if i % 3 == 0 {
                "password_reset"
            } else {
                "welcome"
            };
            letter(
                &job_of_kind(&app, id, kind),
                "rejected",
                "550 <ada@example.com> unknown",
            )
        })
        .collect();
    publish_dead(&app, &letters).await;
    assert_eq!(
        app.dead_queue_length().await,
        0,
        "every letter is in the table"
    );

    let first = table(&app)
        .list(&Filter::default(), None, 1000)
        .await
        .unwrap();
    let second = table(&app)
        .list(&Filter::default(), None, 1000)
        .await
        .unwrap();
    let newest_first: Vec<String> = expected.iter().rev().cloned().collect();
    assert_eq!(ids(&first.letters), newest_first);
    assert_eq!(first, second, "reading changes nothing");
    assert_eq!(first.letters[0].recipient, "a***@example.com");
    assert_eq!(first.letters[0].reason, "550 <a***@example.com> unknown");

    let out = app
        .cli_output(&["dlq", "list", "--json", "--limit", "1000"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    let listed: Value = serde_json::from_str(&out.stdout).unwrap();
    let cli_ids: Vec<&str> = listed["letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(cli_ids, newest_first);
    assert!(listed["next"].is_null());
    let out = app
        .cli_output(&[
            "dlq",
            "list",
            "--summary",
            "--kind",
            "password_reset",
            "--json",
        ])
        .await;
    let summary: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(summary["total"], 334);
    assert_eq!(summary["by_reason"][0]["count"], 334);
    assert_eq!(listed_rows(&app).await, 1000);
}

async fn listed_rows(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM mailroom_dead_letters")
        .await
}

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
async fn a_job_dead_after_a_550_gets_one_more_claim_when_replayed_and_is_sent_once() {
    let app = TestApp::spawn_with(&["--fail", "RCPT:550:1"]).await;
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
    assert!(reason.contains("550"), "{reason}");
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
async fn purging_by_id_takes_exactly_that_one_and_only_with_yes() {
    let app = TestApp::spawn().await;
    let letters: Vec<Letter> = ["k-1", "k-2", "k-3"]
        .iter()
        .map(|id| letter(&app.job(id), "rejected", "550"))
        .collect();
    publish_dead(&app, &letters).await;

    let refused = app.cli_output(&["dlq", "purge", "k-2"]).await;
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("--yes"), "{}", refused.stderr);
    assert_eq!(listed(&app).await, ["k-1", "k-2", "k-3"]);

    let out = app
        .cli_output(&["dlq", "purge", "k-2", "--yes", "--by", "ops"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("purged 1"), "{}", out.stdout);
    assert_eq!(listed(&app).await, ["k-1", "k-3"]);
    let purged = app
        .cli(&["dlq", "list", "--state", "purged", "--json"])
        .await;
    let purged: Value = serde_json::from_str(&purged).unwrap();
    assert_eq!(purged["letters"][0]["job_id"], "k-2");
    assert_eq!(purged["letters"][0]["purged_by"], "ops");
    let unknown = app.cli_output(&["dlq", "purge", "k-9", "--yes"]).await;
    assert!(!unknown.status.success(), "an unknown id is an error");
    let again = app.cli_output(&["dlq", "purge", "k-2", "--yes"]).await;
    assert!(!again.status.success(), "a purged row is no longer dead");
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
