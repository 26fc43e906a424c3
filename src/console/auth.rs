//! Who may use the console, and proof that a POST came from its own pages.
//!
//! - The session is a cookie `mailroom_console` = `v1.<expiry>.<nonce>.<auth>.<name>.<mac>`,
//!   HMAC-SHA256 with a key derived from `MAILROOM_API_TOKEN`, so every `serve` process with the
//!   same token accepts it and changing the token ends every session. HttpOnly,
//!   SameSite=Strict, Path=/console, 12 hours; `Secure` when the request came over HTTPS, which
//!   for mailroom (plain HTTP only) means a TLS proxy said so in `X-Forwarded-Proto: https` or
//!   `Forwarded: proto=https`. Trusting that header is safe: a client that forges it only gets
//!   a cookie its own browser will not send back over plain HTTP.
//! - Without a token (loopback only, like the API) the first GET gets a session at once.
//! - Every POST carries the CSRF token (form field `csrf`, or header `X-CSRF-Token` from htmx),
//!   an HMAC of the session's nonce; a cross-site `Sec-Fetch-Site` or a foreign `Origin` is
//!   refused first. The login form has its own pre-login session for the same check.
//!
//! Tokens, cookies and CSRF values are compared in constant time and never logged.

use axum::{
    Form,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
};
use maud::{Markup, html};

use super::Console;
use super::layout;
use super::session::{Claims, Keys, SESSION_SECS, constant_time_eq, session_cookie, set_cookie};

/// The largest POST body read to find its `csrf` field (a template edit and its fields).
const MAX_FORM_BYTES: usize = 4 << 20;

/// The session of a request that passed [`guard`], for the handlers.
#[derive(Clone, Debug)]
pub(super) struct Session {
    /// Who saves: the name given at login, or `local` without a token.
    pub name: String,
    /// The CSRF token every form and htmx request of this session carries.
    pub csrf: String,
    /// Whether a logout button makes sense (there is a token to log in with again).
    pub can_log_out: bool,
}

/// Why a POST was refused, said to the browser (never with the values involved).
fn forbidden(why: &str) -> Response {
    (StatusCode::FORBIDDEN, format!("refused: {why}\n")).into_response()
}

/// The second line against cross-site requests: the browser's own `Sec-Fetch-Site`, else
/// `Origin` against `Host` (or the proxy's `X-Forwarded-Host`).
fn cross_site(headers: &HeaderMap) -> Option<&'static str> {
    let value = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = headers.get("sec-fetch-site") {
        return (site != "same-origin").then_some("a cross-site request (Sec-Fetch-Site)");
    }
    let origin = value(header::ORIGIN)?;
    let host = headers
        .get("x-forwarded-host")
        .and_then(|v| v.to_str().ok())
        .or_else(|| value(header::HOST));
    let origin_host = origin.split_once("://").map(|(_, rest)| rest);
    (origin_host.is_none() || origin_host != host).then_some("a request from another origin")
}

/// Reads the `csrf` field of a form body, and gives the body back for the handler.
async fn csrf_field(request: Request) -> Result<(Option<String>, Request), Response> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_FORM_BYTES)
        .await
        .map_err(|_| (StatusCode::PAYLOAD_TOO_LARGE, "form too large\n").into_response())?;
    let field = url::form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.into_owned());
    Ok((field, Request::from_parts(parts, Body::from(bytes))))
}

/// Checks a POST's origin and CSRF token against `claims`; the request back when they pass.
async fn check_post(keys: &Keys, claims: &Claims, request: Request) -> Result<Request, Response> {
    if let Some(why) = cross_site(request.headers()) {
        return Err(forbidden(why));
    }
    let expected = keys.csrf(claims);
    let header = request
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (given, request) = match header {
        Some(h) => (Some(h), request),
        None => csrf_field(request).await?,
    };
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), expected.as_bytes()) => Ok(request),
        Some(_) => Err(forbidden("a wrong CSRF token")),
        None => Err(forbidden("no CSRF token")),
    }
}

