//! Replay and purge from the console. Every action goes through two requests: a GET of
//! `/console/dead-letters/confirm` (changes nothing) that states what would happen, with counts
//! ("Replay 12 dead letters of group …?"), and a POST of its form, which carries the session's
//! CSRF token like every console form, to `/console/dead-letters/replay` or `/purge`; its page
//! says how many were published or purged and why any were not.
//!
//! An action takes row ids (one letter, or the checked rows of a list) or one failure group;
//! only rows still `dead` are taken. The console acts as the session's name.

use std::sync::Arc;

use axum::{
    Extension,
    body::Bytes,
    extract::{RawQuery, State},
};
use maud::{Markup, html};

use super::{Console, Session, letters, no_database, page, table, unavailable};
use crate::dlq::{DeadLetters, Filter, Replayer, Report, Selection, seal};

/// What the confirmation and its POST name.
#[derive(Clone, Debug, Default, PartialEq)]
struct Target {
    /// `replay` or `purge` (the confirmation's).
    action: String,
    ids: Vec<i64>,
    /// A failure group's key (hex).
    group: Option<String>,
}

impl Target {
    /// The target of a query string or a form body.
    fn parse(encoded: &[u8]) -> Target {
        let mut target = Target::default();
        for (name, value) in url::form_urlencoded::parse(encoded) {
            match &*name {
                "action" => target.action = value.into_owned(),
                "id" => target.ids.extend(value.trim().parse::<i64>().ok()),
                "group" if !value.trim().is_empty() => target.group = Some(value.trim().into()),
                _ => {}
            }
        }
        target
    }

    /// The selection it names: a group, or rows; `None` when it names neither or both.
    fn selection(&self) -> Option<Selection> {
        match (&self.group, self.ids.is_empty()) {
            (Some(group), true) => Some(Selection::Group(group.clone())),
            (None, false) => Some(Selection::Rows(self.ids.clone())),
            _ => None,
        }
    }
}

/// "of group “550 … no such user” (rejected)", "selected", or "(row 7)" for one letter.
async fn described(dlq: &DeadLetters, target: &Target) -> String {
    if let Some(key) = &target.group {
        let groups = dlq.groups(&Filter::default()).await.unwrap_or_default();
        return match groups.iter().find(|g| &g.group == key) {
            Some(g) => format!("of group “{}” ({})", g.reason, g.class),
            None => "of a group that has no dead letters now".into(),
        };
    }
    match target.ids.as_slice() {
        [id] => format!("(letter {id})"),
        _ => "selected".into(),
    }
}

/// Who the console acts as: the session's name.
fn actor(session: &Session) -> String {
    let name = session.name.trim();
    if name.is_empty() {
        "console".into()
    } else {
        name.into()
    }
}

/// `GET /console/dead-letters/confirm?action=…&id=…|group=…`: what would happen, and the form
/// that does it.
pub(in crate::console) async fn confirm(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    RawQuery(query): RawQuery,
) -> Markup {
    let Some(dlq) = table(&console) else {
        return no_database(&console, &session);
    };
    let target = Target::parse(query.unwrap_or_default().as_bytes());
    let verb = match target.action.as_str() {
        "replay" => "Replay",
        "purge" => "Purge",
        _ => return refused(&console, &session, "Name an action: replay or purge."),
    };
    let Some(selection) = target.selection() else {
        return refused(
            &console,
            &session,
            "Nothing selected: check letters, or choose a group.",
        );
    };
    let count = match dlq.count(&selection).await {
        Ok(n) => n,
        Err(e) => {
            return page(
                &console,
                &session,
                "Dead letters",
                unavailable("Counting failed", &e),
            );
        }
    };
    let what = described(&dlq, &target).await;
    let question = format!("{verb} {} {what}?", letters(count));
    let content = html! {
        @if count == 0 {
            p id="question" { "Nothing to " (target.action) ": none of these is still dead." }
        } @else {
            p id="question" { (question) }
            @if verb == "Replay" {
                p { "Each is republished to the work queue with confirms, then marked replayed by "
                    strong { (actor(&session)) } ". A job already sent is not sent again." }
            } @else {
                p { "Each is marked purged by " strong { (actor(&session)) }
                    " and kept until the retention deletes it." }
            }
            form method="post" action=(format!("/console/dead-letters/{}", target.action)) {
                input type="hidden" name="csrf" value=(session.csrf);
                @if let Some(group) = &target.group { input type="hidden" name="group" value=(group); }
                @for id in &target.ids { input type="hidden" name="id" value=(id); }
                div.actions {
                    button.primary type="submit" id="confirm" { (verb) " " (letters(count)) }
                    a href="/console/dead-letters" { "Cancel" }
                }
            }
        }
    };
    page(&console, &session, &format!("{verb} dead letters"), content)
}

