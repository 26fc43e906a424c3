//! `GET /console/dead-letters/{id}`: one dead letter in full. The job (id, kind, locale,
//! recipients), the error (class, reason), replay or purge of it, the email as it would render
//! now with this process's templates (subject, text, and the HTML in the Templates preview's
//! sandboxed frame, [`crate::console::preview::rendered_markup`]), `x-death`, every header and
//! the original body. Email addresses are masked everywhere but in the rendered email, as
//! `mailroom dlq show` does without `--reveal`.

use std::sync::Arc;

use axum::{
    Extension,
    extract::{Path, State},
};
use maud::{Markup, html};
use serde_json::Value;

use super::{Console, Session, no_database, page, unavailable, when};
use crate::console::preview;
use crate::dlq::{Death, Detail};
use crate::job::EmailJob;

/// `GET /console/dead-letters/{id}`.
pub(in crate::console) async fn letter(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path(id): Path<i64>,
) -> Markup {
    let Some(dlq) = super::table(&console) else {
        return no_database(&console, &session);
    };
    let title = format!("Dead letter {id}");
    let found = match dlq.show(&id.to_string()).await {
        Ok(details) => details.into_iter().find(|d| d.entry.id == id),
        Err(e) => {
            let content = unavailable("The dead letter could not be read", &e);
            return page(&console, &session, &title, content);
        }
    };
    let Some(detail) = found else {
        let content = html! { p.errors role="alert" id="errors" { "No dead letter " (id) "." }
        a href="/console/dead-letters" { "Back to the dead letters" } };
        return page(&console, &session, &title, content);
    };
    let rendered = render_now(&console, &detail);
    let shown = detail.masked();
    let content = html! {
        (job_markup(&shown))
        (error_markup(&shown))
        h2 { "As it would render now" }
        (rendered)
        h2 { "x-death" }
        (deaths_markup(&shown.deaths))
        h2 { "Headers" }
        (headers_markup(&shown))
        h2 { "Original body" }
        p.muted { (shown.entry.body_size) " bytes"
            @if shown.entry.truncated { ", only its head kept" } "; addresses masked." }
        pre.body id="body" { (body_text(&shown.job)) }
    };
    page(&console, &session, &title, content)
}

/// The email the job would be now, with this process's templates, or why it would fail.
fn render_now(console: &Console, detail: &Detail) -> Markup {
    let Some(live) = &console.live else {
        return html! { p.notice { "This process has no templates to render with: start it with "
        code { "--templates" } "." } };
    };
    if detail.entry.truncated {
        return preview::errors_markup(
            "Not rendered",
            &["only the head of the body was kept".into()],
        );
    }
    let bytes = match &detail.job {
        Value::String(text) => text.clone().into_bytes(),
        json => json.to_string().into_bytes(),
    };
    let job = match EmailJob::decode(&bytes) {
        Ok(job) => job,
        Err(e) => return preview::errors_markup("Not a valid job", &[e.to_string()]),
    };
    let j = &job.job;
    let templates = live.current();
    match preview::render(
        &templates,
        &j.kind,
        j.locale.as_deref().unwrap_or(""),
        &j.data,
    ) {
        Ok(email) => preview::rendered_markup(console, &email),
        Err(e) => preview::errors_markup("It would fail again", &[e]),
    }
}

fn job_markup(d: &Detail) -> Markup {
    let e = &d.entry;
    let field = |name: &str| d.job.get(name).and_then(Value::as_str).map(str::to_owned);
    let recipients: Vec<String> = ["to", "cc", "bcc"]
        .iter()
        .filter_map(|list| d.job.get(*list).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    html! {
        h2 { "Job" }
        dl.facts id="job" {
            dt { "Job id" } dd { (e.job_id) }
            dt { "Kind" } dd { (e.kind) }
            dt { "Locale" } dd { (field("locale").unwrap_or_else(|| "default".into())) }
            dt { "Recipients" } dd { @if recipients.is_empty() { "none" } @else { (recipients.join(", ")) } }
            dt { "State" } dd id="state" { (e.state)
                @if let Some(by) = e.replayed_by.as_ref().or(e.purged_by.as_ref()) { " by " (by) }
                @if let Some(result) = &e.replay_result { " (" (result) ")" } }
            dt { "Ingested" } dd { (when(Some(e.ingested_at))) }
        }
        @if e.state == "dead" {
            form method="get" action="/console/dead-letters/confirm" {
                input type="hidden" name="id" value=(e.id);
                div.actions {
                    button type="submit" name="action" value="replay" id="replay-one" { "Replay this one" }
                    button type="submit" name="action" value="purge" id="purge-one" { "Purge this one" }
                }
            }
        }
    }
}

fn error_markup(d: &Detail) -> Markup {
    let e = &d.entry;
    html! {
        h2 { "Error" }
        dl.facts id="error" {
            dt { "Class" } dd { (e.class) }
            dt { "Reason" } dd { (e.reason) }
            dt { "Attempts" } dd { (e.attempts.map_or("—".into(), |a| a.to_string())) }
            dt { "Failed" } dd { (when(e.failed_at)) }
            dt { "Replayed before" } dd { (e.replays) " times" }
        }
    }
}

fn deaths_markup(deaths: &[Death]) -> Markup {
    if deaths.is_empty() {
        return html! { p id="x-death" { "None: the worker dead-lettered it itself (see the error above)." } };
    }
    html! {
        div.table-wrap { table id="x-death" {
            thead { tr { th { "Count" } th { "Reason" } th { "Queue" } th { "Exchange" } th { "Time" }
                th { "Routing keys" } } }
            tbody { @for d in deaths { tr {
                td { (d.count) } td { (d.reason) } td { (d.queue) } td { (d.exchange) }
                td { (when(d.time)) } td { (d.routing_keys.join(", ")) }
            } } }
        } }
    }
}

fn headers_markup(d: &Detail) -> Markup {
    html! {
        dl.facts id="headers" {
            dt { "Exchange, routing key" } dd { (d.exchange) ", " (d.routing_key) }
            @for (name, value) in &d.headers {
                dt { (name) }
                dd { @match value { Value::String(s) => (s), other => code { (other.to_string()) } } }
            }
        }
    }
}

/// The body as text: JSON pretty-printed, anything else as it was read.
fn body_text(job: &Value) -> String {
    match job {
        Value::String(text) => text.clone(),
        json => serde_json::to_string_pretty(json).unwrap_or_default(),
    }
}
