//! Wiring: each process built from plain settings, in one place (as zero-to-production's
//! `Application::build`). The CLI parses arguments into these settings and calls one `run_*`
//! function with its shutdown signal; the tests build the same pieces. Validation that needs
//! more than one setting (the lease against the SMTP timeout, the API's exposure) happens here.
//!
//! - [`WorkerConfig`] → [`build_worker`], [`run_worker`]: `mailroom worker`;
//! - [`RelayConfig`] → [`build_relay`], [`run_relay`]: `mailroom relay`;
//! - [`ServeConfig`] → [`run_serve`]: `mailroom serve`, the HTTP API;
//! - [`RunConfig`] → [`run_all`]: `mailroom run`, relay, worker and HTTP API in one process;
//! - here, what they share: the first contact with the database and the broker
//!   ([`check_database`], [`check_broker`]), the broker settings, loading and following the
//!   template directory, and the optional `/metrics` (and `/readyz`) listener of a process
//!   without the HTTP API.
//!
//! Every `run_*` checks its database first: reachable, taking the login, and carrying the
//! schema of this binary's migrations; else the process ends at once with one line that says
//! why (exit 69 or 78, [`crate::exit`]). A broker that refuses the login ends it too; a broker
//! that is down does not: the session loops wait for it.

mod relay;
mod run;
mod serve;
mod worker;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::broker::Topology;
use crate::config::{Delays, SecretUrl, UrlList};
use crate::db::Database;
use crate::dlq::seal::ReplayKey;
use crate::exit::{self, Code};
use crate::http::Readiness;
use crate::http::metrics::{Metrics, QueueDepths};
use crate::render::{LiveTemplates, Templates};

pub use relay::{RelayConfig, RelayTuning, build_relay, run_relay};
pub use run::{RunConfig, run_all};
pub use serve::{HttpConfig, ServeConfig, api_state, bind, run_serve};
pub use worker::{DkimConfig, WorkerConfig, build_worker, run_worker};

/// The broker every process talks to, and the names of its exchanges and queues.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// One URL, or several to fail over between nodes.
    pub amqp_url: UrlList,
    /// Prefix of every exchange and queue.
    pub namespace: String,
    /// The retry tiers, increasing.
    pub retry_delays: Delays,
    /// Seals replayed dead letters; `None` uses the key kept in the database.
    pub replay_key: Option<ReplayKey>,
}

impl BrokerConfig {
    pub fn topology(&self) -> Topology {
        Topology::new(&self.namespace, self.retry_delays.0.clone())
    }
}

/// Starts the dead-letter ingester of a worker, `serve` or `run` process
/// ([`crate::dlq::ingest`]): a consumer of `<ns>.dead` on a pool of its own, until `shutdown`.
pub fn spawn_ingest(
    database_url: &SecretUrl,
    broker: &BrokerConfig,
    retention: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    let db = Database::connect_lazy(database_url, 2)?;
    let ingester = crate::dlq::ingest::Ingester::new(
        broker.amqp_url.clone(),
        broker.topology(),
        db,
        retention,
    );
    Ok(tokio::spawn(ingester.run(shutdown.clone())))
}

/// The first contact with the database: one connection at once (a refusal says where and
/// why), then the schema against this binary's migrations (none, behind: run `mailroom
/// migrate`; newer: refused).
pub async fn check_database(url: &SecretUrl) -> anyhow::Result<()> {
    let db = Database::connect_lazy(url, 1)?;
    db.verify().await?;
    let schema = db.require_schema().await;
    db.close().await;
    Ok(schema?)
}

/// The first contact with the broker: a refused login or virtual host ends the start (the
/// configuration is wrong); a broker that cannot be reached is logged and left to the session
/// loop, which waits for it.
pub async fn check_broker(urls: &UrlList, name: &str) -> anyhow::Result<()> {
    match crate::broker::connect(urls, &format!("{name} (startup check)")).await {
        Ok(conn) => {
            let _ = conn.close(200, "startup check".into()).await;
            Ok(())
        }
        Err(e) if exit::code_of(&e) == Code::Config => Err(e),
        Err(e) => {
            tracing::warn!(
                error = exit::one_line(&e),
                "RabbitMQ is not reachable yet; waiting for it"
            );
            Ok(())
        }
    }
}

/// Loads the template directory `dir`, made absolute first so that a reload does not depend on
/// the working directory; returns that absolute path with the set. Every process and command
/// that reads templates loads them here.
pub fn load_templates(dir: &Path) -> anyhow::Result<(PathBuf, Templates)> {
    let dir = std::path::absolute(dir)
        .with_context(|| format!("template directory {}", dir.display()))?;
    let loaded = Templates::load(&dir)
        .with_context(|| format!("loading templates from {}", dir.display()))?;
    Ok((dir, loaded))
}

/// Loads `dir` ([`load_templates`]) and follows it ([`follow_templates`]) until `shutdown`.
pub fn live_templates(
    dir: &Path,
    interval: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<Arc<LiveTemplates>> {
    let (dir, loaded) = load_templates(dir)?;
    let live = Arc::new(LiveTemplates::new(dir, loaded));
    follow_templates(live.clone(), interval, shutdown)?;
    Ok(live)
}

/// Polls `live`'s directory every `interval`, and reloads it on SIGHUP, until `shutdown`.
pub fn follow_templates(
    live: Arc<LiveTemplates>,
    interval: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let hup = live.clone();
    crate::shutdown::on_hangup(move || hup.request_reload(), shutdown)?;
    tokio::spawn(live.watch(interval, shutdown.clone()));
    Ok(())
}

/// The queue depths of `broker`'s queues for `/metrics`, read on a connection named for `role`.
pub fn queue_depths(broker: &BrokerConfig, role: &str) -> Arc<QueueDepths> {
    let name = format!("mailroom {role} metrics (pid {})", std::process::id());
    Arc::new(QueueDepths::new(
        broker.amqp_url.clone(),
        broker.topology(),
        name,
    ))
}

/// A `/metrics` (and `/healthz`) listener of its own, serving until `shutdown`.
type MetricsServer = JoinHandle<anyhow::Result<()>>;

/// Binds and serves `metrics` and `readiness` on `addr` until `shutdown`, when an address was
/// given.
pub async fn spawn_metrics(
    addr: Option<SocketAddr>,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<MetricsServer>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} for metrics"))?;
    let stop = shutdown.clone();
    Ok(Some(tokio::spawn(crate::http::serve_metrics(
        listener, metrics, readiness, stop,
    ))))
}

/// Stops the metrics listener, if there is one, and waits for it.
async fn stop_metrics(
    server: Option<MetricsServer>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    shutdown.cancel();
    match server {
        Some(server) => server.await?,
        None => Ok(()),
    }
}