/// In front of every page but the login form and the assets: a valid session (issued at once
/// without a token), and on a POST, the origin and CSRF checks.
pub(super) async fn guard(
    State(console): State<std::sync::Arc<Console>>,
    mut request: Request,
    next: Next,
) -> Response {
    let keys = &console.keys;
    let found = session_cookie(request.headers()).and_then(|v| keys.open(v));
    let valid = found.filter(|c| c.authenticated || keys.token.is_none());
    let is_post = request.method() == Method::POST;
    let (claims, issued) = match valid {
        Some(c) => (c, false),
        None if keys.token.is_none() && !is_post => (Claims::fresh(true, "local"), true),
        None if is_post => return forbidden("no session; log in again"),
        None => return to_login(request.headers()),
    };
    if is_post {
        request = match check_post(keys, &claims, request).await {
            Ok(r) => r,
            Err(refusal) => return refusal,
        };
    }
    let cookie = issued.then(|| set_cookie(request.headers(), &keys.seal(&claims), SESSION_SECS));
    request.extensions_mut().insert(Session {
        csrf: keys.csrf(&claims),
        name: claims.name,
        can_log_out: keys.token.is_some(),
    });
    let mut response = next.run(request).await;
    if let Some(cookie) = cookie {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// A redirect to the login form (`HX-Redirect` for htmx, which would swap a redirect's body).
fn to_login(headers: &HeaderMap) -> Response {
    if headers.contains_key("hx-request") {
        return (
            [("hx-redirect", "/console/login")],
            StatusCode::UNAUTHORIZED,
        )
            .into_response();
    }
    Redirect::to("/console/login").into_response()
}

/// `GET /console/login`: the form, with a pre-login session for its CSRF token.
pub(super) async fn login_form(
    State(console): State<std::sync::Arc<Console>>,
    headers: HeaderMap,
) -> Response {
    if console.keys.token.is_none() {
        return Redirect::to("/console").into_response();
    }
    login_page(&console.keys, &headers, StatusCode::OK, None)
}

fn login_page(
    keys: &Keys,
    headers: &HeaderMap,
    status: StatusCode,
    error: Option<&str>,
) -> Response {
    let existing = session_cookie(headers).and_then(|v| keys.open(v));
    let (claims, issued) = match existing {
        Some(c) => (c, false),
        None => (Claims::fresh(false, ""), true),
    };
    let body = login_markup(&keys.csrf(&claims), error);
    let mut response = (status, layout::bare("Log in", body)).into_response();
    if issued {
        let cookie = set_cookie(headers, &keys.seal(&claims), SESSION_SECS);
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

fn login_markup(csrf: &str, error: Option<&str>) -> Markup {
    html! {
        @if let Some(error) = error { p.errors role="alert" id="login-error" { (error) } }
        form method="post" action="/console/login" {
            input type="hidden" name="csrf" value=(csrf);
            label for="token" { "API token (MAILROOM_API_TOKEN)" }
            input type="password" id="token" name="token" autocomplete="current-password" required;
            label for="name" { "Your name (recorded with template revisions)" }
            input type="text" id="name" name="name" autocomplete="name" maxlength="64";
            div.actions { button.primary type="submit" id="login" { "Log in" } }
        }
    }
}

#[derive(serde::Deserialize)]
pub(super) struct Login {
    csrf: String,
    token: String,
    #[serde(default)]
    name: String,
}

/// `POST /console/login`: the token, checked in constant time; a new session on success.
pub(super) async fn login(
    State(console): State<std::sync::Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<Login>,
) -> Response {
    let keys = &console.keys;
    let Some(token) = &keys.token else {
        return Redirect::to("/console").into_response();
    };
    if let Some(why) = cross_site(&headers) {
        return forbidden(why);
    }
    let pre = session_cookie(&headers).and_then(|v| keys.open(v));
    let csrf_ok = pre
        .as_ref()
        .is_some_and(|c| constant_time_eq(form.csrf.as_bytes(), keys.csrf(c).as_bytes()));
    if !csrf_ok {
        return forbidden("no or a wrong CSRF token; reload the login page");
    }
    if !constant_time_eq(form.token.as_bytes(), token.as_bytes()) {
        tracing::warn!("console login refused: wrong token");
        let error = "That is not the API token.";
        return login_page(keys, &headers, StatusCode::UNAUTHORIZED, Some(error));
    }
    let name = form.name.trim();
    let claims = Claims::fresh(true, if name.is_empty() { "operator" } else { name });
    tracing::info!(name = %claims.name, "console login");
    let cookie = set_cookie(&headers, &keys.seal(&claims), SESSION_SECS);
    let mut response = Redirect::to("/console/templates").into_response();
    response.headers_mut().append(header::SET_COOKIE, cookie);
    response
}

/// `POST /console/logout`: the cookie expired, back to the login form.
pub(super) async fn logout(headers: HeaderMap) -> Response {
    let mut response = Redirect::to("/console/login").into_response();
    let cookie = set_cookie(&headers, "", 0);
    response.headers_mut().append(header::SET_COOKIE, cookie);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cross_site_post_is_told_apart_from_a_same_origin_one() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        h.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(cross_site(&h).is_none());
        h.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert!(cross_site(&h).is_some());
        h.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert!(cross_site(&h).is_none());
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(cross_site(&h).is_some());
    }
}
