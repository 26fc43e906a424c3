//! The Jobs pages in Chromium: a job found by recipient, its timeline with a 451 attempt then
//! the sent one, replies in order, and its email rendered in the sandboxed frame; a job whose
//! id holds CJK characters and a `/` found by prefix, its page opened through the link.

use serde_json::json;

use crate::helpers::*;

/// Searches the Jobs page with `field` set to `value`; the results' text once `wanted` shows.
async fn search(
    browser: &Browser,
    console: &ConsoleServer,
    field: &str,
    value: &str,
    wanted: &str,
) -> String {
    console.open(browser, "/console/jobs").await;
    browser.fill(&format!("#{field}"), value).await;
    browser.click("#search-submit").await;
    browser.wait_for_text("#jobs", wanted).await
}

#[tokio::test]
async fn a_job_found_by_recipient_shows_its_451_attempt_then_the_sent_one_and_its_email() {
    let app = TestApp::spawn_with(&["--fail", "DATA:451:1"]).await;
    let console = app.start_console_run().await;
    let mut grace = app.email_job("order-grace");
    grace.to = vec!["Grace Hopper <Grace@Example.ORG>".into()];
    app.enqueue(&grace).await.unwrap();
    app.wait_for_row("order-grace", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    app.enqueue(&app.email_job("order-someone-else"))
        .await
        .unwrap();
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;

    let found = search(
        &browser,
        &console,
        "recipient",
        "Grace@example.org",
        "order-grace",
    )
    .await;
    assert!(!found.contains("order-someone-else"), "{found}");
    assert!(found.contains("G***@example.org"), "masked: {found}");
    browser.click("#jobs a").await;
    browser.wait_for_text("#job-state", "sent").await;

    let timeline = browser.text("#timeline").await;
    let at = |needle: &str| {
        timeline
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} in {timeline}"))
    };
    assert!(at("Created") < at("Published to the broker"), "{timeline}");
    assert!(
        at("Published to the broker") < at("Attempt 1: failed"),
        "{timeline}"
    );
    // A 451 after the final dot: the server's reply is in the attempt's error.
    assert!(at("Attempt 1: failed") < at("(451)"), "{timeline}");
    assert!(at("(451)") < at("Attempt 2: sent"), "{timeline}");
    assert!(at("Attempt 2: sent") < at("SMTP reply: 250"), "{timeline}");
    let last = timeline.lines().last().unwrap_or_default();
    assert!(last.starts_with("Sent"), "ends sent: {timeline}");

    browser
        .wait_for_text("#preview-subject", "Welcome to Acme Cloud, Ada!")
        .await;
    let frame = browser
        .script(
            "const f = document.querySelector('#preview-html');
             return { sandbox: f.getAttribute('sandbox'), src: f.src }",
            json!([]),
        )
        .await;
    assert_eq!(
        frame["sandbox"], "",
        "an empty sandbox: no scripts, opaque origin"
    );
    let document = reqwest::get(frame["src"].as_str().unwrap()).await.unwrap();
    let csp = document.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("sandbox") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(document.text().await.unwrap().contains("Acme Cloud"));
}

#[tokio::test]
async fn a_job_id_with_cjk_characters_and_a_slash_is_found_and_its_page_opens() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve().await;
    let id = "注文/2026-12?#1";
    app.enqueue(&app.email_job(id)).await.unwrap();
    app.enqueue(&app.email_job("注文-other")).await.unwrap();
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;

    let found = search(&browser, &console, "job_id", "注文/*", id).await;
    assert!(!found.contains("注文-other"), "{found}");
    browser.click("#jobs a").await;
    let summary = browser.wait_for_text("#job-summary", id).await;
    assert!(summary.contains("queued"), "{summary}");
    assert!(
        browser
            .url()
            .await
            .contains("%E6%B3%A8%E6%96%87%2F2026-12%3F%231/welcome")
    );
    let timeline = browser.text("#timeline").await;
    assert!(timeline.starts_with("Created"), "{timeline}");
    browser
        .wait_for_text("#preview-subject", "Welcome to Acme Cloud")
        .await;

    console
        .open(&browser, "/console/jobs/%E6%B3%A8%E6%96%87%2Fnone/welcome")
        .await;
    browser.wait_for_text("#no-job", "注文/none").await;
}
