//! `mailroom status`: what became of a job, from the outbox and the ledger.

use clap::Args;

use super::DatabaseArgs;
use crate::db::{Database, OnAcquire};

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
        let db = Database::connect(&self.db.database_url, 1, OnAcquire::Ping).await?;
        db.require_schema().await?;
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
