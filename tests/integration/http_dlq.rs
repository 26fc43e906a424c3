//! `/v1/dlq`: the dead-letter queue over HTTP, only with the API token: list, show, dry run,
//! replay (sent once) and purge.

use serde_json::{Value, json};

use crate::helpers::*;

async fn dlq_get(api: &Api, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = api.client.get(format!("{}{path}", api.base));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn dlq_post(api: &Api, path: &str, body: Value, token: Option<&str>) -> (u16, Value) {
    let mut req = api.client.post(format!("{}{path}", api.base)).json(&body);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test]
async fn dead_letters_are_listed_and_replayed_over_http_only_with_the_token() {
    // The first attempt is refused for good (554, not an address's fault, so the address is
    // not suppressed): the job is dead-lettered as `rejected`.
    let app = TestApp::spawn_with(&["--fail", "RCPT:554:1"]).await;
    let worker = app.start_worker(&[]);
    let ingester = app.start_ingester();
    let api = Api::start(&app).await;
    app.publish(&app.job("d-1")).await;
    app.wait_for_row("d-1", "welcome", "dead", |n| n.status.as_str() == "dead")
        .await;

    let (code, _) = dlq_get(&api, "/v1/dlq", None).await;
    assert_eq!(code, 401);
    let (code, _) = dlq_get(&api, "/v1/dlq", Some("wrong")).await;
    assert_eq!(code, 401);
    let listed = eventually("the dead letter listed", || async {
        let (code, list) = dlq_get(&api, "/v1/dlq", Some(TOKEN)).await;
        assert_eq!(code, 200, "{list}");
        (list["letters"].as_array().unwrap().len() == 1).then_some(list)
    })
    .await;
    let listed = &listed["letters"];
    assert_eq!(listed[0]["job_id"], "d-1");
    assert_eq!(listed[0]["class"], "rejected");
    assert_eq!(listed[0]["recipient"], "a***@example.com");
    let (_, none) = dlq_get(&api, "/v1/dlq?class=invalid&since=1h", Some(TOKEN)).await;
    assert_eq!(none, json!({"letters": [], "next": null}));
    let (_, summary) = dlq_get(&api, "/v1/dlq?summary=true", Some(TOKEN)).await;
    assert_eq!(summary["by_kind"]["welcome"], 1);
    let (code, shown) = dlq_get(&api, "/v1/dlq/d-1", Some(TOKEN)).await;
    assert_eq!(code, 200);
    assert_eq!(shown[0]["notification"]["status"], "dead");
    let (code, _) = dlq_get(&api, "/v1/dlq/nope", Some(TOKEN)).await;
    assert_eq!(code, 404);

    let select = json!({ "ids": ["d-1"] });
    let (code, _) = dlq_post(&api, "/v1/dlq/replay", select.clone(), None).await;
    assert_eq!(code, 401);
    let (code, err) = dlq_post(&api, "/v1/dlq/replay", json!({}), Some(TOKEN)).await;
    assert_eq!(code, 400, "{err}");
    let dry = json!({ "ids": ["d-1"], "dry_run": true });
    let (code, previews) = dlq_post(&api, "/v1/dlq/replay", dry, Some(TOKEN)).await;
    assert_eq!(code, 200, "{previews}");
    assert_eq!(previews[0]["subject"], "Welcome to Acme Cloud, Ada!");
    assert_eq!(previews[0]["status"], "dead");
    assert_eq!(app.smtp.received().len(), 0, "a dry run sends nothing");

    let (code, report) = dlq_post(&api, "/v1/dlq/replay", select, Some(TOKEN)).await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["moved"], 1);
    app.smtp.wait_for(1).await;
    assert_eq!(app.smtp.count(&app.message_id("d-1", "welcome")), 1);
    let (_, left) = dlq_get(&api, "/v1/dlq", Some(TOKEN)).await;
    assert_eq!(left, json!({"letters": [], "next": null}));
    let (_, replayed) = dlq_get(&api, "/v1/dlq?state=replayed", Some(TOKEN)).await;
    assert_eq!(replayed["letters"][0]["replayed_by"], "api");
    assert_eq!(replayed["letters"][0]["replay_result"], "published");
    // A body without a JSON content type, as `curl -d` sends it, is read all the same.
    let resp = api
        .client
        .post(format!("{}/v1/dlq/purge", api.base))
        .bearer_auth(TOKEN)
        .body(r#"{"all": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let report: Value = resp.json().await.unwrap();
    assert_eq!(report["purged"], 0);
    worker.stop().await;
    ingester.stop().await;
}
