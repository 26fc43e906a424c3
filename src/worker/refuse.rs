//! A delivery the worker refuses before any claim (it fails validation, or names a kind
//! without a template): a producer that wrote raw SQL the relay could not check, or published
//! straight to the broker. It is dead-lettered with class `invalid`, and when its `job_id` and
//! `kind` are still readable from the body (and valid themselves) the ledger gets a `dead` row
//! with the reason, unless it has a row already: `status` and `GET /v1/emails/…` then tell the
//! truth, and a `sent` row is never overwritten.

use std::time::Duration;

use super::{ErrorClass, Outcome, Worker};
use crate::job::EmailJob;

impl Worker {
    /// Dead-letters a refused delivery as `invalid`, recording it first when it can be named.
    /// If the record cannot be written (database down) the delivery is retried instead, so the
    /// ledger is never left behind the dead-letter queue.
    pub(super) async fn refuse(&self, body: &[u8], reason: String) -> Outcome {
        if let Some((job_id, kind)) = readable_key(body) {
            // Boxed: the statement's future is some 18 KB, and every delivery's task would
            // carry (and copy when spawned) that much for this rare path.
            match Box::pin(self.db.record_refused(&job_id, &kind, &reason)).await {
                Ok(inserted) => tracing::debug!(inserted, "refused job recorded dead"),
                Err(e) => {
                    return Outcome::Retry {
                        delay: self.settings.topology.tier_for(Duration::ZERO),
                        reason: format!("database unavailable while recording a refused job: {e}"),
                    };
                }
            }
        }
        Outcome::DeadLetter {
            class: ErrorClass::Invalid,
            reason,
            attempts: 0,
        }
    }
}

/// The `(job_id, kind)` of a refused body, when both are strings that pass validation on their
/// own (so the ledger's columns hold them).
pub(super) fn readable_key(body: &[u8]) -> Option<(String, String)> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let job_id = value.get("job_id")?.as_str()?.to_string();
    let kind = value.get("kind")?.as_str()?.to_string();
    let probe = EmailJob {
        job_id,
        kind,
        to: vec!["probe@example.com".into()],
        cc: vec![],
        bcc: vec![],
        reply_to: None,
        locale: None,
        data: serde_json::json!({}),
        headers: Default::default(),
        created_at: None,
        send_at: None,
        expires_at: None,
    };
    let valid = probe.validate().ok()?;
    Some((valid.job.job_id, valid.job.kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_body_is_named_when_its_id_and_kind_are_valid() {
        let body = br#"{"job_id":"j-1","kind":"no_such_kind","to":["x"],"data":[]}"#;
        assert_eq!(
            readable_key(body),
            Some(("j-1".to_string(), "no_such_kind".to_string()))
        );
    }

    #[test]
    fn a_refused_body_without_a_valid_id_or_kind_is_not_named() {
        assert_eq!(readable_key(b"not json"), None);
        assert_eq!(readable_key(br#"{"job_id":"j-1"}"#), None);
        assert_eq!(readable_key(br#"{"job_id":"","kind":"welcome"}"#), None);
        assert_eq!(readable_key(br#"{"job_id":"j-1","kind":"../etc"}"#), None);
        assert_eq!(readable_key(br#"{"job_id":7,"kind":"welcome"}"#), None);
    }
}
