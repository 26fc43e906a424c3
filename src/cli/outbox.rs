//! The producer-side commands: `relay`, `serve` (HTTP API), `run` (relay + worker + HTTP),
//! `enqueue` and `status`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::sync::Notify;

use super::{BrokerArgs, DatabaseArgs, MetricsOptions, WorkerArgs};
use crate::config;
use crate::db::Database;
use crate::db::outbox::Enqueued;
use crate::http::{self, ApiState};
use crate::metrics::Metrics;
use crate::relay::{Relay, RelaySettings};
use crate::render::{LiveTemplates, Templates};

#[derive(Debug, Args)]
pub struct RelayOptions {
    /// Outbox rows claimed, published and marked per batch.
    #[arg(long, env = "MAILROOM_RELAY_BATCH", default_value_t = 500)]
    pub relay_batch: i64,
    /// Bytes of message bodies per batch at most (a batch is cut there; one row always goes).
    #[arg(long, env = "MAILROOM_RELAY_BATCH_BYTES", default_value_t = crate::relay::DEFAULT_BATCH_BYTES)]
    pub relay_batch_bytes: usize,
    /// PostgreSQL: the longest wait between probes of an idle outbox (covers notifications lost
    /// while the listener reconnects); LISTEN/NOTIFY wakes an idle relay at once.
    #[arg(long, env = "MAILROOM_RELAY_POLL", default_value = "5s", value_parser = config::parse_duration)]
    pub relay_poll: Duration,
    /// The wait between lock-free probes of the outbox while rows keep coming; it doubles while
    /// none do, up to --relay-poll (PostgreSQL) or --relay-poll-max (MySQL/MariaDB).
    #[arg(long, env = "MAILROOM_RELAY_POLL_MIN", default_value = "10ms", value_parser = config::parse_duration)]
    pub relay_poll_min: Duration,
    /// MySQL/MariaDB: the longest wait between polls of an idle outbox, i.e. the most latency
    /// the poll adds and one lock-free query per interval.
    #[arg(long, env = "MAILROOM_RELAY_POLL_MAX", default_value = "1s", value_parser = config::parse_duration)]
    pub relay_poll_max: Duration,
    /// Published outbox rows older than this are deleted (in batches of 1,000).
    #[arg(long, env = "MAILROOM_OUTBOX_RETENTION", default_value = "7d", value_parser = config::parse_duration)]
    pub outbox_retention: Duration,
}

impl RelayOptions {
    fn build(&self, db: &DatabaseArgs, broker: &BrokerArgs) -> anyhow::Result<Relay> {
        // The relay retries a failed batch or probe on its next turn: no ping before each use.
        let database_url = Some(db.database_url.clone());
        let db = Database::connect_lazy_with(&db.database_url, 4, false)?;
        let settings = RelaySettings {
            amqp: broker.amqp_url.clone(),
            topology: broker.topology(),
            batch_size: self.relay_batch.max(1),
            batch_bytes: self.relay_batch_bytes.max(1),
            poll_interval: self.relay_poll,
            poll_min: self.relay_poll_min,
            poll_max: self.relay_poll_max,
            retention: self.outbox_retention,
            name: format!("mailroom relay (pid {})", std::process::id()),
            database_url,
        };
        Ok(Relay::new(settings, db))
    }
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub relay: RelayOptions,
    #[command(flatten)]
    pub metrics: MetricsOptions,
}

impl RelayArgs {
    /// Builds the relay these options describe.
    pub fn build(&self) -> anyhow::Result<Relay> {
        self.relay.build(&self.db, &self.broker)
    }

    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        let relay = self.build()?;
        let metrics = Metrics {
            relay: Some(relay.stats()),
            db: Some(Database::connect_lazy(&self.db.database_url, 1)?),
            ..Metrics::default()
        };
        let server = self.metrics.spawn(metrics, &shutdown).await?;
        let result = relay.run(shutdown.clone()).await;
        shutdown.cancel();
        if let Some(server) = server {
            server.await??;
        }
        result
    }
}

#[derive(Debug, Args)]
pub struct HttpOptions {
    /// Where the HTTP API listens.
    #[arg(long, env = "MAILROOM_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// Bearer token required by /v1; without one the API listens on loopback only.
    #[arg(long, env = "MAILROOM_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
}

