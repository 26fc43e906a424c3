//! Dead letters as rows: `<ns>.dead` is ingested into `mailroom_dead_letters` ([`ingest`]), and
//! everything people do with dead letters reads and changes that table, as plain async
//! functions returning data, shared by the CLI (`mailroom dlq …`), the HTTP API and any page.
//! The queue stays the transport; the table is what people browse, so two readers at the same
//! time see the same rows, and reading declares and changes nothing on the broker.
//!
//! - [`DeadLetters::list`]: a [`Page`] of [`Entry`]s (masked recipient, class, reason, state),
//!   newest first, filtered by a [`Filter`], continued by its [`Page::next`] cursor.
//! - [`DeadLetters::groups`]: failure [`Group`]s (one class, one normalised reason) with counts,
//!   first and last seen; [`DeadLetters::summary`] counts by kind and group.
//! - [`DeadLetters::show`]: rows in full (the job, every header, `x-death`, the ledger row);
//!   [`Detail::masked`] masks every email address, which both doors do unless asked to reveal.
//! - [`DeadLetters::replay`], [`DeadLetters::dry_run`], [`DeadLetters::purge`],
//!   [`DeadLetters::expire`]: on a [`Selection`] (row ids, job ids, a filter, a group, all),
//!   see `selection.rs` and `replay.rs`.

mod browse;
mod class;
pub mod ingest;
mod letter;
mod replay;
pub mod seal;
mod selection;
mod stored;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::db::{Database, Notification};
use crate::job::mask_addresses;

pub use browse::{Cursor, Group, Page, Summary};
pub use class::{Class, UnknownClass};
pub use letter::Death;
pub use replay::{CLAIM_TTL, Preview, Replayer};
pub use selection::{NotOneSelection, Report, Selection, SelectionArgs, default_actor};
pub use stored::{MAX_STORED_BODY, OVERSIZE_KEPT, decode_properties};

/// One dead letter, as a listing shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    /// The row id: what `show`, `replay --id` and `/v1/dlq/{id}` take.
    pub id: i64,
    pub job_id: String,
    pub kind: String,
    /// The first recipient, masked (`a***@example.com +1`); `?` when the job has none.
    pub recipient: String,
    /// A [`Class`] name: `invalid`, `template`, `rejected`, `exhausted`, `uncertain` (set by the
    /// worker), `poison` (the broker's delivery limit), `broker` (other broker dead-lettering) or
    /// `unknown`; kept as written, so a class from another version still shows.
    pub class: String,
    /// Why it died, with any email address masked.
    pub reason: String,
    /// Its failure group (hex), as `dlq groups` and `/v1/dlq/groups` name it.
    pub group: String,
    pub attempts: Option<i64>,
    pub failed_at: Option<DateTime<Utc>>,
    /// How many times it was replayed before it died this time.
    pub replays: i64,
    pub ingested_at: DateTime<Utc>,
    /// `dead`, `replayed` or `purged`.
    pub state: String,
    pub replayed_at: Option<DateTime<Utc>>,
    pub replayed_by: Option<String>,
    /// `published`, or why the last replay failed.
    pub replay_result: Option<String>,
    pub purged_at: Option<DateTime<Utc>>,
    pub purged_by: Option<String>,
    /// The body's size as it arrived; above [`MAX_STORED_BODY`] only its head is kept.
    pub body_size: i64,
    /// Whether only the head of the body was kept (an oversize letter: it cannot be replayed).
    pub truncated: bool,
}

/// Which rows a state filter takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum States {
    /// Only `dead` rows: what is still to be dealt with.
    #[default]
    Dead,
    Replayed,
    Purged,
    All,
}

impl States {
    fn column(self) -> Option<&'static str> {
        match self {
            States::Dead => Some("dead"),
            States::Replayed => Some("replayed"),
            States::Purged => Some("purged"),
            States::All => None,
        }
    }
}

impl std::str::FromStr for States {
    type Err = String;

