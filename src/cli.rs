//! The command line: one subcommand per process role. Every option is also an environment
//! variable; `--help` lists both and never prints the values found in the environment.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use lettre::message::Mailbox;

mod dlq;
mod dlq_print;
pub mod outbox;
mod templates;

use crate::broker::{self, Topology};
use crate::config::{self, Delays, OnUncertain, SecretUrl, UrlList};
use crate::db::Database;
use crate::dlq::seal::ReplayKey;
use crate::door::{self, Admitted};
use crate::http::metrics::Metrics;
use crate::job::EmailJob;
use crate::render::{LiveTemplates, Templates};
use crate::smtp::{Mailer, MailerSettings};
use crate::telemetry::LogFormat;
use crate::worker::{Worker, WorkerSettings};

/// mailroom: transactional email from your database transaction to the inbox, once.
#[derive(Debug, Parser)]
#[command(name = "mailroom", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log line format.
    #[arg(
        long,
        global = true,
        env = "MAILROOM_LOG_FORMAT",
        default_value = "text",
        value_enum
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database migrations for the engine in DATABASE_URL.
    Migrate(DatabaseArgs),
    /// Consume jobs, send each email once, retry or dead-letter failures.
    Worker(Box<WorkerArgs>),
    /// Publish one job straight to the broker (with confirms), bypassing the outbox: for smoke
    /// tests and for producers without a database.
    Publish(PublishArgs),
    /// Publish the outbox to the broker: claim unpublished rows, publish with confirms, mark.
    Relay(outbox::RelayArgs),
    /// The HTTP API: enqueue jobs, read their status, health and readiness.
    Serve(outbox::ServeArgs),
    /// Relay, worker and HTTP API in one process: the default on a single machine.
    Run(Box<outbox::RunArgs>),
    /// Write one job to the outbox in its own transaction (shell scripts and smoke tests).
    Enqueue(outbox::EnqueueArgs),
    /// Show what became of a job: queued, published, sending, sent, failed, uncertain, dead.
    Status(outbox::StatusArgs),
    /// The dead-letter queue: list, show, replay or purge dead letters without losing any.
    Dlq(dlq::DlqArgs),
    /// Check every template against its sample data, or preview one.
    Templates(templates::TemplatesArgs),
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// Database URL: postgres://user:password@host:port/database (add ?sslmode=verify-full for TLS).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: SecretUrl,
}

#[derive(Debug, Args)]
pub struct BrokerArgs {
    /// RabbitMQ URL(s): amqp://user:password@host:5672/vhost or amqps://…; a comma-separated
    /// list fails over between nodes.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: UrlList,
    /// Prefix of every exchange and queue: <ns> (exchange), <ns>.email, <ns>.retry.*, <ns>.dead.
    #[arg(long, env = "MAILROOM_NAMESPACE", default_value = "mailroom")]
    pub namespace: String,
    /// Retry tiers (queues whose TTL sends a job back), comma-separated, increasing.
    #[arg(long, env = "MAILROOM_RETRY_DELAYS", default_value = "5s,30s,2m,10m,1h", value_parser = config::parse_delays)]
    pub retry_delays: Delays,
    /// Key that seals replayed dead letters, so workers honour only mailroom's own replays
    /// (32+ characters; the same on every worker and replaying process). Default: a random key
    /// kept in the database, created on first use.
    #[arg(long, env = "MAILROOM_REPLAY_KEY", hide_env_values = true)]
    pub replay_key: Option<ReplayKey>,
}

