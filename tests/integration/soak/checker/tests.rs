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

/// One window event of job `job`'s claim number `attempt` in `process`'s log.
fn event(process: &str, job: &str, attempt: i64, window: Window) -> WindowEvent {
    WindowEvent {
        process: process.into(),
        key: Key::new(job, "welcome"),
        attempt,
        window,
    }
}

/// The events of one whole send that SMTP accepted and the process recorded.
fn recorded(process: &str, job: &str, attempt: i64) -> Vec<WindowEvent> {
    [Window::Sending, Window::Accepted, Window::Closed]
        .map(|w| event(process, job, attempt, w))
        .to_vec()
}

/// `clean()` with job `a` received twice and these window events.
fn sent_twice(windows: Vec<WindowEvent>) -> History {
    let mut h = clean();
    h.received.push(mid("a"));
    h.windows = windows;
    h
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
fn a_duplicate_from_a_process_killed_after_smtp_accepted_is_explained_as_w1() {
    let mut h = sent_twice(
        [
            vec![
                event("worker-0.1", "a", 1, Window::Sending),
                event("worker-0.1", "a", 1, Window::Accepted),
            ],
            recorded("worker-1.1", "a", 2),
        ]
        .concat(),
    );
    h.killed.insert("worker-0.1".into());
    let r = check(&h);
    assert!(r.holds(), "{r}");
    assert_eq!(r.duplicates.len(), 1);
    assert_eq!(
        r.duplicates[0].windows,
        ["worker-0.1 attempt 1: W1: killed after SMTP accepted"]
    );
    assert_eq!(
        r.duplicates[0].others,
        ["worker-1.1 attempt 2: sent recorded"]
    );
}

#[test]
fn a_send_that_never_got_its_reply_explains_one_copy() {
    // Same process: the first send timed out after the dot, the retry was recorded.
    let h = sent_twice(
        [
            vec![
                event("worker-0.1", "a", 1, Window::Sending),
                event("worker-0.1", "a", 1, Window::Uncertain),
            ],
            recorded("worker-0.1", "a", 2),
        ]
        .concat(),
    );
    let r = check(&h);
    assert!(r.holds(), "{r}");
    assert_eq!(
        r.duplicates[0].windows,
        ["worker-0.1 attempt 1: W1: uncertain send (reply lost)"]
    );
}

#[test]
fn a_sent_the_worker_could_not_record_explains_one_copy_as_w2() {
    let h = sent_twice(
        [
            vec![
                event("worker-0.1", "a", 1, Window::Sending),
                event("worker-0.1", "a", 1, Window::Accepted),
                event("worker-0.1", "a", 1, Window::Unrecorded),
            ],
            recorded("worker-2.1", "a", 2),
        ]
        .concat(),
    );
    let r = check(&h);
    assert!(r.holds(), "{r}");
    assert_eq!(
        r.duplicates[0].windows,
        ["worker-0.1 attempt 1: W2: sent, could not record it"]
    );
}

#[test]
fn a_duplicate_whose_windows_all_closed_is_unexplained() {
    let r = check(&sent_twice(recorded("worker-0.1", "a", 1)));
    assert_eq!(r.unexplained(), 1);
    assert!(!r.holds());
    assert!(r.to_string().contains("UNEXPLAINED duplicate a/welcome ×2"));
}

/// A live worker's definite failure (4xx, refused, a break before the dot) and its retry on
/// another worker: the first send reached no inbox, so it explains nothing.
#[test]
fn a_live_process_retrying_after_a_definite_failure_does_not_explain_a_duplicate() {
    let h = sent_twice(
        [
            vec![
                event("worker-0.1", "a", 1, Window::Sending),
                event("worker-0.1", "a", 1, Window::Failed),
            ],
            recorded("worker-1.1", "a", 2),
        ]
        .concat(),
    );
    let r = check(&h);
    assert_eq!(r.unexplained(), 1, "{r}");
    assert!(r.duplicates[0].windows.is_empty(), "{r}");
    assert!(!r.holds());
}

/// Issue 12 finding 1: a claim that waited for an SMTP session past its lease, while the
/// job's second copy took the expired claim over in another live worker and sent; then the
/// first holder sent too, and its record was refused. A lease violation, not a window.
#[test]
fn a_claim_taken_over_between_two_live_workers_does_not_explain_a_duplicate() {
    let h = sent_twice(
        [
            vec![event("worker-0.1", "a", 1, Window::Sending)],
            recorded("worker-1.1", "a", 2),
            vec![
                event("worker-0.1", "a", 1, Window::Accepted),
                event("worker-0.1", "a", 1, Window::TakenOver),
            ],
        ]
        .concat(),
    );
    let r = check(&h);
    assert_eq!(r.unexplained(), 1, "{r}");
    assert!(
        r.to_string()
            .contains("worker-0.1 attempt 1: record refused: claim taken over"),
        "{r}"
    );
}

/// The same takeover inside one process (both copies prefetched by one worker): the two
/// claims are told apart by their attempt numbers, and neither window explains the copy.
#[test]
fn a_takeover_within_one_live_process_does_not_explain_a_duplicate() {
    let h = sent_twice(vec![
        event("worker-0.1", "a", 1, Window::Sending),
        event("worker-0.1", "a", 2, Window::Sending),
        event("worker-0.1", "a", 2, Window::Accepted),
        event("worker-0.1", "a", 2, Window::Closed),
        event("worker-0.1", "a", 1, Window::Accepted),
        event("worker-0.1", "a", 1, Window::TakenOver),
    ]);
    let r = check(&h);
    assert_eq!(r.unexplained(), 1, "{r}");
}

/// A window a live process never ended in its log is no evidence of W1/W2: only a SIGKILL
/// ends a window without an outcome line.
#[test]
fn a_window_left_open_by_a_live_process_does_not_explain_a_duplicate() {
    let h = sent_twice(
        [
            vec![
                event("worker-0.1", "a", 1, Window::Sending),
                event("worker-0.1", "a", 1, Window::Accepted),
                event("worker-1.1", "a", 2, Window::Sending),
            ],
            recorded("worker-1.1", "a", 3),
        ]
        .concat(),
    );
    let r = check(&h);
    assert_eq!(r.unexplained(), 1, "{r}");
    assert_eq!(r.duplicates[0].others.len(), 3, "{r}");
}

/// A process killed after its window ended (`sent` recorded) does not explain a later copy.
#[test]
fn a_killed_process_explains_only_a_window_it_was_killed_in() {
    let mut h = sent_twice(
        [
            recorded("worker-0.1", "a", 1),
            vec![
                event("worker-0.1", "b", 1, Window::Sending),
                event("worker-0.1", "b", 1, Window::Accepted),
            ],
            recorded("worker-1.1", "a", 2),
        ]
        .concat(),
    );
    h.killed.insert("worker-0.1".into());
    let r = check(&h);
    assert_eq!(r.unexplained(), 1, "{r}");
}

#[test]
fn every_extra_copy_needs_a_window_of_its_own() {
    let mut h = sent_twice(vec![
        event("worker-0.1", "a", 1, Window::Sending),
        event("worker-0.1", "a", 1, Window::Uncertain),
    ]);
    h.received.push(mid("a"));
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
