//! One job's page, `/console/jobs/{job_id}/{kind}`: its state, its timeline from
//! [`crate::jobs::timeline`] (created, published, each claim and attempt with its SMTP reply,
//! replays, sent or dead; what `GET /v1/jobs/{id}/{kind}/timeline` returns), and the email as
//! it renders now, with the job's data and today's templates, shown as the Templates preview
//! shows a draft ([`super::preview::rendered_markup`]: the HTML in a sandboxed frame).
//!
//! Job ids are up to 200 bytes of any UTF-8, `/` included: each path segment is
//! percent-encoded ([`job_href`]), and axum decodes it back before the handler sees it.

use std::sync::Arc;

use axum::{
    Extension,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use super::Console;
use super::auth::Session;
use super::layout::{self, Section};
use super::preview::{errors_markup, render, rendered_markup};
use crate::jobs::{Event, Timeline, timeline};

/// A path segment's bytes kept as they are: the unreserved characters of RFC 3986.
const SEGMENT: &percent_encoding::AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The URL of a job's page.
pub(super) fn job_href(job_id: &str, kind: &str) -> String {
    format!(
        "/console/jobs/{}/{}",
        utf8_percent_encode(job_id, SEGMENT),
        utf8_percent_encode(kind, SEGMENT)
    )
}

/// `GET /console/jobs/{job_id}/{kind}`.
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path((job_id, kind)): Path<(String, String)>,
) -> Response {
    let page = |status: StatusCode, title: &str, content: Markup| {
        let page = layout::page(&session, console.designer, Section::Jobs, title, content);
        (status, page).into_response()
    };
    let Some(db) = &console.db else {
        let none = html! { p.notice { "No database here." } };
        return page(StatusCode::NOT_FOUND, "Job", none);
    };
    let title = format!("Job {job_id} · {kind}");
    match timeline(db, &job_id, &kind, false).await {
        Ok(Some(t)) => {
            let email = email(&console, &job_id, &kind).await;
            let content = html! { (summary(&t)) (events(&t.events)) (email) };
            page(StatusCode::OK, &title, content)
        }
        Ok(None) => {
            let none = html! { p.notice id="no-job" { "No " code { (kind) } " job " code { (job_id) }
            " in the outbox or the ledger." } p { a href="/console/jobs" { "Search jobs" } } };
            page(StatusCode::NOT_FOUND, &title, none)
        }
        Err(e) => {
            let failed = errors_markup("The job could not be read", &[format!("{e:#}")]);
            page(StatusCode::SERVICE_UNAVAILABLE, &title, failed)
        }
    }
}

fn time(at: Option<DateTime<Utc>>) -> String {
    at.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
        .unwrap_or_else(|| "unknown time".into())
}

fn summary(t: &Timeline) -> Markup {
    let s = &t.status;
    html! {
        dl.facts id="job-summary" {
            dt { "Job id" } dd { code.id { (s.job_id) } }
            dt { "Kind" } dd { (s.kind) }
            dt { "State" } dd { span id="job-state" class=(format!("state-{}", s.state)) { (s.state) } }
            dt { "Attempts" } dd { (s.attempts) }
            dt { "Recipient" } dd { (t.recipient.as_deref().unwrap_or("not claimed yet")) }
            @if let Some(id) = &s.message_id { dt { "Message-ID" } dd { code.id { (id) } } }
            @if let Some(rev) = &s.template_revision { dt { "Templates" } dd { "revision " code { (rev) } } }
        }
    }
}

/// The timeline as an ordered list, oldest first, each step in words.
fn events(events: &[Event]) -> Markup {
    html! {
        section aria-labelledby="timeline-title" {
            h2 id="timeline-title" { "Timeline" }
            ol.timeline id="timeline" {
                @for e in events {
                    li class=(format!("event-{}", e.event)) {
                        strong { (headline(e)) } " " span.muted { (time(e.at)) }
                        @if let (Some(claimed), "attempt") = (e.claimed_at, e.event.as_str()) {
                            br; span.muted { "claimed " (time(Some(claimed))) }
                        }
                        @if let Some(class) = &e.class { br; "class: " (class) }
                        @if let Some(reply) = &e.smtp_reply {
                            br; "SMTP reply: " code.smtp-reply { (reply) }
                        }
                        @if let Some(error) = &e.error { br; "error: " code.error { (error) } }
                    }
                }
            }
        }
    }
}

fn headline(e: &Event) -> String {
    let n = e.attempt.map(|n| format!(" {n}")).unwrap_or_default();
    match e.event.as_str() {
        "created" => "Created".into(),
        "published" => "Published to the broker".into(),
        "claimed" => format!("Attempt{n} under way"),
        "attempt" => format!("Attempt{n}: {}", e.outcome.as_deref().unwrap_or("ended")),
        "replayed" => "Replayed by an operator".into(),
        "sent" => "Sent".into(),
        "dead" => "Dead".into(),
        other => other.to_owned(),
    }
}

/// The email as it renders now: the job's data from its outbox row, today's templates.
async fn email(console: &Console, job_id: &str, kind: &str) -> Markup {
    let rendered = rendered_now(console, job_id, kind).await;
    html! {
        section aria-labelledby="email-title" {
            h2 id="email-title" { "The email, as it renders now" }
            @match rendered {
                Ok(markup) => (markup),
                Err(why) => p.notice id="no-email" { (why) },
            }
        }
    }
}

async fn rendered_now(console: &Console, job_id: &str, kind: &str) -> Result<Markup, String> {
    let (Some(db), Some(live)) = (&console.db, &console.live) else {
        return Err(
            "This process has no templates: start it with --templates to see the email.".into(),
        );
    };
    let payload = db
        .outbox_payload(job_id, kind)
        .await
        .map_err(|e| format!("The job's data could not be read: {e}"))?
        .ok_or(
            "The job's data is not kept here: it was published straight to the broker, or \
                its outbox row was deleted by retention.",
        )?;
    let job: Value =
        serde_json::from_str(&payload).map_err(|e| format!("The job's payload: {e}"))?;
    let locale = job.get("locale").and_then(Value::as_str).unwrap_or("");
    let data = job.get("data").cloned().unwrap_or(Value::Null);
    let templates = live.current();
    Ok(match render(&templates, kind, locale, &data) {
        Ok(email) => rendered_markup(console, &email),
        Err(e) => errors_markup("It does not render with today's templates", &[e]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_id_with_a_slash_and_cjk_is_one_encoded_segment() {
        assert_eq!(
            job_href("注文/1 a?b#c", "welcome"),
            "/console/jobs/%E6%B3%A8%E6%96%87%2F1%20a%3Fb%23c/welcome"
        );
        assert_eq!(job_href("a-b_c.d~e", "k"), "/console/jobs/a-b_c.d~e/k");
    }
}
