//! `mailroom suppressions`: the addresses mailroom does not send to. `add` and `remove` change
//! the list (`by` is recorded), `list` pages through it newest first, `check` says whether an
//! address is on it. `GET/PUT/DELETE /v1/suppressions` do the same over HTTP.

use clap::{Args, Subcommand};

use super::DatabaseArgs;
use crate::db::suppressions::{self, Reason, Suppression};
use crate::db::{Database, OnAcquire};

#[derive(Debug, Args)]
pub struct SuppressionsArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(subcommand)]
    pub command: SuppressionsCommand,
}

#[derive(Debug, Subcommand)]
pub enum SuppressionsCommand {
    /// Suppress an address: jobs to it are recorded `suppressed` and not sent.
    Add(AddArgs),
    /// Lift an address's suppression.
    Remove(AddressArg),
    /// Say whether an address is suppressed, and why (exit 1 when it is not).
    Check(AddressArg),
    /// Suppressed addresses, newest first.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The address; its domain's case does not matter, its local part's does.
    pub address: String,
    /// hard_bounce, complaint, unsubscribed or manual.
    #[arg(long, default_value = "manual")]
    pub reason: Reason,
    /// A note kept with the entry (a ticket, the bounce's text).
    #[arg(long)]
    pub detail: Option<String>,
    /// Who made the entry, as lists show it (default: cli).
    #[arg(long)]
    pub by: Option<String>,
}

#[derive(Debug, Args)]
pub struct AddressArg {
    /// The address; its domain's case does not matter, its local part's does.
    pub address: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only entries of this reason.
    #[arg(long)]
    pub reason: Option<Reason>,
    /// Entries per page (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
}

impl SuppressionsArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let db = Database::connect(&self.db.database_url, 1, OnAcquire::Ping).await?;
        db.require_schema().await?;
        match &self.command {
            SuppressionsCommand::Add(a) => {
                let key = suppressions::key(&a.address).map_err(anyhow::Error::msg)?;
                let by = a.by.clone().unwrap_or_else(|| "cli".into());
                db.suppress(&key, a.reason, a.detail.as_deref(), &by)
                    .await?;
                println!("{key} suppressed ({})", a.reason);
            }
            SuppressionsCommand::Remove(a) => {
                let key = suppressions::key(&a.address).map_err(anyhow::Error::msg)?;
                if db.unsuppress(&key).await? {
                    println!("{key} is no longer suppressed");
                } else {
                    println!("{key} was not suppressed; nothing changed");
                }
            }
            SuppressionsCommand::Check(a) => {
                let key = suppressions::key(&a.address).map_err(anyhow::Error::msg)?;
                match db
                    .suppressed_among(std::slice::from_ref(&key))
                    .await?
                    .first()
                {
                    Some(s) => println!("{}", line(s)),
                    None => anyhow::bail!("{key} is not suppressed"),
                }
            }
            SuppressionsCommand::List(a) => {
                for s in db.suppressions(a.reason, None, a.limit).await? {
                    if a.json {
                        println!("{}", serde_json::to_string(&s)?);
                    } else {
                        println!("{}", line(&s));
                    }
                }
            }
        }
        Ok(())
    }
}

/// `ada@example.com  hard_bounce  2026-12-01 10:00:00Z  by worker, job 42: 550 5.1.1 …`
fn line(s: &Suppression) -> String {
    let at = s.created_at.format("%Y-%m-%d %H:%M:%SZ");
    let detail = s
        .detail
        .as_deref()
        .map(|d| format!(": {d}"))
        .unwrap_or_default();
    format!(
        "{}  {}  {at}  by {}{detail}",
        s.address, s.reason, s.created_by
    )
}
