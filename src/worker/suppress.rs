//! The suppression list at the worker: a job's claim reads the suppression list's entries for
//! its recipients in the claim's own statement (`ClaimRequest::screen`), so the lookup costs no
//! statement or round trip of its own. Suppressed `cc` and `bcc` addresses, and suppressed `to`
//! addresses beside others, are left out of the email; a job whose every `to` address is
//! suppressed is not sent: its row becomes `dead` with class `suppressed` (no dead letter:
//! nothing failed), and `status` says `suppressed`. A one-recipient job the SMTP server refused
//! as an unknown mailbox or domain suppresses its address (`MAILROOM_SUPPRESS_BOUNCES`).

use uuid::Uuid;

use super::Worker;
use super::outcome::Outcome;
use super::stats::Stats;
use crate::db::suppressions::{self, Reason, SUPPRESSED, Suppression};
use crate::db::{LedgerStatus, Record};
use crate::job::{ValidJob, mask_email};

/// The enhanced status codes of a refused address (RFC 3463, X.1.Y "addressing status"): bad
/// destination mailbox (5.1.1), bad destination system (5.1.2), no mail accepted by the
/// domain (5.1.10, RFC 7505).
const UNKNOWN_ADDRESS: [&str; 3] = ["5.1.1", "5.1.2", "5.1.10"];

/// What the suppression list leaves of a job.
pub(super) enum Screened {
    /// Send it, to the recipients left.
    Send(ValidJob),
    /// Every `to` address is suppressed: the first entry says why.
    Suppressed(ValidJob, Suppression),
}

