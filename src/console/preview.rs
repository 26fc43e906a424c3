//! A draft rendered as the worker would render it: the template directory copied to a scratch
//! folder, the draft written over its own files, the whole set loaded with
//! [`Templates::check`] (compiled, linted, every kind rendering its sample in strict mode),
//! then the kind rendered in the locale with the chosen data. The same check guards a save.
//!
//! The preview shows the subject, the text part and the HTML part in an iframe with an empty
//! `sandbox` (no scripts, an opaque origin) whose document, `/console/preview/{id}`, has its own
//! CSP: inline style and `data:` images only, so an email's remote images are not fetched.
//! Documents are kept in memory for [`PREVIEW_TTL`] under an unguessable id.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::{
    Form,
    extract::{Path as UrlPath, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use maud::{Markup, html};
use serde_json::Value;

use super::Console;
use super::files::{self, Parts};
use crate::render::{RenderedEmail, Templates};

/// How long a rendered document stays fetchable: enough for the iframe to load it.
const PREVIEW_TTL: Duration = Duration::from_secs(600);
/// How many documents are kept at most (older ones are dropped first).
const PREVIEW_LIMIT: usize = 256;

/// The CSP of a previewed email: no script, no request anywhere, framed by the console only.
const DOCUMENT_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
                            font-src data:; frame-ancestors 'self'; sandbox";

/// Rendered HTML documents by id.
#[derive(Default)]
pub(super) struct Cache(Mutex<HashMap<String, (Instant, String)>>);

impl Cache {
    fn put(&self, html: String) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, (at, _)| at.elapsed() < PREVIEW_TTL);
        while map.len() >= PREVIEW_LIMIT {
            let oldest = map
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            oldest.map(|k| map.remove(&k));
        }
        map.insert(id.clone(), (Instant::now(), html));
        id
    }

    fn get(&self, id: &str) -> Option<String> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id)
            .filter(|(at, _)| at.elapsed() < PREVIEW_TTL)
            .map(|(_, html)| html.clone())
    }
}

/// A scratch copy of a template directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The set `dir` would be with `draft` saved for `kind` in `locale`, or every error as
/// `path:line:column: message` with paths relative to the directory.
pub(super) fn check_draft(
    dir: &Path,
    kind: &str,
    locale: &str,
    draft: &Parts,
) -> Result<Templates, Vec<String>> {
    let scratch = Scratch(
        std::env::temp_dir().join(format!("mailroom-draft-{}", uuid::Uuid::new_v4().simple())),
    );
    let io = |e: std::io::Error| vec![format!("cannot copy the template directory: {e}")];
    files::copy_tree(dir, &scratch.0).map_err(io)?;
    let current = files::effective(dir, kind, locale).map_err(io)?;
    for (path, text) in files::changed_files(&scratch.0.join(kind), locale, &current, draft) {
        std::fs::write(path, text).map_err(io)?;
    }
    Templates::check(&scratch.0).map_err(|errors| {
        let prefix = format!("{}/", scratch.0.display());
        errors
            .iter()
            .map(|e| e.located().replace(&prefix, ""))
            .collect()
    })
}

/// Where the preview's data comes from.
#[derive(Debug, serde::Deserialize)]
pub(super) struct PreviewForm {
    #[serde(flatten)]
    pub parts: Parts,
    /// A job id whose outbox payload's `data` to render with; empty: the kind's sample.json.
    #[serde(default)]
    pub job_id: String,
}

/// The data to render with: a job's, when one is named, else the kind's sample.
async fn data_for(
    console: &Console,
    templates: &Templates,
    kind: &str,
    job_id: &str,
) -> Result<Value, String> {
    let job_id = job_id.trim();
    if job_id.is_empty() {
        return templates
            .sample(kind)
            .cloned()
            .ok_or("no sample.json".into());
    }
    let Some(db) = &console.db else {
        return Err("no database here: only sample.json can be previewed".into());
    };
    let payload = db
        .outbox_payload(job_id, kind)
        .await
        .map_err(|e| format!("reading job {job_id:?}: {e}"))?
        .ok_or_else(|| format!("no {kind} job {job_id:?} in the outbox"))?;
    let job: Value = serde_json::from_str(&payload).map_err(|e| format!("job payload: {e}"))?;
    Ok(job.get("data").cloned().unwrap_or(Value::Null))
}

/// `POST /console/templates/{kind}/{locale}/preview`: the draft rendered, or its errors.
pub(super) async fn preview(
    State(console): State<Arc<Console>>,
    UrlPath((kind, locale)): UrlPath<(String, String)>,
    Form(form): Form<PreviewForm>,
) -> Response {
    let Some(dir) = console.dir.clone() else {
        return (StatusCode::NOT_FOUND, "no template directory").into_response();
    };
    let Some((kind, locale)) = files::find(&dir, &kind, &locale) else {
        return (StatusCode::NOT_FOUND, "no such template").into_response();
    };
    let (k, l, parts) = (kind.clone(), locale.clone(), form.parts.clone());
    let checked = tokio::task::spawn_blocking(move || check_draft(&dir, &k, &l, &parts)).await;
    let templates = match checked {
        Ok(Ok(t)) => t,
        Ok(Err(errors)) => {
            return errors_markup("The draft does not load", &errors).into_response();
        }
        Err(e) => return errors_markup("Preview failed", &[e.to_string()]).into_response(),
    };
    let rendered = match data_for(&console, &templates, &kind, &form.job_id).await {
        Ok(data) => render(&templates, &kind, &locale, &data),
        Err(e) => Err(e),
    };
    match rendered {
        Ok(email) => rendered_markup(&console, &email).into_response(),
        Err(e) => errors_markup("The draft does not render this data", &[e]).into_response(),
    }
}

pub(super) fn render(
    templates: &Templates,
    kind: &str,
    locale: &str,
    data: &Value,
) -> Result<RenderedEmail, String> {
    let locale = (!locale.is_empty()).then_some(locale);
    templates
        .render(kind, locale, data)
        .map_err(|e| e.to_string())
}

/// The subject, text and HTML of a rendered email (the HTML in a sandboxed frame).
pub(super) fn rendered_markup(console: &Console, email: &RenderedEmail) -> Markup {
    let id = console.previews.put(email.html.clone());
    html! {
        dl.preview id="rendered" {
            dt { "Subject" } dd id="preview-subject" { (email.subject) }
            dt { "Text part" }
            dd { pre id="preview-text" { (email.text.as_deref().unwrap_or("(no text part)")) } }
            dt { "HTML part" }
            dd { iframe id="preview-html" sandbox="" title="The HTML part, rendered"
                src=(format!("/console/preview/{id}")) {} }
        }
    }
}

/// A list of errors, each `path:line:column: message`.
pub(super) fn errors_markup(title: &str, errors: &[String]) -> Markup {
    html! {
        div.errors id="errors" role="alert" {
            p { strong { (title) } }
            ul { @for e in errors { li { (e) } } }
        }
    }
}

/// `GET /console/preview/{id}`: a rendered HTML part, under its own CSP.
pub(super) async fn document(
    State(console): State<Arc<Console>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    match console.previews.get(&id) {
        Some(html) => (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CONTENT_SECURITY_POLICY, DOCUMENT_CSP),
                (header::X_FRAME_OPTIONS, "SAMEORIGIN"),
            ],
            html,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "preview expired; edit to render again",
        )
            .into_response(),
    }
}
