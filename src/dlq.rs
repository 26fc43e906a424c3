//! The dead-letter queue `<ns>.dead`: list, show, replay and purge, as plain async functions
//! returning data, shared by the CLI (`mailroom dlq …`) and the HTTP API.
//!
//! Nothing here loses or reorders a dead letter it does not mean to touch: every operation is
//! one [`unacked`] pass that takes each message unacknowledged and lets the broker requeue the
//! untouched ones in place when the pass ends, or when the process dies. The operations that act
//! on a [`Selection`] (replay, purge, dry run) are in [`selection`].
//!
//! - [`DeadLetters::list`]: one [`Entry`] per message (masked recipient, class, reason, …),
//!   filtered by a [`Filter`]; [`summarize`] counts them by kind and reason.
//! - [`DeadLetters::show`]: the whole job, every header, `x-death`, and the ledger row;
//!   [`Detail::masked`] masks every email address in it, which both doors do unless asked to
//!   reveal them (`--reveal`, `?reveal=true`).
//! - [`DeadLetters::replay`]: republish the [`Selection`] through the main exchange with
//!   confirms, then remove it (at-least-once: a crash in between duplicates, never loses). The
//!   copy carries `x-mailroom-replay`, which lets the worker claim a `dead` or `uncertain` row
//!   one more time; a `sent` row is never claimed again, so a replay never sends twice. The
//!   worker honours it only with a valid [`seal`] (a copy from another publisher has none).
//! - [`DeadLetters::dry_run`]: render the selection against today's templates, change nothing.
//! - [`DeadLetters::purge`]: remove the selection for good.

mod class;
mod letter;
pub mod seal;
mod selection;
mod unacked;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use lapin::{Connection, message::Delivery};
use serde::Serialize;
use serde_json::Value;

use crate::broker::{self, Topology};
use crate::config::UrlList;
use crate::db::{Database, Notification};
use crate::job::mask_addresses;

pub use class::{Class, UnknownClass};
pub use letter::Death;
pub use selection::{NotOneSelection, Preview, Progress, Report, Selection};

/// One dead letter, as a listing shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    /// 1-based position in the queue when it was read.
    pub position: usize,
    pub job_id: String,
    pub kind: String,
    /// The first recipient, masked (`a***@example.com +1`); `?` when the body has none.
    pub recipient: String,
    /// A [`Class`] name: `invalid`, `template`, `rejected`, `exhausted`, `uncertain` (set by the
    /// worker), `poison` (the broker's delivery limit), `broker` (other broker dead-lettering) or
    /// `unknown`; kept as written, so a class from another version still shows.
    pub class: String,
    /// Why it died, with any email address masked.
    pub reason: String,
    pub attempts: Option<i64>,
    pub failed_at: Option<DateTime<Utc>>,
    /// How many times it was replayed before.
    pub replays: i64,
}

/// Which dead letters a listing shows; every field set must match.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub kind: Option<String>,
    pub class: Option<Class>,
    /// Failed at or after this instant (messages without a failure time never match).
    pub since: Option<DateTime<Utc>>,
    /// Substring of the reason or the job id.
    pub grep: Option<String>,
}

impl Filter {
    pub fn matches(&self, e: &Entry) -> bool {
        self.kind.as_ref().is_none_or(|k| *k == e.kind)
            && self.class.is_none_or(|c| c.as_str() == e.class)
            && self
                .since
                .is_none_or(|since| e.failed_at.is_some_and(|at| at >= since))
            && self
                .grep
                .as_ref()
                .is_none_or(|g| e.reason.contains(g.as_str()) || e.job_id.contains(g.as_str()))
    }
}

/// Counts of a listing.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub total: usize,
    pub by_kind: BTreeMap<String, usize>,
    /// Most frequent first.
    pub by_reason: Vec<ReasonCount>,
}

