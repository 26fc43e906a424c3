//! The operations on a [`Selection`]: replay, purge and dry run, each one pass over the queue
//! that acts on the selected dead letters and leaves every other one where it was. The selection
//! is built here once, for the CLI and the HTTP API alike ([`Selection::one_of`]): job ids, a
//! kind, a [`Class`], or all, for replay and purge the same. A replay publishes a copy with
//! confirms *before* it removes the dead letter, so a crash in between leaves the job in both
//! places (the claim deduplicates), never in neither.

use std::collections::BTreeMap;

use anyhow::Context;
use lapin::{Channel, message::Delivery};
use serde::Serialize;

use super::seal::{self, ReplayKey};
use super::{Class, DeadLetters, Entry, letter, unacked::Pass};
use crate::broker;
use crate::db::Database;
use crate::job::{EmailJob, mask_email};
use crate::render::Templates;

/// Which dead letters a replay or purge takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// These job ids (every dead letter of each).
    Ids(Vec<String>),
    Kind(String),
    Class(Class),
    All,
}

/// A replay or purge must name exactly one selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("name exactly one selection: ids, kind, class or all")]
pub struct NotOneSelection;

impl Selection {
    /// The one selection named, as `mailroom dlq replay|purge` and `/v1/dlq/replay|purge` take
    /// it: job ids, a kind, a class, or all. Naming none, or several, is refused.
    pub fn one_of(
        ids: Vec<String>,
        kind: Option<String>,
        class: Option<Class>,
        all: bool,
    ) -> Result<Selection, NotOneSelection> {
        let named = [!ids.is_empty(), kind.is_some(), class.is_some(), all];
        if named.iter().filter(|n| **n).count() != 1 {
            return Err(NotOneSelection);
        }
        Ok(match (kind, class) {
            (Some(k), _) => Selection::Kind(k),
            (_, Some(c)) => Selection::Class(c),
            _ if all => Selection::All,
            _ => Selection::Ids(ids),
        })
    }

    pub fn matches(&self, e: &Entry) -> bool {
        match self {
            Selection::Ids(ids) => ids.contains(&e.job_id),
            Selection::Kind(k) => *k == e.kind,
            Selection::Class(c) => c.as_str() == e.class,
            Selection::All => true,
        }
    }
}

/// Why a dead letter was left alone because the selection did not take it; every other reason
/// in [`Report::skipped`] is a selected dead letter that stays in the queue.
const NOT_SELECTED: &str = "not selected";

/// What a replay or purge did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    /// Dead letters looked at: at most the queue's length when the pass began.
    pub examined: usize,
    /// Republished to the main exchange (confirmed) and removed.
    pub moved: usize,
    pub purged: usize,
    /// Dead letters left in the queue, counted by why (`not selected`, `publish failed: …`).
    pub skipped: BTreeMap<String, usize>,
    /// Why the pass stopped early, if it did; the messages not reached stay in the queue.
    pub interrupted: Option<String>,
}

impl Report {
    /// Selected dead letters that stay in the queue (a publish failed), the unselected ones not
    /// counted.
    pub fn selected_left(&self) -> usize {
        self.skipped
            .iter()
            .filter(|(why, _)| why.as_str() != NOT_SELECTED)
            .map(|(_, n)| n)
            .sum()
    }

    /// Whether `selection` named job ids and none of them was found.
    pub fn found_none_of(&self, selection: &Selection) -> bool {
        matches!(selection, Selection::Ids(_)) && self.moved + self.purged == 0
    }

    fn skip(&mut self, why: impl Into<String>) {
        *self.skipped.entry(why.into()).or_default() += 1;
    }
}

/// How far a long operation got: `done` of at most `total` messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
}

/// What replaying one dead letter would send, rendered with today's templates.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Preview {
    pub job_id: String,
    pub kind: String,
    pub locale: Option<String>,
    /// Every recipient (to, cc, bcc), masked.
    pub recipients: Vec<String>,
    pub subject: Option<String>,
    /// Why it would fail again: an invalid job or a render error (file, line, variable).
    pub error: Option<String>,
    /// The ledger row's status, when a database was given: `sent` means nothing would be sent.
    pub status: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Action<'k> {
    /// Each copy sealed with this key ([`seal`]).
    Replay(&'k ReplayKey),
    Purge,
}

