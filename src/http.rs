//! The HTTP API (axum): enqueue a job, read its status, the dead-letter queue, metrics, health
//! and readiness.
//!
//! - `POST /v1/emails` ([`enqueue`]): a job as JSON; the `Idempotency-Key` header, when present,
//!   becomes the job_id. Validated like at every door, written to the outbox, `202 Accepted`
//!   with a `Location` to poll; refusals are `application/problem+json` naming the field.
//!   The same key and job again is accepted and writes nothing; another body under it is 422.
//!   The body limit is the job limit (413 beyond).
//! - `GET /v1/emails/{job_id}/{kind}`: the job's state (see [`crate::status`]).
//! - `/v1/dlq…`: the dead letters ([`dlq`]): list, groups, show, replay, purge.
//! - `GET /v1/overview`: the pipeline at a glance ([`overview`]): the last hour per minute, the
//!   workers, queue depths, the outbox.
//! - `/v1/suppressions…`: the addresses not sent to ([`suppressions`]): list, show, put, delete.
//! - `GET /v1/jobs?…` and `GET /v1/jobs/{job_id}/{kind}/timeline`: every job findable, with
//!   its timeline ([`jobs`]).
//! - `GET /metrics`: Prometheus text ([`metrics`]).
//! - `GET /healthz` (the process runs) and `GET /readyz` (database and broker reachable, on a
//!   kept connection; error details only with the token: [`ready`]).
//!
//! `worker` and `relay --metrics-addr` serve [`metrics_router`]: `/metrics`, `/healthz`, and
//! `/readyz` from the process's own broker session and database ([`Readiness`]).
//!
//! Every request gets an id, is logged once, and every error is an RFC 9457 problem
//! ([`conventions`], [`problem`]).
//!
//! `/v1` requires `Authorization: Bearer <MAILROOM_API_TOKEN>`. Without a token the server
//! refuses to listen on anything but a loopback address. `/metrics`, like the health checks,
//! needs no token: it holds counts, template names and a revision, no job data.

pub mod conventions;
mod dlq;
mod enqueue;
mod jobs;
pub mod metrics;
pub mod overview;
mod problem;
pub mod ready;
mod suppressions;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, Path, Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tokio_util::sync::CancellationToken;

use crate::broker::Topology;
use crate::config::UrlList;
use crate::db::Database;
use crate::dlq::seal::ReplayKey;
use crate::http::metrics::Metrics;
use crate::job::MAX_JOB_BYTES;
use crate::render::LiveTemplates;
pub use ready::{BrokerProbe, Readiness};

/// What the handlers share.
pub struct ApiState {
    pub db: Database,
    pub amqp: UrlList,
    /// The exchanges and queues, for the dead-letter endpoints.
    pub topology: Topology,
    /// When set, jobs naming a kind without a template are refused at once, and dead-letter
    /// dry runs render with them.
    pub templates: Option<Arc<LiveTemplates>>,
    pub token: Option<String>,
    /// The relay of the same process (`mailroom run`), woken after each new outbox row.
    pub relay_wake: Option<Arc<tokio::sync::Notify>>,
    /// What `/metrics` reports.
    pub metrics: Metrics,
    /// `/readyz`'s broker connection, kept between probes.
    pub broker_probe: BrokerProbe,
    /// `MAILROOM_REPLAY_KEY`, to seal replays; `None` uses the key kept in the database.
    pub replay_key: Option<ReplayKey>,
}

/// Refuses a configuration that would expose an unauthenticated API beyond this machine.
pub fn check_exposure(addr: &SocketAddr, token: Option<&str>) -> anyhow::Result<()> {
    if token.is_none() && !addr.ip().is_loopback() {
        anyhow::bail!(
            "refusing to serve the API on {addr} without MAILROOM_API_TOKEN; set a token or listen on 127.0.0.1"
        );
    }
    Ok(())
}

