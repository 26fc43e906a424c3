//! The claim ledger `sent_notifications`: one row per `(job_id, kind)`, a small state machine
//! that lets any number of workers and redeliveries send each email at most once.
//!
//! ```text
//!            claim (insert)            SMTP 2xx + record
//!   (none) ───────────────▶ sending ─────────────────────▶ sent
//!                            │  ▲ take over: failed, or sending with an expired lease,
//!                            │  │ or uncertain when MAILROOM_ON_UNCERTAIN=resend
//!             4xx / refused  ▼  │
//!                  failed / uncertain ──5xx, bad template, attempts exhausted──▶ dead
//! ```
//! The claim is one atomic statement; everything after it is guarded by the claim token, so a
//! worker whose lease was taken over cannot overwrite the new owner's result.

use std::time::Duration;

use uuid::Uuid;

use super::{Database, mysql, postgres};

/// A row's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Sending,
    Sent,
    Failed,
    Uncertain,
    Dead,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Sending => "sending",
            Status::Sent => "sent",
            Status::Failed => "failed",
            Status::Uncertain => "uncertain",
            Status::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "sending" => Status::Sending,
            "sent" => Status::Sent,
            "failed" => Status::Failed,
            "uncertain" => Status::Uncertain,
            "dead" => Status::Dead,
            _ => return None,
        })
    }
}

impl TryFrom<String> for Status {
    type Error = String;

    fn try_from(text: String) -> Result<Status, String> {
        Status::parse(&text).ok_or_else(|| format!("unknown status {text:?}"))
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a worker asks for when it claims a job.
#[derive(Clone, Debug)]
pub struct ClaimRequest<'a> {
    pub job_id: &'a str,
    pub kind: &'a str,
    pub message_id: &'a str,
    /// The token the claim will hold, chosen before it is sent: when the commit's outcome is
    /// unknown (the connection broke during it), the worker can still find and give back a
    /// claim that did commit.
    pub token: Uuid,
    /// How long the claim is exclusive; longer than the SMTP timeout plus the time to record.
    pub lease: Duration,
    /// Whether an `uncertain` row, or a `sending` row whose lease expired, may be taken over
    /// (`MAILROOM_ON_UNCERTAIN=resend`).
    pub resend_uncertain: bool,
    /// A copy replayed from the dead-letter queue: a `dead` or `uncertain` row may be taken over
    /// (one more claim per replayed copy). A `sent` row never is.
    pub replay: bool,
}

/// The answer to a claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// This worker owns the row until the lease ends; `attempt` counts claims, this one included.
    Claimed { attempt: i32, token: Uuid },
    /// Someone else's row, as it was read right after the refusal (`None`: it vanished).
    Refused(Option<ExistingClaim>),
}

/// The state of a row that refused a claim.
#[derive(Clone, Debug, PartialEq)]
pub struct ExistingClaim {
    pub status: Status,
    pub attempts: i32,
    /// Time left on the lease; `None` when there is no lease or it has expired.
    pub lease_remaining: Option<Duration>,
    /// For a `dead` row: the class and reason it was dead-lettered with.
    pub error_class: Option<String>,
    pub last_error: Option<String>,
}

/// What a refused claim means for the delivery at hand.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// Sent before: acknowledge the duplicate and send nothing.
    AlreadySent,
    /// Dead-lettered before: acknowledge; only an explicit replay sends it again.
    AlreadyDead,
    /// Another worker holds a live lease (or the row changed under us): try again after
    /// `after`. Never acknowledge it away: the holder may die, and this copy may be the last.
    Busy { after: Duration },
    /// The previous send may have reached the server and the policy is `dead-letter`.
    Uncertain,
}

/// Decides what a refused claim means. Pure, so the whole table is unit-tested.
/// `resend_uncertain` is the claim's own policy (`MAILROOM_ON_UNCERTAIN=resend`).
pub fn judge_refusal(existing: Option<&ExistingClaim>, resend_uncertain: bool) -> Refusal {
    let Some(existing) = existing else {
        // Deleted between the two statements (retention): claim again shortly.
        return Refusal::Busy {
            after: Duration::ZERO,
        };
    };
    match (existing.status, existing.lease_remaining) {
        (Status::Sent, _) => Refusal::AlreadySent,
        (Status::Dead, _) => Refusal::AlreadyDead,
        (Status::Sending, Some(left)) => Refusal::Busy { after: left },
        // With `resend` the claim takes such a row over, so it was refused in another state
        // and the row changed before it was read (a lease expiring in between, a holder
        // recording `uncertain`): claim again, never dead-letter (found by the chaos soak).
        (Status::Sending, None) | (Status::Uncertain, _) if resend_uncertain => Refusal::Busy {
            after: Duration::ZERO,
        },
        // Refused although expired or uncertain: the policy forbids resending.
        (Status::Sending, None) | (Status::Uncertain, _) => Refusal::Uncertain,
        // `failed` is always claimable; it was refused only because it changed meanwhile.
        (Status::Failed, _) => Refusal::Busy {
            after: Duration::ZERO,
        },
    }
}

