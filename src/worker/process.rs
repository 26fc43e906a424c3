//! One delivery → one [`Outcome`]: decode and validate, wait for an SMTP session, claim
//! `(job_id, kind)`, render, send if the claim's deadline covers the whole send ([`lease`]),
//! record. No database transaction is held across the SMTP call: the claim and each record are
//! single statements, and the lease keeps other workers away in between.
//!
//! [`lease`]: super::lease

use std::time::Duration;

use tokio::time::Instant;

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use lapin::message::Delivery;
use uuid::Uuid;

use super::Worker;
use super::lease::Deadline;
use super::stats::Stats;
use crate::broker;
use crate::config::OnUncertain;
use crate::db::is_data_error;
use crate::db::{Claim, ClaimRequest, LedgerStatus as Status, Record, Refusal, judge_refusal};
use crate::failpoint;
use crate::job::{EmailJob, ValidJob, mask_addresses, mask_email};
use crate::render::Templates;
use crate::smtp::{SendError, Session};

/// Extra wait past a live lease before trying again, so the retry lands after it expired.
const LEASE_MARGIN: Duration = Duration::from_secs(1);
/// How long a delivery tries to give back a claim whose commit outcome is unknown before it
/// moves on (the database is failing; the claim then ends with its lease).
const RELEASE_PATIENCE: Duration = Duration::from_secs(2);
/// Growth of the retry delay per attempt (before rounding up to a tier).
const RETRY_FACTOR: f32 = 3.0;

/// What to do with a delivery. Computed once; `settle` is the only place that acts on it.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Done: the email was sent now, or earlier (a duplicate delivery).
    Ack { duplicate: bool },
    /// Try again later through the retry tier covering `delay`.
    Retry { delay: Duration, reason: String },
    /// Give up: to the dead-letter queue with a reason an operator can act on.
    DeadLetter {
        class: ErrorClass,
        reason: String,
        attempts: i64,
    },
}

/// Why a job was dead-lettered (the `x-mailroom-error-class` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The message is not a valid job: not JSON, wrong shape, bad address, unknown kind.
    Invalid,
    /// The template could not render this job's data (missing variable, unsafe subject).
    Template,
    /// The SMTP server refused it for good (5xx).
    Rejected,
    /// Transient failures until `MAILROOM_MAX_ATTEMPTS` ran out.
    Exhausted,
    /// It may have been sent, and the policy is to let a human decide.
    Uncertain,
}

impl ErrorClass {
    pub fn parse(s: &str) -> Option<ErrorClass> {
        [
            ErrorClass::Invalid,
            ErrorClass::Template,
            ErrorClass::Rejected,
            ErrorClass::Exhausted,
            ErrorClass::Uncertain,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Invalid => "invalid",
            ErrorClass::Template => "template",
            ErrorClass::Rejected => "rejected",
            ErrorClass::Exhausted => "exhausted",
            ErrorClass::Uncertain => "uncertain",
        }
    }
}

/// The span of one delivery. Fields the body provides are filled in once it is decoded.
pub(super) fn delivery_span(d: &Delivery) -> tracing::Span {
    let job_id = d.properties.message_id().as_ref().map(|s| s.to_string());
    tracing::info_span!(
        "delivery",
        job_id = job_id.as_deref().unwrap_or("?"),
        kind = tracing::field::Empty,
        attempt = broker::int_header(&d.properties, broker::ATTEMPT_HEADER).unwrap_or(1),
        to = tracing::field::Empty,
        redelivered = d.redelivered,
    )
}

