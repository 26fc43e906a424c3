//! The HTTP API against real services: enqueue with an idempotency key, validation, the token,
//! and a job's status walking to `sent`.

use mailroom::http;
use serde_json::{Value, json};

use crate::helpers::*;

impl Api {
    async fn post(&self, key: Option<&str>, body: &Value) -> (u16, Value) {
        let mut req = self
            .client
            .post(format!("{}/v1/emails", self.base))
            .bearer_auth(TOKEN)
            .json(body);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }
}

fn body_without_id(app: &TestApp) -> Value {
    let mut job = app.job("ignored");
    job.as_object_mut().unwrap().remove("job_id");
    job
}

#[tokio::test]
async fn the_same_idempotency_key_twice_sends_one_email() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let (code, first) = api.post(Some("signup-77"), &body_without_id(&app)).await;
    assert_eq!(code, 202, "{first}");
    assert_eq!(first["job_id"], "signup-77");
    assert_eq!(first["duplicate"], false);
    let (code, second) = api.post(Some("signup-77"), &body_without_id(&app)).await;
    assert_eq!(code, 202);
    assert_eq!(second["duplicate"], true);

    app.deliver_through_outbox("signup-77", "welcome").await;
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn an_invalid_body_is_refused_with_422_naming_the_field() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let mut job = body_without_id(&app);
    job["to"] = json!(["not an address"]);
    let (code, err) = api.post(Some("bad-1"), &job).await;
    assert_eq!(code, 422);
    assert_eq!(err["field"], "to[0]");

    let (code, err) = api
        .post(
            Some("bad-2"),
            &json!({"kind": "welcome", "to": "ada@example.com"}),
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(err["field"], "to", "{err}");

    let mut job = body_without_id(&app);
    job["kind"] = json!("no_such_template");
    let (code, err) = api.post(Some("bad-3"), &job).await;
    assert_eq!(code, 422);
    assert_eq!(err["field"], "kind");

    // What the worker could never send: already expired, or expiring before it is due.
    let mut job = body_without_id(&app);
    job["expires_at"] = json!("2020-01-01T00:00:00Z");
    let (code, err) = api.post(Some("bad-4"), &job).await;
    assert_eq!(code, 422);
    assert_eq!(err["field"], "expires_at", "{err}");
    job["send_at"] = json!("2099-01-02T00:00:00Z");
    job["expires_at"] = json!("2099-01-01T00:00:00Z");
    let (code, err) = api.post(Some("bad-5"), &job).await;
    assert_eq!(code, 422);
    assert_eq!(err["field"], "expires_at", "{err}");
    assert_eq!(app.unpublished().await, 0, "nothing was written");
}

#[tokio::test]
async fn requests_without_the_token_get_401_and_health_needs_none() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let resp = api
        .client
        .post(format!("{}/v1/emails", api.base))
        .json(&app.job("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = api
        .client
        .get(format!("{}/v1/emails/x/welcome", api.base))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = api
        .client
        .get(format!("{}/healthz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let resp = api
        .client
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "{}",
        resp.text().await.unwrap()
    );
}

#[tokio::test]
async fn the_status_endpoint_walks_through_the_states_of_a_real_job() {
    let app = TestApp::spawn_with(&["--fail", "DATA:451:1"]).await;
    let api = Api::start(&app).await;
    let (code, _) = api.post(Some("walk-1"), &body_without_id(&app)).await;
    assert_eq!(code, 202);
    assert_eq!(api.status("walk-1", "welcome").await["state"], "queued");

    let relay = app.start_relay(&[]);
    eventually("published", || async {
        (api.status("walk-1", "welcome").await["state"] == "published").then_some(())
    })
    .await;
    let worker = app.start_worker(&[]);
    let sent = eventually("sent", || async {
        let s = api.status("walk-1", "welcome").await;
        (s["state"] == "sent").then_some(s)
    })
    .await;
    assert_eq!(sent["attempts"], 2, "the first attempt met a 451");
    assert!(sent["smtp_reply"].as_str().unwrap().starts_with("250"));
    assert!(sent["sent_at"].is_string());
    relay.stop().await;
    worker.stop().await;
    let missing = api
        .client
        .get(format!("{}/v1/emails/nope/welcome", api.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);
}

#[test]
fn an_unauthenticated_api_refuses_to_listen_beyond_loopback() {
    let public: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
    let local: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
    assert!(http::check_exposure(&public, None).is_err());
    assert!(http::check_exposure(&public, Some(TOKEN)).is_ok());
    assert!(http::check_exposure(&local, None).is_ok());
}