/// How many dead letters share one class and reason.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReasonCount {
    pub class: String,
    pub reason: String,
    pub count: usize,
}

/// Counts entries by kind and by (class, reason).
pub fn summarize(entries: &[Entry]) -> Summary {
    let mut by_kind = BTreeMap::new();
    let mut reasons: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for e in entries {
        *by_kind.entry(e.kind.clone()).or_default() += 1;
        *reasons.entry((&e.class, &e.reason)).or_default() += 1;
    }
    let mut by_reason: Vec<ReasonCount> = reasons
        .into_iter()
        .map(|((class, reason), count)| ReasonCount {
            class: class.to_owned(),
            reason: reason.to_owned(),
            count,
        })
        .collect();
    by_reason.sort_by_key(|r| std::cmp::Reverse(r.count));
    Summary {
        total: entries.len(),
        by_kind,
        by_reason,
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
    pub routing_key: String,
    /// The job's `sent_notifications` row, if any (and if a database was given).
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

/// A connection to the broker for dead-letter operations.
pub struct DeadLetters {
    conn: Connection,
    topology: Topology,
}

impl DeadLetters {
    /// Connects (named `name` in `rabbitmqctl list_connections`) and declares the topology.
    pub async fn connect(
        urls: &UrlList,
        topology: Topology,
        name: &str,
    ) -> anyhow::Result<DeadLetters> {
        let conn = broker::connect(urls, name).await?;
        let setup = conn.create_channel().await?;
        broker::declare_topology(&setup, &topology).await?;
        let _ = setup.close(200, "declared".into()).await;
        Ok(DeadLetters { conn, topology })
    }

    /// The dead-letter queue these operations work on.
    pub fn dead_queue(&self) -> &str {
        &self.topology.dead
    }

    /// Every dead letter matching `filter`, in queue order; the queue is left as it was.
    pub async fn list(&self, filter: &Filter) -> anyhow::Result<Vec<Entry>> {
        self.read(|e, _| filter.matches(&e).then_some(e)).await
    }

    /// Every dead letter of `job_id` in full, with its ledger row when `db` is given.
    pub async fn show(&self, job_id: &str, db: Option<&Database>) -> anyhow::Result<Vec<Detail>> {
        let mut found = self
            .read(|entry, d| (entry.job_id == job_id).then(|| detail(entry, d)))
            .await?;
        if let Some(db) = db {
            for detail in &mut found {
                let e = &detail.entry;
                detail.notification = db.notification(&e.job_id, &e.kind).await?.map(Row::from);
            }
        }
        Ok(found)
    }

    /// One [`unacked`] pass over the queue, in order, keeping what `keep` makes of each dead
    /// letter; the queue is left as it was.
    async fn read<T>(
        &self,
        mut keep: impl FnMut(Entry, &Delivery) -> Option<T>,
    ) -> anyhow::Result<Vec<T>> {
        let mut pass = unacked::Pass::open(&self.conn, &self.topology.dead).await?;
        let mut kept = Vec::new();
        let mut position = 0;
        let result = async {
            while let Some(d) = pass.next().await? {
                position += 1;
                kept.extend(keep(letter::entry(position, &d), &d));
            }
            anyhow::Ok(())
        }
        .await;
        pass.close().await;
        result.map(|()| kept)
    }

    /// Closes the connection.
    pub async fn close(self) {
        let _ = self.conn.close(200, "done".into()).await;
    }
}

/// One dead letter in full, its ledger row not read yet.
fn detail(entry: Entry, d: &Delivery) -> Detail {
    Detail {
        job: serde_json::from_slice(&d.data)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&d.data).into_owned())),
        headers: letter::headers_json(&d.properties),
        deaths: letter::deaths(&d.properties),
        routing_key: d.routing_key.to_string(),
        notification: None,
        entry,
    }
}

/// The `since` of a [`Filter`], as the CLI and the HTTP API take it: `2h` → two hours ago;
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
