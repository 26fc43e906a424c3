//! `GET /v1/overview`: the last hour from the workers' heartbeats, the queues, the outbox; and
//! what it says when a source is down.

use std::path::Path;
use std::sync::Arc;

use mailroom::config::UrlList;
use mailroom::http::metrics::{Metrics, QueueDepths};
use mailroom::render::{LiveTemplates, Templates};
use serde_json::{Value, json};

use crate::helpers::*;

fn templates() -> Arc<LiveTemplates> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    Arc::new(LiveTemplates::fixed(Templates::load(&dir).unwrap()))
}

async fn overview(api: &Api) -> Value {
    let resp = api
        .client
        .get(format!("{}/v1/overview", api.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn the_overview_counts_the_hour_lists_the_workers_and_reads_queues_and_outbox() {
    let app = TestApp::spawn().await;
    let queues = QueueDepths::new(
        app.amqp_url.parse::<UrlList>().unwrap(),
        app.topology.clone(),
        "mailroom test overview",
    );
    let metrics = Metrics {
        queues: Some(Arc::new(queues)),
        ..Metrics::default()
    };
    let api = Api::start_with(&app, templates(), metrics).await;
    let worker = app.start_worker(&[]);
    for i in 0..3 {
        app.publish(&app.job(&format!("overview-{i}"))).await;
    }
    let mut refused = app.job("overview-bad");
    refused["kind"] = json!("no_such_template");
    app.publish(&refused).await;
    worker
        .stats
        .wait_until(|s| s.sent == 3 && s.dead_lettered == 1)
        .await;
    worker.stop().await;
    // A row the relay (not running) has yet to publish.
    app.enqueue(&app.email_job("overview-pending"))
        .await
        .unwrap();

    let o = overview(&api).await;
    assert_eq!(o["namespace"], json!(app.namespace));
    assert_eq!(o["minutes"].as_array().unwrap().len(), 60, "{o:#}");
    assert_eq!(
        o["last_hour"],
        json!({"sent": 3, "retried": 0, "dead": 1}),
        "{o:#}"
    );
    let workers = o["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{o:#}");
    assert_eq!(workers[0]["state"], "stopped");
    assert_eq!(workers[0]["sent"], 3);
    assert_eq!(o["outbox"]["pending"], 1, "{o:#}");
    assert!(o["outbox"]["relay_lag_seconds"].as_f64().unwrap() >= 0.0);
    let roles: Vec<&str> = o["queues"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles.first(), Some(&"work"), "{o:#}");
    assert_eq!(roles.last(), Some(&"dead"), "{o:#}");
    assert!(roles.contains(&"retry"), "{o:#}");
    assert_eq!(o["unavailable"], json!([]), "{o:#}");
}

#[tokio::test]
async fn an_unreachable_broker_leaves_the_queues_out_and_says_so() {
    let app = TestApp::spawn().await;
    let port = ClosedPort::new();
    let closed = format!("amqp://guest:guest@127.0.0.1:{}/%2f", port.port());
    let queues = QueueDepths::new(
        closed.parse::<UrlList>().unwrap(),
        app.topology.clone(),
        "mailroom test overview",
    );
    let metrics = Metrics {
        queues: Some(Arc::new(queues)),
        ..Metrics::default()
    };
    let api = Api::start_with(&app, templates(), metrics).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("overview-partial")).await;
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;

    let o = overview(&api).await;
    assert!(o["queues"].is_null(), "{o:#}");
    let unavailable = o["unavailable"].as_array().unwrap();
    assert_eq!(unavailable.len(), 1, "{o:#}");
    assert!(
        unavailable[0].as_str().unwrap().starts_with("queues:"),
        "{o:#}"
    );
    // The database's parts are still there.
    assert_eq!(o["last_hour"]["sent"], 1, "{o:#}");
    assert_eq!(o["outbox"]["pending"], 0, "{o:#}");
}

#[tokio::test]
async fn serve_reports_the_queue_depths_in_its_metrics() {
    let app = TestApp::spawn().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let _serve = app.spawn_serve_process(&addr, &[]);
    let dead = r#"mailroom_queue_messages{queue="dead"} 0"#;
    let text = mailroom_test_kit::waits::eventually("serve's /metrics", || async {
        scrape_metrics(&addr).await.filter(|t| t.contains(dead))
    })
    .await;
    assert!(
        text.contains(r#"mailroom_queue_consumers{queue="work"}"#),
        "{text}"
    );
}
