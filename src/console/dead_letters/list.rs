//! `GET /console/dead-letters`: the failure groups of the dead rows (each linking to the list
//! within it, and to replay or purge it), then the letters, newest first, with filters, an
//! "older" link for the next page and checkboxes for a selection to replay or purge.

use std::sync::Arc;

use axum::{
    Extension,
    extract::{Query, State},
};
use maud::{Markup, html};

use super::query::{ListQuery, set};
use super::{Console, Session, letters, no_database, page, table, unavailable, when};
use crate::dlq::{Class, Cursor, DeadLetters, Entry, Filter, Group, Page};

/// Letters on one page.
const PAGE_SIZE: usize = 50;

/// `GET /console/dead-letters`.
pub(in crate::console) async fn list(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<ListQuery>,
) -> Markup {
    let Some(dlq) = table(&console) else {
        return no_database(&console, &session);
    };
    let groups = match dlq.groups(&Filter::default()).await {
        Ok(groups) => groups_markup(&groups),
        Err(e) => unavailable("The failure groups could not be read", &e),
    };
    let letters = match query.parse() {
        Ok((filter, cursor)) => letters_markup(&dlq, &query, &filter, cursor).await,
        Err(errors) => super::super::preview::errors_markup("These filters do not parse", &errors),
    };
    let content = html! {
        h2 { "Failure groups" }
        (groups)
        h2 id="letters-heading" { "Letters" }
        (filter_form(&query))
        (letters)
    };
    page(&console, &session, "Dead letters", content)
}

fn groups_markup(groups: &[Group]) -> Markup {
    if groups.is_empty() {
        return html! { p id="groups" { "No dead letters: nothing to replay or purge." } };
    }
    html! {
        div.table-wrap {
            table id="groups" {
                caption.muted { "Dead letters of one class with one reason (addresses and ids taken out)" }
                thead { tr { th { "Class" } th { "Reason" } th { "Count" } th { "First seen" }
                    th { "Last seen" } th { "Act" } } }
                tbody {
                    @for g in groups {
                        tr data-group=(g.group) {
                            td { (g.class) }
                            td.reason {
                                a href=(format!("/console/dead-letters?group={}", g.group)) { (g.reason) }
                            }
                            td { (g.count) }
                            td { (when(Some(g.first_seen))) }
                            td { (when(Some(g.last_seen))) }
                            td {
                                a.replay-group href=(act_url("replay", &g.group)) { "Replay" }
                                " · "
                                a.purge-group href=(act_url("purge", &g.group)) { "Purge" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The confirmation of `action` on a whole group.
fn act_url(action: &str, group: &str) -> String {
    let group: String = url::form_urlencoded::byte_serialize(group.as_bytes()).collect();
    format!("/console/dead-letters/confirm?action={action}&group={group}")
}

fn filter_form(q: &ListQuery) -> Markup {
    let classes = Class::ALL.iter().map(|c| c.as_str());
    let states = ["dead", "replayed", "purged", "all"];
    html! {
        form.filters method="get" action="/console/dead-letters" id="filters" {
            @if !q.group.is_empty() {
                input type="hidden" name="group" value=(q.group);
                p.notice {
                    "Within one failure group: "
                    a id="replay-group" href=(act_url("replay", &q.group)) { "replay it" }
                    ", " a id="purge-group" href=(act_url("purge", &q.group)) { "purge it" }
                    ", or " a href="/console/dead-letters" { "show every group" } "."
                }
            }
            div {
                label for="f-kind" { "Kind" }
                input type="text" id="f-kind" name="kind" value=(q.kind) placeholder="welcome";
            }
            div {
                label for="f-class" { "Class" }
                select id="f-class" name="class" {
                    option value="" { "any" }
                    @for c in classes { option value=(c) selected[q.class == c] { (c) } }
                }
            }
            div {
                label for="f-state" { "State" }
                select id="f-state" name="state" {
                    @for s in states {
                        option value=(s) selected[q.state == s || (q.state.is_empty() && s == "dead")] { (s) }
                    }
                }
            }
            div {
                label for="f-since" { "Since" }
                input type="text" id="f-since" name="since" value=(q.since)
                    placeholder="2h or 2026-12-01T10:00:00Z";
            }
            div {
                label for="f-until" { "Until" }
                input type="text" id="f-until" name="until" value=(q.until)
                    placeholder="30m or an RFC 3339 time";
            }
            div {
                label for="f-text" { "Text in reason, recipient or job id" }
                input type="text" id="f-text" name="text" value=(q.text);
            }
            div.actions { button type="submit" id="filter" { "Filter" } }
        }
    }
}

async fn letters_markup(
    dlq: &DeadLetters,
    query: &ListQuery,
    filter: &Filter,
    cursor: Option<Cursor>,
) -> Markup {
    let group = set(&query.group);
    match dlq
        .list_in(filter, group.as_deref(), cursor, PAGE_SIZE)
        .await
    {
        Ok(page) => page_markup(query, &page),
        Err(e) => unavailable("The dead letters could not be read", &e),
    }
}

fn page_markup(query: &ListQuery, page: &Page) -> Markup {
    if page.letters.is_empty() {
        return html! { p id="letters" { "No dead letters match." } };
    }
    html! {
        form method="get" action="/console/dead-letters/confirm" id="selection" {
            div.table-wrap {
                table id="letters" {
                    caption.muted { (letters(page.letters.len() as i64)) " on this page, newest first" }
                    thead { tr { th { "Select" } th { "Id" } th { "Job" } th { "Kind" } th { "Recipient" }
                        th { "Class" } th { "Reason" } th { "Failed" } th { "State" } } }
                    tbody { @for e in &page.letters { (row(e)) } }
                }
            }
            div.actions {
                button type="submit" name="action" value="replay" id="replay-selected" { "Replay selected" }
                button type="submit" name="action" value="purge" id="purge-selected" { "Purge selected" }
                @if let Some(next) = &page.next {
                    a id="older" href=(query.older(next)) { "Older" }
                }
            }
        }
    }
}

fn row(e: &Entry) -> Markup {
    let label = format!("Select dead letter {} (job {})", e.id, e.job_id);
    html! {
        tr data-job=(e.job_id) {
            td { @if e.state == "dead" {
                input type="checkbox" name="id" value=(e.id) aria-label=(label);
            } }
            td { a href=(format!("/console/dead-letters/{}", e.id)) { (e.id) } }
            td.job { (e.job_id) }
            td { (e.kind) }
            td { (e.recipient) }
            td { (e.class) }
            td.reason { (e.reason) }
            td { (when(e.failed_at.or(Some(e.ingested_at)))) }
            td { (e.state)
                @if let Some(by) = e.replayed_by.as_ref().or(e.purged_by.as_ref()) { " by " (by) } }
        }
    }
}