impl Worker {
    pub(super) async fn process(&self, delivery: &Delivery) -> Outcome {
        let job = match EmailJob::decode(&delivery.data) {
            Ok(job) => job,
            Err(e) => return self.refuse(&delivery.data, e.to_string()).await,
        };
        let span = tracing::Span::current();
        span.record("job_id", job.job.job_id.as_str());
        span.record("kind", job.job.kind.as_str());
        if let Some(first) = job.to.first() {
            span.record("to", mask_email(first.email.as_ref()).as_str());
        }
        // One snapshot per delivery: a reload mid-delivery never mixes two revisions.
        let templates = self.templates.current();
        if !templates.contains(&job.job.kind) {
            let reason = format!("unknown kind {:?}: no such template", job.job.kind);
            return self.refuse(&delivery.data, reason).await;
        }
        failpoint::hit_job("worker.before_claim", &job.job.job_id).await;
        // The SMTP session comes first: a delivery may wait for one as long as the pool is
        // busy, and holds no claim (no lease runs) while it waits.
        let waiting = Instant::now();
        let Some(session) = self.mailer.session().await else {
            return self.retry(Duration::ZERO, "the mailer is closed".into());
        };
        self.stats.observe_session_wait(waiting.elapsed());
        let message_id = self.mailer.message_id(&job.job.job_id, &job.job.kind);
        let request = ClaimRequest {
            job_id: &job.job.job_id,
            kind: &job.job.kind,
            message_id: &message_id,
            token: Uuid::new_v4(),
            lease: self.settings.lease,
            resend_uncertain: self.settings.on_uncertain == OnUncertain::Resend,
            replay: match self.replay_keys.honour(delivery).await {
                Ok(genuine) => genuine,
                Err(e) => {
                    return self.retry(Duration::ZERO, format!("database unavailable: {e:#}"));
                }
            },
        };
        let replay = request.replay;
        let asked = Instant::now();
        let claim = match self.ledger.claim(&request).await {
            Ok(claim) => claim,
            Err(e) if is_data_error(&e) => {
                let reason = format!("the database refuses this job's data: {e}");
                return dead(ErrorClass::Invalid, reason, 0);
            }
            Err(e) => {
                if commit_outcome_unknown(&e) {
                    self.release_unknown_claim(&request).await;
                }
                return self.retry(Duration::ZERO, format!("database unavailable: {e}"));
            }
        };
        match claim {
            Claim::Claimed { attempt, token } => {
                let deadline = Deadline::of_claim(asked, self.settings.lease);
                tracing::Span::current().record("attempt", attempt);
                if attempt > self.settings.max_attempts && !replay {
                    // Only a claim taken over after its holder vanished gets here without a
                    // recorded failure: a job that kills its worker every time (a poison job).
                    // Its retries through a tier start a fresh delivery count, so the queue's
                    // delivery limit would never stop it; the claim count does. (A replay from
                    // the dead-letter queue is an operator's explicit extra attempt.)
                    let reason = format!(
                        "claimed {attempt} times without an outcome: the worker died each time (poison job?)"
                    );
                    return self
                        .give_up(&job, token, attempt, ErrorClass::Exhausted, reason)
                        .await;
                }
                let claimed = Claimed {
                    attempt,
                    token,
                    deadline,
                };
                self.send_claimed(&job, claimed, session, &templates).await
            }
            Claim::Refused(existing) => {
                drop(session);
                self.refused(&job, existing.as_ref()).await
            }
        }
    }

    /// A claim whose commit failed may still have committed (the connection broke during the
    /// COMMIT): give it back by its token, so it is neither counted as an attempt nor left
    /// `sending` until its lease ends. If the database cannot be reached for that either, the
    /// row keeps its lease (README, Guarantees: a claim with an unknown outcome).
    async fn release_unknown_claim(&self, request: &ClaimRequest<'_>) {
        let db = self.ledger.database();
        let reason = "claim outcome unknown (the database failed during the claim); given back";
        let release = db.release(request.job_id, request.kind, request.token, reason);
        match tokio::time::timeout(RELEASE_PATIENCE, release).await {
            Ok(Ok(true)) => tracing::info!("the claim had committed after all; gave it back"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "cannot check whether the claim committed"),
            Err(_) => tracing::debug!("cannot check whether the claim committed: no answer"),
        }
    }

    /// Gives an unused claim back (nothing was sent on it) and retries the job soon; the
    /// attempt is not counted. A failure to give it back only delays the job until the lease
    /// ends.
    async fn give_back(&self, job: &ValidJob, token: Uuid, reason: String) -> Outcome {
        Stats::bump(&self.stats.given_back);
        tracing::info!(reason, "giving the claim back unused");
        let db = self.ledger.database();
        if let Err(e) = db
            .release(&job.job.job_id, &job.job.kind, token, &reason)
            .await
        {
            tracing::warn!(error = %e, "cannot give the claim back; it ends with its lease");
        }
        self.retry(Duration::ZERO, reason)
    }

