//! The console in a real headless Chromium against the real `mailroom serve` / `run` binary:
//! logging in, editing a template with its live preview, saving it and seeing the next email
//! use it, a broken edit refused with nothing written, CSRF, no external requests, a phone's
//! width, and the designer's preview that follows the files.

use serde_json::json;

use crate::helpers::*;

/// The `mailroom_template_info` line of a `/metrics` text: the revision in use.
fn revision_line(metrics: &str) -> Option<String> {
    metrics
        .lines()
        .find(|l| l.starts_with("mailroom_template_info{"))
        .map(str::to_owned)
}

#[tokio::test]
async fn the_token_logs_in_and_a_wrong_token_is_refused() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve().await;
    let browser = Browser::start(Screen::Desktop).await;

    browser
        .goto(&format!("{}/console/templates", console.base))
        .await;
    assert!(
        browser.url().await.ends_with("/console/login"),
        "a visitor is sent to log in"
    );
    console.log_in(&browser, "not-the-token", "Mallory").await;
    browser
        .wait_for_text("#login-error", "not the API token")
        .await;
    assert!(!browser.has("#templates").await);

    let landed = console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    assert!(landed.ends_with("/console/templates"), "{landed}");
    let table = browser.wait_for_text("#templates", "welcome").await;
    assert!(
        table.contains("ok"),
        "every shipped template checks: {table}"
    );
    browser.wait_for_text("#logout", "Ada").await;
}

#[tokio::test]
async fn an_edit_shows_in_the_preview_and_once_saved_the_next_email_uses_it() {
    let app = TestApp::spawn().await;
    let console = app.start_console_run().await;
    let metrics_at = console.base.clone();
    let before = revision_line(
        &scrape_metrics(metrics_at.trim_start_matches("http://"))
            .await
            .unwrap(),
    );
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    browser
        .goto(&format!(
            "{}/console/templates/welcome/default",
            console.base
        ))
        .await;
    browser
        .wait_for_text("#preview-subject", "Welcome to Acme Cloud, Ada!")
        .await;

    browser
        .fill(
            "#subject",
            "Hello {{user.name}}, your {{product_name}} awaits",
        )
        .await;
    browser
        .wait_for_text("#preview-subject", "Hello Ada, your Acme Cloud awaits")
        .await;
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
    assert!(document.text().await.unwrap().contains("Acme Cloud"));
    assert_eq!(
        console.file("welcome/subject.hbs"),
        std::fs::read(shipped().join("welcome/subject.hbs")).unwrap(),
        "a preview writes nothing"
    );

    browser.click("#save").await;
    browser.wait_for_text("#save-result", "Saved").await;
    assert_eq!(
        console.file("welcome/subject.hbs"),
        b"Hello {{user.name}}, your {{product_name}} awaits"
    );
    eventually("the process to send with the saved revision", || async {
        let now = revision_line(&scrape_metrics(metrics_at.trim_start_matches("http://")).await?);
        (now != before).then_some(())
    })
    .await;
    app.publish(&app.job("after-edit")).await;
    let got = app.smtp.wait_for(1).await;
    assert_eq!(subject(&got[0]), "Hello Ada, your Acme Cloud awaits");

    browser
        .goto(&format!(
            "{}/console/templates/welcome/default",
            console.base
        ))
        .await;
    // The preview settles first: its swap moves the history down the page.
    browser.wait_for_text("#preview-subject", "Hello Ada").await;
    let history = browser.wait_for_text("#history", "Ada").await;
    assert!(
        history.contains("(on disk)"),
        "the files before the first save are a revision: {history}"
    );
    browser.click("#history tbody tr:first-child a").await;
    browser
        .wait_for_text("pre.diff", "+Hello {{user.name}}")
        .await;
}

#[tokio::test]
async fn a_broken_edit_is_refused_with_its_line_and_nothing_is_written() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve().await;
    let (subject_before, html_before) = (
        console.file("welcome/subject.hbs"),
        console.file("welcome/html.hbs"),
    );
    let browser = Browser::start(Screen::Desktop).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    browser
        .goto(&format!(
            "{}/console/templates/welcome/default",
            console.base
        ))
        .await;
    browser.wait_for_text("#preview-subject", "Welcome").await;

    browser
        .fill("#subject", "Welcome {{#if user}}unclosed")
        .await;
    browser
        .wait_for_text("#errors", "welcome/subject.hbs:1")
        .await;
    browser.click("#save").await;
    let refusal = browser.wait_for_text("#save-result", "Not saved").await;
    assert!(
        refusal.contains("welcome/subject.hbs:1"),
        "the error has its line: {refusal}"
    );

    browser
        .fill("#subject", "Welcome {{no_such_variable}}")
        .await;
    browser.click("#save").await;
    let refusal = browser
        .wait_for_text("#save-result", "no_such_variable")
        .await;
    assert!(refusal.contains("Not saved"), "{refusal}");
    assert_eq!(console.file("welcome/subject.hbs"), subject_before);
    assert_eq!(console.file("welcome/html.hbs"), html_before);
    let leftovers: Vec<_> = std::fs::read_dir(console.templates.path().join("welcome"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files: {leftovers:?}");
}

#[tokio::test]
async fn a_post_without_the_csrf_token_is_refused() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve().await;
    let session = console.http_session().await;
    let before = console.file("welcome/subject.hbs");
    let save = format!("{}/console/templates/welcome/default/save", console.base);
    let draft = |csrf: Option<&str>| {
        let mut form = vec![
            ("subject", "Changed {{user.name}}"),
            ("html", "<p>{{user.name}}</p>"),
            ("text", ""),
            ("base", session.base_hash.as_str()),
        ];
        form.extend(csrf.map(|c| ("csrf", c)));
        form_body(&form)
    };
    for (csrf, why) in [
        (None, "no CSRF token"),
        (Some("0".repeat(64)), "a wrong CSRF token"),
    ] {
        let answer = session
            .client
            .post(&save)
            .header("cookie", &session.cookie)
            .header("content-type", FORM)
            .body(draft(csrf.as_deref()))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 403, "{why}");
        assert!(answer.text().await.unwrap().contains(why));
    }
    let cross_site = session
        .client
        .post(&save)
        .header("cookie", &session.cookie)
        .header("sec-fetch-site", "cross-site")
        .header("content-type", FORM)
        .body(draft(Some(&session.csrf)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        cross_site.status(),
        403,
        "a cross-site POST, even with the token"
    );
    assert_eq!(
        console.file("welcome/subject.hbs"),
        before,
        "nothing written"
    );

    let answer = session
        .client
        .post(&save)
        .header("cookie", &session.cookie)
        .header("content-type", FORM)
        .body(draft(Some(&session.csrf)))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "the same POST with the token saves");
    assert_eq!(
        console.file("welcome/subject.hbs"),
        b"Changed {{user.name}}"
    );
}

