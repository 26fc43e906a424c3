//! Reading the table: pages of entries with a cursor, failure groups, counts, and rows in full.
//! Read-only: no broker, nothing declared, nothing changed, so any number of readers see the
//! same rows at the same time.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::{DeadLetters, Detail, Entry, Filter, Row, letter, stored};
use crate::db::dead_letters::{DeadLetterRow, GroupRow, LetterQuery};
use crate::job::mask_addresses;

/// Most entries one page holds.
pub const MAX_PAGE: usize = 1000;

/// Where the next page starts: below this row id (pages run newest first). Opaque to callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor(i64);

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Cursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Cursor, String> {
        s.parse::<i64>()
            .ok()
            .filter(|id| *id > 0)
            .map(Cursor)
            .ok_or_else(|| format!("{s:?} is not a cursor from a previous page"))
    }
}

/// One page of a listing, newest first.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Page {
    pub letters: Vec<Entry>,
    /// The cursor of the next page; `None` on the last one. Letters that arrive meanwhile are
    /// newer: they never push an older one onto a page already read, nor hide one.
    pub next: Option<String>,
}

/// A failure group: dead letters of one class with one normalised reason.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Group {
    /// Its key (hex), as `replay --group` and `{"group": …}` take it.
    pub group: String,
    pub class: String,
    /// The normalised reason: addresses, ids and long numbers taken out.
    pub reason: String,
    pub count: i64,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// Counts of the letters a filter takes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub total: i64,
    pub by_kind: BTreeMap<String, i64>,
    /// The failure groups, largest first.
    pub by_reason: Vec<Group>,
}

/// The query of a filter (the state included).
pub(super) fn query(filter: &Filter) -> LetterQuery {
    LetterQuery {
        state: filter.state.column().map(str::to_owned),
        kind: filter.kind.clone(),
        class: filter.class.map(|c| c.as_str().to_owned()),
        since: filter.since,
        until: filter.until,
        text: filter.text.clone(),
        ..LetterQuery::default()
    }
}

/// The entry of a row, the recipient and the reason masked.
pub(super) fn entry(r: &DeadLetterRow) -> Entry {
    Entry {
        id: r.id,
        job_id: r.job_id.clone(),
        kind: r.kind.clone(),
        recipient: letter::masked_recipient(r.recipient.as_deref(), r.recipients),
        class: r.class.clone(),
        reason: mask_addresses(&r.reason),
        group: hex::encode(&r.group_key),
        attempts: r.attempts,
        failed_at: r.failed_at,
        replays: r.replays,
        ingested_at: r.ingested_at,
        state: r.state.clone(),
        replayed_at: r.replayed_at,
        replayed_by: r.replayed_by.clone(),
        replay_result: r.replay_result.clone(),
        purged_at: r.purged_at,
        purged_by: r.purged_by.clone(),
        body_size: r.body_size,
        truncated: usize::try_from(r.body_size).unwrap_or(usize::MAX) > stored::MAX_STORED_BODY,
    }
}

fn group(g: GroupRow) -> Group {
    Group {
        group: hex::encode(&g.group_key),
        class: g.class,
        reason: mask_addresses(&g.reason_group),
        count: g.count,
        first_seen: g.first_seen,
        last_seen: g.last_seen,
    }
}

impl DeadLetters {
    /// Up to `limit` (at most [`MAX_PAGE`]) entries matching `filter`, newest first, after
    /// `cursor` (the `next` of the previous page).
    pub async fn list(
        &self,
        filter: &Filter,
        cursor: Option<Cursor>,
        limit: usize,
    ) -> anyhow::Result<Page> {
        self.list_in(filter, None, cursor, limit).await
    }

    /// [`DeadLetters::list`] within one failure group (its hex key) when `group` names one; a
    /// malformed key takes nothing.
    pub async fn list_in(
        &self,
        filter: &Filter,
        group: Option<&str>,
        cursor: Option<Cursor>,
        limit: usize,
    ) -> anyhow::Result<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let mut q = query(filter);
        q.group_key = group.map(|g| hex::decode(g).unwrap_or_else(|_| vec![0xff]));
        q.before = cursor.map(|c| c.0);
        q.limit = Some(limit as i64 + 1);
        let mut rows = self
            .db
            .dead_letters(&q)
            .await
            .context("reading the dead letters")?;
        let next = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|r| Cursor(r.id).to_string())
        } else {
            None
        };
        Ok(Page {
            letters: rows.iter().map(entry).collect(),
            next,
        })
    }

    /// The failure groups among the letters `filter` takes, largest first.
    pub async fn groups(&self, filter: &Filter) -> anyhow::Result<Vec<Group>> {
        let groups = self
            .db
            .dead_letter_groups(&query(filter))
            .await
            .context("reading the failure groups")?;
        Ok(groups.into_iter().map(group).collect())
    }

    /// Counts of the letters `filter` takes: in all, by kind, by group.
    pub async fn summary(&self, filter: &Filter) -> anyhow::Result<Summary> {
        let by_kind: BTreeMap<String, i64> = self
            .db
            .dead_letters_by_kind(&query(filter))
            .await
            .context("counting the dead letters")?
            .into_iter()
            .collect();
        Ok(Summary {
            total: by_kind.values().sum(),
            by_kind,
            by_reason: self.groups(filter).await?,
        })
    }

    /// The rows `key` names, in full, newest first: the row with that id (when `key` is a
    /// number) and every row of the job with that id, each with the job's ledger row.
    pub async fn show(&self, key: &str) -> anyhow::Result<Vec<Detail>> {
        let mut q = LetterQuery {
            job_ids: vec![key.to_owned()],
            payload: true,
            ..LetterQuery::default()
        };
        let mut rows = self
            .db
            .dead_letters(&q)
            .await
            .context("reading the dead letter")?;
        if let Ok(id) = key.parse::<i64>()
            && !rows.iter().any(|r| r.id == id)
        {
            q.job_ids.clear();
            q.ids = vec![id];
            rows.extend(self.db.dead_letters(&q).await?);
            rows.sort_by_key(|r| std::cmp::Reverse(r.id));
        }
        let mut details = Vec::with_capacity(rows.len());
        for r in &rows {
            let notification = self
                .db
                .notification(&r.job_id, &r.kind)
                .await
                .with_context(|| format!("reading the ledger row of {}", r.job_id))?;
            details.push(detail(r, notification.map(Row::from))?);
        }
        Ok(details)
    }
}

/// One row in full.
fn detail(r: &DeadLetterRow, notification: Option<Row>) -> anyhow::Result<Detail> {
    let props = stored::decode_properties(&r.properties)
        .with_context(|| format!("dead letter {}", r.id))?;
    Ok(Detail {
        entry: entry(r),
        job: serde_json::from_slice(&r.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&r.body).into_owned())),
        headers: letter::headers_json(&props),
        deaths: letter::deaths(&props),
        exchange: r.exchange.clone(),
        routing_key: r.routing_key.clone(),
        notification,
    })
}
