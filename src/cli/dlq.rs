//! `mailroom dlq list | show | replay | purge`: the dead-letter queue for operators. Thin: parse,
//! call [`crate::dlq`], print ([`super::dlq_print`]: aligned lines, or `--json` for scripts).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use clap::builder::PossibleValue;
use clap::{ArgGroup, Args, Subcommand, ValueEnum};

use super::dlq_print as print;
use super::{BrokerArgs, DatabaseArgs};
use crate::config::SecretUrl;
use crate::db::Database;
use crate::dlq::seal::{self, ReplayKey};
use crate::dlq::{Class, DeadLetters, Detail, Filter, Progress, Report, Selection, parse_since};

/// How often progress is redrawn on a terminal.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    pub command: DlqCommand,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Browse the dead letters without removing or reordering any.
    List(ListArgs),
    /// One job's dead letters in full: the job, every header, x-death, and its ledger row.
    Show(ShowArgs),
    /// Republish dead letters through the main exchange with confirms, then remove them.
    Replay(Box<ReplayArgs>),
    /// Remove dead letters for good.
    Purge(PurgeArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Only this kind (template).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only this class (why it died).
    #[arg(long, value_enum)]
    pub class: Option<Class>,
    /// Failed at or after: an RFC 3339 time (2026-11-30T12:00:00Z) or a duration ago (2h, 30m).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// Only those whose reason or job id contains this text.
    #[arg(long)]
    pub grep: Option<String>,
    /// Count by kind and by reason instead of listing.
    #[arg(long)]
    pub summary: bool,
    /// Print JSON (the HTTP API's `GET /v1/dlq`) instead of aligned columns.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// The job id.
    pub id: String,
    /// Print email addresses in full (recipients, data, headers, ledger row); by default every
    /// one is masked, in the text and the JSON alike, as in listings.
    #[arg(long)]
    pub reveal: bool,
    /// Print JSON (the HTTP API's `GET /v1/dlq/{job_id}`) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("selection").required(true).args(["ids", "kind", "class", "all"])))]
pub struct ReplayArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Job ids to replay.
    pub ids: Vec<String>,
    /// Every dead letter of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Every dead letter of this class (why it died).
    #[arg(long, value_enum)]
    pub class: Option<Class>,
    /// Every dead letter.
    #[arg(long)]
    pub all: bool,
    /// Render the selection against today's templates and show what would be sent; publish
    /// and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Template directory, for --dry-run.
    #[arg(long, env = "MAILROOM_TEMPLATES", default_value = "./templates")]
    pub templates: PathBuf,
    /// Database: where the workers' replay key is kept (needed to replay unless
    /// MAILROOM_REPLAY_KEY is set); with --dry-run (optional) it marks the jobs already sent,
    /// which a replay skips.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<SecretUrl>,
    /// Print the report (or the dry run's previews) as JSON, as the HTTP API answers.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("selection").required(true).args(["ids", "kind", "class", "all"])))]
pub struct PurgeArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Job ids to purge.
    pub ids: Vec<String>,
    /// Every dead letter of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Every dead letter of this class (why it died).
    #[arg(long, value_enum)]
    pub class: Option<Class>,
    /// Every dead letter.
    #[arg(long)]
    pub all: bool,
    /// Confirms that the selected dead letters are deleted for good.
    #[arg(long)]
    pub yes: bool,
    /// Print the report as JSON, as the HTTP API answers.
    #[arg(long)]
    pub json: bool,
}

/// The selection of a replay or purge; clap's argument group already lets exactly one through.
fn selection(
    ids: &[String],
    kind: &Option<String>,
    class: Option<Class>,
    all: bool,
) -> anyhow::Result<Selection> {
    Ok(Selection::one_of(ids.to_vec(), kind.clone(), class, all)?)
}

/// `--class` takes exactly the classes mailroom writes; clap lists them in `--help` and in the
/// error for any other value.
impl ValueEnum for Class {
    fn value_variants<'a>() -> &'a [Self] {
        &Class::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.as_str()).help(self.describe()))
    }
}

impl DlqArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        let broker = match &self.command {
            DlqCommand::List(a) => &a.broker,
            DlqCommand::Show(a) => &a.broker,
            DlqCommand::Replay(a) => &a.broker,
            DlqCommand::Purge(a) => &a.broker,
        };
        // A replay without its key fails before it touches the broker.
        let key = match &self.command {
            DlqCommand::Replay(a) if !a.dry_run => Some(replay_key(a).await?),
            _ => None,
        };
        let dlq = DeadLetters::connect(&broker.amqp_url, broker.topology(), "mailroom dlq").await?;
        let result = match (&self.command, key) {
            (DlqCommand::List(a), _) => list(&dlq, a).await,
            (DlqCommand::Show(a), _) => show(&dlq, a).await,
            (DlqCommand::Replay(a), Some(key)) => replay(&dlq, a, &key).await,
            (DlqCommand::Replay(a), None) => dry_run(&dlq, a).await,
            (DlqCommand::Purge(a), _) => purge(&dlq, a).await,
        };
        dlq.close().await;
        result
    }
}

