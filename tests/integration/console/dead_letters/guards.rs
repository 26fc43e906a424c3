//! What guards the Dead letters section: a replay or purge POST without the CSRF token is
//! refused, a broker that is down is said in one line with nothing marked, and the pages fit a
//! phone and fetch nothing from elsewhere.

use serde_json::json;

use super::{dead_with_x_death, row, rows};
use crate::helpers::*;

#[tokio::test]
async fn a_replay_or_purge_post_without_the_csrf_token_is_refused() {
    let app = TestApp::spawn().await;
    let id = dead_with_x_death(&app, &app.job("guarded")).await;
    let console = app.start_console_serve().await;
    let session = console.http_session().await;
    let post = |action: &str, body: String| {
        session
            .client
            .post(format!("{}/console/dead-letters/{action}", console.base))
            .header("cookie", &session.cookie)
            .header("content-type", FORM)
            .body(body)
            .send()
    };
    let id = id.to_string();
    for action in ["replay", "purge"] {
        let answer = post(action, form_body(&[("id", &id)])).await.unwrap();
        assert_eq!(answer.status(), 403, "{action}");
        assert!(answer.text().await.unwrap().contains("no CSRF token"));
        let wrong = form_body(&[("id", &id), ("csrf", &"0".repeat(64))]);
        assert_eq!(post(action, wrong).await.unwrap().status(), 403);
    }
    assert_eq!(row(&rows(&app).await, "guarded").state, "dead");
    assert_eq!(app.ready_messages().await, 0, "nothing published");

    let answer = post("purge", form_body(&[("id", &id), ("csrf", &session.csrf)]))
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(
        answer
            .text()
            .await
            .unwrap()
            .contains("Purged 1 of 1 dead letter")
    );
    assert_eq!(row(&rows(&app).await, "guarded").state, "purged");
}

#[tokio::test]
async fn with_the_broker_down_a_replay_says_so_in_one_line_and_marks_nothing() {
    let app = TestApp::spawn().await;
    let id = dead_with_x_death(&app, &app.job("stranded")).await;
    let port = ClosedPort::new();
    let down = format!("amqp://guest:guest@127.0.0.1:{}/%2f", port.port());
    let console = app.start_console_serve_on(&down).await;
    let session = console.http_session().await;
    let answer = session
        .client
        .post(format!("{}/console/dead-letters/replay", console.base))
        .header("cookie", &session.cookie)
        .header("content-type", FORM)
        .body(form_body(&[
            ("id", &id.to_string()),
            ("csrf", &session.csrf),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let html = answer.text().await.unwrap();
    let at = html
        .find("id=\"result\"")
        .unwrap_or_else(|| panic!("{html}"));
    let result = &html[at..at + html[at..].find("</p>").unwrap()];
    assert!(
        result.contains("The broker is unreachable; nothing was replayed or marked"),
        "{result}"
    );
    assert!(!result.contains('\n'), "one line: {result}");
    let e = rows(&app).await.into_iter().next().unwrap();
    assert_eq!((e.state.as_str(), e.replay_result), ("dead", None));
}

#[tokio::test]
async fn the_dead_letter_pages_fit_a_phone_and_fetch_nothing_from_elsewhere() {
    let app = TestApp::spawn().await;
    let mut job = app.job("phone-with-a-rather-long-job-identifier-0123456789abcdef");
    job["to"] = json!(["A Person With A Long Name <someone.with.a.long.address@example.com>"]);
    let id = dead_with_x_death(&app, &job).await;
    let group = rows(&app).await[0].group.clone();
    let console = app.start_console_serve().await;
    let browser = Browser::start(Screen::Phone).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    let pages = [
        "/console/dead-letters".to_string(),
        format!("/console/dead-letters?group={group}"),
        format!("/console/dead-letters/{id}"),
        format!("/console/dead-letters/confirm?action=replay&group={group}"),
    ];
    for page in pages {
        console.open(&browser, &page).await;
        browser.find("main h1").await;
        if page.ends_with(&format!("/{id}")) {
            browser.wait_for_text("#preview-subject", "Welcome").await;
        }
        let seen = browser
            .script(
                "return { width: window.innerWidth, scroll: document.documentElement.scrollWidth,
                          origins: performance.getEntriesByType('resource').map(e => new URL(e.name).origin) }",
                json!([]),
            )
            .await;
        assert_eq!(seen["width"], 390, "{page}: {seen}");
        assert!(
            seen["scroll"].as_i64().unwrap() <= 390,
            "{page} scrolls sideways: {seen}"
        );
        for origin in seen["origins"].as_array().unwrap() {
            assert_eq!(origin.as_str().unwrap(), console.base, "{page}: {seen}");
        }
    }
}
