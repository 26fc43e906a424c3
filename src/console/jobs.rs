//! The Jobs section: a search form (job id or prefix, recipient, kind, state, since/until)
//! over [`crate::jobs::search`], the same search as `GET /v1/jobs` and `mailroom jobs search`;
//! results newest first, a page at a time, each linking to its job's page ([`super::job`]).
//! Recipients are masked, as in the API without `reveal`.

use std::sync::Arc;

use axum::{
    Extension,
    extract::{Query, State},
};
use maud::{Markup, html};

use super::Console;
use super::auth::Session;
use super::job::job_href;
use super::layout::{self, Section};
use super::preview::errors_markup;
use crate::jobs::{Page, STATES, Search, SearchError, search};

/// How many jobs a page of results shows.
const PAGE_SIZE: i64 = 50;

/// The form as the browser sends it: every field present, empty when not used.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct SearchForm {
    job_id: String,
    recipient: String,
    kind: String,
    state: String,
    since: String,
    until: String,
    cursor: String,
}

impl SearchForm {
    /// The search it asks for, with `cursor` (the page to show).
    fn search(&self) -> Search {
        let given = |s: &str| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
        Search {
            job_id: given(&self.job_id),
            recipient: given(&self.recipient),
            kind: given(&self.kind),
            state: given(&self.state),
            since: given(&self.since),
            until: given(&self.until),
            cursor: given(&self.cursor),
            limit: Some(PAGE_SIZE),
            reveal: false,
        }
    }

    /// The URL of these filters on the page after `cursor` (the first page without one).
    fn page_href(&self, cursor: Option<&str>) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        let filters = [
            ("job_id", &self.job_id),
            ("recipient", &self.recipient),
            ("kind", &self.kind),
            ("state", &self.state),
            ("since", &self.since),
            ("until", &self.until),
        ];
        for (name, value) in filters.iter().filter(|(_, v)| !v.trim().is_empty()) {
            query.append_pair(name, value.trim());
        }
        if let Some(cursor) = cursor {
            query.append_pair("cursor", cursor);
        }
        match query.finish() {
            q if q.is_empty() => "/console/jobs".to_owned(),
            q => format!("/console/jobs?{q}"),
        }
    }
}

/// `GET /console/jobs?…`: the form, and the jobs that match it (the newest when it is empty).
pub(super) async fn list(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(form): Query<SearchForm>,
) -> Markup {
    let results = match &console.db {
        None => {
            html! { p.notice { "No database here: jobs are searched in " code { "mailroom serve" }
            " or " code { "mailroom run" } "." } }
        }
        Some(db) => match search(db, &form.search()).await {
            Ok(page) => results(&form, &page),
            Err(SearchError::Filter(e)) => errors_markup(
                "This search cannot be run",
                &[format!("{}: {}", label(e.field), e.reason)],
            ),
            Err(e) => errors_markup("The search failed", &[e.to_string()]),
        },
    };
    let content = html! { (filters(&form)) (results) };
    layout::page(&session, console.designer, Section::Jobs, "Jobs", content)
}

/// The form's label of a search field, for an error about it.
fn label(field: &str) -> &str {
    match field {
        "job_id" => "Job id",
        "recipient" => "Recipient",
        "kind" => "Kind",
        "state" => "State",
        "since" => "Created since",
        "until" => "Created before",
        "cursor" => "Page",
        other => other,
    }
}

fn filters(form: &SearchForm) -> Markup {
    let field = |name: &str, text: &str, value: &str, hint: &str| {
        html! { div {
            label for=(name) { (text) }
            input type="text" id=(name) name=(name) value=(value) autocomplete="off"
                placeholder=(hint) spellcheck="false";
        } }
    };
    html! {
        form.filters id="search" method="get" action="/console/jobs" role="search" {
            (field("job_id", "Job id (a trailing * for a prefix)", &form.job_id, "order-1042 or order-*"))
            (field("recipient", "Recipient (first To address)", &form.recipient, "ada@example.com"))
            (field("kind", "Kind", &form.kind, "welcome"))
            div {
                label for="state" { "State" }
                select id="state" name="state" {
                    option value="" selected[form.state.is_empty()] { "any" }
                    @for state in STATES {
                        option value=(state) selected[form.state == *state] { (state) }
                    }
                }
            }
            (field("since", "Created since (RFC 3339 or 2h, 7d)", &form.since, "2h"))
            (field("until", "Created before", &form.until, "2026-12-01T12:00:00Z"))
            div.actions { button.primary type="submit" id="search-submit" { "Search" }
                a href="/console/jobs" { "Clear" } }
        }
    }
}

fn results(form: &SearchForm, page: &Page) -> Markup {
    html! {
        section aria-labelledby="results-title" {
            h2 id="results-title" { "Jobs, newest first" }
            @if page.jobs.is_empty() {
                p id="no-jobs" { @if form.cursor.is_empty() { "No job matches." }
                    @else { "No more jobs match." } }
            } @else {
                div.table-wrap { table id="jobs" {
                    thead { tr { th scope="col" { "Created (UTC)" } th scope="col" { "Job id" }
                        th scope="col" { "Kind" } th scope="col" { "State" }
                        th scope="col" { "Recipient" } } }
                    tbody { @for job in &page.jobs { tr {
                        td { (job.created_at.format("%Y-%m-%d %H:%M:%S")) }
                        td.id { a href=(job_href(&job.job_id, &job.kind)) { (job.job_id) } }
                        td { (job.kind) }
                        td { span class=(format!("state-{}", job.state)) { (job.state) } }
                        td { (job.recipient.as_deref().unwrap_or("—")) }
                    } } }
                } }
            }
            nav.actions aria-label="Pages" {
                @if !form.cursor.is_empty() {
                    a href=(form.page_href(None)) { "First page" }
                }
                @if let Some(next) = &page.next_cursor {
                    a id="next-page" rel="next" href=(form.page_href(Some(next))) { "Next page" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_fields_are_no_filter_and_the_next_page_keeps_the_filters_encoded() {
        let form = SearchForm {
            job_id: "注文/1*".into(),
            recipient: "  ".into(),
            state: "sent".into(),
            ..SearchForm::default()
        };
        let search = form.search();
        assert_eq!(search.job_id.as_deref(), Some("注文/1*"));
        assert_eq!((search.recipient, search.kind), (None, None));
        assert_eq!(
            form.page_href(Some("7b22")),
            "/console/jobs?job_id=%E6%B3%A8%E6%96%87%2F1*&state=sent&cursor=7b22"
        );
        assert_eq!(SearchForm::default().page_href(None), "/console/jobs");
    }
}
