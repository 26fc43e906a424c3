//! `mailroom broker migrate-dead-queue`: the broker's side of an upgrade ([`crate::broker::migrate`]).

use clap::{Args, Subcommand};

use super::BrokerArgs;
use crate::broker::migrate;

#[derive(Debug, Args)]
pub struct BrokerCommandArgs {
    #[command(subcommand)]
    pub command: BrokerCommand,
}

#[derive(Debug, Subcommand)]
pub enum BrokerCommand {
    /// Replace a classic `<ns>.dead` (older versions) by a quorum queue, moving its letters
    /// with confirms; safe to run again after an interruption, and a no-op once done.
    MigrateDeadQueue(MigrateArgs),
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
}

impl BrokerCommandArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        match &self.command {
            BrokerCommand::MigrateDeadQueue(args) => {
                let topology = args.broker.topology();
                let done = migrate::migrate_dead_queue(&args.broker.amqp_url, &topology).await?;
                if done.was_classic || done.from_holding > 0 {
                    println!(
                        "{} is a quorum queue now: {} letters moved from the classic queue, {} from {}",
                        topology.dead,
                        done.from_classic,
                        done.from_holding,
                        migrate::holding_queue(&topology)
                    );
                } else {
                    println!("{} is a quorum queue already: nothing to do", topology.dead);
                }
                Ok(())
            }
        }
    }
}
