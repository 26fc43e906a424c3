//! The values the database layer reads and writes, shared by the facades (`ledger`, `outbox`,
//! `group`) and the engines (`postgres`, `mysql`). A leaf: it imports nothing else of `db`, so
//! an engine module reads with this file alone, and no module of `db` imports in a circle.
//!
//! - the claim ledger: [`LedgerStatus`] of a row, [`ClaimRequest`] and its answer [`Claim`],
//!   [`ExistingClaim`], [`Record`], and [`Notification`] (a whole row);
//! - the suppression list: [`Suppression`] and its [`Reason`], which a claim also looks up;
//! - the outbox: [`PendingRow`] (claimed by a relay) and [`OutboxStatus`];
//! - group commit: a [`Group`] of [`ClaimItem`]s and [`RecordItem`]s, and its [`GroupResult`];
//! - dead letters (`dead_letter`): [`NewDeadLetter`], [`DeadLetterRow`], [`GroupRow`] and the
//!   [`LetterQuery`] every read takes.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

mod dead_letter;
pub use dead_letter::{DeadLetterRow, GroupRow, LetterQuery, NewDeadLetter, like_pattern};

// ---- the claim ledger ----

/// The status of a ledger row, as its column `sent_notifications.status` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerStatus {
    Sending,
    Sent,
    Failed,
    Uncertain,
    Dead,
}

impl LedgerStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerStatus::Sending => "sending",
            LedgerStatus::Sent => "sent",
            LedgerStatus::Failed => "failed",
            LedgerStatus::Uncertain => "uncertain",
            LedgerStatus::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<LedgerStatus> {
        Some(match s {
            "sending" => LedgerStatus::Sending,
            "sent" => LedgerStatus::Sent,
            "failed" => LedgerStatus::Failed,
            "uncertain" => LedgerStatus::Uncertain,
            "dead" => LedgerStatus::Dead,
            _ => return None,
        })
    }
}

impl TryFrom<String> for LedgerStatus {
    type Error = String;

    fn try_from(text: String) -> Result<LedgerStatus, String> {
        LedgerStatus::parse(&text).ok_or_else(|| format!("unknown status {text:?}"))
    }
}

impl std::fmt::Display for LedgerStatus {
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
    /// The job's first `to` address, normalised (`job::normalised_address`), written with the
    /// claim for the recipient search.
    pub recipient: Option<String>,
    /// The job's recipients as the suppression list keys them (`suppressions::key`): a claim
    /// taken comes back with their entries, read in the claim's own statement.
    pub screen: &'a [String],
}

/// The answer to a claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// This worker owns the row until the lease ends; `attempt` counts claims, this one included.
    /// `suppressed`: the suppression list's entries among the request's `screen` addresses.
    Claimed {
        attempt: i32,
        token: Uuid,
        suppressed: Vec<Suppression>,
    },
    /// Someone else's row, as it was read right after the refusal (`None`: it vanished).
    Refused(Option<ExistingClaim>),
}

impl Claim {
    /// A claim taken, with the entries of `found` among `screen`.
    pub(super) fn taken(
        attempt: i32,
        token: Uuid,
        screen: &[String],
        found: &[Suppression],
    ) -> Claim {
        let suppressed = found
            .iter()
            .filter(|s| screen.contains(&s.address))
            .cloned()
            .collect();
        Claim::Claimed {
            attempt,
            token,
            suppressed,
        }
    }
}

/// The state of a row that refused a claim.
#[derive(Clone, Debug, PartialEq)]
pub struct ExistingClaim {
    pub status: LedgerStatus,
    pub attempts: i32,
    /// Time left on the lease; `None` when there is no lease or it has expired.
    pub lease_remaining: Option<Duration>,
    /// For a `dead` row: the class and reason it was dead-lettered with.
    pub error_class: Option<String>,
    pub last_error: Option<String>,
}

/// One row, as `status` and the tests read it.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct Notification {
    pub job_id: String,
    pub kind: String,
    #[sqlx(try_from = "String")]
    pub status: LedgerStatus,
    pub attempts: i32,
    pub message_id: String,
    pub smtp_reply: Option<String>,
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    pub sent_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Revision (content hash) of the template set that rendered the sent email.
    pub template_revision: Option<String>,
    /// Why a `dead` or `uncertain` row was given up (`rejected`, `expired`, `suppressed`, …).
    pub error_class: Option<String>,
}

/// The result to record after an attempt.
#[derive(Clone, Debug)]
pub struct Record<'a> {
    pub job_id: &'a str,
    pub kind: &'a str,
    /// The claim this worker holds; `None` records over an expired `sending` row instead.
    pub token: Option<Uuid>,
    pub status: LedgerStatus,
    pub smtp_reply: Option<&'a str>,
    pub error: Option<&'a str>,
    /// For a `dead` row: the class of the failure (an `ErrorClass` name).
    pub class: Option<&'a str>,
}