impl DeadLetters {
    /// Republishes the selected dead letters through the main exchange (routing key = kind) with
    /// confirms, each removed from the dead-letter queue only after its confirm. Each copy is
    /// sealed with `key` (see [`seal::resolve`]), or workers take it for an ordinary copy.
    pub async fn replay(
        &self,
        selection: &Selection,
        key: &ReplayKey,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> anyhow::Result<Report> {
        self.sweep(selection, Action::Replay(key), progress).await
    }

    /// Removes the selected dead letters for good.
    pub async fn purge(
        &self,
        selection: &Selection,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> anyhow::Result<Report> {
        self.sweep(selection, Action::Purge, progress).await
    }

    /// Renders the selected dead letters against `templates` and reports what a replay would
    /// send; publishes nothing and leaves the queue as it was.
    pub async fn dry_run(
        &self,
        selection: &Selection,
        templates: &Templates,
        db: Option<&Database>,
    ) -> anyhow::Result<Vec<Preview>> {
        let mut previews = self
            .read(|e, d| {
                selection
                    .matches(&e)
                    .then(|| preview(&e, &d.data, templates))
            })
            .await?;
        if let Some(db) = db {
            for p in &mut previews {
                let row = db
                    .notification(&p.job_id, &p.kind)
                    .await
                    .with_context(|| format!("reading the ledger row of {}", p.job_id))?;
                p.status = row.map(|r| r.status.to_string());
            }
        }
        Ok(previews)
    }

    /// Returns the report even when the pass stops early (`interrupted`), so the caller can
    /// still say what moved; an error means nothing was touched.
    async fn sweep(
        &self,
        selection: &Selection,
        action: Action<'_>,
        progress: &mut (dyn FnMut(Progress) + Send),
    ) -> anyhow::Result<Report> {
        let mut pass = Pass::open(&self.conn, &self.topology.dead).await?;
        let mut publisher = match action {
            Action::Replay(_) => Some(broker::confirm_channel(&self.conn).await?),
            Action::Purge => None,
        };
        let total = pass.total();
        let mut report = Report::default();
        let result = async {
            while let Some(d) = pass.next().await? {
                report.examined += 1;
                let entry = letter::entry(report.examined, &d);
                let target = (&pass, &d, &entry);
                self.act_on(target, selection, action, publisher.as_mut(), &mut report)
                    .await?;
                progress(Progress {
                    done: report.examined,
                    total,
                });
            }
            anyhow::Ok(())
        }
        .await;
        pass.close().await;
        if let Some(publisher) = publisher {
            let _ = publisher.close(200, "replay done".into()).await;
        }
        if let Err(e) = result {
            report.interrupted = Some(format!("{e:#}"));
        }
        Ok(report)
    }

    /// One dead letter of a sweep: left alone, replayed or purged, and counted in `report`.
    async fn act_on(
        &self,
        (pass, d, entry): (&Pass, &Delivery, &Entry),
        selection: &Selection,
        action: Action<'_>,
        publisher: Option<&mut Channel>,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        if !selection.matches(entry) {
            report.skip(NOT_SELECTED);
        } else if let (Some(publisher), Action::Replay(key)) = (publisher, action) {
            self.move_one(publisher, key, pass, d, entry, report)
                .await?;
        } else {
            pass.remove(d)
                .await
                .with_context(|| format!("purging {}", entry.job_id))?;
            report.purged += 1;
        }
        Ok(())
    }

    /// Publish (confirmed), then remove. A failed publish leaves the dead letter in place.
    async fn move_one(
        &self,
        publisher: &mut Channel,
        key: &ReplayKey,
        pass: &Pass,
        d: &Delivery,
        e: &Entry,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        let props = seal::sealed(letter::replay_properties(&d.properties), &d.data, key);
        let exchange = &self.topology.exchange;
        if let Err(err) =
            broker::publish_confirmed(publisher, exchange, &e.kind, &d.data, props).await
        {
            tracing::warn!(job_id = %e.job_id, kind = %e.kind, error = %err, "replay: publish failed; the dead letter stays");
            report.skip(format!("publish failed: {err}"));
            if !publisher.status().connected() {
                *publisher = broker::confirm_channel(&self.conn)
                    .await
                    .context("reopening the publishing channel")?;
            }
            return Ok(());
        }
        report.moved += 1;
        pass.remove(d).await.with_context(|| {
            format!(
                "{} was replayed, but remains in the dead-letter queue too (a second replay is deduplicated)",
                e.job_id
            )
        })
    }
}

fn preview(e: &Entry, body: &[u8], templates: &Templates) -> Preview {
    let mut p = Preview {
        job_id: e.job_id.clone(),
        kind: e.kind.clone(),
        locale: None,
        recipients: vec![],
        subject: None,
        error: None,
        status: None,
    };
    match EmailJob::decode(body) {
        Err(err) => p.error = Some(format!("invalid job: {err}")),
        Ok(job) => {
            let j = &job.job;
            p.locale = j.locale.clone();
            p.recipients = job
                .to
                .iter()
                .chain(&job.cc)
                .chain(&job.bcc)
                .map(|m| mask_email(m.email.as_ref()))
                .collect();
            match templates.render(&j.kind, j.locale.as_deref(), &j.data) {
                Ok(rendered) => p.subject = Some(rendered.subject),
                Err(err) => p.error = Some(err.to_string()),
            }
        }
    }
    p
}
