//! `mailroom enqueue`: one job written to the outbox in its own transaction.

use clap::Args;

use super::DatabaseArgs;
use super::job::JobArgs;
use crate::db::outbox::Enqueued;
use crate::db::{Database, OnAcquire};

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub job: JobArgs,
}

impl EnqueueArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let admitted = self.job.admitted()?;
        let job = admitted.job();
        let db = Database::connect(&self.db.database_url, 1, OnAcquire::Ping).await?;
        db.require_schema().await?;
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
