//! The page around every section: head (stylesheet, htmx and its configuration), navigation,
//! and the security headers of every console response.

use axum::{
    extract::Request,
    http::{HeaderValue, header},
    middleware::Next,
    response::Response,
};
use maud::{DOCTYPE, Markup, html};

use super::assets;
use super::auth::Session;

/// The console's CSP: its own origin only, no inline script or style, framed by nobody.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   frame-src 'self'; connect-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'; object-src 'none'";

/// htmx's settings, read from a meta tag: no style element injected (the CSP forbids inline
/// style), no eval, no scripts from swapped fragments, requests to this origin only.
const HTMX_CONFIG: &str = r#"{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false,"selfRequestsOnly":true,"historyCacheSize":0}"#;

/// A section in the navigation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    Overview,
    DeadLetters,
    Jobs,
    Suppressions,
    Templates,
}

const SECTIONS: [(Section, &str, &str); 5] = [
    (Section::Overview, "Overview", "/console"),
    (
        Section::DeadLetters,
        "Dead letters",
        "/console/dead-letters",
    ),
    (Section::Jobs, "Jobs", "/console/jobs"),
    (
        Section::Suppressions,
        "Suppressions",
        "/console/suppressions",
    ),
    (Section::Templates, "Templates", "/console/templates"),
];

/// A whole page: the navigation with `current` marked, `title` and `content`. `designer`
/// shows only the Templates section (`templates preview --serve`).
pub(super) fn page(
    session: &Session,
    designer: bool,
    current: Section,
    title: &str,
    content: Markup,
) -> Markup {
    let csrf_header = serde_json::json!({ "X-CSRF-Token": session.csrf }).to_string();
    let sections = SECTIONS
        .iter()
        .filter(|(s, ..)| !designer || *s == Section::Templates);
    html! {
        (DOCTYPE)
        html lang="en" {
        head { (head(title)) }
        body hx-headers=(csrf_header) {
            header.top {
                a.brand href="/console" { "mailroom" }
                nav aria-label="Sections" {
                    ul {
                        @for (section, label, href) in sections {
                            li {
                                @if *section == current {
                                    a href=(href) aria-current="page" { (label) }
                                } @else {
                                    a href=(href) { (label) }
                                }
                            }
                        }
                    }
                }
                @if session.can_log_out {
                    form method="post" action="/console/logout" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        button type="submit" id="logout" { "Log out " (session.name) }
                    }
                }
            }
            main { h1 { (title) } (content) }
        }
        }
    }
}

/// A page without navigation (the login form).
pub(super) fn bare(title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title)) }
            body { header.top { span.brand { "mailroom" } } main { h1 { (title) } (content) } }
        }
    }
}

fn head(title: &str) -> Markup {
    html! {
        meta charset="utf-8";
        meta name="viewport" content="width=device-width, initial-scale=1";
        meta name="htmx-config" content=(HTMX_CONFIG);
        meta name="referrer" content="no-referrer";
        title { (title) " · mailroom console" }
        link rel="stylesheet" href=(assets::css_url());
        script src=(assets::htmx_url()) defer {}
    }
}

/// Every console response: the CSP (unless the handler set its own, as the preview document
/// does), no sniffing, no referrer, no framing, and no caching of pages that hold job data.
pub(super) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let defaults = [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in defaults {
        headers
            .entry(name)
            .or_insert(HeaderValue::from_static(value));
    }
    response
}
