//! `/v1/dlq`: the dead letters over HTTP, the same operations as `mailroom dlq` and the same
//! JSON as its `--json` output (both call [`crate::dlq`]). Reads use the table only: no broker.
//!
//! - `GET /v1/dlq?kind=&class=&since=&until=&text=&state=&cursor=&limit=&summary=true`: a page
//!   `{"letters": [...], "next": cursor|null}` (or the counts); a class that is not one
//!   mailroom writes is a 400 listing the classes.
//! - `GET /v1/dlq/groups?…`: the failure groups, same filters.
//! - `GET /v1/dlq/{id}`: the row with that id, or the job's rows, in full with its ledger row;
//!   every email address masked unless `?reveal=true`, as `mailroom dlq show [--reveal]`.
//! - `POST /v1/dlq/replay` with one selection: `{"rows": [...]}`, `{"ids": [...]}` (job ids),
//!   `{"group": G}`, a filter (`kind`, `class`, `text`, with `since`, `until`) or
//!   `{"all": true}`; plus `"dry_run": true` to render with the live templates and change
//!   nothing. The rows record `api` as who replayed.
//! - `POST /v1/dlq/purge`, the same selection, plus `"delete": true` to delete the rows.
//!
//! A replay or purge answers 200 with its report when every selected row was handled; 502
//! with the report when some stayed dead (publish failed, interrupted); 404 when ids were named
//! and none is dead.

mod query;

use std::sync::Arc;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use super::{ApiState, error};
use crate::dlq::{DeadLetters, Detail, Replayer, Report, Selection, seal};
use query::{ListQuery, ShowQuery, parse};

/// Who the rows record as having replayed or purged through the API.
const ACTOR: &str = "api";

fn table(state: &ApiState) -> DeadLetters {
    DeadLetters::new(state.db.clone())
}

fn unavailable(e: &anyhow::Error) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, None, &format!("{e:#}"))
}

pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    Query(q): Query<ListQuery>,
) -> Response {
    let (filter, cursor) = match q.filter() {
        Ok(parsed) => parsed,
        Err(response) => return *response,
    };
    let dlq = table(&state);
    if q.summary {
        return match dlq.summary(&filter).await {
            Ok(summary) => Json(summary).into_response(),
            Err(e) => unavailable(&e),
        };
    }
    match dlq.list(&filter, cursor, q.limit.unwrap_or(50)).await {
        Ok(page) => Json(page).into_response(),
        Err(e) => unavailable(&e),
    }
}

pub(super) async fn groups(
    State(state): State<Arc<ApiState>>,
    Query(q): Query<ListQuery>,
) -> Response {
    let (filter, _) = match q.filter() {
        Ok(parsed) => parsed,
        Err(response) => return *response,
    };
    match table(&state).groups(&filter).await {
        Ok(groups) => Json(groups).into_response(),
        Err(e) => unavailable(&e),
    }
}

pub(super) async fn show(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    Query(q): Query<ShowQuery>,
) -> Response {
    match table(&state).show(&id).await {
        Ok(d) if d.is_empty() => error(
            StatusCode::NOT_FOUND,
            None,
            "no dead letter with that row id or job id",
        ),
        Ok(d) if q.reveal => Json(d).into_response(),
        Ok(d) => Json(d.into_iter().map(Detail::masked).collect::<Vec<_>>()).into_response(),
        Err(e) => unavailable(&e),
    }
}

pub(super) async fn replay(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let (body, selection) = match parse(&body) {
        Ok(parsed) => parsed,
        Err(r) => return *r,
    };
    if body.delete {
        return error(
            StatusCode::BAD_REQUEST,
            Some("delete"),
            "delete belongs to purge",
        );
    }
    let dlq = table(&state);
    if body.dry_run {
        let Some(templates) = &state.templates else {
            return error(
                StatusCode::BAD_REQUEST,
                Some("dry_run"),
                "this server has no templates to render with (start it with --templates)",
            );
        };
        return match dlq.dry_run(&selection, &templates.current()).await {
            Ok(previews) => Json(previews).into_response(),
            Err(e) => unavailable(&e),
        };
    }
    let replayed = async {
        let key = seal::resolve(state.replay_key.as_ref(), &state.db).await?;
        let name = "mailroom http dlq replay";
        let mut replayer = Replayer::connect(&state.amqp, &state.topology, name, key).await?;
        let report = dlq.replay(&selection, &mut replayer, ACTOR).await;
        replayer.close().await;
        report
    }
    .await;
    finish(&selection, replayed)
}

pub(super) async fn purge(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let (body, selection) = match parse(&body) {
        Ok(parsed) => parsed,
        Err(r) => return *r,
    };
    if body.dry_run {
        return error(
            StatusCode::BAD_REQUEST,
            Some("dry_run"),
            "purge has no dry run; list first",
        );
    }
    let report = table(&state).purge(&selection, ACTOR, body.delete).await;
    finish(&selection, report)
}

/// The report, with a status that says whether everything selected was handled.
fn finish(selection: &Selection, report: anyhow::Result<Report>) -> Response {
    let report = match report {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let code = if report.interrupted.is_some() || report.selected_left() > 0 {
        StatusCode::BAD_GATEWAY
    } else if report.found_none_of(selection) {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    (code, Json(json!(report))).into_response()
}
