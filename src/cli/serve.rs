//! `mailroom serve`: the HTTP API's arguments, parsed into [`ServeConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{BrokerArgs, DatabaseArgs};
use crate::config;
use crate::startup::{self, HttpConfig, ServeConfig};

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
    /// The settings these arguments give (shared with `run`).
    pub fn config(&self) -> HttpConfig {
        HttpConfig {
            addr: self.http_addr,
            api_token: self.api_token.clone(),
        }
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
    #[command(flatten)]
    pub dead_letters: super::dlq::RetentionArgs,
}

impl ServeArgs {
    /// The settings these arguments give.
    pub fn config(&self) -> ServeConfig {
        ServeConfig {
            database_url: self.db.database_url.clone(),
            broker: self.broker.config(),
            http: self.http.config(),
            templates: self.templates.clone(),
            template_reload_interval: self.template_reload_interval,
            dead_letter_retention: self.dead_letters.dead_letter_retention,
        }
    }

    /// Serves the API until SIGTERM/SIGINT ([`startup::run_serve`]).
    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        startup::run_serve(&self.config(), shutdown).await
    }
}
