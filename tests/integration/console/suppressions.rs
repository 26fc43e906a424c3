//! The Suppressions page in Chromium against `mailroom serve`: an address added through the
//! form is recorded with the operator's name, a real worker then records a job to it
//! `suppressed` and sends nothing, and its Remove button lifts it.

use crate::helpers::*;

#[tokio::test]
async fn an_address_suppressed_in_the_console_is_not_mailed_until_it_is_removed() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve().await;
    let browser = Browser::start(Screen::Phone).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    console.open(&browser, "/console/suppressions").await;
    browser
        .wait_for_text("#entries", "No address is suppressed")
        .await;

    browser
        .fill("#add input[name=address]", "ada@EXAMPLE.com")
        .await;
    browser
        .script(
            "document.querySelector('#add select[name=reason]').value = 'unsubscribed';",
            serde_json::json!([]),
        )
        .await;
    browser
        .fill("#add input[name=detail]", "asked by phone")
        .await;
    browser.click("#add button").await;
    browser
        .wait_for_text("#done", "suppressed (unsubscribed)")
        .await;
    let row = browser.wait_for_text("#entries", "ada@example.com").await;
    assert!(
        row.contains("asked by phone") && row.contains("Ada"),
        "{row}"
    );

    let worker = app.start_worker(&[]);
    app.publish(&app.job("to-ada")).await;
    worker.stats.wait_until(|s| s.suppressed == 1).await;
    let out = app.cli(&["status", "to-ada", "welcome"]).await;
    assert!(
        out.contains("suppressed") && out.contains("asked by phone"),
        "{out}"
    );

    browser.click("#entries button.remove").await;
    browser
        .wait_for_text("#done", "is no longer suppressed")
        .await;
    browser
        .wait_for_text("#entries", "No address is suppressed")
        .await;
    app.publish(&app.job("to-ada-again")).await;
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("to-ada", "welcome")), 0);
    assert_eq!(
        app.smtp.count(&app.message_id("to-ada-again", "welcome")),
        1
    );
}

#[tokio::test]
async fn a_suppression_post_without_the_csrf_token_is_refused_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve().await;
    let session = console.http_session().await;
    let post = |csrf: Option<&str>| {
        let mut form = vec![("address", "ada@example.com"), ("reason", "manual")];
        form.extend(csrf.map(|c| ("csrf", c)));
        session
            .client
            .post(format!("{}/console/suppressions/add", console.base))
            .header("cookie", &session.cookie)
            .header("content-type", FORM)
            .body(form_body(&form))
            .send()
    };
    assert_eq!(post(None).await.unwrap().status(), 403);
    let out = app.cli(&["suppressions", "list"]).await;
    assert!(out.trim().is_empty(), "{out}");
    // The same POST with the session's token is taken: the refusal was the token's.
    assert_eq!(post(Some(&session.csrf)).await.unwrap().status(), 303);
    let out = app.cli(&["suppressions", "list"]).await;
    assert!(out.contains("ada@example.com  manual"), "{out}");
}
