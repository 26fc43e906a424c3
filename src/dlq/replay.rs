//! Replaying dead rows, and the dry run that says what a replay would send. A replay
//! *claims* each row (one atomic UPDATE that sets its token where no live claim is held),
//! republishes the stored letter through the main exchange with confirms (the failure headers
//! dropped, `x-mailroom-replay` counted, the copy sealed with [`seal`]), *then* marks its row
//! replayed (who, when, result) where its claim still stands.
//!
//! The claim is why two replays at once (two operators, the CLI and the console) publish each
//! row once: the second finds the row claimed, or no longer dead, and leaves it to the first
//! (counted in [`Report::claimed_elsewhere`]). A claim rather than `SELECT … FOR UPDATE SKIP
//! LOCKED`: no transaction or pooled connection is held across the broker's confirm, and it
//! works the same on both engines. A crash between the claim and the mark leaves the row `dead`
//! with a claim that expires after [`CLAIM_TTL`]; the next replay then publishes it again:
//! at-least-once, and harmless, because the worker's ledger claims `(job_id, kind)` once and a
//! `sent` row is never sent again.

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

/// How long a replay's claim on one row holds: far beyond one publish and its confirm
/// ([`broker::CONFIRM_TIMEOUT`], plus reopening a channel), so a running replay never loses a
/// claim, while a row left claimed by a crashed replay is replayable again five minutes later.
pub const CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(300);

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
        let setup = conn.create_channel().await?;
        broker::declare_topology(&setup, topology).await?;
        let _ = setup.close(200, "declared".into()).await;
        let channel = broker::confirm_channel(&conn).await?;
        Ok(Replayer {
            conn,
            channel,
            exchange: topology.exchange.clone(),
            key,
        })
    }

    /// Publishes one stored letter, sealed, and waits for its confirm.
    async fn publish(&mut self, r: &DeadLetterRow) -> anyhow::Result<()> {
        let props = stored::decode_properties(&r.properties)?;
        let props = seal::sealed(letter::replay_properties(&props), &r.body, &self.key);
        let result =
            broker::publish_confirmed(&self.channel, &self.exchange, &r.kind, &r.body, props)
                .await
                .map_err(anyhow::Error::from);
        if result.is_err() && !self.channel.status().connected() {
            self.channel = broker::confirm_channel(&self.conn)
                .await
                .context("reopening the publishing channel")?;
        }
        result
    }

    /// Closes the connection.
    pub async fn close(self) {
        let _ = self.conn.close(200, "replay done".into()).await;
    }
}

impl DeadLetters {
    /// Republishes the selected dead rows through `replayer`, each claimed first and marked
    /// replayed by `by` after its confirm; rows another replay holds are left to it. Returns
    /// the report even when it stops early (`interrupted`).
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
                for r in &rows {
                    report.examined += 1;
                    let claimed = self
                        .db
                        .claim_dead_letter(r.id, &token, CLAIM_TTL)
                        .await
                        .with_context(|| format!("claiming dead letter {}", r.id))?;
                    if !claimed {
                        report.claimed_elsewhere += 1;
                        continue;
                    }
                    self.replay_one(r, replayer, (&token, by), &mut report)
                        .await?;
                }
            }
        }
        .await;
        if let Err(e) = result {
            report.interrupted = Some(format!("{e:#}"));
        }
        Ok(report)
    }

    async fn replay_one(
        &self,
        r: &DeadLetterRow,
        replayer: &mut Replayer,
        (token, by): (&str, &str),
        report: &mut Report,
    ) -> anyhow::Result<()> {
        let outcome = if r.body_size > r.body.len() as i64 {
            Err(format!(
                "oversize: only the first {} of {} bytes were kept",
                r.body.len(),
                r.body_size
            ))
        } else {
            replayer
                .publish(r)
                .await
                .map_err(|e| format!("publish failed: {e:#}"))
        };
        let result = outcome
            .as_ref()
            .map_or_else(String::clone, |()| "published".into());
        let marked = self
            .db
            .mark_dead_letter_replay(r.id, token, by, &result, outcome.is_ok())
            .await
            .with_context(|| format!("marking dead letter {} replayed", r.id))?;
        if !marked {
            tracing::warn!(id = r.id, job_id = %r.job_id, "replay: the claim expired before the mark");
        }
        match outcome {
            Ok(()) => {
                report.moved += 1;
                report.ids.push(r.id);
            }
            Err(why) => {
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
