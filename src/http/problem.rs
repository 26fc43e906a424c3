//! The one shape of every error the API answers: an RFC 9457 problem
//! (`application/problem+json`) with `type` (`tag:mailroom,2026:problem/<kind>`), `title`,
//! `status` and `detail`, plus extension members:
//!
//! - `field` (as mailroom has always named it: `to[0]`, `headers.X-Tag`, `Idempotency-Key`,
//!   a query parameter) and `pointer`, its RFC 6901 JSON pointer (`/to/0`), when one field of
//!   the body or the query is at fault (a header has no pointer);
//! - `request_id`, the request's id ([`super::conventions`]), also in the `X-Request-Id`
//!   response header and in the access log line, so a problem a client reports can be found in
//!   the logs;
//! - `error`, the same text as `detail`, kept for clients of the bodies the `/v1/dlq` and status
//!   endpoints answered before problems (deprecated).
//!
//! `/healthz`, `/readyz` and `/metrics` keep their own bodies (docs/OPERATING.md).

use axum::{
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

tokio::task_local! {
    /// The id of the request being answered, set around each handler by
    /// [`super::conventions`], read when a problem is built.
    pub(super) static REQUEST_ID: String;
}

/// An RFC 9457 problem, with the field to fix when there is one.
#[derive(Debug)]
pub(super) struct Problem {
    pub status: StatusCode,
    /// The last segment of `type`: `invalid-job`, `not-found`, …
    pub kind: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub field: Option<String>,
    /// Whether `field` names a header (no JSON pointer then).
    pub header: bool,
    /// Whether to add the deprecated `error` member.
    pub legacy: bool,
}

impl Problem {
    /// A problem of this status, kind, title and detail, about no field in particular.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Problem {
        Problem {
            status,
            kind,
            title,
            detail: detail.into(),
            field: None,
            header: false,
            legacy: false,
        }
    }

    /// The same problem about this field of the body or the query.
    pub fn at(mut self, field: impl Into<String>) -> Problem {
        self.field = Some(field.into());
        self
    }

    /// The same problem about this request header.
    pub fn at_header(mut self, name: &str) -> Problem {
        self.field = Some(name.to_string());
        self.header = true;
        self
    }

    /// A problem whose kind and title follow from the status alone (the shared `error` helper
    /// and axum's own rejections).
    pub fn of_status(status: StatusCode, detail: impl Into<String>) -> Problem {
        let (kind, title) = match status.as_u16() {
            400 => ("bad-request", "The request is malformed"),
            401 => ("unauthorized", "A valid bearer token is required"),
            404 => ("not-found", "Nothing is here"),
            405 => ("method-not-allowed", "This method is not allowed here"),
            413 => ("too-large", "The body is too large"),
            415 => ("unsupported-media-type", "The body must be JSON"),
            422 => ("unprocessable", "The request breaks a rule"),
            503 => ("unavailable", "A service mailroom needs is unavailable"),
            s if s >= 500 => ("server-error", "The server failed to answer"),
            _ => ("client-error", "The request was refused"),
        };
        Problem::new(status, kind, title, detail)
    }

    /// The problem's JSON body.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "type": format!("tag:mailroom,2026:problem/{}", self.kind),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
            "field": self.field,
        });
        if let (Some(field), false) = (&self.field, self.header) {
            body["pointer"] = json!(pointer(field));
        }
        if let Ok(id) = REQUEST_ID.try_with(Clone::clone) {
            body["request_id"] = json!(id);
        }
        if self.legacy {
            body["error"] = json!(self.detail);
        }
        body
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            self.body().to_string(),
        )
            .into_response()
    }
}

/// The RFC 6901 pointer of a field as mailroom names it: `to[0]` is `/to/0`,
/// `headers.X-Tag` is `/headers/X-Tag`, `data` is `/data`.
pub(super) fn pointer(field: &str) -> String {
    let segments: Vec<String> = match field.strip_prefix("headers.") {
        // A header name may itself hold a dot: it is one segment.
        Some(name) => vec!["headers".into(), name.into()],
        None => field
            .split(['[', ']'])
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    };
    segments
        .iter()
        .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_become_json_pointers() {
        assert_eq!(pointer("to[0]"), "/to/0");
        assert_eq!(pointer("cc[12]"), "/cc/12");
        assert_eq!(pointer("data"), "/data");
        assert_eq!(pointer("headers.X-Tag.v2"), "/headers/X-Tag.v2");
        assert_eq!(pointer("a/b~c"), "/a~1b~0c");
    }

    #[test]
    fn a_header_field_has_no_pointer_and_a_problem_outside_a_request_no_request_id() {
        let body = Problem::of_status(StatusCode::BAD_REQUEST, "bad key")
            .at_header("Idempotency-Key")
            .body();
        assert_eq!(body["field"], "Idempotency-Key");
        assert!(body.get("pointer").is_none() && body.get("request_id").is_none());
        assert_eq!(body["type"], "tag:mailroom,2026:problem/bad-request");
    }

    #[tokio::test]
    async fn a_problem_built_inside_a_request_carries_its_id() {
        let body = REQUEST_ID
            .scope("req-1".to_string(), async {
                Problem::of_status(StatusCode::NOT_FOUND, "no such job").body()
            })
            .await;
        assert_eq!(body["request_id"], "req-1");
        assert_eq!(body["status"], 404);
    }
}
