//! `/v1/dlq`: the dead-letter queue over HTTP, the same operations as `mailroom dlq` and the same
//! JSON as its `--json` output (both call [`crate::dlq`]).
//!
//! - `GET /v1/dlq?kind=&class=&since=&grep=&summary=true`: the entries (or their counts); a
//!   class that is not one mailroom writes is a 400 listing the classes.
//! - `GET /v1/dlq/{job_id}`: that job's dead letters in full, with its ledger row; every email
//!   address masked unless `?reveal=true`, as `mailroom dlq show [--reveal]`.
//! - `POST /v1/dlq/replay` `{"ids": [...]} | {"kind": K} | {"class": C} | {"all": true}`, plus
//!   `"dry_run": true` to render against the live templates and change nothing.
//! - `POST /v1/dlq/purge`, the same selection.
//!
//! A replay or purge answers 200 with its report when every selected dead letter was handled;
//! 502 with the report when some stayed in the queue (publish failed, pass interrupted); 404 when
//! job ids were named and none was found.

use std::sync::Arc;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::json;

use super::{ApiState, error};
use crate::dlq::{Class, DeadLetters, Detail, Filter, Report, Selection, seal, summarize};

/// Query parameters of the listing, as the CLI's filters.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    kind: Option<String>,
    class: Option<String>,
    /// RFC 3339 time or a duration ago (`2h`).
    since: Option<String>,
    grep: Option<String>,
    #[serde(default)]
    summary: bool,
}

/// Query parameters of `show`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ShowQuery {
    /// Email addresses in full instead of masked.
    #[serde(default)]
    reveal: bool,
}

/// The body of a replay or purge: exactly one selection.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SelectionBody {
    #[serde(default)]
    ids: Vec<String>,
    kind: Option<String>,
    class: Option<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    dry_run: bool,
}

/// The body as JSON whatever its Content-Type (`curl -d` sends a form type), as `/v1/emails`,
/// and the one selection it names; whether it asks for a dry run.
fn parse(body: &[u8]) -> Result<(bool, Selection), Box<Response>> {
    let body: SelectionBody = serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            None,
            &format!("body is not a selection: {e}"),
        ))
    })?;
    let class = class(body.class.as_deref())?;
    let selection = Selection::one_of(body.ids, body.kind, class, body.all)
        .map_err(|why| Box::new(error(StatusCode::BAD_REQUEST, None, &why.to_string())))?;
    Ok((body.dry_run, selection))
}

/// The class a filter names, if any; an unknown one is a 400 that lists the classes.
fn class(given: Option<&str>) -> Result<Option<Class>, Box<Response>> {
    given.map(str::parse::<Class>).transpose().map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            Some("class"),
            &e.to_string(),
        ))
    })
}

async fn connect(state: &ApiState) -> anyhow::Result<DeadLetters> {
    DeadLetters::connect(&state.amqp, state.topology.clone(), "mailroom http dlq").await
}

fn unavailable(e: &anyhow::Error) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, None, &format!("{e:#}"))
}

pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    Query(q): Query<ListQuery>,
) -> Response {
    let since = match q.since.as_deref().map(crate::dlq::parse_since) {
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, Some("since"), &e),
        Some(Ok(at)) => Some(at),
        None => None,
    };
    let class = match class(q.class.as_deref()) {
        Ok(class) => class,
        Err(response) => return *response,
    };
    let filter = Filter {
        kind: q.kind,
        class,
        since,
        grep: q.grep,
    };
    let dlq = match connect(&state).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let entries = dlq.list(&filter).await;
    dlq.close().await;
    match entries {
        Ok(entries) if q.summary => Json(summarize(&entries)).into_response(),
        Ok(entries) => Json(entries).into_response(),
        Err(e) => unavailable(&e),
    }
}

pub(super) async fn show(
    State(state): State<Arc<ApiState>>,
    Path(job_id): Path<String>,
    Query(q): Query<ShowQuery>,
) -> Response {
    let dlq = match connect(&state).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let details = dlq.show(&job_id, Some(&state.db)).await;
    dlq.close().await;
    match details {
        Ok(d) if d.is_empty() => error(
            StatusCode::NOT_FOUND,
            None,
            "no dead letter with that job id",
        ),
        Ok(d) if q.reveal => Json(d).into_response(),
        Ok(d) => Json(d.into_iter().map(Detail::masked).collect::<Vec<_>>()).into_response(),
        Err(e) => unavailable(&e),
    }
}

pub(super) async fn replay(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let (dry_run, selection) = match parse(&body) {
        Ok(parsed) => parsed,
        Err(r) => return *r,
    };
    let templates = match (&state.templates, dry_run) {
        (None, true) => {
            return error(
                StatusCode::BAD_REQUEST,
                Some("dry_run"),
                "this server has no templates to render with (start it with --templates)",
            );
        }
        (t, _) => t.as_ref().map(|t| t.current()),
    };
    let dlq = match connect(&state).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let response = match templates {
        Some(t) if dry_run => match dlq.dry_run(&selection, &t, Some(&state.db)).await {
            Ok(previews) => Json(previews).into_response(),
            Err(e) => unavailable(&e),
        },
        _ => match seal::resolve(state.replay_key.as_ref(), &state.db).await {
            Ok(key) => finish(&selection, dlq.replay(&selection, &key, &mut |_| {}).await),
            Err(e) => unavailable(&e),
        },
    };
    dlq.close().await;
    response
}

pub(super) async fn purge(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let (dry_run, selection) = match parse(&body) {
        Ok(parsed) => parsed,
        Err(r) => return *r,
    };
    if dry_run {
        return error(
            StatusCode::BAD_REQUEST,
            Some("dry_run"),
            "purge has no dry run; list first",
        );
    }
    let dlq = match connect(&state).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let response = finish(&selection, dlq.purge(&selection, &mut |_| {}).await);
    dlq.close().await;
    response
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
