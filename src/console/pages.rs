//! The sections still to come: each says what it will show. A section is one handler like
//! these, returning [`layout::page`], and one route in `console::router`.

use std::sync::Arc;

use axum::{Extension, extract::State};
use maud::{Markup, html};

use super::Console;
use super::auth::Session;
use super::layout::{self, Section};

/// `GET /console`.
pub(super) async fn overview(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Markup {
    let what = "sent, retried and dead per minute, queue depths, outbox backlog and relay lag, \
                the SMTP circuit and the workers seen";
    placeholder(&console, &session, Section::Overview, "Overview", what)
}

/// `GET /console/jobs`.
pub(super) async fn jobs(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Markup {
    let what = "search by job id, recipient, kind, state and time, and each job's timeline";
    placeholder(&console, &session, Section::Jobs, "Jobs", what)
}

fn placeholder(
    console: &Console,
    session: &Session,
    section: Section,
    title: &str,
    what: &str,
) -> Markup {
    let content = html! {
        p.notice { "Coming next: " (what) ". Until then, " code { "mailroom dlq" } " and "
            code { "mailroom status" } " answer from the command line." }
        p { a href="/console/templates" { "Templates" } " are editable now." }
    };
    layout::page(session, console.designer, section, title, content)
}