impl BrokerArgs {
    pub fn topology(&self) -> Topology {
        Topology::new(&self.namespace, self.retry_delays.0.clone())
    }
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// SMTP server: smtp://host:25 (plain, loopback only), smtp://user:pass@host:587?tls=required
    /// (STARTTLS), smtps://user:pass@host:465 (implicit TLS), or file:///dir to write .eml files.
    /// A password goes only over smtps:// or tls=required (loopback excepted).
    #[arg(long, env = "SMTP_URL", hide_env_values = true)]
    pub smtp_url: SecretUrl,
    /// Sender mailbox, e.g. "Shop <noreply@shop.example>".
    #[arg(long, env = "MAILROOM_FROM")]
    pub from: Mailbox,
    /// Right-hand side of the Message-ID <job_id.kind@DOMAIN> (default: the domain of --from).
    #[arg(long, env = "MAILROOM_MESSAGE_ID_DOMAIN")]
    pub message_id_domain: Option<String>,
    /// Template directory (templates/<kind>/subject.hbs, html.hbs, text.hbs, sample.json).
    #[arg(long, env = "MAILROOM_TEMPLATES", default_value = "./templates")]
    pub templates: PathBuf,
    /// When an email may have been accepted but the result was not recorded: resend (a rare
    /// duplicate, same Message-ID) or dead-letter (a rare loss; a human decides).
    #[arg(
        long,
        env = "MAILROOM_ON_UNCERTAIN",
        default_value = "resend",
        value_enum
    )]
    pub on_uncertain: OnUncertain,
    /// Claim lease: how long a claimed job is exclusive. At least --smtp-timeout plus 2s (to
    /// claim, record the result and keep a margin); checked at startup.
    #[arg(long, env = "MAILROOM_LEASE", default_value = "2m", value_parser = config::parse_duration)]
    pub lease: Duration,
    /// Deadline of one whole SMTP send (connect to final reply); far below RabbitMQ's 30-minute
    /// consumer_timeout.
    #[arg(long, env = "MAILROOM_SMTP_TIMEOUT", default_value = "60s", value_parser = config::parse_duration)]
    pub smtp_timeout: Duration,
    /// Attempts (claims) before a transiently failing job is dead-lettered.
    #[arg(long, env = "MAILROOM_MAX_ATTEMPTS", default_value_t = 8)]
    pub max_attempts: i32,
    /// Deliveries processed at once.
    #[arg(long, env = "MAILROOM_CONCURRENCY", default_value_t = 32)]
    pub concurrency: usize,
    /// Deliveries RabbitMQ sends ahead (basic.qos); at least --concurrency.
    #[arg(long, env = "MAILROOM_PREFETCH", default_value_t = 64)]
    pub prefetch: u16,
    /// Claims and results of concurrent deliveries written together, at most this many per
    /// statement and commit (group commit); 1 writes each on its own.
    #[arg(long, env = "MAILROOM_LEDGER_GROUP", default_value_t = 64)]
    pub ledger_group: usize,
    /// Concurrent SMTP sessions at most (lettre's pool does not bound them by itself).
    #[arg(long, env = "MAILROOM_SMTP_CONNECTIONS", default_value_t = 16)]
    pub smtp_connections: u32,
    /// On SIGTERM/SIGINT, how long deliveries in flight may take to finish.
    #[arg(long, env = "MAILROOM_SHUTDOWN_GRACE", default_value = "30s", value_parser = config::parse_duration)]
    pub shutdown_grace: Duration,
    /// How often the template directory is checked for edits (SIGHUP checks at once). A good
    /// edit is used by the next email; a broken one is logged and the last good set keeps
    /// sending.
    #[arg(long, env = "MAILROOM_TEMPLATE_RELOAD_INTERVAL", default_value = "2s", value_parser = config::parse_duration)]
    pub template_reload_interval: Duration,
    #[command(flatten)]
    pub metrics: MetricsOptions,
}

/// An optional listener of its own for `/metrics`, for processes without the HTTP API.
#[derive(Debug, Args)]
pub struct MetricsOptions {
    /// Serve /metrics (Prometheus) and /healthz on this address, e.g. 0.0.0.0:9090.
    #[arg(long, env = "MAILROOM_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl MetricsOptions {
    /// Binds and serves `metrics` until `shutdown`, when an address was given.
    pub async fn spawn(
        &self,
        metrics: Metrics,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<Option<tokio::task::JoinHandle<anyhow::Result<()>>>> {
        let Some(addr) = self.metrics_addr else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr} for metrics"))?;
        let stop = shutdown.clone();
        Ok(Some(tokio::spawn(crate::http::serve_metrics(
            listener, metrics, stop,
        ))))
    }
}

impl WorkerArgs {
    /// Runs the worker, the template watcher (and SIGHUP) and the optional metrics listener
    /// until SIGTERM/SIGINT.
    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        let worker = self.build()?;
        self.watch_templates(worker.templates(), &shutdown)?;
        let metrics = Metrics {
            worker: Some(worker.stats()),
            templates: Some(worker.templates()),
            ..Metrics::default()
        };
        let server = self.metrics.spawn(metrics, &shutdown).await?;
        let result = worker.run(shutdown.clone()).await;
        shutdown.cancel();
        if let Some(server) = server {
            server.await??;
        }
        result
    }

    /// Starts polling the template directory, and reloading on SIGHUP, until `shutdown`.
    pub fn watch_templates(
        &self,
        live: Arc<LiveTemplates>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        follow_templates(live, self.template_reload_interval, shutdown)
    }

    /// Resolves and validates the options, loads the templates, and builds the worker.
    pub fn build(&self) -> anyhow::Result<Worker> {
        crate::worker::lease::check(self.lease, self.smtp_timeout).map_err(anyhow::Error::msg)?;
        let templates = std::path::absolute(&self.templates)
            .with_context(|| format!("template directory {}", self.templates.display()))?;
        let loaded = Templates::load(&templates)
            .with_context(|| format!("loading templates from {}", templates.display()))?;
        let templates = LiveTemplates::new(templates, loaded);
        let domain = match &self.message_id_domain {
            Some(d) => d.clone(),
            None => self.from.email.domain().to_string(),
        };
        let mailer = Mailer::new(&MailerSettings {
            url: self.smtp_url.clone(),
            from: self.from.clone(),
            message_id_domain: domain,
            timeout: self.smtp_timeout,
            max_connections: self.smtp_connections.max(1),
        })?;
        let concurrency = self.concurrency.max(1);
        let pool_size = u32::try_from(concurrency)
            .unwrap_or(u32::MAX)
            .saturating_add(2);
        let db = Database::connect_lazy(&self.db.database_url, pool_size)?;
        let settings = WorkerSettings {
            amqp: self.broker.amqp_url.clone(),
            topology: self.broker.topology(),
            concurrency,
            prefetch: self
                .prefetch
                .max(u16::try_from(concurrency).unwrap_or(u16::MAX)),
            lease: self.lease,
            on_uncertain: self.on_uncertain,
            max_attempts: self.max_attempts.max(1),
            ledger_group: self.ledger_group.max(1),
            shutdown_grace: self.shutdown_grace,
            name: format!("mailroom worker (pid {})", std::process::id()),
            replay_key: self.broker.replay_key.clone(),
        };
        Ok(Worker::new(settings, db, Arc::new(templates), mailer))
    }
}

