//! One delivery → one [`Outcome`]: decode and validate, wait for a place in line for an SMTP
//! session, claim `(job_id, kind)`, then ([`send`]) render, wait for the connection while the
//! claim's deadline still covers the whole send, send if it does ([`lease`]), record. No database transaction is held across the SMTP call: the claim and each
//! record are single statements, and the lease keeps other workers away in between.
//!
//! [`lease`]: super::lease
//! [`send`]: super::send

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use uuid::Uuid;

use super::Worker;
use super::lease::Deadline;
use super::outcome::{ErrorClass, Outcome, dead};
use super::stats::Stats;
use super::suppress::{self, Screened};
use crate::broker;
use crate::config::OnUncertain;
use crate::db::is_data_error;
use crate::db::{Claim, ClaimRequest, LedgerStatus, Record, Refusal, judge_refusal};
use crate::failpoint;
use crate::job::{EmailJob, ValidJob, mask_email};
use crate::render::Templates;
use crate::smtp::Reservation;

/// Extra wait past a live lease before trying again, so the retry lands after it expired.
const LEASE_MARGIN: Duration = Duration::from_secs(1);
/// How long a delivery tries to give back a claim whose commit outcome is unknown before it
/// moves on (the database is failing; the claim then ends with its lease).
const RELEASE_PATIENCE: Duration = Duration::from_secs(2);
/// Growth of the retry delay per attempt (before rounding up to a tier).
const RETRY_FACTOR: f32 = 3.0;

/// The span of one delivery. Every field is recorded once, when it is known (a field recorded
/// twice would be printed twice in the text format): the job's id, kind and masked first
/// recipient once the body is decoded, the attempt once the claim is decided, the SMTP reply
/// and the send's duration in milliseconds once the send ended.
pub(super) fn delivery_span(d: &Delivery) -> tracing::Span {
    use tracing::field::Empty;
    tracing::info_span!(
        "delivery",
        job_id = Empty,
        kind = Empty,
        attempt = Empty,
        to = Empty,
        redelivered = d.redelivered,
        smtp_ms = Empty,
        smtp_reply = Empty,
    )
}

impl Worker {
    pub(super) async fn process(&self, delivery: &Delivery) -> Outcome {
        let span = tracing::Span::current();
        match self.take_claim(delivery).await {
            Ok(taken) => {
                span.record("attempt", taken.claimed.attempt);
                let Taken {
                    job,
                    templates,
                    claimed,
                    replay,
                    reservation,
                    pass,
                } = taken;
                let outcome = self
                    .use_claim(&job, claimed, replay, reservation, &templates)
                    .await;
                // The domains' concurrency is held until the send ended.
                drop(pass);
                outcome
            }
            Err(outcome) => {
                // No claim of ours: the delivery's own count (retries through the tiers).
                let attempt = broker::int_header(&delivery.properties, broker::ATTEMPT_HEADER);
                span.record("attempt", attempt.unwrap_or(1));
                outcome
            }
        }
    }

