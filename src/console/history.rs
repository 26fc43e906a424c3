//! The revision history of one kind in one locale, kept in `mailroom_template_revisions` so
//! every `serve` process shows the same one and it survives a redeploy of the directory: each
//! save records the parts as saved, with their hash, time and the name given at login. When
//! the files changed outside the console since the last recorded revision, the save first
//! records them as they were, by `(on disk)`, so every diff shows one save's change.

use std::sync::Arc;

use axum::{
    Extension,
    extract::{Path as UrlPath, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::{Markup, html};
use similar::TextDiff;

use super::Console;
use super::auth::Session;
use super::files::{self, Parts, url_locale};
use super::layout::{self, Section};
use crate::db::revisions::{NewRevision, TemplateRevision};

/// How many revisions the editor lists, and a diff looks back through for the one before.
const SHOWN: i64 = 50;
/// The author of a revision that was found on disk rather than saved here.
const ON_DISK: &str = "(on disk)";

/// Records a save of `after` over `before` (nothing without a database).
pub(super) async fn record(
    console: &Console,
    author: &str,
    kind: &str,
    locale: &str,
    before: &Parts,
    after: &Parts,
) -> sqlx::Result<()> {
    let Some(db) = &console.db else {
        return Ok(());
    };
    let latest = db.template_revisions(kind, locale, 1).await?;
    let insert = |parts: &Parts, hash: String, author: String| {
        let (subject, html, text) = (
            parts.subject.clone(),
            parts.html.clone(),
            parts.text.clone(),
        );
        async move {
            let text = (!text.is_empty()).then_some(text.as_str());
            let revision = NewRevision {
                kind,
                locale,
                hash: &hash,
                subject: &subject,
                html: &html,
                text,
                author: &author,
            };
            db.insert_template_revision(&revision).await
        }
    };
    let before_hash = before.hash();
    if latest.first().is_none_or(|r| r.hash != before_hash) {
        insert(before, before_hash.clone(), ON_DISK.to_owned()).await?;
    }
    if after.hash() != before_hash {
        insert(after, after.hash(), author.to_owned()).await?;
    }
    Ok(())
}

/// The editor's list of revisions, newest first, each linking to its diff.
pub(super) async fn section(console: &Console, kind: &str, locale: &str) -> Markup {
    let Some(db) = &console.db else {
        return html! { h2 { "History" } p.muted { "No revision history here: it is kept in the database, which this process does not use." } };
    };
    let base = format!("/console/templates/{kind}/{}/history", url_locale(locale));
    match db.template_revisions(kind, locale, SHOWN).await {
        Err(e) => html! { h2 { "History" } p.errors { "Cannot read the history: " (e) } },
        Ok(revisions) if revisions.is_empty() => {
            html! { h2 { "History" } p.muted { "No revision saved from the console yet." } }
        }
        Ok(revisions) => html! {
            h2 { "History" }
            div.table-wrap { table id="history" {
                thead { tr { th { "When (UTC)" } th { "Who" } th { "Revision" } th { "" } } }
                tbody { @for r in &revisions { tr {
                    td { (r.created_at.format("%Y-%m-%d %H:%M:%S")) }
                    td { (r.author) }
                    td { code { (&r.hash[..12]) } }
                    td { a href=(format!("{base}/{}", r.id)) { "Diff" } }
                } } }
            } }
        },
    }
}

/// `GET /console/templates/{kind}/{locale}/history/{id}`: what that revision changed.
pub(super) async fn diff(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    UrlPath((kind, locale, id)): UrlPath<(String, String, i64)>,
) -> Response {
    let (Some(db), Some(dir)) = (&console.db, &console.dir) else {
        return (StatusCode::NOT_FOUND, "no revision history here").into_response();
    };
    let Some((kind, locale)) = files::find(dir, &kind, &locale) else {
        return (StatusCode::NOT_FOUND, "no such template").into_response();
    };
    let revisions = match db.template_revisions(&kind, &locale, SHOWN).await {
        Ok(r) => r,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let Some(at) = revisions.iter().position(|r| r.id == id) else {
        return (StatusCode::NOT_FOUND, "no such revision of this template").into_response();
    };
    let (revision, previous) = (&revisions[at], revisions.get(at + 1));
    let title = format!(
        "{kind} · {} · {}",
        url_locale(&locale),
        &revision.hash[..12]
    );
    let content = diff_markup(revision, previous);
    layout::page(
        &session,
        console.designer,
        Section::Templates,
        &title,
        content,
    )
    .into_response()
}

fn diff_markup(revision: &TemplateRevision, previous: Option<&TemplateRevision>) -> Markup {
    let text = |r: &TemplateRevision| r.text.clone().unwrap_or_default();
    let parts = [
        (
            "Subject",
            previous.map(|p| p.subject.clone()),
            revision.subject.clone(),
        ),
        (
            "HTML part",
            previous.map(|p| p.html.clone()),
            revision.html.clone(),
        ),
        ("Text part", previous.map(text), text(revision)),
    ];
    html! {
        p { "Saved " (revision.created_at.format("%Y-%m-%d %H:%M:%S UTC")) " by " (revision.author)
            @if let Some(p) = previous { ", over " code { (&p.hash[..12]) } } @else { ", the first revision recorded" }
            ". Lines starting with " code { "-" } " were removed, " code { "+" } " added." }
        @for (label, old, new) in parts {
            h2 { (label) }
            pre.diff { (unified(old.as_deref().unwrap_or(""), &new)) }
        }
    }
}

/// A line diff of `old` and `new`, every line prefixed with `-`, `+` or a space.
pub(super) fn unified(old: &str, new: &str) -> String {
    if old == new {
        return "(unchanged)".to_owned();
    }
    TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_marks_removed_and_added_lines() {
        let diff = unified("Hello\nWorld\n", "Hello\nThere\n");
        assert!(diff.contains("-World"), "{diff}");
        assert!(diff.contains("+There"), "{diff}");
        assert_eq!(unified("same", "same"), "(unchanged)");
    }
}