fn refused(console: &Console, session: &Session, why: &str) -> Markup {
    let content = html! {
        p.errors role="alert" id="errors" { (why) }
        a href="/console/dead-letters" { "Back to the dead letters" }
    };
    page(console, session, "Dead letters", content)
}

/// `POST /console/dead-letters/replay`: republishes the target, then says what happened. When
/// the broker cannot be reached, nothing is claimed or marked.
pub(in crate::console) async fn replay(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    body: Bytes,
) -> Markup {
    let Some(dlq) = table(&console) else {
        return no_database(&console, &session);
    };
    let target = Target::parse(&body);
    let Some(selection) = target.selection() else {
        return refused(
            &console,
            &session,
            "Nothing selected: check letters, or choose a group.",
        );
    };
    let Some(to) = &console.replay else {
        return refused(
            &console,
            &session,
            "This process has no broker to replay to.",
        );
    };
    let connected = async {
        let key = seal::resolve(to.replay_key.as_ref(), dlq.database()).await?;
        Replayer::connect(&to.amqp, &to.topology, "mailroom console replay", key).await
    }
    .await;
    let mut replayer = match connected {
        Ok(r) => r,
        Err(e) => {
            let content = html! { p.errors role="alert" id="result" {
            "The broker is unreachable; nothing was replayed or marked: " (format!("{e:#}")) } };
            return page(&console, &session, "Replay", content);
        }
    };
    let what = described(&dlq, &target).await;
    let report = dlq
        .replay(&selection, &mut replayer, &actor(&session))
        .await;
    replayer.close().await;
    let content = match report {
        Ok(report) => replayed(&report, &what),
        Err(e) => unavailable("The replay failed", &e),
    };
    page(&console, &session, "Replay", content)
}

fn replayed(r: &Report, what: &str) -> Markup {
    let examined = r.examined - r.claimed_elsewhere;
    html! {
        p id="result" { "Published " (r.moved) " of " (letters(examined as i64)) " " (what) "." }
        (left(r))
        @if r.claimed_elsewhere > 0 {
            p id="elsewhere" { (letters(r.claimed_elsewhere as i64))
                " were being replayed by another replay at the same time, and were left to it." }
        }
        p { a href="/console/dead-letters" { "Back to the dead letters" } }
    }
}

/// The selected rows left dead, by why, and why the action stopped early, if it did.
fn left(r: &Report) -> Markup {
    html! {
        @if !r.skipped.is_empty() {
            div.errors id="failures" role="alert" {
                p { strong { (letters(r.selected_left() as i64)) " stay dead:" } }
                ul { @for (why, n) in &r.skipped { li { (n) " × " (why) } } }
            }
        }
        @if let Some(why) = &r.interrupted {
            p.errors role="alert" id="interrupted" { "Stopped early; the rows not reached stay dead: " (why) }
        }
    }
}

/// `POST /console/dead-letters/purge`: marks the target purged, then says how many.
pub(in crate::console) async fn purge(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    body: Bytes,
) -> Markup {
    let Some(dlq) = table(&console) else {
        return no_database(&console, &session);
    };
    let target = Target::parse(&body);
    let Some(selection) = target.selection() else {
        return refused(
            &console,
            &session,
            "Nothing selected: check letters, or choose a group.",
        );
    };
    let what = described(&dlq, &target).await;
    let content = match dlq.purge(&selection, &actor(&session), false).await {
        Ok(r) => html! {
            p id="result" { "Purged " (r.purged) " of " (letters(r.examined as i64)) " " (what) "." }
            @if r.examined > r.purged {
                p id="elsewhere" { (letters((r.examined - r.purged) as i64))
                    " were taken by a replay or purge running at the same time, and were left to it." }
            }
            (left(&r))
            p { a href="/console/dead-letters" { "Back to the dead letters" } }
        },
        Err(e) => unavailable("The purge failed", &e),
    };
    page(&console, &session, "Purge", content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_names_rows_or_a_group_never_both() {
        let rows = Target::parse(b"action=replay&id=3&id=4&id=x&csrf=t");
        assert_eq!(rows.action, "replay");
        assert_eq!(rows.selection(), Some(Selection::Rows(vec![3, 4])));
        let group = Target::parse(b"action=purge&group=ab12&group=");
        assert_eq!(group.selection(), Some(Selection::Group("ab12".into())));
        assert_eq!(Target::parse(b"id=3&group=ab12").selection(), None);
        assert_eq!(Target::parse(b"action=replay").selection(), None);
    }
}
