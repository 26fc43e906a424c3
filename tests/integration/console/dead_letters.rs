//! The Dead letters section in a real headless Chromium against `mailroom serve`: failure
//! groups made by a real worker, a group replayed after a confirmation that states its count
//! and each of its jobs then sent once, a letter's page (error, `x-death`, the email rendered
//! now in a sandboxed frame), purging a selection; [`guards`]: the CSRF token, a broker that is
//! down, and the pages on a phone.

use lapin::{
    BasicProperties, Connection,
    options::BasicPublishOptions,
    types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString},
};
use mailroom::broker;
use mailroom::dlq::{DeadLetters, Entry, Filter, States};
use serde_json::{Value, json};

use crate::helpers::*;

mod guards;

/// Every row, any state, newest first.
async fn rows(app: &TestApp) -> Vec<Entry> {
    let all = Filter {
        state: States::All,
        ..Filter::default()
    };
    let dlq = DeadLetters::new(app.db.clone());
    dlq.list(&all, None, 1000).await.unwrap().letters
}

fn row<'a>(rows: &'a [Entry], job_id: &str) -> &'a Entry {
    rows.iter().find(|e| e.job_id == job_id).unwrap()
}

/// Dead letters made by a real worker: welcome jobs `bounced` (the recorder must answer their
/// RCPT with a 554) and jobs naming no template `unknown`, then ingested into the table.
async fn dead_through_a_worker(
    app: &TestApp,
    worker: &RunningWorker,
    bounced: &[&str],
    unknown: &[&str],
) {
    for id in bounced {
        app.publish(&app.job(id)).await;
    }
    for id in unknown {
        let mut job = app.job(id);
        job["kind"] = "no_such_template".into();
        app.publish_raw("welcome", id, job.to_string().as_bytes())
            .await;
    }
    let n = bounced.len() + unknown.len();
    worker
        .stats
        .wait_until(|s| s.dead_lettered == n as u64)
        .await;
    eventually("the dead letters to be rows", || async {
        app.ingest_dead().await;
        (rows(app).await.len() == n).then_some(())
    })
    .await;
}

/// Publishes `job` to the dead-letter exchange as RabbitMQ dead-letters a rejected message
/// (`x-death`) after the worker's 550, and ingests it; its row id.
async fn dead_with_x_death(app: &TestApp, job: &Value) -> i64 {
    let id = job["job_id"].as_str().unwrap();
    let mut death = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    death.insert(ShortString::from("count"), AMQPValue::LongLongInt(1));
    death.insert(ShortString::from("reason"), text("rejected"));
    death.insert(ShortString::from("queue"), text(&app.topology.queue));
    death.insert(ShortString::from("exchange"), text(&app.topology.exchange));
    death.insert(
        ShortString::from("time"),
        AMQPValue::Timestamp(1_796_040_000),
    );
    let keys = FieldArray::from(vec![text("welcome")]);
    death.insert(
        ShortString::from("routing-keys"),
        AMQPValue::FieldArray(keys),
    );
    let props: BasicProperties = broker::with_headers(
        &broker::job_properties(id, "welcome", 1),
        &[
            (
                "x-mailroom-error",
                text("550 5.1.1 <ada@example.com>: no such user"),
            ),
            ("x-mailroom-error-class", text("rejected")),
            (
                "x-death",
                AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])),
            ),
        ],
    );
    let conn = Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = broker::confirm_channel(&conn).await.unwrap();
    let body = job.to_string().into_bytes();
    let confirm = ch
        .basic_publish(
            app.topology.dlx.as_str().into(),
            "welcome".into(),
            BasicPublishOptions::default(),
            &body,
            props,
        )
        .await
        .unwrap();
    assert!(confirm.await.unwrap().is_ack());
    let _ = conn.close(200, "published".into()).await;
    app.ingest_dead().await;
    row(&rows(app).await, id).id
}

/// Clicks the link of the failure group whose row mentions `text`.
async fn open_group(browser: &Browser, text: &str) {
    let script = "const row = [...document.querySelectorAll('#groups tbody tr')]
                    .find(r => r.textContent.includes(arguments[0]));
                  row.querySelector('td.reason a').click(); return true;";
    browser.script(script, json!([text])).await;
    browser
        .wait_for_text("#filters", "Within one failure group")
        .await;
}

