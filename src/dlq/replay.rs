//! Replaying dead rows, and the dry run that says what a replay would send. A replay goes a
//! page of rows at a time: it *claims* the page (one atomic UPDATE that sets its token on each
//! row where no live claim is held), republishes the claimed rows' stored letters through the
//! main exchange together, each with its own confirm (the failure headers dropped,
//! `x-mailroom-replay` counted, the copy sealed with [`seal`]), *then* marks the rows the
//! broker took replayed (who, when, result) in one statement, where their claims still stand,
//! and notes on each of the others why it stays dead.
//!
//! The claim is why two replays at once (two operators, the CLI and the console) publish each
//! row once: the second finds the row claimed, or no longer dead, and leaves it to the first
//! (counted in [`Report::claimed_elsewhere`]). A claim rather than `SELECT … FOR UPDATE SKIP
//! LOCKED`: no transaction or pooled connection is held across the broker's confirms, and it
//! works the same on both engines. A crash between the claim and the mark leaves the rows
//! `dead` with claims that expire after [`CLAIM_TTL`]; the next replay then publishes them
//! again: at-least-once, and harmless, because the worker's ledger claims `(job_id, kind)` once
//! and a `sent` row is never sent again.

use std::collections::BTreeMap;

use anyhow::Context;
use lapin::{Channel, Connection};
use serde::Serialize;

use super::seal::{self, ReplayKey};
use super::selection::{Report, Selection};
use super::{DeadLetters, letter, stored};
use crate::broker::{self, Topology};
use crate::config::UrlList;
use crate::db::dead_letters::DeadLetterRow;
use crate::job::{EmailJob, mask_email};
use crate::render::Templates;

/// Rows read per round of a replay: bounds the memory a whole-table selection takes.
const BATCH: i64 = 200;

/// How long a replay's claim on a row holds: far beyond publishing a page (its publishes run
/// together, each bounded by [`broker::CONFIRM_TIMEOUT`], writing included), so a running
/// replay does not lose a claim, while a row left claimed by a crashed replay is replayable
/// again five minutes later.
pub const CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(300);
const _: () = assert!(CLAIM_TTL.as_secs() >= 10 * broker::CONFIRM_TIMEOUT.as_secs());

/// What replaying one dead letter would send, rendered with today's templates.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Preview {
    pub id: i64,
    pub job_id: String,
    pub kind: String,
    pub locale: Option<String>,
    /// Every recipient (to, cc, bcc), masked.
    pub recipients: Vec<String>,
    pub subject: Option<String>,
    /// Why it would fail again: an invalid job, a render error (file, line, variable), a body
    /// not kept whole.
    pub error: Option<String>,
    /// The ledger row's status: `sent` means nothing would be sent.
    pub status: Option<String>,
}

/// The broker side of a replay: a connection, a confirming channel, the main exchange and the
/// key that seals each copy.
pub struct Replayer {
    conn: Connection,
    channel: Channel,
    exchange: String,
    key: ReplayKey,
}

impl Replayer {
    /// Connects (named `name` in `rabbitmqctl list_connections`) and declares the topology, so
    /// the copies have somewhere to go.
    pub async fn connect(
        urls: &UrlList,
        topology: &Topology,
        name: &str,
        key: ReplayKey,
    ) -> anyhow::Result<Replayer> {
        let conn = broker::connect(urls, name).await?;
        broker::declare_topology(&conn, topology).await?;
        let channel = broker::confirm_channel(&conn).await?;
        Ok(Replayer {
            conn,
            channel,
            exchange: topology.exchange.clone(),
            key,
        })
    }

    /// Reopens the publishing channel if it closed (a refused publish closes it), so that a
    /// page is claimed only when it can be published.
    async fn ready(&mut self) -> anyhow::Result<()> {
        if !self.channel.status().connected() {
            self.channel = broker::confirm_channel(&self.conn)
                .await
                .context("reopening the publishing channel")?;
        }
        Ok(())
    }

    /// Publishes stored letters, each sealed, all at once, and waits for their confirms; each
    /// letter's outcome, in order.
    async fn publish_all(&self, rows: &[&DeadLetterRow]) -> Vec<anyhow::Result<()>> {
        let publishes = rows.iter().map(|r| self.publish(r)).collect();
        broker::in_order(publishes).await
    }

    /// Publishes one stored letter, sealed, and waits for its confirm.
    async fn publish(&self, r: &DeadLetterRow) -> anyhow::Result<()> {
        let props = stored::decode_properties(&r.properties)?;
        let props = seal::sealed(letter::replay_properties(&props), &r.body, &self.key);
        broker::publish_confirmed(&self.channel, &self.exchange, &r.kind, &r.body, props).await?;
        Ok(())
    }

    /// Closes the connection.
    pub async fn close(self) {
        let _ = self.conn.close(200, "replay done".into()).await;
    }
}

