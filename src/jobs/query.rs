//! The search: filters as the HTTP query and the CLI spell them, checked into a
//! [`JobQuery`], and a page of jobs with the cursor of the next.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::db::Database;
use crate::db::jobs::{JobKey, JobQuery};
use crate::job::{mask_email, normalised_address};

/// The most jobs one page holds, and the default.
pub const MAX_LIMIT: i64 = 500;
const DEFAULT_LIMIT: i64 = 50;
/// The states a job can be in: the ledger's, then the outbox's (not yet claimed).
pub const STATES: &[&str] = &[
    "sending",
    "sent",
    "failed",
    "uncertain",
    "dead",
    "pending",
    "published",
    "parked",
];

/// A search as given: every field optional, as text.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Search {
    /// A job id; with a trailing `*`, a prefix.
    pub job_id: Option<String>,
    /// An address; its domain's case does not matter, its local part's does.
    pub recipient: Option<String>,
    pub kind: Option<String>,
    pub state: Option<String>,
    /// RFC 3339, or a duration ago (`90s`, `15m`, `2h`, `7d`).
    pub since: Option<String>,
    pub until: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    pub limit: Option<i64>,
    /// Addresses in full instead of masked.
    #[serde(default)]
    pub reveal: bool,
}

/// A filter that cannot be used; `field` names it.
#[derive(Debug, thiserror::Error)]
#[error("`{field}`: {reason}")]
pub struct FilterError {
    pub field: &'static str,
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> FilterError {
    FilterError {
        field,
        reason: reason.into(),
    }
}

/// One job found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Found {
    pub job_id: String,
    pub kind: String,
    pub state: String,
    pub created_at: DateTime<Utc>,
    /// The first `to` address (masked unless revealed): the claim's, or the outbox row's.
    pub recipient: Option<String>,
}

/// A page of jobs, newest first, and the cursor of the next page (none after the last).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Page {
    pub jobs: Vec<Found>,
    pub next_cursor: Option<String>,
}

/// The jobs that match `search`: one page.
pub async fn search(db: &Database, search: &Search) -> Result<Page, SearchError> {
    let query = checked(search, Utc::now())?;
    let limit = query.limit;
    let mut rows = db
        .search_jobs(&JobQuery {
            limit: limit + 1,
            ..query
        })
        .await
        .map_err(SearchError::Database)?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = more.then(|| rows.last()).flatten().map(|last| {
        cursor_of(&JobKey {
            created_at: last.created_at,
            job_id: last.job_id.clone(),
            kind: last.kind.clone(),
        })
    });
    let jobs = rows
        .into_iter()
        .map(|r| Found {
            recipient: r
                .recipient
                .map(|a| if search.reveal { a } else { mask_email(&a) }),
            job_id: r.job_id,
            kind: r.kind,
            state: r.state,
            created_at: r.created_at,
        })
        .collect();
    Ok(Page { jobs, next_cursor })
}

/// Why a search failed: a filter to fix, or the database.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error("database unavailable: {0}")]
    Database(sqlx::Error),
}

/// The search as a query, or the first filter that cannot be used.
pub fn checked(s: &Search, now: DateTime<Utc>) -> Result<JobQuery, FilterError> {
    let (job_id, prefix) = match s.job_id.as_deref() {
        Some(id) => match id.strip_suffix('*') {
            Some(p) => (Some(p.to_string()), true),
            None => (Some(id.to_string()), false),
        },
        None => (None, false),
    };
    if job_id.as_deref().is_some_and(str::is_empty) && !prefix {
        return Err(refuse("job_id", "is empty"));
    }
    let recipient = match s.recipient.as_deref() {
        Some(a) if !a.contains('@') => return Err(refuse("recipient", "is not an address")),
        other => other.map(normalised_address),
    };
    if let Some(state) = s.state.as_deref().filter(|st| !STATES.contains(st)) {
        return Err(refuse(
            "state",
            format!("{state:?} is not one of {}", STATES.join(", ")),
        ));
    }
    let limit = s.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(refuse("limit", format!("must be 1 to {MAX_LIMIT}")));
    }
    Ok(JobQuery {
        job_id: job_id.filter(|id| !id.is_empty()),
        prefix,
        recipient,
        kind: s.kind.clone(),
        state: s.state.clone(),
        since: time("since", s.since.as_deref(), now)?,
        until: time("until", s.until.as_deref(), now)?,
        after: s.cursor.as_deref().map(key_of).transpose()?,
        limit,
    })
}

/// RFC 3339, or a duration before `now` (`90s`, `15m`, `2h`, `7d`).
fn time(
    field: &'static str,
    given: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, FilterError> {
    let Some(given) = given else { return Ok(None) };
    if let Ok(at) = DateTime::parse_from_rfc3339(given) {
        return Ok(Some(at.with_timezone(&Utc)));
    }
    let bad = || {
        refuse(
            field,
            format!("{given:?} is neither RFC 3339 nor a duration like 2h"),
        )
    };
    let (number, unit) = given.split_at(given.len().saturating_sub(1));
    let n: i64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(bad()),
    };
    Ok(Some(now - chrono::Duration::seconds(seconds)))
}

/// A cursor: the last job's key as hex of JSON (opaque, and safe in a URL).
fn cursor_of(key: &JobKey) -> String {
    let json = serde_json::to_vec(key).unwrap_or_default();
    json.iter().map(|b| format!("{b:02x}")).collect()
}

fn key_of(cursor: &str) -> Result<JobKey, FilterError> {
    let bad = || refuse("cursor", "is not a cursor this API gave");
    if !cursor.len().is_multiple_of(2) || !cursor.is_ascii() {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&cursor[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    serde_json::from_slice(&bytes).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_cursor_round_trips_and_a_forged_one_is_refused_naming_the_field() {
        let key = JobKey {
            created_at: now(),
            job_id: "注文-1".into(),
            kind: "welcome".into(),
        };
        assert_eq!(key_of(&cursor_of(&key)).unwrap(), key);
        assert_eq!(key_of("zz").unwrap_err().field, "cursor");
        assert_eq!(key_of("7b").unwrap_err().field, "cursor");
    }

    #[test]
    fn filters_are_checked_and_the_recipient_normalised() {
        let search = Search {
            job_id: Some("order-*".into()),
            recipient: Some("Ada@Example.COM".into()),
            since: Some("2h".into()),
            ..Search::default()
        };
        let q = checked(&search, now()).unwrap();
        assert_eq!((q.job_id.as_deref(), q.prefix), (Some("order-"), true));
        assert_eq!(q.recipient.as_deref(), Some("Ada@example.com"));
        assert_eq!(q.since, Some(now() - chrono::Duration::hours(2)));
        let bad = |s: Search| checked(&s, now()).unwrap_err().field;
        let state = Some("lost".into());
        assert_eq!(
            bad(Search {
                state,
                ..Search::default()
            }),
            "state"
        );
        let until = Some("yesterday".into());
        assert_eq!(
            bad(Search {
                until,
                ..Search::default()
            }),
            "until"
        );
        assert_eq!(
            bad(Search {
                limit: Some(0),
                ..Search::default()
            }),
            "limit"
        );
        let recipient = Some("nobody".into());
        assert_eq!(
            bad(Search {
                recipient,
                ..Search::default()
            }),
            "recipient"
        );
    }
}