    async fn refused(
        &self,
        job: &ValidJob,
        existing: Option<&crate::db::ExistingClaim>,
    ) -> Outcome {
        let attempts = existing.map_or(0, |e| i64::from(e.attempts));
        match judge_refusal(existing, self.settings.on_uncertain == OnUncertain::Resend) {
            // The row is dead, but its dead letter may never have reached the queue (the
            // connection broke mid-publish and the broker handed the job back): dead-letter it
            // again with its recorded reason. A second dead letter is harmless; none is a loss.
            Refusal::AlreadyDead
                if let Some(class) = existing
                    .and_then(|e| e.error_class.as_deref())
                    .and_then(ErrorClass::parse) =>
            {
                let reason = existing
                    .and_then(|e| e.last_error.clone())
                    .unwrap_or_else(|| "dead-lettered before".into());
                dead(class, reason, attempts)
            }
            Refusal::AlreadySent | Refusal::AlreadyDead => {
                tracing::info!(status = ?existing.map(|e| e.status), "already handled; acknowledging the duplicate");
                Outcome::Ack { duplicate: true }
            }
            Refusal::Busy { after } => self.retry(
                after + LEASE_MARGIN,
                "another worker holds the claim".into(),
            ),
            Refusal::Uncertain => {
                let reason = "a previous attempt may have been delivered (lease expired or reply lost); MAILROOM_ON_UNCERTAIN=dead-letter".to_string();
                // An expired `sending` row becomes `uncertain`, so `status` tells the truth.
                let record = Record {
                    job_id: &job.job.job_id,
                    kind: &job.job.kind,
                    token: None,
                    status: Status::Uncertain,
                    smtp_reply: None,
                    error: Some(&reason),
                    class: Some(ErrorClass::Uncertain.as_str()),
                };
                self.record_once(&record).await;
                dead(ErrorClass::Uncertain, reason, attempts)
            }
        }
    }

