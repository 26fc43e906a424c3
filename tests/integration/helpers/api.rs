//! The HTTP API of one test, served in this process on a port of its own with the test's
//! database, broker namespace and a bearer token.

use std::sync::Arc;

use mailroom::config::UrlList;
use mailroom::http::metrics::Metrics;
use mailroom::http::{self, ApiState};
use mailroom::render::LiveTemplates;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::app::TestApp;

pub const TOKEN: &str = "test-token-5a1f";

/// `GET http://{addr}/metrics`: the text, or `None` while nothing answers there.
pub async fn scrape_metrics(addr: &str) -> Option<String> {
    let resp = reqwest::get(format!("http://{addr}/metrics")).await.ok()?;
    resp.text().await.ok()
}

/// The HTTP API of one test, on a port of its own, stopped when dropped.
pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
    shutdown: CancellationToken,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Api {
    pub async fn start(app: &TestApp) -> Api {
        let templates = mailroom::render::Templates::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates"),
        )
        .unwrap();
        let metrics = Metrics {
            db: Some(app.db.clone()),
            ..Metrics::default()
        };
        Api::start_with(app, Arc::new(LiveTemplates::fixed(templates)), metrics).await
    }

    /// The API with these templates and this `/metrics` content.
    pub async fn start_with(app: &TestApp, templates: Arc<LiveTemplates>, metrics: Metrics) -> Api {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(ApiState {
            db: app.db.clone(),
            amqp: app.amqp_url.parse::<UrlList>().unwrap(),
            topology: app.topology.clone(),
            templates: Some(templates),
            token: Some(TOKEN.into()),
            relay_wake: None,
            metrics,
            broker_probe: http::BrokerProbe::new(
                app.amqp_url.parse::<UrlList>().unwrap(),
                "mailroom test readiness probe",
            ),
            replay_key: None,
        });
        let shutdown = CancellationToken::new();
        tokio::spawn(http::serve(listener, state, shutdown.clone()));
        Api {
            base,
            client: reqwest::Client::new(),
            shutdown,
        }
    }

    pub async fn status(&self, job_id: &str, kind: &str) -> Value {
        let url = format!("{}/v1/emails/{job_id}/{kind}", self.base);
        self.client
            .get(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}
