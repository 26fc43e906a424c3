//! `mailroom publish`: one job straight to the broker, with confirms, bypassing the outbox.

use clap::Args;

use super::BrokerArgs;
use super::job::JobArgs;
use crate::broker;

#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub job: JobArgs,
}

impl PublishArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let admitted = self.job.admitted()?;
        let job = admitted.job();
        let topology = self.broker.topology();
        let conn = broker::connect(&self.broker.amqp_url, "mailroom publish").await?;
        broker::declare_topology(&conn, &topology).await?;
        let ch = broker::confirm_channel(&conn).await?;
        let props = broker::job_properties(&job.job_id, &job.kind, 1);
        broker::publish_confirmed(&ch, &topology.exchange, &job.kind, &admitted.body, props)
            .await?;
        let _ = conn.close(200, "published".into()).await;
        println!("{}", job.job_id);
        Ok(())
    }
}
