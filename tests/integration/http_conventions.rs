//! The HTTP conventions over a real server: every refusal is an RFC 9457 problem (404 for an
//! unknown route, 405 with `Allow`, 413 one byte past the limit and not at it, 415, 401 with
//! `WWW-Authenticate`), and every answer carries a request id, the client's when it is sane.

use mailroom::job::MAX_JOB_BYTES;
use reqwest::{Method, Response};
use serde_json::Value;

use crate::helpers::*;

/// The problem of `resp`: asserts its status and content type, returns its body.
async fn problem(resp: Response, status: u16) -> Value {
    assert_eq!(resp.status().as_u16(), status);
    let ctype = match resp.headers().get("content-type") {
        Some(t) => t.to_str().unwrap().to_string(),
        None => panic!("no content type: {resp:?}"),
    };
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(ctype, "application/problem+json", "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .starts_with("tag:mailroom,2026:problem/"),
        "{body}"
    );
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    assert_eq!(body["request_id"], id.as_str(), "{body}");
    body
}

impl Api {
    fn authed(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
    }
}

#[tokio::test]
async fn an_unknown_route_is_a_404_problem_and_a_wrong_method_a_405_with_allow() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let resp = api
        .authed(Method::GET, "/v1/nothing-here")
        .send()
        .await
        .unwrap();
    problem(resp, 404).await;
    let resp = api.authed(Method::GET, "/v1/emails").send().await.unwrap();
    let allow = resp.headers()["allow"].to_str().unwrap().to_string();
    let body = problem(resp, 405).await;
    assert_eq!(allow, "POST", "{body}");
    let resp = api.authed(Method::DELETE, "/healthz").send().await.unwrap();
    assert!(resp.headers().contains_key("allow"));
    problem(resp, 405).await;
}

#[tokio::test]
async fn a_body_one_byte_over_the_limit_is_a_413_problem_and_one_at_the_limit_is_read() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let mut body = app.job("conv-limit").to_string().into_bytes();
    body.resize(MAX_JOB_BYTES, b' ');
    let post = |body: Vec<u8>| {
        api.authed(Method::POST, "/v1/emails")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let at = post(body.clone()).await.unwrap();
    assert_eq!(at.status().as_u16(), 202, "{}", at.text().await.unwrap());
    body.push(b' ');
    let body = problem(post(body).await.unwrap(), 413).await;
    assert_eq!(body["type"], "tag:mailroom,2026:problem/too-large");
}

#[tokio::test]
async fn a_body_that_is_not_json_by_its_content_type_is_a_415_and_curls_form_type_is_read() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let job = app.job("conv-ctype").to_string();
    for ctype in [
        "text/plain",
        "application/xml",
        "multipart/form-data; boundary=x",
    ] {
        let resp = api
            .authed(Method::POST, "/v1/emails")
            .header("content-type", ctype)
            .body(job.clone())
            .send()
            .await
            .unwrap();
        let body = problem(resp, 415).await;
        assert_eq!(body["field"], "Content-Type", "{body}");
    }
    let resp = api
        .authed(Method::POST, "/v1/dlq/purge")
        .header("content-type", "text/csv")
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(resp, 415).await;
    let resp = api
        .authed(Method::POST, "/v1/emails")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(job)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    assert_eq!(
        app.unpublished().await,
        1,
        "only the form-typed post was written"
    );
}

#[tokio::test]
async fn json_syntax_and_shape_errors_are_problems_naming_the_field_by_pointer() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let post = |body: String| {
        api.authed(Method::POST, "/v1/emails")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let body = problem(post("{\"kind\":".into()).await.unwrap(), 400).await;
    assert_eq!(body["type"], "tag:mailroom,2026:problem/not-json");
    let mut job = app.job("conv-shape");
    job["to"] = serde_json::json!(["ada@example.com", "not an address"]);
    let body = problem(post(job.to_string()).await.unwrap(), 422).await;
    assert_eq!(body["field"], "to[1]");
    assert_eq!(body["pointer"], "/to/1");
    let resp = api
        .authed(Method::GET, "/v1/dlq?summary=maybe")
        .send()
        .await
        .unwrap();
    problem(resp, 400).await;
}

#[tokio::test]
async fn a_401_challenges_with_bearer_and_says_invalid_token_only_when_one_was_given() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let url = format!("{}/v1/emails/x/welcome", api.base);
    let resp = api.client.get(&url).send().await.unwrap();
    let challenge = resp.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(challenge, r#"Bearer realm="mailroom""#);
    problem(resp, 401).await;
    let resp = api
        .client
        .get(&url)
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    let challenge = resp.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        challenge,
        r#"Bearer realm="mailroom", error="invalid_token""#
    );
    problem(resp, 401).await;
    let resp = api
        .client
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(!resp.headers().contains_key("www-authenticate"));
    problem(resp, 404).await;
}

#[tokio::test]
async fn a_sane_request_id_is_echoed_and_an_absent_or_insane_one_is_replaced() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let get = |id: Option<&str>| {
        let mut req = api.client.get(format!("{}/healthz", api.base));
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        req.send()
    };
    let id_of = |resp: &Response| resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let given = "trace-4bf92f3577b34da6:a3ce929d0e0e4736";
    assert_eq!(id_of(&get(Some(given)).await.unwrap()), given);
    let generated = id_of(&get(None).await.unwrap());
    assert_eq!(generated.len(), 32, "{generated}");
    let too_long = "x".repeat(65);
    for insane in ["has space", too_long.as_str(), "quote\"tab\tinside"] {
        let replaced = id_of(&get(Some(insane)).await.unwrap());
        assert_ne!(replaced, insane);
        assert!(
            replaced.bytes().all(|b| b.is_ascii_hexdigit()),
            "{replaced}"
        );
    }
    let at_limit = "y".repeat(64);
    assert_eq!(id_of(&get(Some(&at_limit)).await.unwrap()), at_limit);
    // Probes keep their bodies; the id is still echoed.
    let resp = get(Some("probe-1")).await.unwrap();
    assert_eq!(id_of(&resp), "probe-1");
    assert_eq!(resp.text().await.unwrap(), "ok");
}

#[tokio::test]
async fn the_metrics_listener_of_a_worker_follows_the_same_conventions() {
    let app = TestApp::spawn().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (_session, watched) = tokio::sync::watch::channel(None);
    let readiness = mailroom::http::Readiness {
        session: watched,
        db: app.db.clone(),
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    tokio::spawn(mailroom::http::serve_metrics(
        listener,
        mailroom::http::metrics::Metrics::default(),
        readiness,
        shutdown,
    ));
    let client = reqwest::Client::new();
    let resp = client
        .get(format!("{base}/v1/emails"))
        .header("x-request-id", "scrape-7")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "scrape-7");
    let body = problem(resp, 404).await;
    assert_eq!(body["request_id"], "scrape-7");
    let resp = client.post(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(resp.headers()["allow"], "GET,HEAD");
    problem(resp, 405).await;
    // /readyz keeps its own body: the worker has no broker session here.
    let resp = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["checks"]["broker"], "down", "{body}");
}
