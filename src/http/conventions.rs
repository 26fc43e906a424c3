//! What every request to every mailroom listener goes through ([`apply`]): the API of
//! `serve`/`run`, and the metrics listener of `worker` and `relay --metrics-addr`.
//!
//! - A request id: the client's `X-Request-Id` when it is sane (1 to 64 bytes of visible
//!   ASCII), else a new one. It is echoed in the `X-Request-Id` response header, set on a
//!   `request` span around the handler (so each line the handler logs carries `request_id`),
//!   written in the access line and in any problem body.
//! - One access line per request (target `mailroom::http::access`).
//! - Problems for axum's own refusals: a 404 for an unknown route ([`not_found`]), and a bare
//!   (empty or `text/plain`) error answer from an extractor or the router (405, keeping
//!   `Allow`; 413; 400/422 of a path or query) becomes an `application/problem+json` with its
//!   text as `detail`. The answers of `/healthz`, `/readyz` (its 503 included) and `/metrics`
//!   are theirs and left as they are; only a bare error becomes a problem.
//! - [`json_body`] on the routes that take a body: a Content-Type that is neither JSON nor the
//!   form type `curl -d` sends is a 415.

use axum::{
    Router,
    body::{Body, to_bytes},
    extract::{MatchedPath, Request},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use tracing::Instrument;

use super::problem::{Problem, REQUEST_ID};

/// The request id header, read and echoed.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The longest client request id kept: enough for a UUID or a trace id with a prefix, short
/// enough for a log line.
const MAX_REQUEST_ID: usize = 64;
/// The most of a bare error body turned into a problem's `detail`: axum's texts are one line.
const MAX_BARE_BODY: usize = 4096;
/// The target of the access log, so that it can be filtered on its own
/// (`RUST_LOG=info,mailroom::http::access=warn`).
const ACCESS: &str = "mailroom::http::access";

/// `router` with the 404 fallback and [`conventions`] on every route.
pub fn apply<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .fallback(not_found)
        .layer(middleware::from_fn(conventions))
}

/// 404 for a path no route matches.
async fn not_found() -> Problem {
    Problem::of_status(StatusCode::NOT_FOUND, "no route for this path")
}

/// The client's request id when it is 1 to 64 bytes of visible ASCII (no space, no control).
pub fn sane_request_id(given: Option<&HeaderValue>) -> Option<&str> {
    let given = given?.to_str().ok()?;
    let sane = !given.is_empty()
        && given.len() <= MAX_REQUEST_ID
        && given.bytes().all(|b| b.is_ascii_graphic());
    sane.then_some(given)
}

/// Whether a route's answers are specified elsewhere (probes and scrapes keep their bodies).
fn is_probe(route: &str) -> bool {
    matches!(route, "/metrics" | "/healthz" | "/readyz")
}

async fn conventions(request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let id = sane_request_id(request.headers().get(REQUEST_ID_HEADER))
        .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_string);
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("(no route)", |p| p.as_str())
        .to_owned();
    // At ERROR level so that it is enabled whenever any line the handler writes is.
    let span = tracing::error_span!("request", request_id = %id);
    let response = REQUEST_ID
        .scope(id.clone(), async {
            problem_of_bare(next.run(request).instrument(span).await).await
        })
        .await;
    let mut response = response;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    let status = response.status().as_u16();
    let duration_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
    access_line(&method, &route, status, duration_ms, &id);
    response
}

/// One line per request: method, the route it matched (`/v1/emails/{job_id}/{kind}`: never the
/// path's values, a query string or a body, which may hold addresses or tokens), status,
/// duration and request id. The API's requests at INFO (WARN for a 5xx); `/metrics` and the
/// probes, scraped every few seconds, at DEBUG.
fn access_line(method: &axum::http::Method, route: &str, status: u16, ms: f64, id: &str) {
    macro_rules! access {
        ($level:ident) => {
            tracing::$level!(target: ACCESS, method = %method, path = %route, status, duration_ms = ms, request_id = %id, "request")
        };
    }
    match (is_probe(route), status >= 500) {
        (true, _) => access!(debug),
        (false, true) => access!(warn),
        (false, false) => access!(info),
    }
}

/// An error answer without a body of its own (axum's rejections: an empty body or one line of
/// `text/plain`) as a problem with the same status and headers (`Allow` on a 405).
async fn problem_of_bare(response: Response) -> Response {
    let status = response.status();
    let bare = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|t| t.as_bytes().starts_with(b"text/plain"));
    if !(status.is_client_error() || status.is_server_error()) || !bare {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = to_bytes(body, MAX_BARE_BODY).await.unwrap_or_default();
    let mut detail = String::from_utf8_lossy(&text).trim().to_string();
    if detail.is_empty() {
        detail = status
            .canonical_reason()
            .unwrap_or("refused")
            .to_lowercase();
    }
    let problem = Problem::of_status(status, detail);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    Response::from_parts(parts, Body::from(problem.body().to_string()))
}

/// A 415 before the handler when the body's Content-Type is not JSON (`application/json`,
/// `application/*+json`) nor `application/x-www-form-urlencoded`, which `curl -d` sends and
/// which mailroom has always read as JSON. No Content-Type is read as JSON too.
pub async fn json_body(request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?").to_ascii_lowercase());
    if let Some(given) = given {
        let essence = given.split(';').next().unwrap_or("").trim();
        let json = essence == "application/json"
            || (essence.starts_with("application/") && essence.ends_with("+json"))
            || essence == "application/x-www-form-urlencoded";
        if !json {
            return Problem::of_status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("the body must be application/json, not {essence:?}"),
            )
            .at_header("Content-Type")
            .into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sane(raw: &[u8]) -> Option<String> {
        let value = HeaderValue::from_bytes(raw).ok();
        sane_request_id(value.as_ref()).map(str::to_string)
    }

    #[test]
    fn a_request_id_is_kept_only_when_it_is_visible_ascii_of_at_most_64_bytes() {
        assert_eq!(sane(b"abc-123_X.Y:z").as_deref(), Some("abc-123_X.Y:z"));
        assert_eq!(sane(&[b'a'; 64]).map(|s| s.len()), Some(64));
        assert_eq!(sane(&[b'a'; 65]), None);
        assert_eq!(sane(b""), None);
        assert_eq!(sane(b"has space"), None);
        assert_eq!(sane(b"tab\there"), None);
        assert_eq!(sane("caf\u{e9}".as_bytes()), None);
    }
}
