//! Dead letters (`mailroom dlq`): the dead-letter queue is ingested into the table, browsing
//! reads the table and changes nothing, replay moves exactly the selection and each replayed
//! job is then sent once (never again if it was sent before), dry runs change nothing, purge
//! takes only what it names.

use lapin::{BasicProperties, Connection, options::*, types::AMQPValue};
use mailroom::broker;
use mailroom::dlq::{DeadLetters, Entry, Filter};
use serde_json::Value;

use crate::helpers::*;

mod browse;
mod claims;
mod filters;
mod ingest;
mod replay;
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
