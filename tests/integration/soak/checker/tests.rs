//! The checker on hand-made histories.

use super::*;

fn mid(job: &str) -> String {
    format!("<{job}.welcome@soak.test>")
}

fn good(job: &str) -> Committed {
    Committed {
        key: Key::new(job, "welcome"),
        message_id: mid(job),
        expect: Expect::Sent,
    }
}

fn bad(job: &str, class: &'static str) -> Committed {
    Committed {
        key: Key::new(job, "welcome"),
        message_id: mid(job),
        expect: Expect::DeadLetter { class },
    }
}

fn letter(job: &str, class: &str, reason: &str) -> DeadLetterSeen {
    DeadLetterSeen {
        key: Key::new(job, "welcome"),
        class: Some(class.into()),
        reason: Some(reason.into()),
    }
}

fn event(process: &str, job: &str, window: Window) -> WindowEvent {
    WindowEvent {
        process: process.into(),
        key: Key::new(job, "welcome"),
        window,
    }
}

/// Two good jobs sent once each, one bad job dead-lettered, ledger clean.
fn clean() -> History {
    History {
        seed: 7,
        committed: vec![good("a"), good("b"), bad("c", "template")],
        ledger: vec![
            (Key::new("a", "welcome"), "sent".into()),
            (Key::new("b", "welcome"), "sent".into()),
            (Key::new("c", "welcome"), "dead".into()),
        ],
        received: vec![mid("a"), mid("b")],
        dead_letters: vec![letter("c", "template", "missing variable user")],
        ..History::default()
    }
}

#[test]
fn a_clean_history_holds() {
    let r = check(&clean());
    assert!(r.holds(), "{r}");
    assert_eq!((r.committed, r.sent, r.dead_lettered), (3, 2, 1));
    assert!(r.to_string().contains("| seed          | 7"));
}

#[test]
fn a_job_neither_received_nor_dead_lettered_is_lost() {
    let mut h = clean();
    h.received.retain(|m| *m != mid("b"));
    h.dead_letters.clear();
    let r = check(&h);
    let lost: Vec<String> = r.lost.iter().map(Key::to_string).collect();
    assert_eq!(lost, ["b/welcome", "c/welcome"]);
    assert!(!r.holds());
}

#[test]
fn a_duplicate_after_an_unclosed_accepted_window_is_explained_as_w1() {
    let mut h = clean();
    h.received.push(mid("a"));
    h.windows = vec![
        event("worker-0.1", "a", Window::Sending),
        event("worker-0.1", "a", Window::Accepted),
        event("worker-1.1", "a", Window::Sending),
        event("worker-1.1", "a", Window::Accepted),
        event("worker-1.1", "a", Window::Closed),
    ];
    h.killed.insert("worker-0.1".into());
    let r = check(&h);
    assert!(r.holds(), "{r}");
    assert_eq!(r.duplicates.len(), 1);
    assert_eq!(r.duplicates[0].windows, ["W1 worker-0.1 (killed)"]);
}

#[test]
fn a_send_that_never_got_its_reply_explains_one_copy_as_w2() {
    let mut h = clean();
    h.received.push(mid("a"));
    // Same process: the first send timed out, the retry was recorded.
    h.windows = vec![
        event("worker-0.1", "a", Window::Sending),
        event("worker-0.1", "a", Window::Sending),
        event("worker-0.1", "a", Window::Accepted),
        event("worker-0.1", "a", Window::Closed),
    ];
    let r = check(&h);
    assert!(r.holds(), "{r}");
    assert_eq!(r.duplicates[0].windows, ["W2 worker-0.1"]);
}

#[test]
fn a_duplicate_whose_windows_all_closed_is_unexplained() {
    let mut h = clean();
    h.received.push(mid("a"));
    h.windows = vec![
        event("worker-0.1", "a", Window::Sending),
        event("worker-0.1", "a", Window::Accepted),
        event("worker-0.1", "a", Window::Closed),
    ];
    let r = check(&h);
    assert_eq!(r.unexplained(), 1);
    assert!(!r.holds());
    assert!(r.to_string().contains("UNEXPLAINED duplicate a/welcome ×2"));
}

#[test]
fn every_extra_copy_needs_a_window_of_its_own() {
    let mut h = clean();
    h.received.extend([mid("a"), mid("a")]);
    h.windows = vec![event("worker-0.1", "a", Window::Accepted)];
    let r = check(&h);
    assert_eq!(r.duplicates[0].copies, 3);
    assert_eq!(r.unexplained(), 1);
}

#[test]
fn emails_nobody_committed_and_sent_bad_jobs_are_unexpected() {
    let mut h = clean();
    h.received.extend([mid("stranger"), mid("c")]);
    let r = check(&h);
    assert_eq!(
        r.unexpected,
        [
            "<c.welcome@soak.test> ×1",
            "<stranger.welcome@soak.test> ×1"
        ]
    );
    assert!(!r.holds());
}

#[test]
fn dead_letters_must_carry_the_expected_class_and_a_reason() {
    let mut h = clean();
    h.dead_letters = vec![letter("c", "invalid", "bad address")];
    assert_eq!(check(&h).misfiled.len(), 1);
    h.dead_letters = vec![letter("c", "template", "")];
    assert_eq!(check(&h).misfiled.len(), 1);
    h.dead_letters = vec![
        letter("c", "template", "x"),
        letter("a", "exhausted", "8 tries"),
    ];
    let r = check(&h);
    assert_eq!(r.misfiled.len(), 1, "{r}");
    assert!(r.misfiled[0].starts_with("a/welcome: good job dead-lettered"));
}

#[test]
fn sending_rows_unpublished_rows_and_leftover_messages_are_stuck() {
    let mut h = clean();
    h.ledger[0].1 = "sending".into();
    h.unpublished = 2;
    h.messages_left = 3;
    let r = check(&h);
    assert_eq!(r.stuck(), 6);
    assert!(!r.holds());
}

#[test]
fn a_process_that_did_not_exit_cleanly_after_sigterm_fails_the_run() {
    let mut h = clean();
    h.hung = vec!["worker-1.5: still running 40s after SIGTERM (SIGKILLed)".into()];
    let r = check(&h);
    assert_eq!(r.hung.len(), 1);
    assert!(!r.holds(), "{r}");
    assert!(r.to_string().contains("hung: worker-1.5"), "{r}");
}