impl HttpOptions {
    /// Checks the exposure rule and binds the listener.
    async fn bind(&self) -> anyhow::Result<tokio::net::TcpListener> {
        http::check_exposure(&self.http_addr, self.api_token.as_deref())?;
        tokio::net::TcpListener::bind(self.http_addr)
            .await
            .with_context(|| format!("listening on {}", self.http_addr))
    }

    /// The handlers' state; `metrics` gets the API's database for the relay lag.
    fn state(
        &self,
        db: &DatabaseArgs,
        broker: &BrokerArgs,
        templates: Option<Arc<LiveTemplates>>,
        metrics: Metrics,
        relay_wake: Option<Arc<Notify>>,
    ) -> anyhow::Result<Arc<ApiState>> {
        let db = Database::connect_lazy(&db.database_url, 8)?;
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
            token: self.api_token.clone(),
            relay_wake,
            broker_probe: http::BrokerProbe::new(
                broker.amqp_url.clone(),
                format!("mailroom readiness probe (pid {})", std::process::id()),
            ),
            replay_key: broker.replay_key.clone(),
        }))
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub http: HttpOptions,
    /// Template directory; when given, jobs of a kind without a template are refused with 422
    /// and `/v1/dlq/replay` can dry-run. Followed live, like the worker's.
    #[arg(long, env = "MAILROOM_TEMPLATES")]
    pub templates: Option<PathBuf>,
    /// How often the template directory is checked for edits (SIGHUP checks at once).
    #[arg(long, env = "MAILROOM_TEMPLATE_RELOAD_INTERVAL", default_value = "2s", value_parser = config::parse_duration)]
    pub template_reload_interval: Duration,
}

impl ServeArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        let templates = match &self.templates {
            Some(dir) => {
                let dir = std::path::absolute(dir)
                    .with_context(|| format!("template directory {}", dir.display()))?;
                let loaded = Templates::load(&dir)
                    .with_context(|| format!("loading templates from {}", dir.display()))?;
                let live = Arc::new(LiveTemplates::new(dir, loaded));
                super::follow_templates(live.clone(), self.template_reload_interval, &shutdown)?;
                Some(live)
            }
            None => None,
        };
        let listener = self.http.bind().await?;
        let state = self
            .http
            .state(&self.db, &self.broker, templates, Metrics::default(), None)?;
        http::serve(listener, state, shutdown).await
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub relay: RelayOptions,
    #[command(flatten)]
    pub http: HttpOptions,
}

impl RunArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        let worker = self.worker.build()?;
        self.worker.watch_templates(worker.templates(), &shutdown)?;
        let relay = self.relay.build(&self.worker.db, &self.worker.broker)?;
        let listener = self.http.bind().await?;
        let metrics = Metrics {
            worker: Some(worker.stats()),
            relay: Some(relay.stats()),
            ..Metrics::default()
        };
        let state = self.http.state(
            &self.worker.db,
            &self.worker.broker,
            Some(worker.templates()),
            metrics,
            Some(relay.waker()),
        )?;
        let extra = self
            .worker
            .metrics
            .spawn(state.metrics.clone(), &shutdown)
            .await?;
        let (w, r, h) = tokio::join!(
            worker.run(shutdown.clone()),
            relay.run(shutdown.clone()),
            http::serve(listener, state, shutdown.clone())
        );
        if let Some(extra) = extra {
            shutdown.cancel();
            extra.await??;
        }
        w.and(r).and(h)
    }
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub job: super::JobArgs,
}

impl EnqueueArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let admitted = self.job.admitted()?;
        let job = admitted.job();
        let db = Database::connect_lazy(&self.db.database_url, 1)?;
        let done = db.enqueue_admitted(&admitted).await?;
        match done {
            Enqueued::New(id) => println!("{} queued (outbox id {id})", job.job_id),
            Enqueued::AlreadyQueued => {
                println!("{} was already queued; nothing written", job.job_id)
            }
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// The job's id.
    pub job_id: String,
    /// The job's kind (default: every kind of this job id).
    pub kind: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl StatusArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let db = Database::connect_lazy(&self.db.database_url, 1)?;
        let statuses = crate::status::job_status(&db, &self.job_id, self.kind.as_deref()).await?;
        if statuses.is_empty() {
            anyhow::bail!("no job {:?} in the outbox or the ledger", self.job_id);
        }
        for s in &statuses {
            if self.json {
                println!("{}", serde_json::to_string(s)?);
            } else {
                println!("{s}");
            }
        }
        Ok(())
    }
}
