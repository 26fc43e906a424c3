//! `mailroom serve`: the HTTP API's settings, its listener and its handlers' state.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    BrokerConfig, check_broker, check_database, live_templates, queue_depths, spawn_ingest,
};
use crate::config::SecretUrl;
use crate::db::Database;
use crate::http::metrics::Metrics;
use crate::http::{self, ApiState};
use crate::render::LiveTemplates;

/// Where the HTTP API listens, and the token it requires; shared by `serve` and `run`.
#[derive(Clone)]
pub struct HttpConfig {
    pub addr: SocketAddr,
    /// Without one, the API listens on loopback only ([`http::check_exposure`]).
    pub api_token: Option<String>,
}

impl fmt::Debug for HttpConfig {
    // Never the token itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConfig")
            .field("addr", &self.addr)
            .field("api_token", &self.api_token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// What `mailroom serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub database_url: SecretUrl,
    pub broker: BrokerConfig,
    pub http: HttpConfig,
    /// When given, jobs of a kind without a template are refused, and dead-letter dry runs
    /// render with them; followed live.
    pub templates: Option<PathBuf>,
    pub template_reload_interval: Duration,
    /// Replayed and purged dead-letter rows older than this are deleted.
    pub dead_letter_retention: Duration,
}

/// Serves the API (and follows the templates, when given) until `shutdown`.
pub async fn run_serve(config: &ServeConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    check_database(&config.database_url).await?;
    check_broker(&config.broker.amqp_url, "mailroom serve").await?;
    let templates = match &config.templates {
        Some(dir) => Some(live_templates(
            dir,
            config.template_reload_interval,
            &shutdown,
        )?),
        None => None,
    };
    let listener = bind(&config.http).await?;
    let state = api_state(
        &config.http,
        &config.database_url,
        &config.broker,
        templates,
        Metrics {
            queues: Some(queue_depths(&config.broker, "serve")),
            ..Metrics::default()
        },
        None,
    )?;
    let ingest = spawn_ingest(
        &config.database_url,
        &config.broker,
        config.dead_letter_retention,
        &shutdown,
    )?;
    let served = http::serve(listener, state, shutdown.clone()).await;
    shutdown.cancel();
    let _ = ingest.await;
    served
}

/// Checks the exposure rule and binds the listener.
pub async fn bind(config: &HttpConfig) -> anyhow::Result<TcpListener> {
    http::check_exposure(&config.addr, config.api_token.as_deref())?;
    TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("listening on {}", config.addr))
}

/// The handlers' state; `metrics` gets the API's database for the relay lag. `relay_wake` is the
/// relay of the same process, woken after each new outbox row.
pub fn api_state(
    config: &HttpConfig,
    database_url: &SecretUrl,
    broker: &BrokerConfig,
    templates: Option<Arc<LiveTemplates>>,
    metrics: Metrics,
    relay_wake: Option<Arc<Notify>>,
) -> anyhow::Result<Arc<ApiState>> {
    let db = Database::connect_lazy(database_url, 8)?;
    Ok(Arc::new(ApiState {
        metrics: Metrics {
            db: Some(db.clone()),
            templates: templates.clone(),
            ..metrics
        },
        db,
        amqp: broker.amqp_url.clone(),
        topology: broker.topology(),
        templates,
        token: config.api_token.clone(),
        relay_wake,
        broker_probe: http::BrokerProbe::new(
            broker.amqp_url.clone(),
            format!("mailroom readiness probe (pid {})", std::process::id()),
        ),
        replay_key: broker.replay_key.clone(),
    }))
}
