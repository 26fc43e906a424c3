//! A delivery and the sending limits ([`super::throttle`]): before its claim it asks for a slot
//! (waiting for one due within [`WAIT_IN_PLACE`], else held back and parked, unclaimed); after
//! a slow-down reply it slows the domain and gives its claim back, so the reply spends no
//! attempt.
//!
//! [`WAIT_IN_PLACE`]: super::throttle::WAIT_IN_PLACE

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Worker;
use super::outcome::Outcome;
use super::throttle::{Admission, Pass};
use crate::job::ValidJob;

impl Worker {
    /// Waits for this job's slot under the limits; `Err` is the outcome of a job held back.
    /// `None` when no limit is configured.
    pub(super) async fn pace(&self, job: &ValidJob) -> Result<Option<Pass>, Outcome> {
        if !self.throttle.is_active() {
            return Ok(None);
        }
        match self.throttle.admit(&recipient_domains(job), Instant::now()) {
            Admission::Go { wait, pass } => {
                if !wait.is_zero() {
                    // Short (at most WAIT_IN_PLACE), and no claim is held while it lasts.
                    tokio::time::sleep(wait).await;
                }
                Ok(Some(pass))
            }
            Admission::Hold { wait, why } => Err(Outcome::Held {
                delay: self.settings.topology.tier_within(wait),
                reason: format!("held back by {why}, about {}", millis_text(wait)),
            }),
        }
    }

    /// The server asked to slow down: slows the job's domains, gives the claim back (not an
    /// attempt), and parks the job for the shortest tier; the limits decide when it goes.
    pub(super) async fn slowed_down(&self, job: &ValidJob, token: Uuid, reason: String) -> Outcome {
        let domains = recipient_domains(job);
        self.throttle.slow_down(&domains, Instant::now());
        tracing::warn!(domains = ?domains, reason = crate::job::mask_addresses(&reason), "the SMTP server asked to slow down; the domain's rate is halved");
        let reason = format!("asked to slow down: {reason}");
        let db = self.ledger.database();
        if let Err(e) = db
            .release(&job.job.job_id, &job.job.kind, token, &reason)
            .await
        {
            tracing::warn!(error = %e, "cannot give the claim back; it ends with its lease");
        }
        Outcome::Held {
            delay: self.settings.topology.tier_within(Duration::ZERO),
            reason,
        }
    }

    /// Counts an accepted email for its domains' metrics.
    pub(super) fn count_sent(&self, job: &ValidJob) {
        if self.throttle.is_active() {
            self.throttle.count_sent(&recipient_domains(job));
        }
    }
}

/// The distinct recipient domains of a job (to, cc, bcc), in lower case.
pub fn recipient_domains(job: &ValidJob) -> Vec<String> {
    let mut domains: Vec<String> = job
        .to
        .iter()
        .chain(&job.cc)
        .chain(&job.bcc)
        .map(|m| m.email.domain().to_ascii_lowercase())
        .collect();
    domains.sort();
    domains.dedup();
    domains
}

fn millis_text(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}
