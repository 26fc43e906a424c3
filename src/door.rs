//! One validation at every door a job can enter by: the HTTP API, `mailroom enqueue` and
//! `publish`, the Rust outbox API, the relay before it publishes, and (through
//! [`EmailJob::decode`]) the worker.
//!
//! The size is checked on the bytes the worker will read. Those are not the bytes a producer
//! sent: PostgreSQL's JSONB (and MySQL 8's JSON) re-spell a payload, with other spacing, key
//! order and number spelling. So the relay never publishes the stored text: it parses the row
//! and publishes the job's canonical serialisation ([`wire_body`]), after checking exactly
//! those bytes with [`EmailJob::decode`], the worker's own function. A door computes the same
//! canonical bytes and checks them the same way, so "accepted at the door" and "accepted by
//! the relay and the worker" are one decision. Canonical means: serde_json's compact form of
//! [`EmailJob`] (fields in declaration order, every default written but an unset `send_at` or
//! `expires_at`, object keys sorted),
//! integral numbers from 1e16 up written as integers (PostgreSQL spells them so), no `-0`,
//! and a fixed point of parse-then-serialise. Numbers outside -2^63..2^64 are refused: a
//! database may re-spell them into digits that do not parse back to the same value.
//!
//! The kind is checked against the templates where a door has them (`serve`, `run`,
//! `enqueue`/`publish` with `--templates`). The relay has none: a raw row with an unknown kind
//! is published, and the worker refuses it and records it `dead` (class `invalid`).

use crate::job::{EmailJob, JobError, ValidJob};
use crate::render::Templates;

/// Parse-then-serialise rounds allowed before a job's numbers count as unstable.
const FIXED_POINT_ROUNDS: usize = 4;
/// Numbers in `data` must be below this (2^64) and at least -2^63: the integer range.
const MAX_NUMBER: f64 = 18_446_744_073_709_551_616.0;
/// Integral floats from here up are written in exponent form by serde_json, which PostgreSQL
/// turns into plain digits; they are written as integers instead.
const INTEGRAL_FROM: f64 = 1e16;

/// A job a door let in: validated, with the exact bytes that will be published.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub valid: ValidJob,
    /// The canonical serialisation: what the outbox stores, the relay publishes and the
    /// worker reads. At most [`crate::job::MAX_JOB_BYTES`].
    pub body: Vec<u8>,
}

impl Admitted {
    pub fn job(&self) -> &EmailJob {
        &self.valid.job
    }

