//! `/v1/suppressions`: the addresses mailroom does not send to, as `mailroom suppressions`.
//!
//! - `GET /v1/suppressions?reason=&limit=`: `{"suppressions": [...]}`, newest first (at most
//!   `limit`, 100 by default, 1000 at most).
//! - `GET /v1/suppressions/{address}`: the entry, or 404 when the address is not suppressed.
//! - `PUT /v1/suppressions/{address}` with `{"reason": "unsubscribed", "detail": "…", "by":
//!   "…"}` (every member optional; `reason` is `manual` by default): the entry as stored.
//! - `DELETE /v1/suppressions/{address}`: 204, or 404 when it was not suppressed.
//!
//! Addresses are normalised (the domain's case does not matter, the local part's does).

use std::sync::Arc;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::json;

use super::ApiState;
use super::problem::Problem;
use crate::db::suppressions::{self, Reason};

/// Query parameters of the listing.
#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    reason: Option<String>,
    limit: Option<u32>,
}

/// The body of a PUT.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    reason: Option<String>,
    detail: Option<String>,
    by: Option<String>,
}

fn bad(kind: &'static str, detail: String, field: &str) -> Response {
    Problem::new(
        StatusCode::BAD_REQUEST,
        kind,
        "The request cannot be used",
        detail,
    )
    .at(field)
    .into_response()
}

fn unavailable(e: &sqlx::Error) -> Response {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "database-unavailable",
        "The database is unavailable",
        format!("database unavailable: {e}"),
    )
    .into_response()
}

fn reason(text: Option<&str>) -> Result<Option<Reason>, String> {
    text.map(|r| r.parse::<Reason>()).transpose()
}

pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(rejection) => return bad("bad-filter", rejection.body_text(), "limit"),
    };
    let reason = match reason(q.reason.as_deref()) {
        Ok(r) => r,
        Err(e) => return bad("bad-reason", e, "reason"),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    match state.db.suppressions(reason, None, limit).await {
        Ok(list) => Json(json!({ "suppressions": list })).into_response(),
        Err(e) => unavailable(&e),
    }
}

pub(super) async fn show(
    State(state): State<Arc<ApiState>>,
    Path(address): Path<String>,
) -> Response {
    let key = match suppressions::key(&address) {
        Ok(key) => key,
        Err(e) => return bad("bad-address", e, "address"),
    };
    match state.db.suppressed_among(std::slice::from_ref(&key)).await {
        Ok(found) => match found.into_iter().next() {
            Some(entry) => Json(entry).into_response(),
            None => not_suppressed(&key),
        },
        Err(e) => unavailable(&e),
    }
}

pub(super) async fn put(
    State(state): State<Arc<ApiState>>,
    Path(address): Path<String>,
    body: Bytes,
) -> Response {
    let key = match suppressions::key(&address) {
        Ok(key) => key,
        Err(e) => return bad("bad-address", e, "address"),
    };
    let entry: Entry = if body.is_empty() {
        Entry::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(entry) => entry,
            Err(e) => return bad("bad-body", format!("the body is not an entry: {e}"), ""),
        }
    };
    let reason = match reason(entry.reason.as_deref()) {
        Ok(r) => r.unwrap_or(Reason::Manual),
        Err(e) => return bad("bad-reason", e, "reason"),
    };
    let by = entry.by.as_deref().unwrap_or("api");
    let stored = state
        .db
        .suppress(&key, reason, entry.detail.as_deref(), by)
        .await;
    if let Err(e) = stored {
        return unavailable(&e);
    }
    show(State(state), Path(key)).await
}

pub(super) async fn delete(
    State(state): State<Arc<ApiState>>,
    Path(address): Path<String>,
) -> Response {
    let key = match suppressions::key(&address) {
        Ok(key) => key,
        Err(e) => return bad("bad-address", e, "address"),
    };
    match state.db.unsuppress(&key).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => not_suppressed(&key),
        Err(e) => unavailable(&e),
    }
}

fn not_suppressed(key: &str) -> Response {
    Problem::of_status(StatusCode::NOT_FOUND, format!("{key} is not suppressed")).into_response()
}