#[tokio::test]
async fn a_group_replayed_after_a_confirmation_of_its_count_sends_each_job_once() {
    let app = TestApp::spawn_with(&["--fail", "RCPT:554:2"]).await;
    let worker = app.start_worker(&[]);
    let (bounced, unknown) = (["bounced-0", "bounced-1"], ["unknown-0", "unknown-1"]);
    dead_through_a_worker(&app, &worker, &bounced, &unknown).await;
    let console = app.start_console_serve().await;
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;

    console.open(&browser, "/console/dead-letters").await;
    let groups = browser.wait_for_text("#groups", "554").await;
    assert!(groups.contains("unknown kind"), "two groups: {groups}");
    open_group(&browser, "554").await;
    let listed = browser.text("#letters").await;
    assert!(
        listed.contains("bounced-0") && listed.contains("bounced-1"),
        "{listed}"
    );
    assert!(!listed.contains("unknown-0"), "only the group: {listed}");
    browser.click("#replay-group").await;
    let question = browser
        .wait_for_text("#question", "Replay 2 dead letters of group")
        .await;
    assert!(question.contains("554"), "{question}");
    assert!(app.smtp.received().is_empty(), "nothing before the POST");
    browser.click("#confirm").await;
    browser
        .wait_for_text("#result", "Published 2 of 2 dead letters")
        .await;

    worker.stats.wait_until(|s| s.sent == 2).await;
    worker.stop().await;
    for id in bounced {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
    }
    let rows = rows(&app).await;
    for id in bounced {
        let e = row(&rows, id);
        assert_eq!(
            (e.state.as_str(), e.replayed_by.as_deref()),
            ("replayed", Some("Ada"))
        );
    }
    for id in unknown {
        let e = row(&rows, id);
        assert_eq!(
            (e.state.as_str(), e.replayed_by.as_deref()),
            ("dead", None),
            "untouched"
        );
    }
}

#[tokio::test]
async fn a_letters_page_shows_its_error_x_death_and_the_email_in_a_sandboxed_frame() {
    let app = TestApp::spawn().await;
    let mut job = app.job("shown");
    job["data"]["note"] = "<b>not bold</b>".into();
    let id = dead_with_x_death(&app, &job).await;
    let console = app.start_console_serve().await;
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;

    console
        .open(&browser, &format!("/console/dead-letters/{id}"))
        .await;
    let error = browser.wait_for_text("#error", "rejected").await;
    assert!(
        error.contains("550 5.1.1") && error.contains("no such user"),
        "{error}"
    );
    assert!(!error.contains("ada@example.com"), "masked: {error}");
    let death = browser.wait_for_text("#x-death", &app.topology.queue).await;
    assert!(death.contains("rejected"), "{death}");
    browser
        .wait_for_text("#preview-subject", "Welcome to Acme Cloud, Ada!")
        .await;
    let sandbox = browser
        .script(
            "return document.querySelector('#preview-html').getAttribute('sandbox')",
            json!([]),
        )
        .await;
    assert_eq!(sandbox, "", "a sandbox that allows nothing");
    let frame = browser.property("#preview-html", "src").await;
    let document = reqwest::get(&frame).await.unwrap();
    let csp = document.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("sandbox") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    let body = browser
        .wait_for_text("#body", "\"job_id\": \"shown\"")
        .await;
    assert!(
        body.contains("<b>not bold</b>"),
        "escaped, shown as text: {body}"
    );
    assert!(
        browser
            .text("#headers")
            .await
            .contains("x-mailroom-error-class")
    );

    browser.click("#replay-one").await;
    browser
        .wait_for_text("#question", &format!("Replay 1 dead letter (letter {id})?"))
        .await;
    browser.click("#confirm").await;
    browser
        .wait_for_text("#result", "Published 1 of 1 dead letter")
        .await;
    assert_eq!(app.ready_messages().await, 1);
}

#[tokio::test]
async fn a_selection_is_purged_after_its_confirmation_and_the_rest_stays_dead() {
    // 554, not 550 5.1.1: a 5.1.1 bounce suppresses the address, and the next job to it would
    // be suppressed instead of dead-lettered.
    let app = TestApp::spawn_with(&["--fail", "RCPT:554"]).await;
    let worker = app.start_worker(&[]);
    dead_through_a_worker(&app, &worker, &["p-0", "p-1", "p-2"], &[]).await;
    worker.stop().await;
    let before = rows(&app).await;
    let console = app.start_console_serve().await;
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;

    console.open(&browser, "/console/dead-letters").await;
    browser.wait_for_text("#letters", "p-2").await;
    for id in ["p-0", "p-2"] {
        let box_of = format!("input[name=id][value=\"{}\"]", row(&before, id).id);
        browser.click(&box_of).await;
    }
    browser.click("#purge-selected").await;
    browser
        .wait_for_text("#question", "Purge 2 dead letters selected?")
        .await;
    browser.click("#confirm").await;
    browser
        .wait_for_text("#result", "Purged 2 of 2 dead letters selected")
        .await;
    let after = rows(&app).await;
    for (id, state) in [("p-0", "purged"), ("p-1", "dead"), ("p-2", "purged")] {
        assert_eq!(row(&after, id).state, state, "{id}");
    }
    assert_eq!(row(&after, "p-0").purged_by.as_deref(), Some("Ada"));
}
