//! The Templates section: every kind × locale with its check status (what `mailroom templates
//! check` reports), and the editor of one, with its live preview and revision history.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use axum::{
    Extension,
    extract::{Path as UrlPath, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::{Markup, html};

use super::auth::Session;
use super::files::{self, Parts, url_locale};
use super::layout::{self, Section};
use super::{Console, history};
use crate::render::Templates;

/// `GET /console/templates`.
pub(super) async fn list(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Markup {
    let content = match console.dir.clone() {
        None => html! { p.notice { "This process has no template directory: start it with "
        code { "--templates" } " to edit templates here." } },
        Some(dir) => {
            let statuses = tokio::task::spawn_blocking(move || statuses(&dir))
                .await
                .unwrap_or_default();
            table(&console, &statuses)
        }
    };
    layout::page(
        &session,
        console.designer,
        Section::Templates,
        "Templates",
        content,
    )
}

/// The errors of each `(kind, locale)` (a file's errors go to the locale it is for; those of
/// shared layouts and partials to `("", "")`).
type Statuses = BTreeMap<(String, String), Vec<String>>;

fn statuses(dir: &Path) -> Statuses {
    let mut statuses: Statuses = files::kinds(dir)
        .into_iter()
        .flat_map(|k| {
            k.locales
                .into_iter()
                .map(move |l| ((k.kind.clone(), l), vec![]))
        })
        .collect();
    let Err(errors) = Templates::check(dir) else {
        return statuses;
    };
    for error in errors {
        let relative = error.path().strip_prefix(dir).unwrap_or(error.path());
        let mut parts = relative.iter().map(|p| p.to_string_lossy().into_owned());
        let (first, file) = (parts.next().unwrap_or_default(), parts.next());
        let locale = file
            .as_deref()
            .and_then(|f| f.strip_suffix(".hbs"))
            .and_then(|stem| stem.split_once('.'))
            .map(|(_, l)| l.to_owned())
            .unwrap_or_default();
        let key = match first.as_str() {
            "layouts" | "partials" => (String::new(), String::new()),
            _ => (first, locale),
        };
        let located = error.located();
        let shown = located.strip_prefix(&format!("{}/", dir.display()));
        statuses
            .entry(key)
            .or_default()
            .push(shown.unwrap_or(&located).to_owned());
    }
    statuses
}

fn table(console: &Console, statuses: &Statuses) -> Markup {
    let shared = statuses.get(&(String::new(), String::new()));
    let revision = console
        .live
        .as_ref()
        .map(|l| l.current().revision().to_owned());
    html! {
        @if let Some(revision) = revision {
            p { "This process sends with revision " code { (revision) } "." }
        }
        @if let Some(errors) = shared.filter(|e| !e.is_empty()) {
            (super::preview::errors_markup("Shared layouts and partials", errors))
        }
        div.table-wrap { table id="templates" {
            thead { tr { th { "Kind" } th { "Locale" } th { "Check" } th { "" } } }
            tbody {
                @for ((kind, locale), errors) in statuses.iter().filter(|((k, _), _)| !k.is_empty()) {
                    tr {
                        td { (kind) }
                        td { (url_locale(locale)) }
                        td { @if errors.is_empty() { span.status-ok { "ok" } } @else {
                            span.status-error { (errors.len()) " error" @if errors.len() > 1 { "s" } }
                            ul { @for e in errors { li { code { (e) } } } }
                        } }
                        td { a href=(format!("/console/templates/{kind}/{}", url_locale(locale))) { "Edit" }
                            " · " a href=(format!("/console/templates/{kind}/{}/live", url_locale(locale))) { "Watch files" } }
                    }
                }
            }
        } }
    }
}

/// `GET /console/templates/{kind}/{locale}`: the editor, filled with what the worker renders.
pub(super) async fn editor(
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
    let parts = match files::effective(dir, &kind, &locale) {
        Ok(p) => p,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let revisions = history::section(&console, &kind, &locale).await;
    let title = format!("{kind} · {}", url_locale(&locale));
    let content = html! {
        (editor_form(&kind, &locale, &parts, &session.csrf, console.db.is_some()))
        (revisions)
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

/// The editor: the three parts, the preview's data, Save; the preview beside it, refreshed by
/// htmx half a second after the last keystroke. Requests are serialised on the form: Save
/// replaces a preview in flight, and a preview waits for a save in flight (never aborts it).
fn editor_form(kind: &str, locale: &str, parts: &Parts, csrf: &str, has_db: bool) -> Markup {
    let base = format!("/console/templates/{kind}/{}", url_locale(locale));
    html! {
        div.editor {
            form id="editor" method="post" action=(format!("{base}/save"))
                hx-post=(format!("{base}/preview")) hx-target="#preview"
                hx-trigger="load, input delay:500ms" hx-sync="this:queue last" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" id="base" name="base" value=(parts.hash());
                label for="subject" { "Subject (" code { (files::part_file("subject", locale)) } ")" }
                textarea.subject id="subject" name="subject" spellcheck="false" { (parts.subject) }
                label for="html" { "HTML part (" code { (files::part_file("html", locale)) } ")" }
                textarea id="html" name="html" rows="16" spellcheck="false" { (parts.html) }
                label for="text" { "Text part (" code { (files::part_file("text", locale)) } ", optional)" }
                textarea id="text" name="text" rows="10" spellcheck="false" { (parts.text) }
                label for="job_id" { "Preview with the data of job (empty: sample.json)" }
                input type="text" id="job_id" name="job_id" autocomplete="off"
                    placeholder=(if has_db { "job id" } else { "no database: sample.json only" })
                    disabled[!has_db];
                div.actions {
                    button.primary type="submit" id="save" hx-post=(format!("{base}/save"))
                        hx-target="#save-result" hx-sync="#editor:replace" { "Save" }
                    span.busy { "working…" }
                }
                div id="save-result" aria-live="polite" {}
            }
            section aria-labelledby="preview-title" {
                h2 id="preview-title" { "Preview" }
                div id="preview" aria-live="polite" { p.muted { "Rendering…" } }
            }
        }
    }
}