    /// The body as text, for the outbox's JSON column.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The one validation of a new job: refused if its `expires_at` has already passed (it could
/// never be sent), then [`admit_any`]. Every error names a field.
pub fn admit(job: EmailJob, templates: Option<&Templates>) -> Result<Admitted, JobError> {
    if let Some(at) = job.expires_at
        && at <= chrono::Utc::now()
    {
        return Err(invalid(
            "expires_at",
            format!(
                "{} has already passed: the job could never be sent",
                at.to_rfc3339()
            ),
        ));
    }
    admit_any(job, templates)
}

/// Canonical bytes, then the worker's decode of exactly those bytes, then the kind against
/// `templates` when given. A job that expired since it was written is let through: the worker
/// records it `expired`, so its status says what became of it.
fn admit_any(job: EmailJob, templates: Option<&Templates>) -> Result<Admitted, JobError> {
    check_no_nul(&job)?;
    let body = wire_body(job)?;
    let valid = match EmailJob::decode(&body) {
        Ok(valid) => valid,
        Err(JobError::TooLarge { size, max }) => return Err(too_large(&body, size, max)),
        Err(e) => return Err(e),
    };
    if let Some(templates) = templates
        && !templates.contains(&valid.job.kind)
    {
        return Err(invalid(
            "kind",
            format!("no template for kind {:?}", valid.job.kind),
        ));
    }
    Ok(Admitted { valid, body })
}

/// [`admit`] for text as a database returns it (the relay's view of an outbox row): parsed
/// whatever its spelling, then admitted like any job.
pub fn admit_stored(payload: &str, templates: Option<&Templates>) -> Result<Admitted, JobError> {
    admit_any(parse(payload.as_bytes())?, templates)
}

/// Deserialises a job without validating it, naming the field a shape error is at.
pub fn parse(body: &[u8]) -> Result<EmailJob, JobError> {
    crate::job::deserialize_job(body).map_err(shape_error)
}

/// [`parse`] for a JSON value (the HTTP API's body).
pub fn from_value(value: serde_json::Value) -> Result<EmailJob, JobError> {
    serde_path_to_error::deserialize(value).map_err(shape_error)
}

fn shape_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> JobError {
    let path = e.path().to_string();
    let reason = e.inner().to_string();
    if path == "." {
        JobError::Malformed(reason)
    } else {
        invalid(path, reason)
    }
}

/// The canonical serialisation of `job` (see the module's doc): a fixed point of
/// parse-then-serialise, so whoever parses it and serialises again gets the same bytes.
pub fn wire_body(mut job: EmailJob) -> Result<Vec<u8>, JobError> {
    normalise_numbers(&mut job.data)?;
    let mut body = serde_json::to_vec(&job).map_err(|e| JobError::Malformed(e.to_string()))?;
    for _ in 0..FIXED_POINT_ROUNDS {
        let mut again = parse(&body)?;
        normalise_numbers(&mut again.data)?;
        let next = serde_json::to_vec(&again).map_err(|e| JobError::Malformed(e.to_string()))?;
        if next == body {
            return Ok(body);
        }
        body = next;
    }
    Err(invalid(
        "data",
        "a number does not survive a JSON round trip unchanged",
    ))
}

/// Whether two jobs are the same request: equal canonical forms, `created_at` aside (a door
/// fills it in when the producer did not). Spacing, key order and omitted defaults do not
/// count; `1` and `1.0` do (a template renders them differently).
pub fn same_request(a: &EmailJob, b: &EmailJob) -> bool {
    let strip = |j: &EmailJob| {
        let mut j = j.clone();
        j.created_at = None;
        wire_body(j).ok()
    };
    match (strip(a), strip(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn normalise_numbers(value: &mut serde_json::Value) -> Result<(), JobError> {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            let Some(f) = n.as_f64().filter(|_| n.is_f64()) else {
                return Ok(());
            };
            if !(i64::MIN as f64..MAX_NUMBER).contains(&f) {
                return Err(invalid(
                    "data",
                    format!("number {n} is out of range (-2^63 to 2^64)"),
                ));
            }
            if f == 0.0 && f.is_sign_negative() {
                *n = serde_json::Number::from_f64(0.0).expect("finite");
            } else if f.abs() >= INTEGRAL_FROM {
                // Every float this large is integral, and fits u64 or i64 by the check above.
                *n = if f > 0.0 {
                    serde_json::Number::from(f as u64)
                } else {
                    serde_json::Number::from(f as i64)
                };
            }
            Ok(())
        }
        Value::Array(items) => items.iter_mut().try_for_each(normalise_numbers),
        Value::Object(map) => map.values_mut().try_for_each(normalise_numbers),
        _ => Ok(()),
    }
}

/// PostgreSQL can store U+0000 neither in JSONB nor in text: refuse it at the door instead of
/// failing the insert as if the database were down.
fn check_no_nul(job: &EmailJob) -> Result<(), JobError> {
    fn has_nul(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(has_nul),
            serde_json::Value::Object(map) => {
                map.iter().any(|(k, v)| k.contains('\0') || has_nul(v))
            }
            _ => false,
        }
    }
    if has_nul(&job.data) {
        return Err(invalid(
            "data",
            "contains U+0000, which the outbox cannot store",
        ));
    }
    Ok(())
}

/// Names the largest field of a job that is too large, so the producer knows what to trim.
fn too_large(body: &[u8], size: usize, max: usize) -> JobError {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let largest = value.as_object().and_then(|fields| {
        fields
            .iter()
            .map(|(name, v)| (v.to_string().len(), name.clone()))
            .max()
    });
    let (part, field) = largest.unwrap_or((size, "data".into()));
    invalid(
        field.clone(),
        format!(
            "the job is {size} bytes as published, more than the {max} allowed (`{field}` is {part} of them)"
        ),
    )
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> JobError {
    JobError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests;
