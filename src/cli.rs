//! The command line: one subcommand per process role. Every option is also an environment
//! variable; `--help` lists both and never prints the values found in the environment.
//!
//! The CLI only parses: a process's arguments become its [`crate::startup`] settings, which
//! build and run it. One file per subcommand (`worker`, `relay`, `serve`, `run`, `publish`,
//! `enqueue`, `status`, `jobs`, `dlq`, `broker`, `templates`); here, the arguments several share.

use clap::{Args, Parser, Subcommand};

mod broker;
mod dlq;
mod dlq_print;
mod enqueue;
mod job;
mod jobs;
mod publish;
mod relay;
mod run;
mod serve;
mod status;
mod suppressions;
mod templates;
mod worker;

use crate::broker::Topology;
use crate::config::{self, Delays, SecretUrl, UrlList};
use crate::db::{Database, OnAcquire};
use crate::dlq::seal::ReplayKey;
use crate::startup::BrokerConfig;
use crate::telemetry::LogFormat;

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
    /// Threads that run the process's tasks. 1: every task on one thread, which costs the
    /// least CPU per email; run one worker per core to use more cores. More: tasks spread over
    /// that many threads (docs/OPERATING.md, "Threads").
    #[arg(
        long,
        global = true,
        env = "MAILROOM_THREADS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    pub threads: u16,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database migrations for the engine in DATABASE_URL.
    Migrate(DatabaseArgs),
    /// Consume jobs, send each email once, retry or dead-letter failures.
    Worker(Box<worker::WorkerArgs>),
    /// Publish one job straight to the broker (with confirms), bypassing the outbox: for smoke
    /// tests and for producers without a database.
    Publish(publish::PublishArgs),
    /// Publish the outbox to the broker: claim unpublished rows, publish with confirms, mark.
    Relay(relay::RelayArgs),
    /// The HTTP API: enqueue jobs, read their status, health and readiness.
    Serve(serve::ServeArgs),
    /// Relay, worker and HTTP API in one process: the default on a single machine.
    Run(Box<run::RunArgs>),
    /// Write one job to the outbox in its own transaction (shell scripts and smoke tests).
    Enqueue(enqueue::EnqueueArgs),
    /// Show what became of a job: queued, published, sending, sent, failed, uncertain, dead.
    Status(status::StatusArgs),
    /// Find jobs by id, recipient, kind, state and time; show one job's timeline.
    Jobs(jobs::JobsArgs),
    /// The dead-letter queue: list, show, replay or purge dead letters without losing any.
    Dlq(dlq::DlqArgs),
    /// The addresses mailroom does not send to: add, remove, check, list.
    Suppressions(suppressions::SuppressionsArgs),
    /// The broker's queues: move a classic dead-letter queue to a quorum one.
    Broker(broker::BrokerCommandArgs),
    /// Check every template against its sample data, or preview one.
    Templates(templates::TemplatesArgs),
}

impl Command {
    /// The subcommand's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Migrate(_) => "migrate",
            Command::Worker(_) => "worker",
            Command::Publish(_) => "publish",
            Command::Relay(_) => "relay",
            Command::Serve(_) => "serve",
            Command::Run(_) => "run",
            Command::Enqueue(_) => "enqueue",
            Command::Status(_) => "status",
            Command::Jobs(_) => "jobs",
            Command::Dlq(_) => "dlq",
            Command::Suppressions(_) => "suppressions",
            Command::Broker(_) => "broker",
            Command::Templates(_) => "templates",
        }
    }
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
        self.config().topology()
    }

    /// The settings these arguments give.
    pub fn config(&self) -> BrokerConfig {
        BrokerConfig {
            amqp_url: self.amqp_url.clone(),
            namespace: self.namespace.clone(),
            retry_delays: self.retry_delays.clone(),
            replay_key: self.replay_key.clone(),
        }
    }
}

/// An optional listener of its own for `/metrics`, for processes without the HTTP API.
#[derive(Debug, Args)]
pub struct MetricsOptions {
    /// Serve /metrics (Prometheus) and /healthz on this address, e.g. 0.0.0.0:9090.
    #[arg(long, env = "MAILROOM_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl Cli {
    /// The runtime `--threads` asks for: one thread runs every task (Tokio's current-thread
    /// scheduler), or a pool of that many threads shares them (the multi-thread scheduler).
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = if self.threads == 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(self.threads.into());
            builder
        };
        builder.enable_all().build()
    }

    /// Runs the chosen command until it is done or a signal stops it.
    pub async fn run(self) -> anyhow::Result<()> {
        crate::db::name_sessions(self.command.name());
        match self.command {
            Command::Migrate(args) => {
                let db = Database::connect(&args.database_url, 1, OnAcquire::Ping).await?;
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
            Command::Jobs(args) => args.run().await,
            Command::Suppressions(args) => args.run().await,
            Command::Dlq(args) => args.run().await,
            Command::Broker(args) => args.run().await,
            Command::Templates(args) => args.run().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use tokio::runtime::RuntimeFlavor;

    use super::Cli;

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        let status = [
            "status",
            "--database-url",
            "postgres://db.example/app",
            "job-1",
        ];
        Cli::try_parse_from(["mailroom"].iter().chain(args).chain(&status))
    }

    #[test]
    fn one_thread_runs_every_task_unless_more_are_asked_for() {
        let default = cli(&[]).unwrap().runtime().unwrap();
        assert_eq!(
            default.handle().runtime_flavor(),
            RuntimeFlavor::CurrentThread
        );
        let three = cli(&["--threads", "3"]).unwrap().runtime().unwrap();
        assert_eq!(three.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(three.metrics().num_workers(), 3);
        let err = cli(&["--threads", "0"]).unwrap_err().to_string();
        assert!(err.contains("--threads"), "{err}");
    }
}
