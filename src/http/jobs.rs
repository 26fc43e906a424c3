//! `/v1/jobs`: every job findable, with its timeline (see [`crate::jobs`]).
//!
//! - `GET /v1/jobs?job_id=&recipient=&kind=&state=&since=&until=&limit=&cursor=&reveal=`:
//!   `{"jobs": [...], "next_cursor"}`, newest first; pass `next_cursor` back as `cursor` for the
//!   next page (none after the last). `job_id=order-*` is a prefix. A filter that cannot be used
//!   is a 400 problem naming it. Recipients are masked unless `reveal=true`.
//! - `GET /v1/jobs/{job_id}/{kind}/timeline?reveal=`: the job's status and its events
//!   (created, published, each attempt with its SMTP reply or error, replayed, sent or dead);
//!   404 when neither the outbox nor the ledger has it.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::Deserialize;

use super::ApiState;
use super::problem::Problem;
use crate::jobs::{self, Search, SearchError};

/// Query parameters of the timeline.
#[derive(Debug, Default, Deserialize)]
pub(super) struct TimelineQuery {
    #[serde(default)]
    reveal: bool,
}

fn bad_query(rejection: &QueryRejection) -> Response {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "bad-filter",
        "A filter cannot be used",
        rejection.body_text(),
    )
    .into_response()
}

fn unavailable(detail: String) -> Response {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "database-unavailable",
        "The database is unavailable",
        detail,
    )
    .into_response()
}

pub(super) async fn search(
    State(state): State<Arc<ApiState>>,
    query: Result<Query<Search>, QueryRejection>,
) -> Response {
    let Query(search) = match query {
        Ok(q) => q,
        Err(rejection) => return bad_query(&rejection),
    };
    match jobs::search(&state.db, &search).await {
        Ok(page) => Json(page).into_response(),
        Err(SearchError::Filter(e)) => Problem::new(
            StatusCode::BAD_REQUEST,
            "bad-filter",
            "A filter cannot be used",
            e.to_string(),
        )
        .at(e.field)
        .into_response(),
        Err(e @ SearchError::Database(_)) => unavailable(e.to_string()),
    }
}

pub(super) async fn timeline(
    State(state): State<Arc<ApiState>>,
    Path((job_id, kind)): Path<(String, String)>,
    query: Result<Query<TimelineQuery>, QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(rejection) => return bad_query(&rejection),
    };
    match jobs::timeline(&state.db, &job_id, &kind, q.reveal).await {
        Ok(Some(timeline)) => Json(timeline).into_response(),
        Ok(None) => Problem::of_status(
            StatusCode::NOT_FOUND,
            format!("no job {job_id:?} of kind {kind:?} in the outbox or the ledger"),
        )
        .into_response(),
        Err(e) => unavailable(format!("database unavailable: {e:#}")),
    }
}