// ---- the outbox ----

/// An outbox row claimed by a relay.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PendingRow {
    pub id: i64,
    pub job_id: String,
    pub kind: String,
    pub payload: String,
    pub publish_attempts: i32,
}

/// The outbox columns of a job's status, as both engines read them.
#[derive(sqlx::FromRow)]
pub(super) struct OutboxRow {
    created_at: chrono::DateTime<chrono::Utc>,
    published_at: Option<chrono::DateTime<chrono::Utc>>,
    publish_attempts: i32,
    last_error: Option<String>,
    parked_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl From<OutboxRow> for OutboxStatus {
    fn from(r: OutboxRow) -> OutboxStatus {
        OutboxStatus {
            created_at: r.created_at,
            published_at: r.published_at,
            publish_attempts: r.publish_attempts,
            last_error: r.last_error,
            parked: r.parked_at.is_some(),
        }
    }
}

/// The outbox side of a job's status.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboxStatus {
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub published_at: Option<chrono::DateTime<chrono::Utc>>,
    pub publish_attempts: i32,
    pub last_error: Option<String>,
    pub parked: bool,
}

// ---- the suppression list (see `suppressions.rs`) ----

/// Why an address is suppressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The recipient's server said the mailbox does not exist (5.1.x).
    HardBounce,
    /// The recipient marked an email as spam.
    Complaint,
    /// The recipient asked not to be mailed.
    Unsubscribed,
    /// An operator's entry.
    Manual,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::HardBounce,
        Reason::Complaint,
        Reason::Unsubscribed,
        Reason::Manual,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::HardBounce => "hard_bounce",
            Reason::Complaint => "complaint",
            Reason::Unsubscribed => "unsubscribed",
            Reason::Manual => "manual",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Reason {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
                format!(
                    "unknown reason {s:?}; the reasons are: {}",
                    names.join(", ")
                )
            })
    }
}

/// One suppressed address.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Suppression {
    pub address: String,
    pub reason: Reason,
    pub detail: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

/// An entry as both engines read it (MySQL/MariaDB casts its binary `address` to text).
#[derive(sqlx::FromRow)]
pub struct SuppressionRow {
    address: String,
    reason: String,
    detail: Option<String>,
    created_by: String,
    created_at: DateTime<Utc>,
}

impl SuppressionRow {
    pub fn entry(self) -> Suppression {
        Suppression {
            address: self.address,
            // The column's CHECK admits only these names.
            reason: self.reason.parse().unwrap_or(Reason::Manual),
            detail: self.detail,
            created_by: self.created_by,
            created_at: self.created_at,
        }
    }
}

// ---- group commit (see `group.rs`) ----

/// A claim in a group: the claim of [`ClaimRequest`] with the token it will hold.
#[derive(Clone, Debug)]
pub struct ClaimItem {
    pub job_id: String,
    pub kind: String,
    pub message_id: String,
    pub token: Uuid,
    pub recipient: Option<String>,
    pub screen: Vec<String>,
}

/// A record in a group: always by the holder of the claim (`token`).
#[derive(Clone, Debug)]
pub struct RecordItem {
    pub job_id: String,
    pub kind: String,
    pub token: Uuid,
    pub status: LedgerStatus,
    pub smtp_reply: Option<String>,
    pub error: Option<String>,
    pub class: Option<String>,
    pub revision: Option<String>,
}

/// One group: claims sharing a lease and policy, and records; every key at most once.
#[derive(Debug, Default)]
pub struct Group {
    pub lease: Duration,
    pub resend_uncertain: bool,
    pub claims: Vec<ClaimItem>,
    pub records: Vec<RecordItem>,
}

/// The answers of a group, in the order of its claims and records.
#[derive(Debug, PartialEq)]
pub struct GroupResult {
    pub claims: Vec<Claim>,
    pub records: Vec<bool>,
}

impl Group {
    /// The addresses every claim of the group looks up, each once.
    pub(super) fn screened_addresses(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .claims
            .iter()
            .flat_map(|c| c.screen.iter().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Claims and records in key order, so that two groups lock rows in the same order.
    pub(super) fn sort(&mut self) {
        self.claims
            .sort_by(|a, b| (&a.job_id, &a.kind).cmp(&(&b.job_id, &b.kind)));
        self.records
            .sort_by(|a, b| (&a.job_id, &a.kind).cmp(&(&b.job_id, &b.kind)));
    }
}
