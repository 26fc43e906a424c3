//! The rows of `mailroom_dead_letters`: what ingesting writes ([`NewDeadLetter`]), what readers
//! get back ([`DeadLetterRow`], [`GroupRow`]), and the one query shape every read takes
//! ([`LetterQuery`]). Plain values; the engines turn them into SQL.

use chrono::{DateTime, Utc};

/// A dead letter about to be stored, every column computed from the delivery.
#[derive(Clone, Debug, PartialEq)]
pub struct NewDeadLetter {
    /// SHA-256 of the letter without the broker's redelivery headers (the idempotency key).
    pub letter_key: Vec<u8>,
    pub job_id: String,
    pub kind: String,
    pub recipient: Option<String>,
    pub recipients: i32,
    pub class: String,
    pub reason: String,
    pub reason_group: String,
    /// SHA-256 of the class and the normalised reason.
    pub group_key: Vec<u8>,
    pub attempts: Option<i64>,
    pub failed_at: Option<DateTime<Utc>>,
    pub replays: i64,
    pub exchange: String,
    pub routing_key: String,
    /// The AMQP basic properties (headers included), encoded as on the wire.
    pub properties: Vec<u8>,
    pub body: Vec<u8>,
    /// The body's size as it arrived (more than `body.len()` when it was cut).
    pub body_size: i64,
}

/// A stored dead letter. `properties` and `body` are empty when the query did not ask for
/// them ([`LetterQuery::payload`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DeadLetterRow {
    pub id: i64,
    pub job_id: String,
    pub kind: String,
    pub recipient: Option<String>,
    pub recipients: i32,
    pub class: String,
    pub reason: String,
    pub reason_group: String,
    pub group_key: Vec<u8>,
    pub attempts: Option<i64>,
    pub failed_at: Option<DateTime<Utc>>,
    pub replays: i64,
    pub exchange: String,
    pub routing_key: String,
    pub properties: Vec<u8>,
    pub body: Vec<u8>,
    pub body_size: i64,
    pub ingested_at: DateTime<Utc>,
    pub state: String,
    pub replayed_at: Option<DateTime<Utc>>,
    pub replayed_by: Option<String>,
    pub replay_result: Option<String>,
    pub purged_at: Option<DateTime<Utc>>,
    pub purged_by: Option<String>,
}

/// One failure group: the letters of one class with one normalised reason.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupRow {
    pub group_key: Vec<u8>,
    pub class: String,
    pub reason_group: String,
    pub count: i64,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// Which rows a read takes; every field set must match. Rows come newest first (highest id).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LetterQuery {
    /// `dead`, `replayed` or `purged`; `None`: any.
    pub state: Option<String>,
    pub kind: Option<String>,
    pub class: Option<String>,
    /// Failed (or, without a failure time, ingested) at or after / before.
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Case-insensitive substring of the reason, the recipient or the job id; `%` and `_` are
    /// literal.
    pub text: Option<String>,
    pub group_key: Option<Vec<u8>>,
    /// These row ids only (empty: no such condition).
    pub ids: Vec<i64>,
    /// These job ids only (empty: no such condition).
    pub job_ids: Vec<String>,
    /// Rows with an id below this one (the cursor of the previous page).
    pub before: Option<i64>,
    /// At most this many rows (`None`: all).
    pub limit: Option<i64>,
    /// Also read `properties` and `body`.
    pub payload: bool,
}

/// The LIKE pattern of a substring, `!` as its escape character: `%`, `_` and `!` literal,
/// lower-cased for a case-insensitive match.
pub fn like_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}
