//! The sections still to come: each says what it will show. A section is one handler like
//! these, returning [`layout::page`], and one route in `console::router`.

use std::sync::Arc;

use axum::{Extension, extract::State};
use maud::{Markup, html};

use super::Console;
use super::auth::Session;
use super::layout::{self, Section};

/// `GET /console/dead-letters`.
pub(super) async fn dead_letters(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Markup {
    let what = "failure groups and dead letters with filters, each letter with its job, error \
                and email, and replay or purge after a confirmation";
    placeholder(
        &console,
        &session,
        Section::DeadLetters,
        "Dead letters",
        what,
    )
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
