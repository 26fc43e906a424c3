//! The Overview page in Chromium against `mailroom serve`: the last hour's counts after a real
//! worker sent and retried jobs, said in words, drawn and tabled; the worker listed; the panel
//! refreshing itself without reloading the page; and an unreachable broker said in one line.

use serde_json::json;

use crate::helpers::*;

/// Runs a worker of `app` until it has sent `sent` jobs in all (retrying as the SMTP recorder
/// makes it), then stops it so its last heartbeat is written.
async fn send(app: &TestApp, ids: &[&str], sent: u64) {
    let worker = app.start_worker(&[]);
    for id in ids {
        app.publish(&app.job(id)).await;
    }
    worker.stats.wait_until(|s| s.sent == sent).await;
    worker.stop().await;
}

#[tokio::test]
async fn the_overview_shows_what_a_real_worker_sent_and_retried_and_lists_it_refreshing_itself() {
    let app = TestApp::spawn_with(&["--fail", "DATA:451:1"]).await;
    let console = app.start_console_serve().await;
    send(&app, &["hour-1", "hour-2", "hour-3"], 3).await;
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    console.open(&browser, "/console").await;

    browser
        .wait_for_text("#hour-totals", "3 sent, 1 retried, 0 dead.")
        .await;
    let charts = browser
        .script(
            "return { bars: document.querySelectorAll('svg.bars rect').length,
                      labels: [...document.querySelectorAll('svg.bars')].map(s => s.getAttribute('aria-label')),
                      minutes: document.querySelector('#minutes').textContent }",
            json!([]),
        )
        .await;
    assert_eq!(
        charts["bars"], 180,
        "60 minutes × sent, retried, dead: {charts}"
    );
    let labels = charts["labels"].to_string();
    assert!(
        labels.contains("sent per minute over the last hour: 3 in all"),
        "{labels}"
    );
    assert!(
        labels.contains("retried per minute over the last hour: 1 in all"),
        "{labels}"
    );
    assert!(
        charts["minutes"].as_str().unwrap().contains("Retried"),
        "{charts}"
    );

    let workers = browser.wait_for_text("#workers", "stopped").await;
    // The worker ran in this test's process: its host and pid are this one's.
    let pid = format!("(pid {})", std::process::id());
    assert!(workers.contains(&pid), "{workers}");
    assert!(workers.contains(env!("CARGO_PKG_VERSION")), "{workers}");
    assert!(workers.contains("3 · 1 · 0"), "{workers}");
    let queues = browser.text("#queues").await;
    assert!(
        queues.contains("work") && queues.contains("dead"),
        "{queues}"
    );
    assert!(browser.text("#outbox").await.contains("Relay lag"));
    browser.wait_for_text("#circuit", "No worker running").await;

    // A mark the page keeps only if it is never reloaded: htmx swaps the panel alone.
    browser.script("window.kept = 'yes'", json!([])).await;
    send(&app, &["hour-4"], 1).await;
    browser
        .wait_for_text("#hour-totals", "4 sent, 1 retried")
        .await;
    assert_eq!(browser.script("return window.kept", json!([])).await, "yes");
}

#[tokio::test]
async fn with_the_broker_unreachable_the_overview_says_so_and_shows_the_rest() {
    let app = TestApp::spawn().await;
    let proxy = FaultProxy::in_front_of(&app.amqp_url).await;
    let console = app
        .start_console_serve_on(&proxy.url_through(&app.amqp_url))
        .await;
    // Serve checked the broker at its start; the depths have not been read yet.
    proxy.set(Fault::Reset);
    app.enqueue(&app.email_job("waiting")).await.unwrap();
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    console.open(&browser, "/console").await;

    let queues = browser
        .wait_for_text("#queues", "Broker unreachable: queue depths unknown.")
        .await;
    assert_eq!(queues.lines().count(), 2, "a title and one line: {queues}");
    browser
        .wait_for_text("#outbox", "Waiting to be published\n1")
        .await;
    browser.wait_for_text("#hour-totals", "0 sent").await;
}
