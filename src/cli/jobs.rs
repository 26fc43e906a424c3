//! `mailroom jobs`: find jobs (`search`) and tell one job's timeline (`show`), as
//! `GET /v1/jobs` and its timeline do (both call [`crate::jobs`]).

use clap::{Args, Subcommand};

use super::DatabaseArgs;
use crate::db::{Database, OnAcquire};
use crate::jobs::{self, Event, Search, Timeline};

#[derive(Debug, Args)]
pub struct JobsArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(subcommand)]
    pub command: JobsCommand,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Jobs by id (a trailing `*` for a prefix), recipient, kind, state and time, newest first.
    Search(SearchArgs),
    /// One job's timeline: created, published, each attempt with its SMTP reply, sent or dead.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// A job id; with a trailing `*` (quoted), every id that starts with it.
    #[arg(long)]
    pub job_id: Option<String>,
    /// An address: its domain's case does not matter, its local part's does.
    #[arg(long)]
    pub recipient: Option<String>,
    /// The job's kind (template name).
    #[arg(long)]
    pub kind: Option<String>,
    /// sending, sent, failed, uncertain, dead (ledger), or pending, published, parked (outbox).
    #[arg(long)]
    pub state: Option<String>,
    /// RFC 3339, or a duration ago (2h, 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// Created before this time: RFC 3339, or a duration ago.
    #[arg(long)]
    pub until: Option<String>,
    /// Jobs per page (1 to 500).
    #[arg(long)]
    pub limit: Option<i64>,
    /// The `next_cursor` a previous page printed.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Addresses in full instead of masked.
    #[arg(long)]
    pub reveal: bool,
    /// Print JSON (the same as `GET /v1/jobs`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The job's id.
    pub job_id: String,
    /// The job's kind.
    pub kind: String,
    /// Addresses in full instead of masked.
    #[arg(long)]
    pub reveal: bool,
    /// Print JSON (the same as the HTTP timeline).
    #[arg(long)]
    pub json: bool,
}

impl JobsArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let db = Database::connect(&self.db.database_url, 1, OnAcquire::Ping).await?;
        db.require_schema().await?;
        match &self.command {
            JobsCommand::Search(args) => search(&db, args).await,
            JobsCommand::Show(args) => show(&db, args).await,
        }
    }
}

async fn search(db: &Database, a: &SearchArgs) -> anyhow::Result<()> {
    let given = Search {
        job_id: a.job_id.clone(),
        recipient: a.recipient.clone(),
        kind: a.kind.clone(),
        state: a.state.clone(),
        since: a.since.clone(),
        until: a.until.clone(),
        cursor: a.cursor.clone(),
        limit: a.limit,
        reveal: a.reveal,
    };
    let page = jobs::search(db, &given).await?;
    if a.json {
        println!("{}", serde_json::to_string(&page)?);
        return Ok(());
    }
    for job in &page.jobs {
        let to = job.recipient.as_deref().unwrap_or("-");
        let at = job.created_at.format("%Y-%m-%d %H:%M:%S%.3fZ");
        println!("{at}  {:<9}  {}  {}  {to}", job.state, job.job_id, job.kind);
    }
    if let Some(cursor) = &page.next_cursor {
        println!("more: --cursor {cursor}");
    }
    Ok(())
}

async fn show(db: &Database, a: &ShowArgs) -> anyhow::Result<()> {
    let Some(timeline) = jobs::timeline(db, &a.job_id, &a.kind, a.reveal).await? else {
        anyhow::bail!(
            "no job {:?} of kind {:?} in the outbox or the ledger",
            a.job_id,
            a.kind
        );
    };
    if a.json {
        println!("{}", serde_json::to_string(&timeline)?);
    } else {
        print_timeline(&timeline);
    }
    Ok(())
}

fn print_timeline(t: &Timeline) {
    println!("{}", t.status);
    if let Some(to) = &t.recipient {
        println!("to {to}");
    }
    for e in &t.events {
        println!("  {}", line(e));
    }
}

/// `2026-12-01 10:00:00.000Z  attempt 2 failed (temporary): 451 …`
fn line(e: &Event) -> String {
    let at = e.at.map_or("-".to_string(), |t| {
        t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
    });
    let mut text = format!("{at}  {}", e.event);
    if let Some(n) = e.attempt {
        text.push_str(&format!(" {n}"));
    }
    if let Some(outcome) = &e.outcome {
        text.push_str(&format!(" {outcome}"));
    }
    if let Some(class) = &e.class {
        text.push_str(&format!(" ({class})"));
    }
    for detail in [&e.smtp_reply, &e.error].into_iter().flatten() {
        text.push_str(&format!(": {detail}"));
    }
    text
}
