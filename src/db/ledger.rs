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

pub use super::rows::{Claim, ClaimRequest, ExistingClaim, LedgerStatus, Notification, Record};

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
        (LedgerStatus::Sent, _) => Refusal::AlreadySent,
        (LedgerStatus::Dead, _) => Refusal::AlreadyDead,
        (LedgerStatus::Sending, Some(left)) => Refusal::Busy { after: left },
        // With `resend` the claim takes such a row over, so it was refused in another state
        // and the row changed before it was read (a lease expiring in between, a holder
        // recording `uncertain`): claim again, never dead-letter (found by the chaos soak).
        (LedgerStatus::Sending, None) | (LedgerStatus::Uncertain, _) if resend_uncertain => {
            Refusal::Busy {
                after: Duration::ZERO,
            }
        }
        // Refused although expired or uncertain: the policy forbids resending.
        (LedgerStatus::Sending, None) | (LedgerStatus::Uncertain, _) => Refusal::Uncertain,
        // `failed` is always claimable; it was refused only because it changed meanwhile.
        (LedgerStatus::Failed, _) => Refusal::Busy {
            after: Duration::ZERO,
        },
    }
}

impl Database {
    /// Claims `(job_id, kind)` in one atomic statement, or reports who holds it. A claim taken
    /// comes back with the suppression list's entries among `req.screen`, looked up just before
    /// it, so a failed lookup leaves no claim behind (a group of claims reads them in its own
    /// statement: `Ledger::claim`).
    pub async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, sqlx::Error> {
        let found = self.suppressed_among(req.screen).await?;
        let claim = match self {
            Database::Postgres(pool) => postgres::claim(pool, req).await?,
            Database::MySql(pool) => mysql::claim(pool, req).await?,
        };
        Ok(match claim {
            Claim::Claimed { attempt, token, .. } => {
                Claim::taken(attempt, token, req.screen, &found)
            }
            refused => refused,
        })
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

    fn row(status: LedgerStatus, lease: Option<u64>) -> ExistingClaim {
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
            judge_refusal(Some(&row(LedgerStatus::Sent, None)), false),
            Refusal::AlreadySent
        );
    }

    #[test]
    fn dead_row_is_not_resent_without_replay() {
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Dead, None)), false),
            Refusal::AlreadyDead
        );
    }

    #[test]
    fn live_lease_means_retry_after_it_ends() {
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Sending, Some(42))), false),
            Refusal::Busy {
                after: Duration::from_secs(42)
            }
        );
    }

    #[test]
    fn expired_or_uncertain_refused_means_the_policy_forbids_resending() {
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Sending, None)), false),
            Refusal::Uncertain
        );
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Uncertain, None)), false),
            Refusal::Uncertain
        );
    }

    #[test]
    fn expired_or_uncertain_refused_under_resend_means_the_row_changed_so_claim_again() {
        let soon = Refusal::Busy {
            after: Duration::ZERO,
        };
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Sending, None)), true),
            soon
        );
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Uncertain, None)), true),
            soon
        );
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Sent, None)), true),
            Refusal::AlreadySent
        );
    }

    #[test]
    fn a_row_that_changed_or_vanished_is_claimed_again_soon() {
        let soon = Refusal::Busy {
            after: Duration::ZERO,
        };
        assert_eq!(
            judge_refusal(Some(&row(LedgerStatus::Failed, None)), false),
            soon
        );
        assert_eq!(judge_refusal(None, false), soon);
    }

    #[test]
    fn status_round_trips_through_its_column_text() {
        for s in [
            LedgerStatus::Sending,
            LedgerStatus::Sent,
            LedgerStatus::Failed,
            LedgerStatus::Uncertain,
            LedgerStatus::Dead,
        ] {
            assert_eq!(LedgerStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(LedgerStatus::parse("queued"), None);
    }
}