async fn list(dlq: &DeadLetters, a: &ListArgs) -> anyhow::Result<()> {
    let filter = Filter {
        kind: a.kind.clone(),
        class: a.class,
        since: a.since,
        grep: a.grep.clone(),
    };
    let entries = dlq.list(&filter).await?;
    match (a.summary, a.json) {
        (true, true) => print::json(&crate::dlq::summarize(&entries)),
        (true, false) => print::summary(&crate::dlq::summarize(&entries)),
        (false, true) => print::json(&entries),
        (false, false) => print::entries(&entries, dlq.dead_queue()),
    }
}

async fn show(dlq: &DeadLetters, a: &ShowArgs) -> anyhow::Result<()> {
    let db = Database::connect_lazy(&a.db.database_url, 1)?;
    let details = dlq.show(&a.id, Some(&db)).await;
    db.close().await;
    let mut details = details?;
    if !a.reveal {
        details = details.into_iter().map(Detail::masked).collect();
    }
    if details.is_empty() {
        anyhow::bail!(
            "no dead letter with job id {:?} in {}",
            a.id,
            dlq.dead_queue()
        );
    }
    if a.json {
        print::json(&details)
    } else {
        print::details(&details)
    }
}

async fn replay(dlq: &DeadLetters, a: &ReplayArgs, key: &ReplayKey) -> anyhow::Result<()> {
    let sel = selection(&a.ids, &a.kind, a.class, a.all)?;
    let report = dlq.replay(&sel, key, &mut progress("replaying")).await;
    finish(dlq, &sel, report, a.json)
}

/// MAILROOM_REPLAY_KEY, else the key the workers read from the database.
async fn replay_key(a: &ReplayArgs) -> anyhow::Result<ReplayKey> {
    if let Some(key) = &a.broker.replay_key {
        return Ok(key.clone());
    }
    let Some(url) = &a.database_url else {
        anyhow::bail!(
            "replaying needs DATABASE_URL (where the workers' replay key is kept) or MAILROOM_REPLAY_KEY"
        );
    };
    let db = Database::connect_lazy(url, 1)?;
    let key = seal::resolve(None, &db).await;
    db.close().await;
    key
}

async fn dry_run(dlq: &DeadLetters, a: &ReplayArgs) -> anyhow::Result<()> {
    let (_, templates) = crate::startup::load_templates(&a.templates)?;
    let db = match &a.database_url {
        Some(url) => Some(Database::connect_lazy(url, 1)?),
        None => None,
    };
    let sel = selection(&a.ids, &a.kind, a.class, a.all)?;
    let previews = dlq.dry_run(&sel, &templates, db.as_ref()).await;
    if let Some(db) = db {
        db.close().await;
    }
    let previews = previews?;
    if a.json {
        print::json(&previews)
    } else {
        print::previews(&previews)
    }
}

async fn purge(dlq: &DeadLetters, a: &PurgeArgs) -> anyhow::Result<()> {
    if !a.yes {
        anyhow::bail!(
            "purge deletes dead letters from {} for good; add --yes to confirm",
            dlq.dead_queue()
        );
    }
    let sel = selection(&a.ids, &a.kind, a.class, a.all)?;
    let report = dlq.purge(&sel, &mut progress("purging")).await;
    finish(dlq, &sel, report, a.json)
}

/// Prints the counts; an early stop, a failed publish or an unknown id exits ≠ 0.
fn finish(
    dlq: &DeadLetters,
    sel: &Selection,
    report: anyhow::Result<Report>,
    json: bool,
) -> anyhow::Result<()> {
    let report = report?;
    if json {
        print::json(&report)?;
    } else {
        print::report(&report);
    }
    if let Some(why) = &report.interrupted {
        anyhow::bail!(
            "stopped early: {why}; the dead letters not reached stay in {}",
            dlq.dead_queue()
        );
    }
    let failed = report.selected_left();
    if failed > 0 {
        anyhow::bail!(
            "{failed} selected dead letters stay in {}",
            dlq.dead_queue()
        );
    }
    if report.found_none_of(sel) {
        anyhow::bail!("no dead letter with those job ids in {}", dlq.dead_queue());
    }
    Ok(())
}

/// Progress on stderr, redrawn in place, only when stderr is a terminal.
fn progress(what: &'static str) -> impl FnMut(Progress) {
    let tty = std::io::stderr().is_terminal();
    let mut last: Option<Instant> = None;
    move |p: Progress| {
        let due = last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) || p.done == p.total;
        if tty && due {
            eprint!("\r{what} {}/{}", p.done, p.total);
            if p.done == p.total {
                eprintln!();
            }
            last = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests;