/// One row, as `status` and the tests read it.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct Notification {
    pub job_id: String,
    pub kind: String,
    #[sqlx(try_from = "String")]
    pub status: Status,
    pub attempts: i32,
    pub message_id: String,
    pub smtp_reply: Option<String>,
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    pub sent_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Revision (content hash) of the template set that rendered the sent email.
    pub template_revision: Option<String>,
}

/// The result to record after an attempt.
#[derive(Clone, Debug)]
pub struct Record<'a> {
    pub job_id: &'a str,
    pub kind: &'a str,
    /// The claim this worker holds; `None` records over an expired `sending` row instead.
    pub token: Option<Uuid>,
    pub status: Status,
    pub smtp_reply: Option<&'a str>,
    pub error: Option<&'a str>,
    /// For a `dead` row: the class of the failure (an `ErrorClass` name).
    pub class: Option<&'a str>,
}

impl Database {
    /// Claims `(job_id, kind)` in one atomic statement, or reports who holds it.
    pub async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::claim(pool, req).await,
            Database::MySql(pool) => mysql::claim(pool, req).await,
        }
    }

    /// Records the result of an attempt. Returns false when the row was no longer ours
    /// (lease taken over): the caller logs it, the new owner's result stands.
    pub async fn record(&self, record: &Record<'_>) -> Result<bool, sqlx::Error> {
        self.record_with_revision(record, None).await
    }

    /// [`Database::record`], also storing the template revision that rendered the email (kept
    /// as it was when `None`).
    pub async fn record_with_revision(
        &self,
        record: &Record<'_>,
        revision: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::record(pool, record, revision).await,
            Database::MySql(pool) => mysql::record(pool, record, revision).await,
        }
    }

    /// Gives back a claim that was not used (nothing was sent on it): the row becomes `failed`
    /// without counting the attempt, so the next copy takes it over at once. False when the
    /// claim is not (or no longer) ours, or never committed.
    pub async fn release(
        &self,
        job_id: &str,
        kind: &str,
        token: Uuid,
        reason: &str,
    ) -> Result<bool, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::release(pool, job_id, kind, token, reason).await,
            Database::MySql(pool) => mysql::release(pool, job_id, kind, token, reason).await,
        }
    }

    /// Reads one row.
    pub async fn notification(
        &self,
        job_id: &str,
        kind: &str,
    ) -> Result<Option<Notification>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::notification(pool, job_id, kind).await,
            Database::MySql(pool) => mysql::notification(pool, job_id, kind).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: Status, lease: Option<u64>) -> ExistingClaim {
        ExistingClaim {
            status,
            attempts: 1,
            lease_remaining: lease.map(Duration::from_secs),
            error_class: None,
            last_error: None,
        }
    }

    #[test]
    fn sent_row_is_a_duplicate_to_acknowledge() {
        assert_eq!(
            judge_refusal(Some(&row(Status::Sent, None)), false),
            Refusal::AlreadySent
        );
    }

    #[test]
    fn dead_row_is_not_resent_without_replay() {
        assert_eq!(
            judge_refusal(Some(&row(Status::Dead, None)), false),
            Refusal::AlreadyDead
        );
    }

    #[test]
    fn live_lease_means_retry_after_it_ends() {
        assert_eq!(
            judge_refusal(Some(&row(Status::Sending, Some(42))), false),
            Refusal::Busy {
                after: Duration::from_secs(42)
            }
        );
    }

    #[test]
    fn expired_or_uncertain_refused_means_the_policy_forbids_resending() {
        assert_eq!(
            judge_refusal(Some(&row(Status::Sending, None)), false),
            Refusal::Uncertain
        );
        assert_eq!(
            judge_refusal(Some(&row(Status::Uncertain, None)), false),
            Refusal::Uncertain
        );
    }

    #[test]
    fn expired_or_uncertain_refused_under_resend_means_the_row_changed_so_claim_again() {
        let soon = Refusal::Busy {
            after: Duration::ZERO,
        };
        assert_eq!(judge_refusal(Some(&row(Status::Sending, None)), true), soon);
        assert_eq!(
            judge_refusal(Some(&row(Status::Uncertain, None)), true),
            soon
        );
        assert_eq!(
            judge_refusal(Some(&row(Status::Sent, None)), true),
            Refusal::AlreadySent
        );
    }

    #[test]
    fn a_row_that_changed_or_vanished_is_claimed_again_soon() {
        let soon = Refusal::Busy {
            after: Duration::ZERO,
        };
        assert_eq!(judge_refusal(Some(&row(Status::Failed, None)), false), soon);
        assert_eq!(judge_refusal(None, false), soon);
    }

    #[test]
    fn status_round_trips_through_its_column_text() {
        for s in [
            Status::Sending,
            Status::Sent,
            Status::Failed,
            Status::Uncertain,
            Status::Dead,
        ] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("queued"), None);
    }
}
