//! The page that follows the files: a kind in a locale rendered from the directory as it is
//! now, with its sample, re-rendered when any file changes. This is what `mailroom templates
//! preview --serve` gives a designer working in their own editor; the console links to it too.
//!
//! The page polls its panel every second with the fingerprint of the files it shows; the
//! server answers `204 No Content` (htmx leaves the page alone) until the fingerprint differs.

use std::path::Path;
use std::sync::Arc;

use axum::{
    Extension,
    extract::{Path as UrlPath, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::{Markup, html};

use super::auth::Session;
use super::files::{self, url_locale};
use super::layout::{self, Section};
use super::{Console, preview};
use crate::render::Templates;

/// `GET /console/templates/{kind}/{locale}/live`.
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    UrlPath((kind, locale)): UrlPath<(String, String)>,
) -> Response {
    let Some(dir) = &console.dir else {
        return (StatusCode::NOT_FOUND, "no template directory").into_response();
    };
    let Some((kind, locale)) = files::find(dir, &kind, &locale) else {
        return (StatusCode::NOT_FOUND, "no such template").into_response();
    };
    let title = format!("{kind} · {} · from the files", url_locale(&locale));
    let url = panel_url(&kind, &locale, "");
    let content = html! {
        p { "Rendered with " code { (kind) "/sample.json" } " from the files in "
            code { (dir.display()) } "; saved edits show here within a second." }
        div id="live" hx-get=(url) hx-trigger="load" hx-swap="outerHTML" { p.muted { "Rendering…" } }
    };
    layout::page(
        &session,
        console.designer,
        Section::Templates,
        &title,
        content,
    )
    .into_response()
}

fn panel_url(kind: &str, locale: &str, since: &str) -> String {
    format!(
        "/console/templates/{kind}/{}/live/panel?since={since}",
        url_locale(locale)
    )
}

#[derive(serde::Deserialize)]
pub(super) struct Since {
    #[serde(default)]
    since: String,
}

/// `GET …/live/panel?since=<fingerprint>`: 204 while the files are unchanged, else the panel.
pub(super) async fn panel(
    State(console): State<Arc<Console>>,
    UrlPath((kind, locale)): UrlPath<(String, String)>,
    Query(since): Query<Since>,
) -> Response {
    let Some(dir) = console.dir.clone() else {
        return (StatusCode::NOT_FOUND, "no template directory").into_response();
    };
    let Some((kind, locale)) = files::find(&dir, &kind, &locale) else {
        return (StatusCode::NOT_FOUND, "no such template").into_response();
    };
    let fingerprint = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || files::fingerprint(&dir))
            .await
            .unwrap_or_default()
    };
    if fingerprint == since.since {
        return StatusCode::NO_CONTENT.into_response();
    }
    let (k, l) = (kind.clone(), locale.clone());
    let body = tokio::task::spawn_blocking(move || rendered(&dir, &k, &l)).await;
    let body = match body {
        Ok(Ok(email)) => preview::rendered_markup(&console, &email),
        Ok(Err(errors)) => preview::errors_markup("The files do not load", &errors),
        Err(e) => preview::errors_markup("Rendering failed", &[e.to_string()]),
    };
    panel_markup(&kind, &locale, &fingerprint, body).into_response()
}

fn rendered(
    dir: &Path,
    kind: &str,
    locale: &str,
) -> Result<crate::render::RenderedEmail, Vec<String>> {
    let prefix = format!("{}/", dir.display());
    let templates = Templates::check(dir).map_err(|errors| {
        errors
            .iter()
            .map(|e| e.located().replace(&prefix, ""))
            .collect::<Vec<_>>()
    })?;
    let sample = templates.sample(kind).cloned().unwrap_or_default();
    preview::render(&templates, kind, locale, &sample).map_err(|e| vec![e])
}

fn panel_markup(kind: &str, locale: &str, fingerprint: &str, body: Markup) -> Markup {
    html! {
        div id="live" data-revision=(fingerprint) hx-get=(panel_url(kind, locale, fingerprint))
            hx-trigger="every 1s" hx-swap="outerHTML" {
            p.muted { "Files " code { (fingerprint) } ", rendered "
                (chrono::Utc::now().format("%H:%M:%S UTC")) "." }
            (body)
        }
    }
}
