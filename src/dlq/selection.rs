//! A [`Selection`] of dead rows and the [`Report`] of what acted on it; purge and the
//! retention (replay and the dry run are in `replay.rs`). The selection is built here once,
//! for the CLI, the HTTP API and any page alike ([`Selection::one_of`]): row ids, job ids, a
//! filter, a failure group, or all; only rows still `dead` are taken.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::Serialize;

use super::{Class, DeadLetters, Filter, States, browse};
use crate::db::dead_letters::LetterQuery;

/// Rows read per round of a replay or purge: bounds the memory a whole-table selection takes.
const BATCH: i64 = 200;

/// Which dead rows a replay or purge takes.
#[derive(Clone, Debug, PartialEq)]
pub enum Selection {
    /// These row ids.
    Rows(Vec<i64>),
    /// Every dead row of these job ids.
    Jobs(Vec<String>),
    /// Every dead row of this failure group (its hex key).
    Group(String),
    /// Every dead row the filter takes.
    Filter(Filter),
    All,
}

/// What a command or request names; [`Selection::one_of`] makes it one selection.
#[derive(Clone, Debug, Default)]
pub struct SelectionArgs {
    pub rows: Vec<i64>,
    pub jobs: Vec<String>,
    pub group: Option<String>,
    /// Its kind, class, since, until and text; the state is ignored (only dead rows).
    pub filter: Filter,
    pub all: bool,
}

/// A replay or purge must name exactly one selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "name exactly one selection: row ids (--id), job ids, a filter (kind, class, since, until, text), a group, or all"
)]
pub struct NotOneSelection;

impl Selection {
    /// The one selection named: naming none, or several kinds of them, is refused.
    pub fn one_of(args: SelectionArgs) -> Result<Selection, NotOneSelection> {
        let named = [
            !args.rows.is_empty(),
            !args.jobs.is_empty(),
            args.group.is_some(),
            !args.filter.is_empty(),
            args.all,
        ];
        if named.iter().filter(|n| **n).count() != 1 {
            return Err(NotOneSelection);
        }
        Ok(if !args.rows.is_empty() {
            Selection::Rows(args.rows)
        } else if !args.jobs.is_empty() {
            Selection::Jobs(args.jobs)
        } else if let Some(group) = args.group {
            Selection::Group(group)
        } else if args.all {
            Selection::All
        } else {
            Selection::Filter(Filter {
                state: States::Dead,
                ..args.filter
            })
        })
    }

    /// Every dead row of a class (the CLI's and the API's `class` selection).
    pub fn class(class: Class) -> Selection {
        Selection::Filter(Filter {
            class: Some(class),
            ..Filter::default()
        })
    }

    /// The query of the dead rows selected; a malformed group key selects nothing.
    pub(super) fn query(&self) -> LetterQuery {
        let dead = || LetterQuery {
            state: Some("dead".into()),
            ..LetterQuery::default()
        };
        match self {
            Selection::Rows(ids) => LetterQuery {
                ids: ids.clone(),
                ..dead()
            },
            Selection::Jobs(jobs) => LetterQuery {
                job_ids: jobs.clone(),
                ..dead()
            },
            Selection::Group(key) => LetterQuery {
                group_key: Some(hex::decode(key).unwrap_or_else(|_| vec![0xff])),
                ..dead()
            },
            Selection::Filter(f) => browse::query(&Filter {
                state: States::Dead,
                ..f.clone()
            }),
            Selection::All => dead(),
        }
    }

    /// Whether it names rows or jobs one by one (none found is then an error).
    fn by_id(&self) -> bool {
        matches!(self, Selection::Rows(_) | Selection::Jobs(_))
    }
}

/// What a replay or purge did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    /// Dead rows the selection took.
    pub examined: usize,
    /// Republished (confirmed) and marked replayed.
    pub moved: usize,
    /// Marked purged.
    pub purged: usize,
    /// Deleted (`--delete`).
    pub deleted: usize,
    /// Selected rows left `dead`, counted by why (`publish failed: …`, `oversize …`).
    pub skipped: BTreeMap<String, usize>,
    /// Selected rows another replay running at the same time claimed (or already replayed):
    /// left to it, so that each row is published once.
    pub claimed_elsewhere: usize,
    /// Why it stopped early, if it did; the rows not reached stay `dead`.
    pub interrupted: Option<String>,
    /// The row ids acted on.
    pub ids: Vec<i64>,
}

impl Report {
    /// Selected rows that stay `dead` (a publish failed, an oversize letter).
    pub fn selected_left(&self) -> usize {
        self.skipped.values().sum()
    }

    /// Whether `selection` named ids and none of them was found dead.
    pub fn found_none_of(&self, selection: &Selection) -> bool {
        selection.by_id() && self.examined == 0
    }

    pub(super) fn skip(&mut self, why: impl Into<String>) {
        *self.skipped.entry(why.into()).or_default() += 1;
    }
}

/// Who acts when the caller names nobody: the OS user (`USER`, `LOGNAME`), else `unknown`.
pub fn default_actor() -> String {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

impl DeadLetters {
    /// How many dead rows `selection` takes now (what a confirmation states).
    pub async fn count(&self, selection: &Selection) -> anyhow::Result<i64> {
        let by_kind = self
            .db
            .dead_letters_by_kind(&selection.query())
            .await
            .context("counting the selected dead letters")?;
        Ok(by_kind.iter().map(|(_, n)| n).sum())
    }

    /// Marks the selected dead rows purged by `by`, or deletes them (`delete`).
    pub async fn purge(
        &self,
        selection: &Selection,
        by: &str,
        delete: bool,
    ) -> anyhow::Result<Report> {
        let mut report = Report::default();
        let mut q = selection.query();
        q.limit = Some(BATCH);
        loop {
            let rows = self.db.dead_letters(&q).await?;
            let Some(last) = rows.last() else { break };
            q.before = Some(last.id);
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            let done = self.db.purge_dead_letters(&ids, by, delete).await?;
            report.examined += rows.len();
            let done = usize::try_from(done).unwrap_or(usize::MAX);
            if delete {
                report.deleted += done;
            } else {
                report.purged += done;
            }
            report.ids.extend(ids);
        }
        Ok(report)
    }

    /// Deletes replayed and purged rows that left `dead` longer than `retention` ago, in
    /// batches of [`BATCH`]; rows still `dead` are kept. How many were deleted.
    pub async fn expire(&self, retention: std::time::Duration) -> anyhow::Result<u64> {
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let mut deleted = 0;
        loop {
            let n = self
                .db
                .expire_dead_letters(cutoff, BATCH)
                .await
                .context("deleting expired dead letters")?;
            deleted += n;
            if n < BATCH as u64 {
                return Ok(deleted);
            }
        }
    }
}
