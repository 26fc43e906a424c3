//! The Dead letters section: the failure groups and the letters of `mailroom_dead_letters`
//! (`list`), one letter in full with the email as it would render now (`letter`), and replay or
//! purge of one, a selection or a group (`act`), always through a confirmation page that states
//! the count, then a POST carrying the CSRF token.
//!
//! Every read and change goes through [`crate::dlq::DeadLetters`], as the CLI and `/v1/dlq` do.
//! The broker is needed only to replay: [`ReplayTo`] says where, and a replay that cannot reach
//! it says so in one line and marks nothing. A replay claims each row before it publishes it
//! (`dlq/replay.rs`), so replays running at once, from here or the CLI, publish each row once.

mod act;
mod letter;
mod list;
mod query;

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::Console;
use super::auth::Session;
use super::layout::{self, Section};
use crate::broker::Topology;
use crate::config::UrlList;
use crate::dlq::DeadLetters;
use crate::dlq::seal::ReplayKey;

pub(super) use act::{confirm, purge, replay};
pub(super) use letter::letter;
pub(super) use list::list;

/// Where a replay publishes: the broker's nodes, the topology and the key that seals copies.
pub(super) struct ReplayTo {
    pub(super) amqp: UrlList,
    pub(super) topology: Topology,
    /// `MAILROOM_REPLAY_KEY`; `None`: the key kept in the database.
    pub(super) replay_key: Option<ReplayKey>,
}

/// The table, or `None` in a console without a database (the designer's preview).
fn table(console: &Console) -> Option<DeadLetters> {
    console.db.clone().map(DeadLetters::new)
}

/// A page of this section.
fn page(console: &Console, session: &Session, title: &str, content: Markup) -> Markup {
    layout::page(
        session,
        console.designer,
        Section::DeadLetters,
        title,
        content,
    )
}

/// The page of a console without a database.
fn no_database(console: &Console, session: &Session) -> Markup {
    let content = html! {
        p.notice { "This process has no database: dead letters are browsed where "
            code { "mailroom serve" } " or " code { "mailroom run" } " runs." }
    };
    page(console, session, "Dead letters", content)
}

/// A failed read, said in one line.
fn unavailable(what: &str, error: &anyhow::Error) -> Markup {
    html! { p.errors role="alert" id="errors" { (what) ": " (format!("{error:#}")) } }
}

/// A time as the pages show it: to the second, in UTC; `—` when unknown.
fn when(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "—".into(),
        |at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// "1 dead letter", "12 dead letters".
fn letters(n: i64) -> String {
    if n == 1 {
        "1 dead letter".into()
    } else {
        format!("{n} dead letters")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_times_read_as_words() {
        assert_eq!(letters(1), "1 dead letter");
        assert_eq!(letters(12), "12 dead letters");
        assert_eq!(when(None), "—");
        let at = DateTime::parse_from_rfc3339("2026-12-01T10:00:03.5Z").unwrap();
        assert_eq!(when(Some(at.into())), "2026-12-01 10:00:03 UTC");
    }
}
