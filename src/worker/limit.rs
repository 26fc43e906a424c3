//! A delivery and the sending limits ([`super::throttle`]): before its claim it asks for a slot
//! (waiting for one due within [`WAIT_IN_PLACE`], else held back and parked, unclaimed); after
//! a slow-down reply it slows what the reply is about and gives its claim back, so the reply
//! spends no attempt. A 4.7.x reply to one RCPT TO is about that recipient's domain; a 4.7.x
//! reply to MAIL, DATA or the message, about every recipient domain of the job; a 421 without
//! 4.7.x says the server closes the session (RFC 5321 §3.8), which is about the server: it
//! slows the global rate.
//!
//! [`WAIT_IN_PLACE`]: super::throttle::WAIT_IN_PLACE

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Worker;
use super::outcome::Outcome;
use super::throttle::{Admission, Pass};
use crate::job::ValidJob;
use crate::smtp::{SendError, SlowDown};

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

    /// The server asked to slow down: slows what the reply is about (one recipient's domain,
    /// the job's domains, or the whole server: [`SlowDown`]), gives the claim back (not an
    /// attempt), and parks the job for the shortest tier; the limits decide when it goes.
    pub(super) async fn slowed_down(
        &self,
        job: &ValidJob,
        token: Uuid,
        error: &SendError,
    ) -> Outcome {
        let now = Instant::now();
        let reason = crate::job::mask_addresses(&error.to_string());
        match error.slow_down() {
            Some(SlowDown::Server) => {
                self.throttle.slow_down_server(now);
                tracing::warn!(
                    reason,
                    "the SMTP server closed the session (421); the send rate is halved for every domain"
                );
            }
            Some(SlowDown::Recipient(domain)) => {
                self.throttle.slow_down(std::slice::from_ref(&domain), now);
                tracing::warn!(
                    domain,
                    reason,
                    "the SMTP server asked to slow down for one recipient's domain; its rate is halved"
                );
            }
            Some(SlowDown::Message) | None => {
                let domains = recipient_domains(job);
                self.throttle.slow_down(&domains, now);
                tracing::warn!(domains = ?domains, reason, "the SMTP server asked to slow down; the rate of the job's domains is halved");
            }
        }
        let reason = format!("asked to slow down: {error}");
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
