//! What became of a job, from the outbox and the claim ledger together:
//! `queued → published → sending → sent | failed | uncertain | dead` (and `parked` for an
//! outbox row the broker kept refusing, `suppressed` for a job to a suppressed address). Shared by `mailroom status` and the HTTP API.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::db::outbox::OutboxStatus;
use crate::db::suppressions::SUPPRESSED;
use crate::db::{Database, Notification};

/// One job's state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobStatus {
    pub job_id: String,
    pub kind: String,
    /// queued, parked, published, sending, sent, failed, uncertain, dead or suppressed.
    pub state: String,
    pub attempts: i32,
    pub publish_attempts: i32,
    pub message_id: Option<String>,
    pub smtp_reply: Option<String>,
    pub last_error: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub published_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub sent_at: Option<DateTime<Utc>>,
    /// Revision (content hash) of the template set that rendered the sent email.
    pub template_revision: Option<String>,
}

/// The status of `(job_id, kind)`, or of every kind of `job_id` when `kind` is `None`.
pub async fn job_status(
    db: &Database,
    job_id: &str,
    kind: Option<&str>,
) -> anyhow::Result<Vec<JobStatus>> {
    let kinds = match kind {
        Some(k) => vec![k.to_string()],
        None => db.kinds_of_job(job_id).await?,
    };
    let mut queued = Vec::new();
    for kind in kinds {
        let row = db.outbox_status(job_id, &kind).await?;
        queued.push((kind, row));
    }
    let mut out = Vec::new();
    for (kind, queued) in queued {
        let ledger = db.notification(job_id, &kind).await?;
        if queued.is_none() && ledger.is_none() {
            continue;
        }
        out.push(JobStatus::of(job_id, kind, ledger, queued));
    }
    Ok(out)
}

impl JobStatus {
    /// A job's state from its ledger row and its outbox row (at least one of them).
    fn of(
        job_id: &str,
        kind: String,
        ledger: Option<Notification>,
        queued: Option<OutboxStatus>,
    ) -> JobStatus {
        let state = match (&ledger, &queued) {
            // Not sent on purpose, not a failure: its own state.
            (Some(n), _) if n.error_class.as_deref() == Some(SUPPRESSED) => SUPPRESSED,
            (Some(n), _) => n.status.as_str(),
            (None, Some(q)) if q.parked => "parked",
            (None, Some(q)) if q.published_at.is_some() => "published",
            (None, _) => "queued",
        };
        JobStatus {
            job_id: job_id.to_string(),
            kind,
            state: state.to_string(),
            attempts: ledger.as_ref().map_or(0, |n| n.attempts),
            publish_attempts: queued.as_ref().map_or(0, |q| q.publish_attempts),
            // A job refused past the doors never had a message (its row's Message-ID is empty).
            message_id: ledger
                .as_ref()
                .map(|n| n.message_id.clone())
                .filter(|m| !m.is_empty()),
            smtp_reply: ledger.as_ref().and_then(|n| n.smtp_reply.clone()),
            last_error: ledger
                .as_ref()
                .and_then(|n| n.last_error.clone())
                .or_else(|| queued.as_ref().and_then(|q| q.last_error.clone())),
            created_at: queued
                .as_ref()
                .map(|q| q.created_at)
                .or(ledger.as_ref().map(|n| n.created_at)),
            published_at: queued.as_ref().and_then(|q| q.published_at),
            updated_at: ledger.as_ref().map(|n| n.updated_at),
            sent_at: ledger.as_ref().and_then(|n| n.sent_at),
            template_revision: ledger.as_ref().and_then(|n| n.template_revision.clone()),
        }
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.job_id, self.kind, self.state)?;
        if self.attempts > 0 {
            write!(f, ", {} attempt(s)", self.attempts)?;
        }
        let times = [
            ("created", self.created_at),
            ("published", self.published_at),
            ("sent", self.sent_at),
        ];
        for (what, at) in times {
            if let Some(at) = at {
                write!(f, ", {what} {}", at.format("%Y-%m-%d %H:%M:%S%.3fZ"))?;
            }
        }
        if let Some(revision) = &self.template_revision {
            write!(f, ", templates {revision}")?;
        }
        if let Some(reply) = &self.smtp_reply {
            write!(f, ", SMTP {reply}")?;
        }
        if let Some(err) = &self.last_error {
            write!(f, ", last error: {err}")?;
        }
        Ok(())
    }
}
