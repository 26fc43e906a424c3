//! The Suppressions section: the addresses mailroom does not send to (the same list as
//! `mailroom suppressions` and `/v1/suppressions`), newest first, filtered by reason; a form
//! that adds one, and a Remove button on each. Both are POSTs carrying the session's CSRF
//! token; an entry made here records the session's name as who made it.

use std::sync::Arc;

use axum::{
    Extension, Form,
    extract::{Query, State},
    response::{IntoResponse, Redirect, Response},
};
use maud::{Markup, html};

use super::Console;
use super::auth::Session;
use super::layout::{self, Section};
use crate::db::suppressions::{self, Reason, Suppression};
use crate::job::mask_email;

/// How many entries the page lists.
const PAGE_SIZE: u32 = 200;

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct ListQuery {
    reason: String,
    /// What the last action did, said once after its redirect.
    done: String,
}

/// The add and remove forms' fields (`csrf` is checked by the guard).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct EntryForm {
    address: String,
    reason: String,
    detail: String,
}

fn page(console: &Console, session: &Session, content: Markup) -> Markup {
    let title = "Suppressions";
    layout::page(
        session,
        console.designer,
        Section::Suppressions,
        title,
        content,
    )
}

fn notice(console: &Console, session: &Session, text: &str) -> Markup {
    page(
        console,
        session,
        html! { p.errors role="alert" id="errors" { (text) } },
    )
}

/// `GET /console/suppressions?reason=`.
pub(super) async fn list(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(query): Query<ListQuery>,
) -> Markup {
    let Some(db) = &console.db else {
        return notice(&console, &session, "This process has no database.");
    };
    let reason = match Some(query.reason.trim()).filter(|r| !r.is_empty()) {
        None => None,
        Some(r) => match r.parse::<Reason>() {
            Ok(r) => Some(r),
            Err(e) => return notice(&console, &session, &e),
        },
    };
    let entries = match db.suppressions(reason, None, PAGE_SIZE).await {
        Ok(entries) => entries_markup(&entries, &session),
        Err(e) => {
            html! { p.errors role="alert" id="errors" { "The list could not be read: " (e) } }
        }
    };
    let content = html! {
        @if !query.done.is_empty() { p.notice role="status" id="done" { (query.done) } }
        p { "Jobs whose every " code { "to" } " address is here are recorded "
            strong { "suppressed" } " and not sent; other recipients here are left out of the \
            email. Addresses compare with the domain's case ignored, the local part's kept." }
        (add_form(&session))
        h2 { "Suppressed addresses" }
        (filter_form(reason))
        (entries)
    };
    page(&console, &session, content)
}

fn reason_options(selected: Option<Reason>, with_any: bool) -> Markup {
    html! {
        @if with_any { option value="" selected[selected.is_none()] { "any" } }
        @for r in Reason::ALL {
            option value=(r.as_str()) selected[selected == Some(r)] { (r.as_str()) }
        }
    }
}

fn add_form(session: &Session) -> Markup {
    html! {
        form method="post" action="/console/suppressions/add" id="add" {
            input type="hidden" name="csrf" value=(session.csrf);
            label { "Address " input type="email" name="address" required; }
            label { "Reason " select name="reason" { (reason_options(Some(Reason::Manual), false)) } }
            label { "Detail " input type="text" name="detail" maxlength="500"; }
            button type="submit" { "Suppress" }
        }
    }
}

fn filter_form(reason: Option<Reason>) -> Markup {
    html! {
        form method="get" action="/console/suppressions" id="filter" {
            label { "Reason " select name="reason" { (reason_options(reason, true)) } }
            button type="submit" { "Filter" }
        }
    }
}

fn entries_markup(entries: &[Suppression], session: &Session) -> Markup {
    if entries.is_empty() {
        return html! { p id="entries" { "No address is suppressed." } };
    }
    html! {
        div.table-wrap {
            table id="entries" {
                thead { tr { th { "Address" } th { "Reason" } th { "Detail" } th { "By" }
                    th { "Since" } th { "Act" } } }
                tbody {
                    @for s in entries {
                        tr {
                            td { (s.address) }
                            td { (s.reason.as_str()) }
                            td.reason { (s.detail.as_deref().unwrap_or("")) }
                            td { (s.created_by) }
                            td { (s.created_at.format("%Y-%m-%d %H:%M:%S UTC")) }
                            td {
                                form method="post" action="/console/suppressions/remove" {
                                    input type="hidden" name="csrf" value=(session.csrf);
                                    input type="hidden" name="address" value=(s.address);
                                    button.remove type="submit" { "Remove" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn done(text: &str) -> Response {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("done", text)
        .finish();
    Redirect::to(&format!("/console/suppressions?{query}")).into_response()
}

/// `POST /console/suppressions/add`.
pub(super) async fn add(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Form(form): Form<EntryForm>,
) -> Response {
    let Some(db) = &console.db else {
        return notice(&console, &session, "This process has no database.").into_response();
    };
    let checked = suppressions::key(&form.address).and_then(|key| {
        let reason = form.reason.parse::<Reason>()?;
        Ok((key, reason))
    });
    let (key, reason) = match checked {
        Ok(checked) => checked,
        Err(e) => return notice(&console, &session, &e).into_response(),
    };
    let detail = Some(form.detail.trim()).filter(|d| !d.is_empty());
    match db.suppress(&key, reason, detail, &session.name).await {
        Ok(()) => done(&format!("{} suppressed ({reason}).", mask_email(&key))),
        Err(e) => notice(&console, &session, &format!("Not saved: {e}")).into_response(),
    }
}

/// `POST /console/suppressions/remove`.
pub(super) async fn remove(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Form(form): Form<EntryForm>,
) -> Response {
    let Some(db) = &console.db else {
        return notice(&console, &session, "This process has no database.").into_response();
    };
    let key = match suppressions::key(&form.address) {
        Ok(key) => key,
        Err(e) => return notice(&console, &session, &e).into_response(),
    };
    match db.unsuppress(&key).await {
        Ok(true) => done(&format!("{} is no longer suppressed.", mask_email(&key))),
        Ok(false) => done(&format!("{} was not suppressed.", mask_email(&key))),
        Err(e) => notice(&console, &session, &format!("Not removed: {e}")).into_response(),
    }
}
