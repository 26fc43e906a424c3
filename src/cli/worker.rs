//! `mailroom worker`: its arguments, parsed into [`WorkerConfig`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use lettre::message::Mailbox;

use super::{BrokerArgs, DatabaseArgs, MetricsOptions};
use crate::config::{self, OnUncertain, SecretUrl};
use crate::startup::{self, WorkerConfig};
use crate::worker::Worker;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// SMTP server: smtp://host:25 (plain, loopback only: see --allow-plain-smtp),
    /// smtp://user:pass@host:587?tls=required (STARTTLS), smtps://user:pass@host:465 (implicit
    /// TLS), or file:///dir to write .eml files. A password goes only over smtps:// or
    /// tls=required (loopback excepted).
    #[arg(long, env = "SMTP_URL", hide_env_values = true)]
    pub smtp_url: SecretUrl,
    /// Allow a plain smtp:// URL to a host that is not loopback (a relay on a network you
    /// trust); without it such a URL is refused at startup.
    #[arg(long, env = "MAILROOM_ALLOW_PLAIN_SMTP")]
    pub allow_plain_smtp: bool,
    /// Sender mailbox: an email address such as "Shop <noreply@shop.example>" or
    /// "noreply@shop.example".
    #[arg(long, env = "MAILROOM_FROM", value_parser = config::parse_from)]
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
    /// claim, record the result and keep a margin); checked at startup. With twice
    /// --smtp-timeout plus 2s or more, deliveries claim while every SMTP connection is busy;
    /// while sends are fast, further back in line too (docs/GUARANTEES.md).
    #[arg(long, env = "MAILROOM_LEASE", default_value = "3m", value_parser = config::parse_duration)]
    pub lease: Duration,
    /// Deadline of one whole SMTP send (connect to final reply); far below RabbitMQ's 30-minute
    /// consumer_timeout.
    #[arg(long, env = "MAILROOM_SMTP_TIMEOUT", default_value = "60s", value_parser = config::parse_duration)]
    pub smtp_timeout: Duration,
    /// Attempts (claims) before a transiently failing job is dead-lettered.
    #[arg(long, env = "MAILROOM_MAX_ATTEMPTS", default_value_t = 8)]
    pub max_attempts: i32,
    /// Suppress the address of a one-recipient job the SMTP server refused for good as an
    /// unknown mailbox or domain (5.1.1, 5.1.2, 5.1.10): later jobs to it are not sent.
    #[arg(long, env = "MAILROOM_SUPPRESS_BOUNCES", default_value_t = true, action = clap::ArgAction::Set)]
    pub suppress_bounces: bool,
    /// Deliveries processed at once (their database pool holds at most 34 connections).
    #[arg(long, env = "MAILROOM_CONCURRENCY", default_value_t = 64)]
    pub concurrency: usize,
    /// Deliveries RabbitMQ sends ahead (basic.qos): at least --concurrency (a lower value is
    /// refused at startup); default twice --concurrency.
    #[arg(long, env = "MAILROOM_PREFETCH")]
    pub prefetch: Option<u16>,
    /// Claims and results of concurrent deliveries written together, at most this many per
    /// statement and commit (group commit); at moderate rates a result waits up to 5 ms for
    /// the next claim to share its commit. 1 writes each on its own, at once.
    #[arg(long, env = "MAILROOM_LEDGER_GROUP", default_value_t = 64)]
    pub ledger_group: usize,
    /// Concurrent SMTP sessions at most (a message waiting for one may ride behind a send in progress on a server that offers PIPELINING).
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
    /// How long `sent` and `dead` rows stay in the ledger (`sent_notifications`): the dedup
    /// horizon, since a copy of a job arriving after its row is deleted is sent again. At least
    /// the retry schedule plus the dead-letter retention (checked at startup); 0s keeps every row.
    #[arg(long, env = "MAILROOM_LEDGER_RETENTION", default_value = "45d", value_parser = config::parse_duration)]
    pub ledger_retention: Duration,
    /// DKIM private key file: PKCS#8 PEM (RSA or Ed25519, as `openssl genpkey` writes), RSA
    /// PKCS#1 PEM, or a base64 Ed25519 seed. Every message is signed; needs --dkim-selector.
    #[arg(long, env = "MAILROOM_DKIM_KEY", requires = "dkim_selector")]
    pub dkim_key: Option<PathBuf>,
    /// DKIM selector: the public key is published at <selector>._domainkey.<domain>.
    #[arg(long, env = "MAILROOM_DKIM_SELECTOR", requires = "dkim_key")]
    pub dkim_selector: Option<String>,
    /// DKIM signing domain (d=); default: the domain of --from.
    #[arg(long, env = "MAILROOM_DKIM_DOMAIN", requires = "dkim_key")]
    pub dkim_domain: Option<String>,
    /// The account's send rate over all workers: 14/s, 600/min or 2000/h (each worker sends at
    /// its share, the rate divided by the live workers). Default: unlimited.
    #[arg(long, env = "MAILROOM_SMTP_RATE", value_parser = config::limits::parse_rate)]
    pub smtp_rate: Option<config::limits::Rate>,
    /// Per recipient domain, over all workers: "*=20/s max 8, gmail.com=5/s, yahoo.com=2/s max
    /// 2" (`*` is every other domain; RATE and/or `max` sends at once). When set, a 421 or
    /// 4.7.x reply halves that domain's rate for a while instead of spending an attempt.
    #[arg(long, env = "MAILROOM_DOMAIN_LIMITS", value_parser = config::limits::parse_domain_limits, default_value = "")]
    pub domain_limits: config::limits::DomainLimits,
    #[command(flatten)]
    pub metrics: MetricsOptions,
    #[command(flatten)]
    pub dead_letters: super::dlq::RetentionArgs,
}

impl WorkerArgs {
    /// The settings these arguments give.
    pub fn config(&self) -> WorkerConfig {
        WorkerConfig {
            database_url: self.db.database_url.clone(),
            broker: self.broker.config(),
            smtp_url: self.smtp_url.clone(),
            allow_plain_smtp: self.allow_plain_smtp,
            from: self.from.clone(),
            message_id_domain: self.message_id_domain.clone(),
            templates: self.templates.clone(),
            on_uncertain: self.on_uncertain,
            lease: self.lease,
            smtp_timeout: self.smtp_timeout,
            max_attempts: self.max_attempts,
            suppress_bounces: self.suppress_bounces,
            dkim: self.dkim_key.clone().map(|key| startup::DkimConfig {
                key,
                selector: self.dkim_selector.clone().unwrap_or_default(),
                domain: self.dkim_domain.clone(),
            }),
            ledger_retention: (!self.ledger_retention.is_zero()).then_some(self.ledger_retention),
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            ledger_group: self.ledger_group,
            smtp_connections: self.smtp_connections,
            shutdown_grace: self.shutdown_grace,
            template_reload_interval: self.template_reload_interval,
            metrics_addr: self.metrics.metrics_addr,
            dead_letter_retention: self.dead_letters.dead_letter_retention,
            smtp_rate: self.smtp_rate,
            domain_limits: self.domain_limits.clone(),
        }
    }

    /// Builds the worker these arguments describe ([`startup::build_worker`]).
    pub fn build(&self) -> anyhow::Result<Worker> {
        startup::build_worker(&self.config())
    }

    /// Runs the worker until SIGTERM/SIGINT ([`startup::run_worker`]).
    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        startup::run_worker(&self.config(), shutdown).await
    }
}