/// The job's recipients as the suppression list keys them, for its claim to look up.
pub(super) fn screen_keys(job: &ValidJob) -> Vec<String> {
    let mut keys: Vec<String> = (job.to.iter().chain(&job.cc).chain(&job.bcc))
        .filter_map(|m| suppressions::key(m.email.as_ref()).ok())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Leaves the recipients among `found` (the entries the claim read) out of the job.
pub(super) fn screen(mut job: ValidJob, found: Vec<Suppression>) -> Screened {
    if found.is_empty() {
        return Screened::Send(job);
    }
    let suppressed = |address: &str| {
        suppressions::key(address).is_ok_and(|k| found.iter().any(|s| s.address == k))
    };
    let to_before = job.to.len();
    let whole = job.clone();
    retain(&mut job.to, &mut job.job.to, &suppressed);
    if job.to.is_empty() {
        // The job as it came, and why its first `to` address is suppressed (not a cc's).
        let to_keys: Vec<String> = (whole.to.iter())
            .filter_map(|m| suppressions::key(m.email.as_ref()).ok())
            .collect();
        let first = (found.iter().find(|s| to_keys.contains(&s.address)))
            .or(found.first())
            .cloned()
            .expect("found is not empty");
        return Screened::Suppressed(whole, first);
    }
    let left_out = to_before - job.to.len()
        + retain(&mut job.cc, &mut job.job.cc, &suppressed)
        + retain(&mut job.bcc, &mut job.job.bcc, &suppressed);
    tracing::info!(left_out, "suppressed recipients left out of the email");
    Screened::Send(job)
}

impl Worker {
    /// A claimed job to suppressed addresses only: recorded `suppressed`, never sent.
    pub(super) async fn suppressed(
        &self,
        job: &ValidJob,
        token: Uuid,
        entry: Suppression,
    ) -> Outcome {
        let reason = format!(
            "not sent: {} is suppressed ({}{}, since {})",
            mask_email(&entry.address),
            entry.reason,
            entry.detail.map(|d| format!(": {d}")).unwrap_or_default(),
            entry.created_at.format("%Y-%m-%d %H:%M:%SZ"),
        );
        match self.record_suppressed(job, token, &reason).await {
            Ok(()) => Outcome::Suppressed { reason },
            // Not acked unrecorded: no dead letter would tell of the job, and its row would say
            // `sending` for good. The claim goes back and the next copy is screened again.
            Err(e) => {
                let why = format!("cannot record the suppressed job: {e}");
                self.give_back(job, token, why).await
            }
        }
    }

    async fn record_suppressed(
        &self,
        job: &ValidJob,
        token: Uuid,
        reason: &str,
    ) -> Result<(), std::sync::Arc<sqlx::Error>> {
        let record = Record {
            job_id: &job.job.job_id,
            kind: &job.job.kind,
            token: Some(token),
            status: LedgerStatus::Dead,
            smtp_reply: None,
            error: Some(reason),
            class: Some(SUPPRESSED),
        };
        self.write_record(&record, None).await.map(|_| ())
    }

    /// After a permanent refusal: suppresses the address of a one-recipient job when the reply
    /// names an unknown mailbox or domain and `MAILROOM_SUPPRESS_BOUNCES` is on. With several
    /// recipients the reply does not say whose address it was.
    pub(super) async fn suppress_bounced(&self, job: &ValidJob, reply: &str) {
        if !self.settings.suppress_bounces || !is_unknown_address(reply) {
            return;
        }
        let [only] = job.to.as_slice() else { return };
        if !job.cc.is_empty() || !job.bcc.is_empty() {
            return;
        }
        let Ok(key) = suppressions::key(only.email.as_ref()) else {
            return;
        };
        let detail = crate::job::clip(&crate::job::mask_addresses(reply), 500);
        let by = format!("worker, job {}", crate::job::clip(&job.job.job_id, 200));
        match self
            .db
            .suppress(&key, Reason::HardBounce, Some(&detail), &by)
            .await
        {
            Ok(()) => {
                Stats::bump(&self.stats.bounces_suppressed);
                tracing::info!(
                    to = mask_email(&key),
                    "address suppressed after a hard bounce"
                );
            }
            Err(e) => tracing::warn!(error = %e, "cannot suppress the bounced address"),
        }
    }
}

/// Keeps the recipients that are not suppressed, in both the parsed and the raw list (the same
/// order); returns how many were left out.
fn retain(
    parsed: &mut Vec<lettre::message::Mailbox>,
    raw: &mut Vec<String>,
    suppressed: &impl Fn(&str) -> bool,
) -> usize {
    let before = parsed.len();
    let keep: Vec<bool> = parsed
        .iter()
        .map(|m| !suppressed(m.email.as_ref()))
        .collect();
    let mut flags = keep.iter();
    parsed.retain(|_| *flags.next().unwrap_or(&true));
    if raw.len() == keep.len() {
        let mut flags = keep.iter();
        raw.retain(|_| *flags.next().unwrap_or(&true));
    }
    before - parsed.len()
}

/// Whether an SMTP reply refuses an address as unknown: an enhanced status code of
/// [`UNKNOWN_ADDRESS`] as a word of its own.
pub(super) fn is_unknown_address(reply: &str) -> bool {
    reply
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .any(|word| UNKNOWN_ADDRESS.contains(&word))
}

#[cfg(test)]
mod tests {
    use super::{Screened, Suppression, is_unknown_address, screen, screen_keys};
    use crate::db::suppressions::Reason;
    use crate::job::{EmailJob, ValidJob};

    fn job(to: &[&str], cc: &[&str]) -> ValidJob {
        let json = serde_json::json!({
            "job_id": "screen-1", "kind": "welcome", "to": to, "cc": cc, "bcc": [],
            "data": {}, "created_at": "2026-12-01T12:00:00Z"
        });
        EmailJob::decode(json.to_string().as_bytes()).unwrap()
    }

    fn entry(address: &str) -> Suppression {
        Suppression {
            address: address.into(),
            reason: Reason::Complaint,
            detail: None,
            created_by: "test".into(),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn the_keys_are_every_recipient_normalised_once() {
        let job = job(
            &["Ada <ada@Example.COM>", "bob@example.com"],
            &["ada@example.com"],
        );
        assert_eq!(
            screen_keys(&job),
            vec!["ada@example.com".to_owned(), "bob@example.com".to_owned()]
        );
    }

    #[test]
    fn a_suppressed_cc_is_left_out_of_both_lists_and_the_rest_goes() {
        let job = job(
            &["ada@example.com"],
            &["cc@example.com", "keep@example.com"],
        );
        let Screened::Send(left) = screen(job, vec![entry("cc@example.com")]) else {
            panic!("a job with its `to` left must be sent");
        };
        assert_eq!(left.cc.len(), 1);
        assert_eq!(left.job.cc, vec!["keep@example.com".to_owned()]);
        assert_eq!(left.to.len(), 1);
    }

    #[test]
    fn a_job_with_no_to_left_names_the_to_entry_not_a_cc_one() {
        let job = job(&["Ada@example.com"], &["cc@example.com"]);
        // Another case in the local part is another mailbox: not suppressed.
        let found = vec![entry("ada@example.com"), entry("cc@example.com")];
        assert!(matches!(screen(job.clone(), found), Screened::Send(_)));
        let found = vec![entry("cc@example.com"), entry("Ada@example.com")];
        let Screened::Suppressed(whole, why) = screen(job, found) else {
            panic!("every `to` address is suppressed");
        };
        assert_eq!(why.address, "Ada@example.com");
        assert_eq!(
            whole.job.cc,
            vec!["cc@example.com".to_owned()],
            "the job as it came"
        );
    }

    #[test]
    fn only_an_unknown_mailbox_or_domain_counts_as_a_hard_bounce() {
        assert!(is_unknown_address(
            "550 5.1.1 <ada@example.com>: mailbox unavailable"
        ));
        assert!(is_unknown_address("RCPT: 556 5.1.10 null MX"));
        assert!(is_unknown_address("550-5.1.2 no such domain"));
        assert!(!is_unknown_address("552 5.3.4 message too big"));
        assert!(!is_unknown_address("550 5.1.11 something else"));
        assert!(!is_unknown_address("550 15.1.1 not a code"));
        assert!(!is_unknown_address("550 mailbox unavailable"));
    }
}