    async fn send_claimed(
        &self,
        job: &ValidJob,
        claimed: Claimed,
        session: Session<'_>,
        templates: &Templates,
    ) -> Outcome {
        let Claimed {
            attempt,
            token,
            deadline,
        } = claimed;
        failpoint::hit_job("worker.after_claim", &job.job.job_id).await;
        let j = &job.job;
        let rendered = match templates.render(&j.kind, j.locale.as_deref(), &j.data) {
            Ok(r) => r,
            Err(e) => {
                return self
                    .give_up(job, token, attempt, ErrorClass::Template, e.to_string())
                    .await;
            }
        };
        let message = match self.mailer.build(job, &rendered) {
            Ok(m) => m,
            Err(e) => {
                return self
                    .give_up(job, token, attempt, ErrorClass::Invalid, e.to_string())
                    .await;
            }
        };
        // The fence: a send starts only if it, and the record of its result, end before the
        // claim's deadline. The send is bounded by the SMTP timeout, so no byte of it goes out
        // on a claim another copy may already have taken over.
        let timeout = self.mailer.timeout();
        if !deadline.covers_send(timeout) {
            let reason = format!(
                "the claim's lease has {:?} left, less than a whole send ({timeout:?}) and its record",
                deadline.remaining()
            );
            return self.give_back(job, token, reason).await;
        }
        // The uncertain window: from here until `sent` is recorded, a crash or a lost reply may
        // leave a delivered email unrecorded, and the redelivery resends it (README, Guarantees).
        // The chaos soak explains every duplicate by one such window that never closed.
        tracing::info!(window = "sending", "uncertain window opens: sending");
        let started = Instant::now();
        let sent = self.mailer.send_in(&session, &message).await;
        drop(session);
        self.stats.smtp_latency.observe(started.elapsed());
        self.breaker.record(&sent);
        if let Err(e) = &sent {
            let window = if matches!(e, SendError::Uncertain { .. }) {
                "uncertain"
            } else {
                "failed"
            };
            tracing::info!(window, error = %e, "uncertain window ends: send failed");
        }
        match sent {
            Ok(reply) => {
                if let Some(created) = j.created_at {
                    let age = (chrono::Utc::now() - created).to_std().unwrap_or_default();
                    self.stats.end_to_end.observe(age);
                }
                tracing::info!(window = "accepted", "SMTP accepted; recording sent");
                failpoint::hit_job("worker.after_smtp_ok", &job.job.job_id).await;
                self.record_sent(job, token, deadline, &reply, templates.revision())
                    .await
            }
            Err(SendError::Permanent { reason }) => {
                self.give_up(job, token, attempt, ErrorClass::Rejected, reason)
                    .await
            }
            Err(SendError::Transient { reason } | SendError::Unreachable { reason }) => {
                self.retry_or_give_up(job, token, attempt, Status::Failed, reason)
                    .await
            }
            Err(SendError::Uncertain { reason }) => match self.settings.on_uncertain {
                OnUncertain::Resend => {
                    self.retry_or_give_up(job, token, attempt, Status::Uncertain, reason)
                        .await
                }
                OnUncertain::DeadLetter => {
                    self.give_up_as(
                        job,
                        token,
                        attempt,
                        Status::Uncertain,
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
        let record = Record {
            job_id: &job.job.job_id,
            kind: &job.job.kind,
            token: Some(token),
            status: Status::Sent,
            smtp_reply: Some(reply),
            error: None,
            class: None,
        };
        let policy = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .with_total_delay(Some(deadline.remaining().max(super::lease::RECORD_BUDGET)))
            .without_max_times();
        let result = (|| self.ledger.record(&record, Some(revision)))
            .retry(policy)
            .notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "cannot record sent; retrying"))
            .await;
        match result {
            Ok(true) => {
                failpoint::hit_job("worker.after_record", &job.job.job_id).await;
                let reply = mask_addresses(reply);
                tracing::info!(window = "closed", reply, templates = revision, "sent");
                Outcome::Ack { duplicate: false }
            }
            Ok(false) => {
                tracing::warn!("sent, but the claim had been taken over; the new holder decides");
                Outcome::Ack { duplicate: false }
            }
            Err(e) => self.retry(
                self.settings.lease,
                format!("sent but could not record it: {e}"),
            ),
        }
    }

    async fn retry_or_give_up(
        &self,
        job: &ValidJob,
        token: Uuid,
        attempt: i32,
        status: Status,
        reason: String,
    ) -> Outcome {
        if attempt >= self.settings.max_attempts {
            let reason = format!("{attempt} attempts, last: {reason}");
            return self
                .give_up(job, token, attempt, ErrorClass::Exhausted, reason)
                .await;
        }
        self.record_once(&record(job, token, status, None, &reason))
            .await;
        self.retry(self.backoff(attempt), reason)
    }

    async fn give_up(
        &self,
        job: &ValidJob,
        token: Uuid,
        attempt: i32,
        class: ErrorClass,
        reason: String,
    ) -> Outcome {
        self.give_up_as(job, token, attempt, Status::Dead, class, reason)
            .await
    }

    async fn give_up_as(
        &self,
        job: &ValidJob,
        token: Uuid,
        attempt: i32,
        status: Status,
        class: ErrorClass,
        reason: String,
    ) -> Outcome {
        self.record_once(&record(job, token, status, Some(class), &reason))
            .await;
        dead(class, reason, i64::from(attempt))
    }

    /// Records a failure once; if the database is down the row keeps its lease, which expires
    /// and lets the next claim take over, so nothing is lost by not insisting.
    async fn record_once(&self, record: &Record<'_>) {
        if let Err(e) = self.ledger.record(record, None).await {
            tracing::warn!(error = %e, status = %record.status, "cannot record the result");
        }
    }

    /// The delay before attempt `attempt + 1`: exponential from the first retry tier.
    fn backoff(&self, attempt: i32) -> Duration {
        let tiers = &self.settings.topology.retry_delays;
        let first = tiers.first().copied().unwrap_or(Duration::from_secs(5));
        let last = tiers.last().copied().unwrap_or(first);
        ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(last)
            .with_factor(RETRY_FACTOR)
            .without_max_times()
            .build()
            .nth(usize::try_from(attempt.max(1) - 1).unwrap_or(0))
            .unwrap_or(last)
    }

    fn retry(&self, wanted: Duration, reason: String) -> Outcome {
        Outcome::Retry {
            delay: self.settings.topology.tier_for(wanted),
            reason,
        }
    }
}

/// A claim this delivery holds: its attempt number, its token, and until when it may be used.
#[derive(Clone, Copy, Debug)]
struct Claimed {
    attempt: i32,
    token: Uuid,
    deadline: Deadline,
}

/// A failure to record; `class` for a row that becomes `dead` or `uncertain`.
fn record<'a>(
    job: &'a ValidJob,
    token: Uuid,
    status: Status,
    class: Option<ErrorClass>,
    reason: &'a str,
) -> Record<'a> {
    Record {
        job_id: &job.job.job_id,
        kind: &job.job.kind,
        token: Some(token),
        status,
        smtp_reply: None,
        error: Some(reason),
        class: class.map(ErrorClass::as_str),
    }
}

/// Whether a failed claim may still have committed: the connection broke while the statement
/// or its COMMIT was on the wire. A pool that gave no connection, or an error the database
/// answered with, means nothing was written.
fn commit_outcome_unknown(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
    )
}

fn dead(class: ErrorClass, reason: String, attempts: i64) -> Outcome {
    tracing::warn!(
        class = class.as_str(),
        reason = mask_addresses(&reason),
        "dead-lettering"
    );
    Outcome::DeadLetter {
        class,
        reason,
        attempts,
    }
}
