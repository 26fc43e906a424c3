//! The job: the JSON a producer writes to the outbox (or publishes directly) and the worker
//! consumes. Decoding and validation live here so that enqueue time and the worker apply the
//! same rules: addresses parse as RFC 5322 mailboxes, no CR/LF/NUL reaches a header, sizes are
//! bounded. A job that fails here can never succeed, so callers treat every error as permanent.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use lettre::message::Mailbox;
use serde::{Deserialize, Serialize};

/// Largest job body accepted, checked before parsing: a job is an address list and a small
/// data object, and RabbitMQ, the outbox and the dead-letter queue all carry it verbatim.
pub const MAX_JOB_BYTES: usize = 64 * 1024;
/// Longest `job_id`, in bytes of UTF-8 (66 CJK characters, 50 emoji, 200 ASCII ones). Bytes, not
/// characters, bound everything the id becomes: the AMQP `message-id` (a short string of at most
/// 255 bytes) and the Message-ID header, which escapes each non-ASCII byte as `=XX` and must stay
/// under the 998-character line limit.
pub const MAX_JOB_ID_BYTES: usize = 200;
/// Longest `kind`: a template directory name.
pub const MAX_KIND_LEN: usize = 64;
/// Most recipients over to, cc and bcc together. One job is one email; a mass mailing is many jobs.
pub const MAX_RECIPIENTS: usize = 50;
/// RFC 5322 line limit, a fair bound for any one header value we accept.
const MAX_HEADER_VALUE_LEN: usize = 998;

/// A job as it travels on the wire. Unknown fields are rejected so that a producer's typo
/// (`"too": [...]`) is a clear error instead of an email to nobody.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailJob {
    /// With `kind`, the idempotency key: the same pair is sent at most once.
    pub job_id: String,
    /// The template to render, e.g. `order_confirmation`.
    pub kind: String,
    pub to: Vec<String>,
    #[serde(default)]
    pub cc: Vec<String>,
    #[serde(default)]
    pub bcc: Vec<String>,
    #[serde(default)]
    pub reply_to: Option<String>,
    /// Template locale, e.g. `fr` or `pt-BR`; the default templates when absent.
    #[serde(default)]
    pub locale: Option<String>,
    /// The template's variables: a JSON object.
    #[serde(default = "empty_object")]
    pub data: serde_json::Value,
    /// Extra headers: `X-…` names and the `List-…` family only.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    /// Not before: a worker that receives the job earlier parks it in a delay tier, unclaimed,
    /// until this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_at: Option<DateTime<Utc>>,
    /// Not after: a job still unsent at this time is given up as `expired`, never sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// A job that passed validation, with its addresses parsed.
#[derive(Debug, Clone)]
pub struct ValidJob {
    pub job: EmailJob,
    pub to: Vec<Mailbox>,
    pub cc: Vec<Mailbox>,
    pub bcc: Vec<Mailbox>,
    pub reply_to: Option<Mailbox>,
}

/// Why a job was refused. The text names the field and the rule, never a full address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("job is {size} bytes, more than the {max} allowed")]
    TooLarge { size: usize, max: usize },
    #[error("job is not valid JSON of the expected shape: {0}")]
    Malformed(String),
    #[error("job field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

