//! What guards the console: the CSRF token and the origin check on every POST, with and
//! without an API token; the security headers; no request to any other site; a phone's width.

use serde_json::json;

use crate::helpers::*;

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
    // 200 bytes, the longest id: CJK and a `/` in one path segment.
    let long_id = format!("{}/{}", "注文".repeat(30), "x".repeat(19));
    app.enqueue(&app.email_job(&long_id)).await.unwrap();
    let job_page = format!(
        "/console/jobs/{}/welcome",
        url::form_urlencoded::byte_serialize(long_id.as_bytes()).collect::<String>()
    );
    // A long address, for a table that must scroll in its own box, not the page.
    let long_address = format!("{}@example.com", "a".repeat(120));
    app.cli(&["suppressions", "add", &long_address]).await;
    let browser = Browser::start(Screen::Phone).await;
    console.log_in(&browser, CONSOLE_TOKEN, "Ada").await;
    let pages = [
        "/console",
        "/console/suppressions",
        "/console/dead-letters",
        "/console/jobs",
        "/console/jobs?state=pending",
        &job_page,
        "/console/templates",
        "/console/templates/welcome/fr",
        "/console/templates/welcome/default/live",
    ];
    for page in pages {
        browser.goto(&format!("{}{page}", console.base)).await;
        browser.find("main h1").await;
        if page.contains("/welcome") {
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