/// The routes.
pub fn router(state: Arc<ApiState>) -> Router {
    let api = Router::new()
        .route(
            "/v1/emails",
            post(enqueue::enqueue)
                .layer(DefaultBodyLimit::max(MAX_JOB_BYTES))
                .layer(middleware::from_fn(conventions::json_body)),
        )
        .route("/v1/emails/{job_id}/{kind}", get(status))
        .route("/v1/overview", get(overview::get))
        .route("/v1/jobs", get(jobs::search))
        .route("/v1/jobs/{job_id}/{kind}/timeline", get(jobs::timeline))
        .route("/v1/dlq", get(dlq::list))
        .route(
            "/v1/dlq/replay",
            post(dlq::replay).layer(middleware::from_fn(conventions::json_body)),
        )
        .route(
            "/v1/dlq/purge",
            post(dlq::purge).layer(middleware::from_fn(conventions::json_body)),
        )
        .route("/v1/dlq/groups", get(dlq::groups))
        .route("/v1/dlq/{job_id}", get(dlq::show))
        .route("/v1/suppressions", get(suppressions::list))
        .route(
            "/v1/suppressions/{address}",
            get(suppressions::show)
                .put(suppressions::put)
                .delete(suppressions::delete),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let all = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/readyz", get(ready::ready))
        .merge(api)
        .with_state(state.clone())
        .merge(crate::console::router(
            crate::console::Console::new(
                Some(state.db.clone()),
                state.templates.clone(),
                state.token.as_deref(),
            )
            .replaying_to(
                state.amqp.clone(),
                state.topology.clone(),
                state.replay_key.clone(),
            )
            .with_pipeline(
                state.metrics.queues.clone().map(|q| q as _),
                &state.topology.exchange,
            ),
        ));
    conventions::apply(all)
}

/// A router with `/metrics`, `/healthz` and `/readyz` (from `readiness`), for `worker` and
/// `relay --metrics-addr`.
pub fn metrics_router(metrics: Metrics, readiness: Readiness) -> Router {
    let all = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|State(s): State<Arc<(Metrics, Readiness)>>| async move { exposition(&s.0).await }),
        )
        .route(
            "/readyz",
            get(|State(s): State<Arc<(Metrics, Readiness)>>| async move { s.1.respond().await }),
        )
        .with_state(Arc::new((metrics, readiness)));
    conventions::apply(all)
}

/// Serves [`metrics_router`] on `listener` until `shutdown` is cancelled.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "metrics listening");
    serve_until(listener, metrics_router(metrics, readiness), shutdown).await
}

/// How long the requests in flight have, once the process is told to stop, to be answered. A
/// request waiting on a database cut off by a partition waits for TCP to give up, minutes
/// (`serve` was seen still running a minute after SIGTERM): past this their connections are
/// closed unanswered and the process goes on stopping.
pub const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown`, then lets the requests in flight finish for
/// at most [`STOP_PATIENCE`].
async fn serve_until(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let stop = shutdown.clone();
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .into_future();
    match crate::shutdown::within_patience(&shutdown, STOP_PATIENCE, served).await {
        Some(served) => served?,
        None => tracing::warn!(
            "requests still in flight {STOP_PATIENCE:?} after the shutdown; their connections are closed unanswered"
        ),
    }
    Ok(())
}

async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    exposition(&state.metrics).await
}

async fn exposition(metrics: &Metrics) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render().await,
    )
        .into_response()
}

/// Serves on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ApiState>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "HTTP API listening");
    serve_until(listener, router(state), shutdown).await
}

async fn require_token(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if authorized(&state, &headers) {
        return next.run(request).await;
    }
    // RFC 6750: `invalid_token` only when a bearer token was given.
    let given = bearer(&headers).is_some();
    let (challenge, detail) = if given {
        (
            r#"Bearer realm="mailroom", error="invalid_token""#,
            "the bearer token is wrong",
        )
    } else {
        (
            r#"Bearer realm="mailroom""#,
            "an Authorization: Bearer <MAILROOM_API_TOKEN> header is required",
        )
    };
    let mut response = problem::Problem::of_status(StatusCode::UNAUTHORIZED, detail)
        .at_header("Authorization")
        .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(challenge),
    );
    response
}

/// The bearer token of the `Authorization` header, if it carries one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Whether the request carries the API's bearer token (always, when the API has none: it then
/// listens on loopback only).
fn authorized(state: &ApiState, headers: &HeaderMap) -> bool {
    let Some(token) = &state.token else {
        return true;
    };
    bearer(headers).is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A problem of this status about `field` (a body member or query parameter) if named, with
/// `message` as its detail ([`problem`]).
fn error(status: StatusCode, field: Option<&str>, message: &str) -> Response {
    let mut problem = problem::Problem::of_status(status, message);
    problem.legacy = true;
    match field {
        Some(field) => problem.at(field),
        None => problem,
    }
    .into_response()
}

async fn status(
    State(state): State<Arc<ApiState>>,
    Path((job_id, kind)): Path<(String, String)>,
) -> Response {
    match crate::status::job_status(&state.db, &job_id, Some(&kind)).await {
        Ok(found) => match found.into_iter().next() {
            Some(s) => Json(s).into_response(),
            None => error(StatusCode::NOT_FOUND, None, "no such job"),
        },
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            &format!("database unavailable: {e:#}"),
        ),
    }
}

/// Percent-encodes one path segment.
fn encode(segment: &str) -> String {
    url::form_urlencoded::byte_serialize(segment.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}