/// Polls `live`'s directory every `interval`, and reloads it on SIGHUP, until `shutdown`.
pub fn follow_templates(
    live: Arc<LiveTemplates>,
    interval: Duration,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let hup = live.clone();
    crate::shutdown::on_hangup(move || hup.request_reload(), shutdown)?;
    tokio::spawn(live.watch(interval, shutdown.clone()));
    Ok(())
}

/// The job described on the command line, for `publish` and `enqueue`.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// Template kind, e.g. welcome.
    #[arg(long)]
    pub kind: String,
    /// Recipient mailbox; repeat for several.
    #[arg(long, required = true)]
    pub to: Vec<String>,
    /// Template data: a JSON object, or @path/to/file.json.
    #[arg(long, default_value = "{}")]
    pub data: String,
    /// Idempotency key (default: a new UUID). The same key is sent at most once.
    #[arg(long)]
    pub job_id: Option<String>,
    /// Template locale, e.g. fr.
    #[arg(long)]
    pub locale: Option<String>,
    /// Template directory: when given, a kind without a template is refused here instead of
    /// being dead-lettered by the worker.
    #[arg(long, env = "MAILROOM_TEMPLATES")]
    pub templates: Option<PathBuf>,
}

impl JobArgs {
    /// Builds the job and lets it through the one validation ([`door::admit`]), against the
    /// templates when `--templates` is given. The error names the field, on one line.
    pub fn admitted(&self) -> anyhow::Result<Admitted> {
        let text = match self.data.strip_prefix('@') {
            Some(path) => {
                std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?
            }
            None => self.data.clone(),
        };
        let job = EmailJob {
            job_id: self
                .job_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            kind: self.kind.clone(),
            to: self.to.clone(),
            cc: vec![],
            bcc: vec![],
            reply_to: None,
            locale: self.locale.clone(),
            data: serde_json::from_str(&text).context("--data is not JSON")?,
            headers: Default::default(),
            created_at: Some(chrono::Utc::now()),
        };
        let templates = match &self.templates {
            Some(dir) => Some(
                Templates::load(dir)
                    .with_context(|| format!("loading templates from {}", dir.display()))?,
            ),
            None => None,
        };
        Ok(door::admit(job, templates.as_ref())?)
    }
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub job: JobArgs,
}

impl PublishArgs {
    async fn run(&self) -> anyhow::Result<()> {
        let admitted = self.job.admitted()?;
        let job = admitted.job();
        let topology = self.broker.topology();
        let conn = broker::connect(&self.broker.amqp_url, "mailroom publish").await?;
        broker::declare_topology(&conn.create_channel().await?, &topology).await?;
        let ch = broker::confirm_channel(&conn).await?;
        let props = broker::job_properties(&job.job_id, &job.kind, 1);
        broker::publish_confirmed(&ch, &topology.exchange, &job.kind, &admitted.body, props)
            .await?;
        let _ = conn.close(200, "published".into()).await;
        println!("{}", job.job_id);
        Ok(())
    }
}

impl Cli {
    /// Runs the chosen command until it is done or a signal stops it.
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Migrate(args) => {
                let db = Database::connect_lazy(&args.database_url, 1)?;
                db.migrate().await?;
                db.close().await;
                tracing::info!("migrations applied");
                Ok(())
            }
            Command::Worker(args) => args.run().await,
            Command::Publish(args) => args.run().await,
            Command::Relay(args) => args.run().await,
            Command::Run(args) => args.run().await,
            Command::Serve(args) => args.run().await,
            Command::Enqueue(args) => args.run().await,
            Command::Status(args) => args.run().await,
            Command::Dlq(args) => args.run().await,
            Command::Templates(args) => args.run(),
        }
    }
}
