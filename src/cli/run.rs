//! `mailroom run`: the arguments of the worker, the relay and the HTTP API in one process,
//! parsed into [`RunConfig`].

use clap::Args;

use super::relay::RelayOptions;
use super::serve::HttpOptions;
use super::worker::WorkerArgs;
use crate::startup::{self, RunConfig};

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
    /// The settings these arguments give.
    pub fn config(&self) -> RunConfig {
        RunConfig {
            worker: self.worker.config(),
            relay: self.relay.tuning(),
            http: self.http.config(),
        }
    }

    /// Runs the three until SIGTERM/SIGINT ([`startup::run_all`]).
    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        startup::run_all(&self.config(), shutdown).await
    }
}
