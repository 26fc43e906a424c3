//! Sending on a claim this delivery holds: render and build the message, wait for an SMTP
//! connection while the claim's deadline covers a whole send, check that it still does, send in
//! the uncertain window, and record the result (`sent` durably, a failure once) before the
//! outcome goes to `settle`.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;
use uuid::Uuid;

use super::Worker;
use super::lease::{Deadline, RECORD_BUDGET};
use super::outcome::{ErrorClass, Outcome};
use super::process::Claimed;
use super::stats::Stats;
use crate::config::OnUncertain;
use crate::db::LedgerStatus;
use crate::db::Record;
use crate::failpoint;
use crate::job::{ValidJob, mask_addresses};
use crate::render::Templates;
use crate::smtp::{BuildError, Outgoing, Reservation, SendError, Session, WINDOW_TARGET as WINDOW};

/// Why a job has no message to send.
enum Unbuilt {
    /// The job's own data cannot make one: give up with this class and reason.
    GiveUp(ErrorClass, String),
    /// mailroom failed to make it (the DKIM signer): retry, as after a failed send.
    Retry(String),
}

impl Worker {
    pub(super) async fn send_claimed(
        &self,
        job: &ValidJob,
        claimed: Claimed,
        reservation: Reservation<'_>,
        templates: &Templates,
    ) -> Outcome {
        let Claimed {
            attempt,
            token,
            deadline,
        } = claimed;
        failpoint::hit_job("worker.after_claim", &job.job.job_id).await;
        let message = match self.compose(job, templates).await {
            Ok(m) => m,
            Err(Unbuilt::GiveUp(class, reason)) => {
                return self.give_up(job, token, attempt, class, reason).await;
            }
            // Nothing was sent: the fault is mailroom's, so the job is retried like a send
            // that failed before its first byte, and dead-lettered as exhausted if it lasts.
            Err(Unbuilt::Retry(reason)) => {
                return self
                    .retry_or_give_up(job, token, attempt, LedgerStatus::Failed, reason)
                    .await;
            }
        };
        // The connection: a claim waits for one at most while the send still fits (with the
        // line no longer than the connections, within one send; see `lease`).
        let timeout = self.mailer.timeout();
        let waiting = Instant::now();
        let session = reservation
            .session(&message, deadline.wait_budget(timeout))
            .await;
        self.stats.observe_connection_wait(waiting.elapsed());
        // The fence: a send starts only if it, and the record of its result, end before the
        // claim's deadline. The send is bounded by the SMTP timeout, so no byte of it goes out
        // on a claim another copy may already have taken over.
        let session = session.filter(|_| deadline.covers_send(timeout));
        let Some(session) = session else {
            let reason = format!(
                "the claim's lease has {:?} left, less than a whole send ({timeout:?}) and its record",
                deadline.remaining()
            );
            return self.give_back(job, token, reason).await;
        };
        // Admitted jobs name a template, so their kind is a bounded label.
        match self.send(session, &message, &job.job.kind).await {
            Ok(reply) => self.accepted(job, token, deadline, &reply, templates).await,
            Err(e) => self.send_failed(job, token, attempt, e).await,
        }
    }

    /// Renders the job and builds its message.
    async fn compose(&self, job: &ValidJob, templates: &Templates) -> Result<Outgoing, Unbuilt> {
        let j = &job.job;
        let rendered = templates
            .render(&j.kind, j.locale.as_deref(), &j.data)
            .map_err(|e| Unbuilt::GiveUp(ErrorClass::Template, e.to_string()))?;
        self.mailer
            .build(job, &rendered)
            .await
            .map_err(|e| match e {
                BuildError::Sign(_) => Unbuilt::Retry(e.to_string()),
                _ => Unbuilt::GiveUp(ErrorClass::Invalid, e.to_string()),
            })
    }

    /// Sends in the uncertain window: once the final dot is on its way (the SMTP client logs
    /// `window="sending"` at DEBUG, target `mailroom::window`) and until `sent` is recorded, a
    /// crash or a lost reply may leave a delivered email unrecorded, and the redelivery resends
    /// it (docs/GUARANTEES.md). The chaos soak explains every duplicate by one such window that
    /// never closed. The session is given back as soon as the send ends.
    async fn send(
        &self,
        session: Session<'_>,
        message: &Outgoing,
        kind: &str,
    ) -> Result<String, SendError> {
        let started = Instant::now();
        if session.rode_along() {
            Stats::bump(&self.stats.rode_along);
        }
        let sent = self.mailer.send_in(&session, message).await;
        drop(session);
        let took = started.elapsed();
        self.stats.kind(kind).smtp_latency.observe(took);
        tracing::Span::current().record("smtp_ms", millis(took));
        self.breaker.record(&sent);
        if let Err(e) = &sent {
            let window = if matches!(e, SendError::Uncertain { .. }) {
                Stats::bump(&self.stats.open_windows);
                "uncertain"
            } else {
                "failed"
            };
            tracing::debug!(target: WINDOW, window, error = %e, "send failed");
        }
        sent
    }