/// Names the field a decoding error happened at, when there is one (`to[0]: invalid type…`).
fn malformed<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> JobError {
    let path = e.path().to_string();
    if path == "." {
        JobError::Malformed(e.inner().to_string())
    } else {
        JobError::Malformed(format!("{path}: {}", e.inner()))
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> JobError {
    JobError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Deserialises `body` as a job, as `serde_path_to_error` over a `serde_json` slice
/// deserializer does (no check for bytes after the value, on either path): first without
/// tracking the path, which every job that parses (nearly all) then pays nothing for, and only
/// when that fails again with the path tracked, so the error still names its field. The
/// tracker wraps every value it passes on: a quarter of each parse (`compose_cost`: 3.3 →
/// 2.5 µs for the bench's job), and the relay parses every row three times.
pub(crate) fn deserialize_job(
    body: &[u8],
) -> Result<EmailJob, serde_path_to_error::Error<serde_json::Error>> {
    if let Ok(job) = EmailJob::deserialize(&mut serde_json::Deserializer::from_slice(body)) {
        return Ok(job);
    }
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
}

impl EmailJob {
    /// Decodes and validates a job body.
    pub fn decode(body: &[u8]) -> Result<ValidJob, JobError> {
        if body.len() > MAX_JOB_BYTES {
            return Err(JobError::TooLarge {
                size: body.len(),
                max: MAX_JOB_BYTES,
            });
        }
        deserialize_job(body).map_err(malformed)?.validate()
    }

    /// Decodes and validates a job already parsed as JSON (the HTTP API's body).
    pub fn from_value(value: serde_json::Value) -> Result<ValidJob, JobError> {
        let job: EmailJob = serde_path_to_error::deserialize(value).map_err(malformed)?;
        job.validate()
    }

    /// Checks every rule and parses the addresses.
    pub fn validate(self) -> Result<ValidJob, JobError> {
        check_job_id(&self.job_id)?;
        check_kind(&self.kind)?;
        if let Some(locale) = &self.locale {
            check_locale(locale)?;
        }
        if !self.data.is_object() {
            return Err(invalid("data", "must be a JSON object"));
        }
        if self.to.is_empty() {
            return Err(invalid("to", "needs at least one recipient"));
        }
        let count = self.to.len() + self.cc.len() + self.bcc.len();
        if count > MAX_RECIPIENTS {
            return Err(invalid(
                "to",
                format!("{count} recipients, more than the {MAX_RECIPIENTS} allowed"),
            ));
        }
        for (name, value) in &self.headers {
            check_extra_header(name, value)?;
        }
        if let (Some(send_at), Some(expires_at)) = (self.send_at, self.expires_at)
            && expires_at <= send_at
        {
            return Err(invalid(
                "expires_at",
                format!("{expires_at} is not after send_at {send_at}: the job could never be sent"),
            ));
        }
        let to = parse_mailboxes("to", &self.to)?;
        let cc = parse_mailboxes("cc", &self.cc)?;
        let bcc = parse_mailboxes("bcc", &self.bcc)?;
        let reply_to = match &self.reply_to {
            Some(raw) => Some(parse_mailbox("reply_to", raw)?),
            None => None,
        };
        Ok(ValidJob {
            job: self,
            to,
            cc,
            bcc,
            reply_to,
        })
    }
}

/// True for characters that must never reach a header: CR, LF, NUL and other C0/C1 controls.
pub fn is_header_unsafe(c: char) -> bool {
    c.is_control()
}

fn check_no_control(field: &str, value: &str) -> Result<(), JobError> {
    if value.contains(['\r', '\n']) {
        return Err(invalid(
            field,
            "contains CR or LF (header injection refused)",
        ));
    }
    if value.chars().any(is_header_unsafe) {
        return Err(invalid(field, "contains a control character"));
    }
    Ok(())
}

fn check_job_id(job_id: &str) -> Result<(), JobError> {
    if job_id.trim().is_empty() {
        return Err(invalid("job_id", "must not be empty"));
    }
    if job_id.len() > MAX_JOB_ID_BYTES {
        return Err(invalid(
            "job_id",
            format!(
                "{} bytes of UTF-8, more than the {MAX_JOB_ID_BYTES} allowed",
                job_id.len()
            ),
        ));
    }
    check_no_control("job_id", job_id)
}

fn check_kind(kind: &str) -> Result<(), JobError> {
    let ok = !kind.is_empty()
        && kind.len() <= MAX_KIND_LEN
        && kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "kind",
            format!("must be 1 to {MAX_KIND_LEN} characters of A-Z, a-z, 0-9, '_' or '-'"),
        ))
    }
}

fn check_locale(locale: &str) -> Result<(), JobError> {
    let mut parts = locale.split('-');
    let lang_ok = parts
        .next()
        .is_some_and(|p| (2..=3).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphabetic()));
    let rest_ok =
        parts.all(|p| (1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()));
    if lang_ok && rest_ok {
        Ok(())
    } else {
        Err(invalid(
            "locale",
            "must be a language tag such as `en` or `pt-BR`",
        ))
    }
}

fn check_extra_header(name: &str, value: &str) -> Result<(), JobError> {
    let field = format!("headers.{name}");
    let lower = name.to_ascii_lowercase();
    let allowed_name = (lower.starts_with("x-") || lower.starts_with("list-"))
        && name.len() > 2
        && name.len() <= 76
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !allowed_name {
        return Err(invalid(
            field,
            "only X-… and List-… header names (letters, digits, '-') may be set",
        ));
    }
    if lower.starts_with("x-mailroom-") {
        return Err(invalid(field, "X-Mailroom-… headers are reserved"));
    }
    if value.len() > MAX_HEADER_VALUE_LEN {
        return Err(invalid(
            field,
            format!("longer than {MAX_HEADER_VALUE_LEN} bytes"),
        ));
    }
    check_no_control(&field, value)
}

/// `text` cut to at most `max` bytes at a character boundary, ending in `…` when it was cut: for
/// reasons and replies copied into headers and the ledger, whose full text is in the log.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

mod address;

pub use address::{
    MAX_RECIPIENT_BYTES, mask_addresses, mask_email, normalised_address, recipient_to_store,
    with_ascii_domain,
};
use address::{parse_mailbox, parse_mailboxes};

#[cfg(test)]
mod tests;
