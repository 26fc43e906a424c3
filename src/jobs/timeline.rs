//! One job's timeline, from its outbox row, its ledger row and the ledger's `history`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::db::Database;
use crate::job::{mask_addresses, mask_email};
use crate::status::{JobStatus, job_status};

/// What happened to one job, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Timeline {
    #[serde(flatten)]
    pub status: JobStatus,
    /// The first `to` address (masked unless revealed), once a worker claimed the job.
    pub recipient: Option<String>,
    pub events: Vec<Event>,
}

/// One step: `created`, `published`, `attempt` (ended), `claimed` (under way), `replayed`,
/// `sent` or `dead`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Event {
    pub event: String,
    pub at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<DateTime<Utc>>,
    /// How an attempt ended: `sent`, `failed`, `uncertain` or `dead`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smtp_reply: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn event(name: &str, at: Option<DateTime<Utc>>) -> Event {
    Event {
        event: name.into(),
        at,
        ..Event::default()
    }
}

/// The timeline of `(job_id, kind)`; `None` when neither the outbox nor the ledger has it.
pub async fn timeline(
    db: &Database,
    job_id: &str,
    kind: &str,
    reveal: bool,
) -> anyhow::Result<Option<Timeline>> {
    let Some(status) = job_status(db, job_id, Some(kind)).await?.into_iter().next() else {
        return Ok(None);
    };
    let ledger = db.ledger_timeline(job_id, kind).await?.unwrap_or_default();
    let history = ledger
        .history
        .as_deref()
        .and_then(|h| serde_json::from_str::<Vec<Value>>(h).ok())
        .unwrap_or_default();
    let mut events = events(&status, ledger.claimed_at, &history);
    let mut recipient = ledger.recipient;
    if !reveal {
        recipient = recipient.map(|a| mask_email(&a));
        for e in &mut events {
            e.smtp_reply = e.smtp_reply.as_deref().map(mask_addresses);
            e.error = e.error.as_deref().map(mask_addresses);
        }
    }
    Ok(Some(Timeline {
        status,
        recipient,
        events,
    }))
}

/// The events of a job: its outbox steps, its ended attempts (`history`), the current attempt
/// from the row, and how it ended.
fn events(status: &JobStatus, claimed_at: Option<DateTime<Utc>>, history: &[Value]) -> Vec<Event> {
    let mut events = vec![event("created", status.created_at)];
    if status.published_at.is_some() {
        events.push(event("published", status.published_at));
    }
    let mut after_dead = false;
    for entry in history.iter().map(attempt_of) {
        if after_dead {
            // An attempt after a dead one: an operator replayed the job.
            events.push(event("replayed", entry.claimed_at));
        }
        after_dead = entry.outcome.as_deref() == Some("dead");
        events.push(entry);
    }
    let current = Event {
        attempt: Some(i64::from(status.attempts)),
        claimed_at,
        ..Event::default()
    };
    match status.state.as_str() {
        "sending" => {
            if after_dead {
                events.push(event("replayed", claimed_at));
            }
            events.push(Event {
                event: "claimed".into(),
                at: claimed_at,
                ..current
            });
        }
        "sent" => {
            if after_dead {
                events.push(event("replayed", claimed_at));
            }
            events.push(Event {
                event: "attempt".into(),
                at: status.sent_at,
                outcome: Some("sent".into()),
                smtp_reply: status.smtp_reply.clone(),
                ..current
            });
            events.push(event("sent", status.sent_at));
        }
        "dead" => {
            let last = events
                .last()
                .filter(|e| e.outcome.as_deref() == Some("dead"));
            events.push(Event {
                class: last.and_then(|e| e.class.clone()),
                error: status.last_error.clone(),
                ..event("dead", status.updated_at)
            });
        }
        _ => {}
    }
    events
}

/// One `history` entry as an ended attempt.
fn attempt_of(entry: &Value) -> Event {
    let text = |key: &str| entry.get(key).and_then(Value::as_str).map(str::to_string);
    let time = |key: &str| {
        entry
            .get(key)
            .and_then(Value::as_str)
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    Event {
        event: "attempt".into(),
        at: time("at"),
        attempt: entry.get("attempt").and_then(Value::as_i64),
        claimed_at: time("claimed_at"),
        outcome: text("status"),
        class: text("class"),
        smtp_reply: text("smtp_reply"),
        error: text("error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(state: &str, attempts: i32) -> JobStatus {
        let at = |s: &str| Some(format!("2026-12-01T10:00:{s}Z").parse().unwrap());
        JobStatus {
            job_id: "j-1".into(),
            kind: "welcome".into(),
            state: state.into(),
            attempts,
            publish_attempts: 1,
            message_id: None,
            smtp_reply: Some("250 ok".into()),
            last_error: Some("550 no such user".into()),
            created_at: at("00"),
            published_at: at("01"),
            updated_at: at("09"),
            sent_at: at("09"),
            template_revision: None,
        }
    }

    fn ended(attempt: i64, outcome: &str) -> Value {
        json!({"event": "attempt", "attempt": attempt, "status": outcome, "class": "rejected",
               "at": "2026-12-01T10:00:05+00:00", "claimed_at": "2026-12-01T10:00:04.5+00:00"})
    }

    fn names(events: &[Event]) -> Vec<&str> {
        events.iter().map(|e| e.event.as_str()).collect()
    }

    #[test]
    fn a_sent_job_after_a_dead_attempt_shows_the_replay_before_its_last_attempt() {
        let events = events(&status("sent", 2), None, &[ended(1, "dead")]);
        assert_eq!(
            names(&events),
            [
                "created",
                "published",
                "attempt",
                "replayed",
                "attempt",
                "sent"
            ]
        );
        assert_eq!(events[2].claimed_at.unwrap().timestamp_subsec_millis(), 500);
        assert_eq!(events[4].attempt, Some(2));
        assert_eq!(events[4].smtp_reply.as_deref(), Some("250 ok"));
    }

    #[test]
    fn a_dead_job_ends_dead_with_the_class_of_its_last_attempt() {
        let events = events(&status("dead", 1), None, &[ended(1, "dead")]);
        assert_eq!(names(&events), ["created", "published", "attempt", "dead"]);
        let dead = events.last().unwrap();
        assert_eq!(dead.class.as_deref(), Some("rejected"));
        assert_eq!(dead.error.as_deref(), Some("550 no such user"));
    }

    #[test]
    fn a_job_under_way_shows_its_claim_and_a_queued_one_only_its_creation() {
        let events = events(&status("sending", 1), None, &[]);
        assert_eq!(names(&events), ["created", "published", "claimed"]);
        let mut queued = status("queued", 0);
        queued.published_at = None;
        assert_eq!(names(&super::events(&queued, None, &[])), ["created"]);
    }
}
