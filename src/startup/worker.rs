//! `mailroom worker`: its settings, and the worker built from them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use tokio_util::sync::CancellationToken;

use super::{
    BrokerConfig, check_broker, check_database, follow_templates, load_templates, queue_depths,
    spawn_ingest, spawn_metrics, stop_metrics,
};
use crate::config::{OnUncertain, SecretUrl};
use crate::db::Database;
use crate::exit::{self, Fatal};
use crate::http::Readiness;
use crate::http::metrics::Metrics;
use crate::render::LiveTemplates;
use crate::smtp::dkim::DkimSettings;
use crate::smtp::{Mailer, MailerSettings};
use crate::worker::{Worker, WorkerSettings};

/// What a worker needs, as given (`mailroom worker --help` says what each means); zero counts are
/// raised to one when the worker is built.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub database_url: SecretUrl,
    pub broker: BrokerConfig,
    pub smtp_url: SecretUrl,
    /// Allows a plain `smtp://` URL to a host that is not loopback.
    pub allow_plain_smtp: bool,
    pub from: Mailbox,
    /// Right-hand side of the Message-ID; `None`: the domain of `from`.
    pub message_id_domain: Option<String>,
    pub templates: PathBuf,
    pub on_uncertain: OnUncertain,
    pub lease: Duration,
    pub smtp_timeout: Duration,
    pub max_attempts: i32,
    /// Suppress an address the SMTP server refused as unknown.
    pub suppress_bounces: bool,
    /// `None` keeps every ledger row.
    pub ledger_retention: Option<Duration>,
    pub concurrency: usize,
    /// At least `concurrency` (refused when lower); `None`: twice `concurrency`.
    pub prefetch: Option<u16>,
    pub ledger_group: usize,
    pub smtp_connections: u32,
    /// Sign every message with DKIM.
    pub dkim: Option<DkimConfig>,
    pub shutdown_grace: Duration,
    pub template_reload_interval: Duration,
    /// A `/metrics` listener of its own.
    pub metrics_addr: Option<SocketAddr>,
    /// Replayed and purged dead-letter rows older than this are deleted.
    pub dead_letter_retention: Duration,
    /// The account's send rate, shared by the fleet.
    pub smtp_rate: Option<crate::config::limits::Rate>,
    /// Per recipient domain: rate, concurrency, and slowing down on a slow-down reply.
    pub domain_limits: crate::config::limits::DomainLimits,
}

/// DKIM as configured: the key file and selector, and the signing domain (`None`: the domain of
/// `from`).
#[derive(Clone, Debug)]
pub struct DkimConfig {
    pub key: PathBuf,
    pub selector: String,
    pub domain: Option<String>,
}

// The ingester and the metrics listener stop beside the worker, so within its bound.
const _: () = assert!(
    crate::dlq::ingest::STOP_PATIENCE.as_millis() < crate::worker::STOP_BEYOND_GRACE.as_millis()
);
const _: () =
    assert!(crate::http::STOP_PATIENCE.as_millis() < crate::worker::STOP_BEYOND_GRACE.as_millis());

/// Runs the worker, the template watcher (and SIGHUP) and the optional metrics listener until
/// `shutdown`.
pub async fn run_worker(config: &WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let worker = build_worker(config)?;
    check_database(&config.database_url).await?;
    check_broker(&config.broker.amqp_url, "mailroom worker").await?;
    follow_templates(
        worker.templates(),
        config.template_reload_interval,
        &shutdown,
    )?;
    let metrics = Metrics {
        worker: Some(worker.stats()),
        templates: Some(worker.templates()),
        queues: Some(queue_depths(&config.broker, "worker")),
        ..Metrics::default()
    };
    let readiness = Readiness {
        session: worker.live(),
        db: worker.database(),
    };
    let server = spawn_metrics(config.metrics_addr, metrics, readiness, &shutdown).await?;
    let ingest = spawn_ingest(
        &config.database_url,
        &config.broker,
        config.dead_letter_retention,
        &shutdown,
    )?;
    let result = worker.run(shutdown.clone()).await;
    shutdown.cancel();
    let _ = ingest.await;
    stop_metrics(server, &shutdown).await?;
    result
}