#[tokio::test]
async fn without_a_token_the_console_opens_on_loopback_and_still_wants_the_csrf_token() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve_with(None).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = client
        .get(format!("{}/console/login", console.base))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303, "no login without a token");
    let editor = format!("{}/console/templates/welcome/default", console.base);
    let page = client.get(&editor).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let set = page.headers()["set-cookie"].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP without a proxy: {set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let html = page.text().await.unwrap();
    let field = |name: &str| {
        let marker = format!("name=\"{name}\" value=\"");
        let at = html.find(&marker).unwrap() + marker.len();
        html[at..].split('"').next().unwrap().to_owned()
    };
    let (base, csrf) = (field("base"), field("csrf"));
    let mut form = vec![
        ("subject", "Local {{user.name}}"),
        ("html", "<p>{{user.name}}</p>"),
        ("base", base.as_str()),
    ];
    let post = |body: String| {
        client
            .post(format!("{editor}/save"))
            .header("cookie", &cookie)
            .header("content-type", FORM)
            .body(body)
            .send()
    };
    assert_eq!(
        post(form_body(&form)).await.unwrap().status(),
        403,
        "no CSRF token"
    );
    form.push(("csrf", csrf.as_str()));
    assert_eq!(post(form_body(&form)).await.unwrap().status(), 200);
    assert_eq!(console.file("welcome/subject.hbs"), b"Local {{user.name}}");
}

/// Every page's resources (`performance` entries) come from the console's own origin, and the
/// page is no wider than the phone's screen.
#[tokio::test]
async fn the_pages_fetch_nothing_from_elsewhere_and_fit_a_phone() {
    let app = TestApp::spawn().await;
    let console = app.start_console_serve().await;
    let browser = Browser::start(Screen::Phone).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    let pages = [
        "/console",
        "/console/dead-letters",
        "/console/jobs",
        "/console/templates",
        "/console/templates/welcome/fr",
        "/console/templates/welcome/default/live",
    ];
    for page in pages {
        browser.goto(&format!("{}{page}", console.base)).await;
        browser.find("main h1").await;
        if page.contains("/welcome/") {
            browser.find("#preview-html").await;
        }
        let seen = browser
            .script(
                "return { width: window.innerWidth, scroll: document.documentElement.scrollWidth,
                          origins: performance.getEntriesByType('resource').map(e => new URL(e.name).origin),
                          htmx: typeof htmx, styles: document.querySelectorAll('style').length }",
                json!([]),
            )
            .await;
        assert_eq!(seen["width"], 390, "{page}: {seen}");
        assert!(
            seen["scroll"].as_i64().unwrap() <= 390,
            "{page} scrolls sideways: {seen}"
        );
        assert_eq!(
            seen["htmx"], "object",
            "{page}: htmx loaded from the binary"
        );
        for origin in seen["origins"].as_array().unwrap() {
            assert_eq!(origin.as_str().unwrap(), console.base, "{page}: {seen}");
        }
    }
    let headers = reqwest::get(format!("{}/console/login", console.base))
        .await
        .unwrap();
    let csp = headers.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(headers.headers()["referrer-policy"], "no-referrer");
    assert_eq!(headers.headers()["x-content-type-options"], "nosniff");
}

#[tokio::test]
async fn the_designer_preview_follows_the_files_as_they_are_saved() {
    let designer = ConsoleServer::start_designer("welcome").await;
    let browser = Browser::start(Screen::Desktop).await;
    browser
        .goto(&format!(
            "{}/console/templates/welcome/default/live",
            designer.base
        ))
        .await;
    browser
        .wait_for_text("#preview-subject", "Welcome to Acme Cloud, Ada!")
        .await;

    let subject = designer.templates.path().join("welcome/subject.hbs");
    std::fs::write(&subject, "Edited in my editor, {{user.name}}").unwrap();
    browser
        .wait_for_text("#preview-subject", "Edited in my editor, Ada")
        .await;
    std::fs::write(&subject, "Broken {{#each}}").unwrap();
    browser
        .wait_for_text("#errors", "welcome/subject.hbs")
        .await;
}