    fn from_str(s: &str) -> Result<States, String> {
        match s {
            "dead" => Ok(States::Dead),
            "replayed" => Ok(States::Replayed),
            "purged" => Ok(States::Purged),
            "all" => Ok(States::All),
            other => Err(format!(
                "unknown state {other:?}; the states are: dead, replayed, purged, all"
            )),
        }
    }
}

/// Which dead letters a listing, a group count or a replay takes; every field set must match.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    pub kind: Option<String>,
    pub class: Option<Class>,
    /// Failed (or, without a failure time, ingested) at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// … and before this one.
    pub until: Option<DateTime<Utc>>,
    /// Case-insensitive text in the reason, the recipient or the job id (`%`, `_` literal).
    pub text: Option<String>,
    pub state: States,
}

impl Filter {
    /// Whether it names anything beyond the default state.
    pub fn is_empty(&self) -> bool {
        self.kind.is_none()
            && self.class.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.text.is_none()
    }
}

/// One dead letter in full, as `show` gives it.
#[derive(Clone, Debug, Serialize)]
pub struct Detail {
    pub entry: Entry,
    /// The body as JSON, or as text when it is not JSON.
    pub job: Value,
    /// Every AMQP header (`x-mailroom-*`, `x-death`, …), tables as objects.
    pub headers: serde_json::Map<String, Value>,
    /// `x-death`, parsed, newest first.
    pub deaths: Vec<Death>,
    pub exchange: String,
    pub routing_key: String,
    /// The job's `sent_notifications` row, if any.
    pub notification: Option<Row>,
}

impl Detail {
    /// The same dead letter with every email address masked (`a***@example.com`) wherever it
    /// appears: the job (recipients, and data such as a support address), the headers (an SMTP
    /// reply quoting the recipient) and the ledger row. One rule for the text and the JSON, so
    /// neither door prints a full address unless the caller asks to reveal them.
    pub fn masked(mut self) -> Detail {
        mask_strings(&mut self.job);
        self.headers.values_mut().for_each(mask_strings);
        if let Some(row) = &mut self.notification {
            for text in [&mut row.smtp_reply, &mut row.last_error]
                .into_iter()
                .flatten()
            {
                *text = mask_addresses(text);
            }
        }
        self
    }
}

/// Masks the email addresses in every string of `value`, at any depth.
fn mask_strings(value: &mut Value) {
    match value {
        Value::String(text) => *text = mask_addresses(text),
        Value::Array(items) => items.iter_mut().for_each(mask_strings),
        Value::Object(fields) => fields.values_mut().for_each(mask_strings),
        _ => {}
    }
}

/// A `sent_notifications` row, for display.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub status: String,
    pub attempts: i32,
    pub message_id: String,
    pub smtp_reply: Option<String>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    pub template_revision: Option<String>,
}

impl From<Notification> for Row {
    fn from(n: Notification) -> Row {
        Row {
            status: n.status.to_string(),
            attempts: n.attempts,
            message_id: n.message_id,
            smtp_reply: n.smtp_reply,
            last_error: n.last_error,
            created_at: n.created_at,
            updated_at: n.updated_at,
            sent_at: n.sent_at,
            template_revision: n.template_revision,
        }
    }
}

/// The dead letters of one database. Cheap to clone; needs no broker (a replay takes a
/// [`Replayer`]).
#[derive(Clone, Debug)]
pub struct DeadLetters {
    db: Database,
}

impl DeadLetters {
    pub fn new(db: Database) -> DeadLetters {
        DeadLetters { db }
    }

    /// The database the rows are in.
    pub fn database(&self) -> &Database {
        &self.db
    }
}

/// A time as the CLI and the HTTP API take it (`since`, `until`): `2h` → two hours ago;
/// otherwise an RFC 3339 time.
pub fn parse_since(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(s.trim()) {
        return Ok(at.with_timezone(&Utc));
    }
    let ago = crate::config::parse_duration(s)
        .map_err(|_| format!("{s:?} is neither an RFC 3339 time nor a duration like 2h"))?;
    let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
    Ok(Utc::now() - ago)
}

#[cfg(test)]
mod tests;