impl DeadLetters {
    /// Republishes the selected dead rows through `replayer`, a page at a time: the page's
    /// rows are claimed in one statement, published together (each waits for its own confirm),
    /// and those the broker took are marked replayed by `by` in one statement; rows another
    /// replay holds are left to it. Returns the report even when it stops early
    /// (`interrupted`).
    pub async fn replay(
        &self,
        selection: &Selection,
        replayer: &mut Replayer,
        by: &str,
    ) -> anyhow::Result<Report> {
        let mut report = Report::default();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut q = selection.query();
        q.payload = true;
        q.limit = Some(BATCH);
        let result = async {
            loop {
                let rows = self.db.dead_letters(&q).await?;
                let Some(last) = rows.last() else {
                    return anyhow::Ok(());
                };
                q.before = Some(last.id);
                replayer.ready().await?;
                report.examined += rows.len();
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                let claimed = self
                    .db
                    .claim_dead_letters(&ids, &token, CLAIM_TTL)
                    .await
                    .context("claiming dead letters")?;
                let mine: Vec<&DeadLetterRow> =
                    rows.iter().filter(|r| claimed.contains(&r.id)).collect();
                report.claimed_elsewhere += rows.len() - mine.len();
                self.replay_page(&mine, replayer, (&token, by), &mut report)
                    .await?;
            }
        }
        .await;
        if let Err(e) = result {
            report.interrupted = Some(format!("{e:#}"));
        }
        Ok(report)
    }

    /// Publishes the claimed rows of one page and marks them: the published ones replayed in
    /// one statement, the failed ones with why (they stay dead), one statement per reason.
    async fn replay_page(
        &self,
        rows: &[&DeadLetterRow],
        replayer: &Replayer,
        (token, by): (&str, &str),
        report: &mut Report,
    ) -> anyhow::Result<()> {
        let (whole, oversize): (Vec<&DeadLetterRow>, Vec<&DeadLetterRow>) = rows
            .iter()
            .partition(|r| r.body_size <= r.body.len() as i64);
        let mut failed: Vec<(&DeadLetterRow, String)> = oversize
            .into_iter()
            .map(|r| {
                let why = format!(
                    "oversize: only the first {} of {} bytes were kept",
                    r.body.len(),
                    r.body_size
                );
                (r, why)
            })
            .collect();
        let mut published = vec![];
        for (r, outcome) in whole.iter().zip(replayer.publish_all(&whole).await) {
            match outcome {
                Ok(()) => published.push(r.id),
                Err(e) => failed.push((r, format!("publish failed: {e:#}"))),
            }
        }
        let marked = self
            .db
            .mark_dead_letters_replay(&published, token, by, "published", true)
            .await
            .context("marking dead letters replayed")?;
        if marked < published.len() as u64 {
            tracing::warn!(
                published = published.len(),
                marked,
                "replay: claims expired before the mark; those rows stay dead and may be replayed again"
            );
        }
        report.moved += published.len();
        report.ids.extend(&published);
        // One statement per reason: a broker that fails mid-page fails its rows alike.
        let mut by_reason: BTreeMap<String, Vec<&DeadLetterRow>> = BTreeMap::new();
        for (r, why) in failed {
            by_reason.entry(why).or_default().push(r);
        }
        for (why, rows) in by_reason {
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            self.db
                .mark_dead_letters_replay(&ids, token, by, &why, false)
                .await
                .with_context(|| format!("noting why dead letters {ids:?} were not replayed"))?;
            for r in rows {
                tracing::warn!(id = r.id, job_id = %r.job_id, kind = %r.kind, "replay: {why}; the row stays dead");
                report.skip(why.split(':').next().unwrap_or_default());
            }
        }
        Ok(())
    }

    /// Renders the selected dead rows with `templates` and says what a replay would send;
    /// publishes nothing and changes nothing.
    pub async fn dry_run(
        &self,
        selection: &Selection,
        templates: &Templates,
    ) -> anyhow::Result<Vec<Preview>> {
        let mut q = selection.query();
        q.payload = true;
        let rows = self.db.dead_letters(&q).await?;
        let mut previews = Vec::with_capacity(rows.len());
        for r in &rows {
            let mut p = preview(r, templates);
            let row = self
                .db
                .notification(&r.job_id, &r.kind)
                .await
                .with_context(|| format!("reading the ledger row of {}", r.job_id))?;
            p.status = row.map(|n| n.status.to_string());
            previews.push(p);
        }
        Ok(previews)
    }
}

fn preview(r: &DeadLetterRow, templates: &Templates) -> Preview {
    let mut p = Preview {
        id: r.id,
        job_id: r.job_id.clone(),
        kind: r.kind.clone(),
        locale: None,
        recipients: vec![],
        subject: None,
        error: None,
        status: None,
    };
    if r.body_size > r.body.len() as i64 {
        p.error = Some(format!(
            "oversize: only the first {} of {} bytes were kept",
            r.body.len(),
            r.body_size
        ));
        return p;
    }
    match EmailJob::decode(&r.body) {
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
