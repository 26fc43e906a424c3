//! Saving an edit: refused unless the files are still those the editor opened and the draft
//! loads (compiles, passes the checks, and every kind renders its sample in strict mode, see
//! [`super::preview::check_draft`]); then each changed file is replaced atomically, this
//! process's live set is told to reload, and the revision is recorded.
//!
//! Workers elsewhere pick the files up at their next poll (`--template-reload-interval`).
//! Each file is replaced atomically, not the set: a worker polling between two renames may load
//! the first file with the second's old version for one interval, or reject the mix and keep
//! its last good set until the next poll.

use std::path::Path;
use std::sync::Arc;

use axum::{
    Extension, Form,
    extract::{Path as UrlPath, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use maud::{Markup, html};

use super::auth::Session;
use super::files::{self, Parts, url_locale};
use super::layout::{self, Section};
use super::{Console, history, preview};

/// What the editor posts.
#[derive(Debug, serde::Deserialize)]
pub(super) struct SaveForm {
    #[serde(flatten)]
    parts: Parts,
    /// The hash of the parts the editor was opened with.
    base: String,
}

/// Why a save did not happen.
#[derive(Debug, thiserror::Error)]
pub(super) enum SaveError {
    #[error("the files changed since this editor opened them; reload to edit the new version")]
    Conflict,
    #[error("the draft does not load")]
    Invalid(Vec<String>),
    #[error("writing {path}: {error}")]
    Write { path: String, error: std::io::Error },
}

/// What a save wrote.
pub(super) struct Saved {
    pub hash: String,
    pub files: Vec<String>,
}

/// Checks and writes `draft` for `kind` in `locale`; nothing is written unless all checks pass.
pub(super) fn save_files(
    dir: &Path,
    kind: &str,
    locale: &str,
    base: &str,
    draft: &Parts,
) -> Result<(Parts, Saved), SaveError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |error| SaveError::Write { path, error }
    };
    let current = files::effective(dir, kind, locale).map_err(io(dir))?;
    if current.hash() != base {
        return Err(SaveError::Conflict);
    }
    preview::check_draft(dir, kind, locale, draft).map_err(SaveError::Invalid)?;
    let mut written = Vec::new();
    for (path, text) in files::changed_files(&dir.join(kind), locale, &current, draft) {
        files::write_atomic(&path, text.as_bytes()).map_err(io(&path))?;
        written.push(format!(
            "{kind}/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    Ok((
        current,
        Saved {
            hash: draft.hash(),
            files: written,
        },
    ))
}

/// `POST /console/templates/{kind}/{locale}/save`.
pub(super) async fn save(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    UrlPath((kind, locale)): UrlPath<(String, String)>,
    Form(form): Form<SaveForm>,
) -> Response {
    let Some(dir) = console.dir.clone() else {
        return (StatusCode::NOT_FOUND, "no template directory").into_response();
    };
    let Some((kind, locale)) = files::find(&dir, &kind, &locale) else {
        return (StatusCode::NOT_FOUND, "no such template").into_response();
    };
    let (k, l, draft) = (kind.clone(), locale.clone(), form.parts.clone());
    let outcome =
        tokio::task::spawn_blocking(move || save_files(&dir, &k, &l, &form.base, &draft)).await;
    let (status, markup) = match outcome {
        Ok(Ok((before, saved))) => {
            let note = record(&console, &session, &kind, &locale, &before, &form.parts).await;
            tracing::info!(kind, locale, name = %session.name, hash = %saved.hash, "template saved from the console");
            (StatusCode::OK, saved_markup(&saved, note.as_deref()))
        }
        Ok(Err(SaveError::Invalid(errors))) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            preview::errors_markup(
                "Not saved: the draft does not load. Nothing was written.",
                &errors,
            ),
        ),
        Ok(Err(e @ SaveError::Conflict)) => (StatusCode::CONFLICT, refusal(&e.to_string())),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, refusal(&e.to_string())),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, refusal(&e.to_string())),
    };
    respond(
        &console,
        &session,
        &headers,
        (&kind, &locale),
        (status, markup),
    )
}

/// The answer: the fragment for htmx (always 2xx, which htmx swaps), else a whole page.
fn respond(
    console: &Console,
    session: &Session,
    headers: &HeaderMap,
    (kind, locale): (&str, &str),
    (status, markup): (StatusCode, Markup),
) -> Response {
    if headers.contains_key("hx-request") {
        // htmx swaps only 2xx answers by default; the refusal is the content to show.
        return ([("hx-reswap", "innerHTML")], (StatusCode::OK, markup)).into_response();
    }
    let back = format!("/console/templates/{kind}/{}", url_locale(locale));
    let content = html! { (markup) p { a href=(back) { "Back to the editor" } } };
    let page = layout::page(
        session,
        console.designer,
        Section::Templates,
        "Save",
        content,
    );
    (status, page).into_response()
}

/// Tells this process's live set to reload and records the revision; a note when it could not.
async fn record(
    console: &Console,
    session: &Session,
    kind: &str,
    locale: &str,
    before: &Parts,
    after: &Parts,
) -> Option<String> {
    if let Some(live) = &console.live {
        live.request_reload();
    }
    match history::record(console, &session.name, kind, locale, before, after).await {
        Ok(()) => None,
        Err(e) => {
            tracing::warn!(kind, locale, error = %e, "template saved, but its revision was not recorded");
            Some(format!(
                "Saved, but the revision history could not be written: {e}"
            ))
        }
    }
}

fn saved_markup(saved: &Saved, note: Option<&str>) -> Markup {
    html! {
        div.notice id="saved" role="status" {
            p { strong { "Saved" } " revision " code { (&saved.hash[..12]) } ": "
                @if saved.files.is_empty() { "nothing had changed." }
                @else { (saved.files.join(", ")) " written. Workers pick it up at their next template poll." } }
            @if let Some(note) = note { p { (note) } }
        }
        input type="hidden" id="base" name="base" value=(saved.hash) hx-swap-oob="true";
    }
}

fn refusal(message: &str) -> Markup {
    html! { div.errors id="errors" role="alert" { p { strong { "Not saved: " } (message) } } }
}