    /// Admits the job, waits for a place in line for an SMTP session and claims the job; `Err` is the outcome of a
    /// delivery that got no claim (refused, a duplicate, busy elsewhere, a failure).
    async fn take_claim<'s>(&'s self, delivery: &Delivery) -> Result<Taken<'s>, Outcome> {
        let (job, templates) = match self.admit(delivery) {
            Ok(admitted) => admitted,
            Err(reason) => return Err(self.refuse(&delivery.data, reason).await),
        };
        failpoint::hit_job("worker.before_claim", &job.job.job_id).await;
        let now = Utc::now();
        if let Some(until) = job.job.send_at.filter(|at| *at > now) {
            return Err(self.defer(until, now));
        }
        if job.job.expires_at.is_some_and(|at| at <= now) {
            // No SMTP session to wait for: the claim only records that it expired.
            return Err(self.expire(delivery, &job).await);
        }
        // The place in line for an SMTP session comes first: a delivery may wait for one as
        // long as the pool is busy, and holds no claim (no lease runs) while it waits.
        let waiting = Instant::now();
        let Some(reservation) = self.mailer.reserve().await else {
            return Err(self.retry(Duration::ZERO, "the mailer is closed".into()));
        };
        self.stats.observe_session_wait(waiting.elapsed());
        if reservation.is_deeper() {
            Stats::bump(&self.stats.deeper_places);
        }
        // The sending limits: a short wait for the slot, or held back (still unclaimed).
        let pass = self.pace(&job).await?;
        let message_id = self.mailer.message_id(&job.job.job_id, &job.job.kind);
        let screen = suppress::screen_keys(&job);
        let request = self
            .claim_request(delivery, &job, &message_id, &screen)
            .await?;
        let replay = request.replay;
        let asked = Instant::now();
        match self.claim(&request).await? {
            Claim::Claimed {
                attempt,
                token,
                suppressed,
            } => {
                let job = match suppress::screen(job, suppressed) {
                    Screened::Send(job) => job,
                    Screened::Suppressed(job, entry) => {
                        drop((reservation, pass));
                        return Err(self.suppressed(&job, token, entry).await);
                    }
                };
                let deadline = Deadline::of_claim(asked, self.settings.lease);
                let claimed = Claimed {
                    attempt,
                    token,
                    deadline,
                };
                Ok(Taken {
                    job,
                    templates,
                    claimed,
                    replay,
                    reservation,
                    pass,
                })
            }
            Claim::Refused(existing) => {
                drop(reservation);
                Err(self.refused(&job, existing.as_ref()).await)
            }
        }
    }

    /// A job not due yet: parked in the longest tier that does not overshoot `until`, with no
    /// claim taken and no attempt counted.
    fn defer(&self, until: DateTime<Utc>, now: DateTime<Utc>) -> Outcome {
        let wait = (until - now).to_std().unwrap_or_default();
        Outcome::Defer {
            delay: self.settings.topology.tier_within(wait),
            until,
        }
    }

    /// A job past its `expires_at` before an SMTP session: given up as `expired`, never sent.
    async fn expire(&self, delivery: &Delivery, job: &ValidJob) -> Outcome {
        match self.claim_unsent(delivery, job).await {
            Ok((attempt, token)) => self.give_up_expired(job, token, attempt).await,
            Err(outcome) => outcome,
        }
    }

    /// Claims a job that will not be sent, only recorded (expired), with no SMTP session to
    /// wait for: its attempt and token, or the outcome of a refused claim (a copy of
    /// a job already sent or dead is a duplicate) or a failed one.
    pub(super) async fn claim_unsent(
        &self,
        delivery: &Delivery,
        job: &ValidJob,
    ) -> Result<(i32, Uuid), Outcome> {
        let message_id = self.mailer.message_id(&job.job.job_id, &job.job.kind);
        let request = self.claim_request(delivery, job, &message_id, &[]).await?;
        match self.claim(&request).await? {
            Claim::Claimed { attempt, token, .. } => Ok((attempt, token)),
            Claim::Refused(existing) => Err(self.refused(job, existing.as_ref()).await),
        }
    }

    /// Gives up on a claimed job whose `expires_at` has passed.
    async fn give_up_expired(&self, job: &ValidJob, token: Uuid, attempt: i32) -> Outcome {
        let at = job
            .job
            .expires_at
            .map_or_else(String::new, |at| at.to_rfc3339());
        let reason = format!("expired at {at} before it could be sent; not sent");
        self.give_up(job, token, attempt, ErrorClass::Expired, reason)
            .await
    }

    /// Decodes and validates the job and takes this delivery's template snapshot; `Err` is the
    /// reason to refuse it (not a job, or a kind without a template).
    fn admit(&self, delivery: &Delivery) -> Result<(ValidJob, Arc<Templates>), String> {
        let span = tracing::Span::current();
        let job = match EmailJob::decode(&delivery.data) {
            Ok(job) => job,
            Err(e) => {
                if let Some(id) = delivery.properties.message_id() {
                    span.record("job_id", id.as_str());
                }
                return Err(e.to_string());
            }
        };
        span.record("job_id", job.job.job_id.as_str());
        span.record("kind", job.job.kind.as_str());
        if let Some(first) = job.to.first() {
            span.record("to", mask_email(first.email.as_ref()).as_str());
        }
        // One snapshot per delivery: a reload mid-delivery never mixes two revisions.
        let templates = self.templates.current();
        if !templates.contains(&job.job.kind) {
            return Err(format!("unknown kind {:?}: no such template", job.job.kind));
        }
        Ok((job, templates))
    }

    /// What to claim: this job under its Message-ID, with a fresh token, and whether the
    /// delivery is a genuine replay (which needs the database to check its seal); `screen`: the
    /// addresses to look up in the suppression list with the claim.
    async fn claim_request<'a>(
        &self,
        delivery: &Delivery,
        job: &'a ValidJob,
        message_id: &'a str,
        screen: &'a [String],
    ) -> Result<ClaimRequest<'a>, Outcome> {
        Ok(ClaimRequest {
            job_id: &job.job.job_id,
            kind: &job.job.kind,
            message_id,
            token: Uuid::new_v4(),
            lease: self.settings.lease,
            resend_uncertain: self.settings.on_uncertain == OnUncertain::Resend,
            recipient: job
                .to
                .first()
                .and_then(|to| crate::job::recipient_to_store(to.email.as_ref())),
            screen,
            replay: match self.replay_keys.honour(delivery).await {
                Ok(genuine) => genuine,
                Err(e) => {
                    return Err(self.retry(Duration::ZERO, format!("database unavailable: {e:#}")));
                }
            },
        })
    }

    /// Claims the job in the ledger; `Err` is the outcome when the database refused the data or
    /// failed (after giving back a claim that may have committed all the same).
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, Outcome> {
        let asked = Instant::now();
        let claimed = self.ledger.claim(request).await;
        self.stats.steps.claim.observe(asked.elapsed());
        match claimed {
            Ok(claim) => Ok(claim),
            Err(e) if is_data_error(&e) => {
                let reason = format!("the database refuses this job's data: {e}");
                Err(dead(ErrorClass::Invalid, reason, 0))
            }
            Err(e) => {
                if commit_outcome_unknown(&e) {
                    self.release_unknown_claim(request).await;
                }
                Err(self.retry(Duration::ZERO, format!("database unavailable: {e}")))
            }
        }
    }

    /// A claim taken: gives up on a poison job, else renders and sends on it.
    async fn use_claim(
        &self,
        job: &ValidJob,
        claimed: Claimed,
        replay: bool,
        reservation: Reservation<'_>,
        templates: &Templates,
    ) -> Outcome {
        let Claimed { attempt, token, .. } = claimed;
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
                .give_up(job, token, attempt, ErrorClass::Exhausted, reason)
                .await;
        }
        // It may have expired while it waited for its place in line.
        if job.job.expires_at.is_some_and(|at| at <= Utc::now()) {
            return self.give_up_expired(job, token, attempt).await;
        }
        self.send_claimed(job, claimed, reservation, templates)
            .await
    }

    /// A claim whose commit failed may still have committed (the connection broke during the
    /// COMMIT): give it back by its token, so it is neither counted as an attempt nor left
    /// `sending` until its lease ends. If the database cannot be reached for that either, the
    /// row keeps its lease (docs/GUARANTEES.md: a claim with an unknown outcome).
    async fn release_unknown_claim(&self, request: &ClaimRequest<'_>) {
        let db = self.ledger.database();
        let reason = "claim outcome unknown (the database failed during the claim); given back";
        let release = db.release(request.job_id, request.kind, request.token, reason);
        match tokio::time::timeout(RELEASE_PATIENCE, release).await {
            Ok(Ok(true)) => tracing::debug!("the claim had committed after all; gave it back"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "cannot check whether the claim committed"),
            Err(_) => tracing::debug!("cannot check whether the claim committed: no answer"),
        }
    }

    /// Gives an unused claim back (nothing was sent on it) and retries the job soon; the
    /// attempt is not counted. A failure to give it back only delays the job until the lease
    /// ends.
    pub(super) async fn give_back(&self, job: &ValidJob, token: Uuid, reason: String) -> Outcome {
        Stats::bump(&self.stats.given_back);
        tracing::debug!(reason, "giving the claim back unused");
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
                tracing::debug!(status = ?existing.map(|e| e.status), "already handled; acknowledging the duplicate");
                Outcome::Ack { duplicate: true }
            }
            Refusal::Busy { after } => self.retry(
                after + LEASE_MARGIN,
                "another worker holds the claim".into(),
            ),
            Refusal::Uncertain => self.dead_uncertain(job, attempts).await,
        }
    }

    /// An earlier attempt may have been delivered, and the policy is to dead-letter such a job
    /// rather than risk a second email.
    async fn dead_uncertain(&self, job: &ValidJob, attempts: i64) -> Outcome {
        let reason = "a previous attempt may have been delivered (lease expired or reply lost); MAILROOM_ON_UNCERTAIN=dead-letter".to_string();
        // An expired `sending` row becomes `uncertain`, so `status` tells the truth.
        let record = Record {
            job_id: &job.job.job_id,
            kind: &job.job.kind,
            token: None,
            status: LedgerStatus::Uncertain,
            smtp_reply: None,
            error: Some(&reason),
            class: Some(ErrorClass::Uncertain.as_str()),
        };
        self.record_once(&record).await;
        dead(ErrorClass::Uncertain, reason, attempts)
    }

    pub(super) async fn retry_or_give_up(
        &self,
        job: &ValidJob,
        token: Uuid,
        attempt: i32,
        status: LedgerStatus,
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

    pub(super) async fn give_up(
        &self,
        job: &ValidJob,
        token: Uuid,
        attempt: i32,
        class: ErrorClass,
        reason: String,
    ) -> Outcome {
        self.give_up_as(job, token, attempt, LedgerStatus::Dead, class, reason)
            .await
    }

    pub(super) async fn give_up_as(
        &self,
        job: &ValidJob,
        token: Uuid,
        attempt: i32,
        status: LedgerStatus,
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
        if let Err(e) = self.write_record(record, None).await {
            tracing::warn!(error = %e, status = %record.status, "cannot record the result");
        }
    }

    /// Records a result through the ledger, timing the step until it is committed.
    pub(super) async fn write_record(
        &self,
        record: &Record<'_>,
        revision: Option<&str>,
    ) -> Result<bool, crate::db::group::LedgerError> {
        let asked = Instant::now();
        let recorded = self.ledger.record(record, revision).await;
        self.stats.steps.record.observe(asked.elapsed());
        recorded
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

    pub(super) fn retry(&self, wanted: Duration, reason: String) -> Outcome {
        Outcome::Retry {
            delay: self.settings.topology.tier_for(wanted),
            reason,
        }
    }
}

/// What a delivery holds once it claimed its job: the job and its template snapshot, the
/// claim, whether it is a genuine replay, and its place in line for an SMTP session.
struct Taken<'s> {
    job: ValidJob,
    templates: Arc<Templates>,
    claimed: Claimed,
    replay: bool,
    reservation: Reservation<'s>,
    /// The sending limits' pass, `None` without limits.
    pass: Option<super::throttle::Pass>,
}

/// A claim this delivery holds: its attempt number, its token, and until when it may be used.
#[derive(Clone, Copy, Debug)]
pub(super) struct Claimed {
    pub(super) attempt: i32,
    pub(super) token: Uuid,
    pub(super) deadline: Deadline,
}

/// A failure to record; `class` for a row that becomes `dead` or `uncertain`.
fn record<'a>(
    job: &'a ValidJob,
    token: Uuid,
    status: LedgerStatus,
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
