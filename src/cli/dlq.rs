//! `mailroom dlq list | groups | show | replay | purge | ingest`: the dead letters for operators.
//! Thin: parse, call [`crate::dlq`], print ([`super::dlq_print`]: aligned lines, or `--json`,
//! the HTTP API's shapes). The reads (`list`, `groups`, `show`) need only the database: no
//! broker, nothing declared.

mod commands;

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::builder::PossibleValue;
use clap::{ArgGroup, Args, Subcommand, ValueEnum};

use super::{BrokerArgs, DatabaseArgs};
use crate::config::{Delays, UrlList};
use crate::dlq::seal::ReplayKey;
use crate::dlq::{Class, Filter, SelectionArgs, States, parse_since};

#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    pub command: DlqCommand,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Browse the dead letters, newest first, a page at a time (reads the table only).
    List(ListArgs),
    /// Failure groups: dead letters with the same class and normalised reason, with counts.
    Groups(GroupsArgs),
    /// Dead letters in full: the job, every header, x-death, and the job's ledger row.
    Show(ShowArgs),
    /// Republish dead letters through the main exchange with confirms, then mark them replayed.
    Replay(Box<ReplayArgs>),
    /// Mark dead letters purged, or delete them.
    Purge(Box<PurgeArgs>),
    /// Move what is in the dead-letter queue into the table now, then exit (workers, serve and
    /// run do it all along); also deletes replayed and purged rows past the retention.
    Ingest(IngestArgs),
}

/// The filters a listing and a group count take.
#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Only this kind (template).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only this class (why it died).
    #[arg(long, value_enum)]
    pub class: Option<Class>,
    /// Failed at or after: an RFC 3339 time (2026-11-30T12:00:00Z) or a duration ago (2h, 30m).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// Failed before: an RFC 3339 time or a duration ago.
    #[arg(long, value_parser = parse_since)]
    pub until: Option<DateTime<Utc>>,
    /// Only those whose reason, recipient or job id contains this text (any case; % and _ are
    /// literal).
    #[arg(long, alias = "grep")]
    pub text: Option<String>,
    /// Which rows: dead (still to deal with), replayed, purged, or all.
    #[arg(long, default_value = "dead", value_parser = parse_states)]
    pub state: States,
}

impl FilterArgs {
    pub fn filter(&self) -> Filter {
        Filter {
            kind: self.kind.clone(),
            class: self.class,
            since: self.since,
            until: self.until,
            text: self.text.clone(),
            state: self.state,
        }
    }
}

fn parse_states(s: &str) -> Result<States, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Letters per page (at most 1000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Continue after this cursor (the `next` a previous page printed).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Count by kind and by failure group instead of listing.
    #[arg(long)]
    pub summary: bool,
    /// Print JSON (the HTTP API's `GET /v1/dlq`) instead of aligned columns.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GroupsArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print JSON (the HTTP API's `GET /v1/dlq/groups`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// A row id (from `list`), or a job id (every dead letter of that job).
    pub id: String,
    /// Print email addresses in full (recipients, data, headers, ledger row); by default every
    /// one is masked, in the text and the JSON alike, as in listings.
    #[arg(long)]
    pub reveal: bool,
    /// Print JSON (the HTTP API's `GET /v1/dlq/{id}`) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Which dead rows a replay or purge takes: exactly one of these.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("selection").required(true).args(["jobs", "id", "group", "kind", "class", "text", "all"])))]
pub struct SelectArgs {
    /// Job ids (every dead row of each).
    pub jobs: Vec<String>,
    /// Row ids (from `list`); repeat for several.
    #[arg(long)]
    pub id: Vec<i64>,
    /// Every dead row of this failure group (from `groups`).
    #[arg(long)]
    pub group: Option<String>,
    /// Every dead row of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Every dead row of this class (why it died).
    #[arg(long, value_enum)]
    pub class: Option<Class>,
    /// Every dead row whose reason, recipient or job id contains this text.
    #[arg(long)]
    pub text: Option<String>,
    /// With --kind, --class or --text: only those failed at or after (RFC 3339 or 2h).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// With --kind, --class or --text: only those failed before.
    #[arg(long, value_parser = parse_since)]
    pub until: Option<DateTime<Utc>>,
    /// Every dead row.
    #[arg(long)]
    pub all: bool,
}

impl SelectArgs {
    pub fn args(&self) -> SelectionArgs {
        SelectionArgs {
            rows: self.id.clone(),
            jobs: self.jobs.clone(),
            group: self.group.clone(),
            filter: Filter {
                kind: self.kind.clone(),
                class: self.class,
                text: self.text.clone(),
                since: self.since,
                until: self.until,
                state: States::Dead,
            },
            all: self.all,
        }
    }
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// RabbitMQ URL(s), as every command takes them; not needed for --dry-run.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<UrlList>,
    /// Prefix of every exchange and queue.
    #[arg(long, env = "MAILROOM_NAMESPACE", default_value = "mailroom")]
    pub namespace: String,
    /// Retry tiers, comma-separated, increasing (declared with the topology).
    #[arg(long, env = "MAILROOM_RETRY_DELAYS", default_value = "5s,30s,2m,10m,1h", value_parser = crate::config::parse_delays)]
    pub retry_delays: Delays,
    /// Key that seals replayed copies (the workers' MAILROOM_REPLAY_KEY); default: the key
    /// kept in the database.
    #[arg(long, env = "MAILROOM_REPLAY_KEY", hide_env_values = true)]
    pub replay_key: Option<ReplayKey>,
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub select: SelectArgs,
    /// Render the selection against today's templates and show what would be sent; publish
    /// and change nothing (needs no broker).
    #[arg(long)]
    pub dry_run: bool,
    /// Template directory, for --dry-run.
    #[arg(long, env = "MAILROOM_TEMPLATES", default_value = "./templates")]
    pub templates: PathBuf,
    /// Who replays, as the rows record it (default: the OS user).
    #[arg(long)]
    pub by: Option<String>,
    /// Print the report (or the dry run's previews) as JSON, as the HTTP API answers.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub select: SelectArgs,
    /// Confirms the purge.
    #[arg(long)]
    pub yes: bool,
    /// Delete the rows instead of marking them purged.
    #[arg(long)]
    pub delete: bool,
    /// Who purges, as the rows record it (default: the OS user).
    #[arg(long)]
    pub by: Option<String>,
    /// Print the report as JSON, as the HTTP API answers.
    #[arg(long)]
    pub json: bool,
}

/// How long replayed and purged dead-letter rows are kept.
#[derive(Clone, Debug, Args)]
pub struct RetentionArgs {
    /// Replayed and purged dead-letter rows older than this are deleted (rows still dead are
    /// kept).
    #[arg(long, env = "MAILROOM_DEAD_LETTER_RETENTION", default_value = "30days", value_parser = crate::config::parse_duration)]
    pub dead_letter_retention: Duration,
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// Print what was ingested as JSON.
    #[arg(long)]
    pub json: bool,
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
        match &self.command {
            DlqCommand::List(a) => commands::list(a).await,
            DlqCommand::Groups(a) => commands::groups(a).await,
            DlqCommand::Show(a) => commands::show(a).await,
            DlqCommand::Replay(a) if a.dry_run => commands::dry_run(a).await,
            DlqCommand::Replay(a) => commands::replay(a).await,
            DlqCommand::Purge(a) => commands::purge(a).await,
            DlqCommand::Ingest(a) => commands::ingest(a).await,
        }
    }
}

#[cfg(test)]
mod tests;
