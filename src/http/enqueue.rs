//! `POST /v1/emails`: the HTTP door. The body is a job as JSON; the `Idempotency-Key` header,
//! when present, is its `job_id`. The job passes the one validation ([`crate::door`], with the
//! live templates), is written to the outbox, and the answer is `202 Accepted` with a
//! `Location` to poll. Refusals are `application/problem+json` (RFC 9457) with a `field`
//! member naming what to fix:
//!
//! | status | type (`tag:mailroom,2026:problem/…`) | when |
//! |---|---|---|
//! | 400 | `not-json` | the body is not JSON |
//! | 400 | `idempotency-key-mismatch` | the header and the body's `job_id` disagree |
//! | 413 | `too-large` | the body is larger than the job limit (64 KiB) |
//! | 415 | `unsupported-media-type` | the Content-Type is not JSON (nor `curl -d`'s form type) |
//! | 422 | `invalid-job` | a field breaks a rule (size as published, kind, ids, addresses, headers) |
//! | 422 | `idempotency-key-reused` | the key was used before with a different body |
//!
//! A retried request (the same key and the same job, spelled any way: spacing, key order,
//! omitted defaults, a different or missing `created_at`) is `202` with `duplicate: true` and
//! writes nothing. The comparison needs the first request's outbox row: once retention deleted
//! it, a retry with any body is answered as a duplicate.

use std::sync::Arc;

use axum::{
    Json,
    body::Bytes,
    extract::{State, rejection::BytesRejection},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::problem::Problem;
use super::{ApiState, encode};
use crate::db::outbox::{self, Enqueued};
use crate::door::{self, Admitted};
use crate::job::{EmailJob, JobError, MAX_JOB_BYTES};

/// A job that breaks a rule: 422 naming its field.
fn invalid(e: &JobError) -> Problem {
    let problem = Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-job",
        "The job breaks a rule",
        e.to_string(),
    );
    match e {
        JobError::Invalid { field, .. } => problem.at(field.clone()),
        _ => problem,
    }
}

/// A problem with the `Idempotency-Key` header.
fn key_problem(
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
) -> Problem {
    Problem::new(status, kind, title, detail).at_header("Idempotency-Key")
}

pub(super) async fn enqueue(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match admit_and_write(&state, &headers, body).await {
        Ok(response) => response,
        Err(problem) => problem.into_response(),
    }
}

/// The steps of the door: read the job, admit it, write it, answer where to poll.
async fn admit_and_write(
    state: &ApiState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let job = job_of(read_body(body)?, headers)?;
    let admitted = admit(state, &job)?;
    let done = write(state, &admitted).await?;
    let job = admitted.job();
    if done == Enqueued::AlreadyQueued {
        check_retry(state, job, headers).await?;
    }
    tracing::debug!(job_id = %job.job_id, kind = %job.kind, duplicate = done == Enqueued::AlreadyQueued, "job enqueued");
    if let (Enqueued::New(_), Some(wake)) = (done, &state.relay_wake) {
        wake.notify_one();
    }
    Ok(accepted(job, done == Enqueued::AlreadyQueued))
}

/// The one validation ([`outbox::admit_for_outbox`]), against the live templates when the
/// server has them.
fn admit(state: &ApiState, job: &EmailJob) -> Result<Admitted, Problem> {
    let templates = state.templates.as_ref().map(|t| t.current());
    outbox::admit_for_outbox(job, templates.as_deref()).map_err(|e| invalid(&e))
}

/// Writes the job to the outbox; nothing when its key is there already.
async fn write(state: &ApiState, admitted: &Admitted) -> Result<Enqueued, Problem> {
    state.db.enqueue_admitted(admitted).await.map_err(|e| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database-unavailable",
            "The database is unavailable",
            format!("database unavailable: {e}"),
        )
    })
}

/// A key already queued: [`check_same_request`], naming the field that carried the key (the
/// header, or the body's `job_id`).
async fn check_retry(state: &ApiState, job: &EmailJob, headers: &HeaderMap) -> Result<(), Problem> {
    check_same_request(state, job).await.map_err(|problem| {
        if headers.contains_key("idempotency-key") {
            problem
        } else {
            problem.at("job_id")
        }
    })
}

/// `202 Accepted`, with the job's status URL in `Location` and in the body.
fn accepted(job: &EmailJob, duplicate: bool) -> Response {
    let location = format!("/v1/emails/{}/{}", encode(&job.job_id), encode(&job.kind));
    let body = json!({
        "job_id": job.job_id, "kind": job.kind,
        "duplicate": duplicate, "status_url": location,
    });
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response()
}

/// The body as JSON: 413 past the job limit (axum's body limit is set to it), 400 when not JSON.
fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Value, Problem> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(
                rejection.status(),
                "too-large",
                "The body is larger than the job limit",
                format!("the body is larger than the job limit of {MAX_JOB_BYTES} bytes"),
            )
        } else {
            Problem::new(
                rejection.status(),
                "unreadable-body",
                "The body could not be read",
                rejection.body_text(),
            )
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "not-json",
            "The body is not JSON",
            format!("body is not JSON: {e}"),
        )
    })
}

/// The job of a body, with the `Idempotency-Key` header as its `job_id`.
fn job_of(mut value: Value, headers: &HeaderMap) -> Result<EmailJob, Problem> {
    if let Some(key) = headers.get("idempotency-key") {
        let Ok(key) = key.to_str() else {
            return Err(key_problem(
                StatusCode::BAD_REQUEST,
                "idempotency-key-mismatch",
                "The Idempotency-Key header is not visible ASCII",
                "the Idempotency-Key header is not visible ASCII".into(),
            ));
        };
        if let Some(obj) = value.as_object_mut() {
            match obj.get("job_id") {
                Some(Value::String(id)) if id != key => {
                    return Err(key_problem(
                        StatusCode::BAD_REQUEST,
                        "idempotency-key-mismatch",
                        "The Idempotency-Key header and the body's job_id disagree",
                        format!("Idempotency-Key {key:?} but job_id {id:?}"),
                    ));
                }
                _ => {
                    obj.insert("job_id".into(), Value::String(key.to_string()));
                }
            }
        }
    }
    door::from_value(value).map_err(|e| invalid(&e))
}

/// A key already in the outbox: the same request again is fine, another body is not.
async fn check_same_request(state: &ApiState, job: &EmailJob) -> Result<(), Problem> {
    let stored = match state.db.outbox_payload(&job.job_id, &job.kind).await {
        Ok(Some(text)) => text,
        // Deleted by retention (or unreadable): nothing to compare with.
        Ok(None) | Err(_) => return Ok(()),
    };
    let same = door::parse(stored.as_bytes()).is_ok_and(|first| door::same_request(&first, job));
    if same {
        return Ok(());
    }
    Err(key_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reused",
        "The Idempotency-Key was used before with a different body",
        format!(
            "job {:?} of kind {:?} was enqueued before with a different body; use a new key for a new job",
            job.job_id, job.kind
        ),
    ))
}