/// Validates the settings, loads the templates, and builds the worker (it connects lazily).
pub fn build_worker(config: &WorkerConfig) -> anyhow::Result<Worker> {
    crate::worker::lease::check(config.lease, config.smtp_timeout).map_err(Fatal::Config)?;
    let horizon = crate::worker::retention::Horizon {
        retry_delays: &config.broker.retry_delays.0,
        max_attempts: config.max_attempts,
        lease: config.lease,
        dead_letter_retention: config.dead_letter_retention,
    };
    crate::worker::retention::check(config.ledger_retention, &horizon).map_err(Fatal::Config)?;
    // The mailer first: a password that could travel in clear text is the graver refusal.
    let mailer =
        Mailer::new(&mailer_settings(config)).map_err(|e| Fatal::Config(exit::one_line(&e)))?;
    crate::config::check_smtp_url(&config.smtp_url, config.allow_plain_smtp)?;
    let concurrency = config.concurrency.max(1);
    let prefetch = crate::config::prefetch_for(concurrency, config.prefetch)?;
    let (dir, loaded) =
        load_templates(&config.templates).map_err(|e| Fatal::Config(exit::one_line(&e)))?;
    let templates = LiveTemplates::new(dir, loaded);
    let db = Database::connect_lazy(&config.database_url, pool_size(concurrency))?;
    let settings = worker_settings(config, concurrency, prefetch);
    Ok(Worker::new(settings, db, Arc::new(templates), mailer))
}

/// Most database connections a worker opens: its claims and records go in groups (two being
/// written at once), so only the rare statements of their own (a claim given back, a replay, a
/// group split after a deadlock) need more, and they may wait for one. The concurrency plus 2,
/// at most 34, so that raising the concurrency does not raise what the database must hold.
pub const MAX_POOL: u32 = 34;

/// The worker's database pool for `concurrency` deliveries at once.
pub fn pool_size(concurrency: usize) -> u32 {
    u32::try_from(concurrency)
        .unwrap_or(u32::MAX)
        .saturating_add(2)
        .min(MAX_POOL)
}

fn mailer_settings(config: &WorkerConfig) -> MailerSettings {
    let domain = match &config.message_id_domain {
        Some(d) => d.clone(),
        None => config.from.email.domain().to_string(),
    };
    MailerSettings {
        url: config.smtp_url.clone(),
        from: config.from.clone(),
        message_id_domain: domain,
        timeout: config.smtp_timeout,
        max_connections: config.smtp_connections.max(1),
        reserved_ahead: crate::worker::lease::reserved_ahead(
            config.lease,
            config.smtp_timeout,
            config.smtp_connections.max(1),
        ),
        deeper: crate::worker::lease::deeper_line(
            config.lease,
            config.smtp_timeout,
            config.smtp_connections.max(1),
            config.concurrency.max(1),
        ),
        dkim: config.dkim.as_ref().map(|d| DkimSettings {
            key: d.key.clone(),
            selector: d.selector.clone(),
            domain: d
                .domain
                .clone()
                .unwrap_or_else(|| config.from.email.domain().to_string()),
        }),
    }
}

fn worker_settings(config: &WorkerConfig, concurrency: usize, prefetch: u16) -> WorkerSettings {
    WorkerSettings {
        amqp: config.broker.amqp_url.clone(),
        topology: config.broker.topology(),
        concurrency,
        prefetch,
        lease: config.lease,
        on_uncertain: config.on_uncertain,
        max_attempts: config.max_attempts.max(1),
        suppress_bounces: config.suppress_bounces,
        ledger_retention: config.ledger_retention,
        ledger_group: config.ledger_group.max(1),
        shutdown_grace: config.shutdown_grace,
        name: format!("mailroom worker (pid {})", std::process::id()),
        replay_key: config.broker.replay_key.clone(),
        smtp_rate: config.smtp_rate,
        domain_limits: config.domain_limits.clone(),
    }
}