    /// The SMTP server accepted the message: measures its age and records it sent.
    async fn accepted(
        &self,
        job: &ValidJob,
        token: Uuid,
        deadline: Deadline,
        reply: &str,
        templates: &Templates,
    ) -> Outcome {
        if let Some(created) = job.job.created_at {
            let age = (chrono::Utc::now() - created).to_std().unwrap_or_default();
            self.stats.end_to_end.observe(age);
        }
        self.count_sent(job);
        let masked = mask_addresses(reply);
        tracing::Span::current().record("smtp_reply", masked.as_str());
        tracing::debug!(target: WINDOW, window = "accepted", "SMTP accepted; recording sent");
        failpoint::hit_job("worker.after_smtp_ok", &job.job.job_id).await;
        self.record_sent(job, token, deadline, reply, templates.revision())
            .await
    }

    /// The send failed: give up on a refusal, retry a transient failure, and an uncertain one
    /// as `MAILROOM_ON_UNCERTAIN` says.
    async fn send_failed(
        &self,
        job: &ValidJob,
        token: Uuid,
        attempt: i32,
        error: SendError,
    ) -> Outcome {
        if self.throttle.adapts() && error.is_slow_down() {
            return self.slowed_down(job, token, &error).await;
        }
        match error {
            SendError::Permanent { reason } => {
                self.suppress_bounced(job, &reason).await;
                self.give_up(job, token, attempt, ErrorClass::Rejected, reason)
                    .await
            }
            SendError::Transient { reason } | SendError::Unreachable { reason } => {
                self.retry_or_give_up(job, token, attempt, LedgerStatus::Failed, reason)
                    .await
            }
            SendError::Uncertain { reason } => match self.settings.on_uncertain {
                OnUncertain::Resend => {
                    self.retry_or_give_up(job, token, attempt, LedgerStatus::Uncertain, reason)
                        .await
                }
                OnUncertain::DeadLetter => {
                    self.give_up_as(
                        job,
                        token,
                        attempt,
                        LedgerStatus::Uncertain,
                        ErrorClass::Uncertain,
                        reason,
                    )
                    .await
                }
            },
        }
    }

    /// Records `sent`, retrying while the database is down: the delivery must not be acked
    /// before the record is durable. If it never becomes durable within the lease, the job goes
    /// to a retry tier; the next claim finds the lease expired and resends (documented window).
    async fn record_sent(
        &self,
        job: &ValidJob,
        token: Uuid,
        deadline: Deadline,
        reply: &str,
        revision: &str,
    ) -> Outcome {
        let record = sent_record(job, token, reply);
        let policy = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .with_total_delay(Some(deadline.remaining().max(RECORD_BUDGET)))
            .without_max_times();
        let asked = Instant::now();
        let result = (|| self.ledger.record(&record, Some(revision)))
            .retry(policy)
            .notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "cannot record sent; retrying"))
            .await;
        self.stats.steps.record.observe(asked.elapsed());
        match result {
            Ok(true) => {
                failpoint::hit_job("worker.after_record", &job.job.job_id).await;
                tracing::debug!(target: WINDOW, window = "closed", templates = revision, "sent recorded");
                Outcome::Ack { duplicate: false }
            }
            Ok(false) => {
                Stats::bump(&self.stats.open_windows);
                tracing::warn!(target: WINDOW, window = "taken-over", "sent, but the claim had been taken over; the new holder decides");
                Outcome::Ack { duplicate: false }
            }
            Err(e) => {
                Stats::bump(&self.stats.open_windows);
                tracing::debug!(target: WINDOW, window = "unrecorded", error = %e, "sent, but could not record it");
                self.retry(
                    self.settings.lease,
                    format!("sent but could not record it: {e}"),
                )
            }
        }
    }
}

/// A duration in milliseconds, with microseconds, for log fields.
pub(super) fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The record of a send the SMTP server accepted with `reply`, under the claim's token.
fn sent_record<'a>(job: &'a ValidJob, token: Uuid, reply: &'a str) -> Record<'a> {
    Record {
        job_id: &job.job.job_id,
        kind: &job.job.kind,
        token: Some(token),
        status: LedgerStatus::Sent,
        smtp_reply: Some(reply),
        error: None,
        class: None,
    }
}
