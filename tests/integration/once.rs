//! The "once" promise when nothing crashes but the worker has to wait, and when the job's own
//! bytes are unusual: a starved SMTP pool behind a slow server, a delivery riding behind the
//! send that holds the one session, a claim too late for a whole send, multibyte ids at the byte limit, ids that differ only in trailing spaces or Unicode
//! normalisation. Counted at the SMTP server, on every engine.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::join_all;
use mailroom::db::group::Ledger;
use mailroom::db::is_data_error;
use mailroom::db::{Claim, ClaimRequest};

use crate::helpers::*;
use mailroom_test_kit::smtp::Received;

/// One SMTP session for 32 deliveries, a server taking 1.5 s per message and a 3 s send
/// timeout under `lease`; `n` jobs, each published twice, all settled (sent or acked as the
/// duplicate) when it returns, with the app still up. Each job reached the SMTP server once,
/// or it panics.
async fn starved_pool(lease: &str, prefix: &str, n: usize) -> (TestApp, RunningWorker) {
    let app = TestApp::spawn_with(&["--data-delay", "1.5"]).await;
    let worker = app.start_worker(&[
        "--concurrency",
        "32",
        "--prefetch",
        "64",
        "--smtp-connections",
        "1",
        "--smtp-timeout",
        "3s",
        "--lease",
        lease,
    ]);
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for id in &ids {
        let job = app.job(id);
        app.publish(&job).await;
        app.publish(&job).await;
    }
    // A duplicate send would show as an extra `sent` before the last duplicate.
    worker
        .stats
        .wait_until(|s| s.sent + s.duplicates >= 2 * n as u64)
        .await;
    for id in &ids {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
    }
    assert_eq!(app.smtp.received().len(), n);
    (app, worker)
}

#[tokio::test]
async fn a_starved_smtp_pool_and_a_slow_server_send_each_job_once() {
    // Most deliveries wait far longer than the 5 s lease for a session. They wait before
    // claiming, so no lease runs out while they wait and no copy takes over a claim whose
    // holder is still going to send.
    let (_app, worker) = starved_pool("5s", "starved", 12).await;
    let waited = worker.stats.longest_session_wait();
    worker.stop().await;
    assert!(
        waited > Duration::from_secs(5),
        "the fault did not land: the longest wait for an SMTP session, {waited:?}, is within the lease"
    );
}

#[tokio::test]
async fn claims_in_line_ahead_of_a_slow_pool_wait_within_their_lease_and_send_each_job_once() {
    // The same starved pool, with a lease that covers one more whole send (8 s for a 3 s
    // timeout): a second delivery claims while the one connection is busy and waits for it
    // after its claim (riding behind the send in progress when it was in line before that
    // send's 354). It must get it within one send and send on a claim still its own.
    let (_app, worker) = starved_pool("8s", "in-line", 8).await;
    let after_claim = worker.stats.longest_connection_wait();
    let given_back = worker.stats.given_back.load(Ordering::Relaxed);
    worker.stop().await;
    assert!(
        after_claim > Duration::from_millis(700),
        "the fault did not land: no claimed delivery waited for the busy connection ({after_claim:?})"
    );
    assert!(
        after_claim < Duration::from_secs(3),
        "a claim waited {after_claim:?} for its connection, longer than one whole send"
    );
    assert_eq!(
        given_back, 0,
        "every claim in line got its connection in time"
    );
}

/// What a server and a worker saw of two jobs sent through one SMTP session.
struct HeldBehind {
    /// As the server recorded them, in the order accepted.
    received: Vec<Received>,
    /// Sends that rode behind the previous message's dot, as the worker counted them.
    rode: u64,
    /// Deliveries handed to the retry queue.
    retried: u64,
}

/// Two jobs through one SMTP session, the server holding the first send's 354 until the second
/// delivery has claimed and waits in line for the session; each job received once.
async fn one_held_behind_the_other(smtp_args: &[&str], prefix: &str) -> HeldBehind {
    let gate_dir = tempfile::tempdir().unwrap();
    let gate = gate_dir.path().join("hold-354");
    std::fs::write(&gate, b"").unwrap();
    let mut args = vec!["--gate-354", gate.to_str().unwrap()];
    args.extend_from_slice(smtp_args);
    let app = TestApp::spawn_with(&args).await;
    let worker = app.start_worker(&["--smtp-connections", "1", "--concurrency", "8"]);
    let ids = [format!("{prefix}-first"), format!("{prefix}-second")];
    for id in &ids {
        app.publish(&app.job(id)).await;
    }
    eventually(
        "a claimed delivery waiting for the held session",
        || async { (worker.stats.smtp_waiting() == 1).then_some(()) },
    )
    .await;
    assert!(
        app.smtp.received().is_empty(),
        "the first send was not held at its 354"
    );
    std::fs::remove_file(&gate).unwrap();
    worker.stats.wait_until(|s| s.sent >= 2).await;
    let snapshot = worker.stats.snapshot();
    let rode = worker.stats.rode_along.load(Ordering::Relaxed);
    worker.stop().await;
    for id in &ids {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
    }
    HeldBehind {
        received: app.smtp.received(),
        rode,
        retried: snapshot.retried,
    }
}

#[tokio::test]
async fn a_delivery_waiting_for_the_busy_session_rides_behind_its_dot_and_each_job_is_sent_once() {
    let seen = one_held_behind_the_other(&[], "ride").await;
    let behind: Vec<bool> = seen.received.iter().map(|r| r.behind_dot).collect();
    assert_eq!(
        behind,
        [false, true],
        "the second message's MAIL did not reach the server with the first one's dot"
    );
    assert_eq!(
        seen.rode, 1,
        "the worker did not count the ride the server saw"
    );
    assert_eq!(seen.retried, 0);
}

#[tokio::test]
async fn without_pipelining_a_delivery_waiting_for_the_busy_session_waits_for_the_reply() {
    let seen = one_held_behind_the_other(&["--no-pipelining"], "no-ride").await;
    assert!(
        seen.received.iter().all(|r| !r.behind_dot),
        "a message rode behind a dot to a server that does not pipeline: {:?}",
        seen.received
    );
    assert_eq!(seen.rode, 0);
}

#[tokio::test]
async fn a_ride_refused_by_a_cap_on_messages_per_connection_is_sent_once_on_a_new_connection() {
    // The server accepts one message per connection: the second's MAIL, written behind the
    // first one's dot, is answered 421 and the connection closed. Nothing of it was accepted,
    // so it goes out at once on a connection of its own, not through the retry queue.
    let seen = one_held_behind_the_other(&["--session-messages", "1"], "capped").await;
    assert_eq!(
        seen.rode, 1,
        "the fault did not land: nothing rode behind the dot"
    );
    assert!(
        seen.received.iter().all(|r| !r.behind_dot),
        "a message was accepted behind a dot on a capped connection: {:?}",
        seen.received
    );
    assert_eq!(
        seen.retried, 0,
        "the refused ride went through the retry queue"
    );
}

/// Publishes a job for each of `batch`, adds them to `ids`, and waits until every job of `ids`
/// was sent.
async fn send_all(
    app: &TestApp,
    worker: &RunningWorker,
    ids: &mut Vec<String>,
    batch: impl Iterator<Item = String>,
) {
    for id in batch {
        app.publish(&app.job(&id)).await;
        ids.push(id);
    }
    let n = ids.len() as u64;
    worker.stats.wait_until(|s| s.sent >= n).await;
}

#[tokio::test]
async fn a_fast_server_turning_slow_gives_back_at_most_the_deeper_places_and_sends_each_job_once() {
    // Two connections, 8 deliveries, a 2 s send under a 7 s lease: the line proper is 4
    // places, and 4 deeper places open while sends end within 3 s / 6 (worker::lease::
    // deeper_line). Then every send takes 1.3 s: the claims made at the back of the deeper
    // line wait three rounds of sends (3.9 s) for a connection, more than the 3.5 s their lease
    // leaves, and are given back. The line must go shallow at once: a line that stayed deep
    // would give back two claims every few seconds for as long as the backlog lasts.
    let files = tempfile::tempdir().unwrap();
    let stall = files.path().join("stall");
    let app = TestApp::spawn_with(&["--stall-file", stall.to_str().unwrap()]).await;
    let worker = app.start_worker(&[
        "--concurrency",
        "8",
        "--prefetch",
        "16",
        "--smtp-connections",
        "2",
        "--smtp-timeout",
        "2s",
        "--lease",
        "7s",
    ]);
    let mut ids = Vec::new();
    // Fast sends first, in bursts larger than the line proper, until a burst took deeper places.
    for burst in 0..20 {
        let batch = (0..12).map(|i| format!("fast-{burst}-{i}"));
        send_all(&app, &worker, &mut ids, batch).await;
        if worker.stats.deeper_places.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    let deepened = worker.stats.deeper_places.load(Ordering::Relaxed);
    assert!(
        deepened > 0,
        "the line never deepened while sends were fast"
    );
    assert_eq!(worker.stats.given_back.load(Ordering::Relaxed), 0);
    // The server turns slow, within the send timeout, with the line deep.
    std::fs::write(files.path().join("stall.new"), "1.3").unwrap();
    std::fs::rename(files.path().join("stall.new"), &stall).unwrap();
    send_all(
        &app,
        &worker,
        &mut ids,
        (0..24).map(|i| format!("slow-{i}")),
    )
    .await;
    let given_back = worker.stats.given_back.load(Ordering::Relaxed);
    worker.stop().await;
    for id in &ids {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
    }
    assert_eq!(app.smtp.received().len(), ids.len());
    assert!(
        given_back >= 1,
        "the fault did not land: no claim made deep in line waited past its lease"
    );
    assert!(
        given_back <= 4,
        "{given_back} claims given back, more than the 4 deeper places: the line stayed deep"
    );
}

#[tokio::test]
async fn a_claim_too_late_for_a_whole_send_is_given_back_uncounted_and_sent_once() {
    // The first delivery stalls 2 s right after its claim: of its 5 s lease, 2.5 s remain
    // before the deadline (lease minus margin), less than a 2 s send plus its 1 s record.
    let app = TestApp::spawn().await;
    let mut worker = app.spawn_worker_process(
        &["--lease", "5s"],
        &[(
            "MAILROOM_FAILPOINTS",
            "worker.after_claim@fenced=delay-once:2s",
        )],
    );
    app.publish(&app.job("fenced")).await;
    let row = app
        .wait_for_row("fenced", "welcome", "row sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    app.smtp.wait_for(1).await;
    terminate(&worker).await;
    worker.wait().await.unwrap();
    let log = std::fs::read_to_string(app.dir.path().join("worker.log")).unwrap();
    assert!(
        log.contains("failpoint: delaying") && log.contains("less than a whole send"),
        "the fence did not trip:\n{log}"
    );
    assert_eq!(row.attempts, 1, "a claim given back is not an attempt");
    assert_eq!(app.smtp.count(&app.message_id("fenced", "welcome")), 1);
    assert_eq!(app.smtp.received().len(), 1);
}

/// Ids at the limit in bytes, each made of characters of another width.
fn multibyte_ids() -> Vec<String> {
    vec![
        "注文確認".repeat(15),                   // 60 CJK characters, 180 bytes
        "📦".repeat(50),                         // 50 emoji, 200 bytes
        "é".repeat(100),                         // 100 two-byte characters, 200 bytes
        format!("{}-order.42", "注".repeat(63)), // 198 bytes with ASCII and dots
    ]
}

#[tokio::test]
async fn multibyte_job_ids_up_to_the_byte_limit_are_sent_once() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    let ids = multibyte_ids();
    for id in &ids {
        assert!(id.len() <= mailroom::job::MAX_JOB_ID_BYTES, "{id}");
        app.publish(&app.job(id)).await;
        app.publish(&app.job(id)).await;
    }
    worker
        .stats
        .wait_until(|s| s.sent + s.duplicates >= 8)
        .await;
    worker.stop().await;
    for id in &ids {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
        let row = app.notification(id, "welcome").await.unwrap();
        assert_eq!(row.status.as_str(), "sent", "{id}");
        assert_eq!(&row.job_id, id);
    }
    assert_eq!(app.smtp.received().len(), ids.len());
}

#[tokio::test]
async fn a_job_id_over_the_byte_limit_is_refused_at_the_outbox_and_dead_lettered_by_the_worker() {
    let app = TestApp::spawn().await;
    let long = "📦".repeat(51); // 204 bytes, 51 characters
    let refused = app.enqueue(&app.email_job(&long)).await.unwrap_err();
    assert!(refused.to_string().contains("job_id"), "{refused}");
    assert!(refused.to_string().contains("204 bytes"), "{refused}");

    let worker = app.start_worker(&[]);
    app.publish(&app.job(&long)).await;
    let dead = app.dead_letters(1).await;
    worker.stop().await;
    assert_eq!(
        dead[0].header("x-mailroom-error-class").as_deref(),
        Some("invalid")
    );
    let reason = dead[0].header("x-mailroom-error").unwrap();
    assert!(reason.contains("204 bytes"), "{reason}");
    assert!(app.smtp.received().is_empty());
}

#[tokio::test]
async fn ids_that_differ_only_in_trailing_spaces_or_normalisation_are_different_jobs() {
    // MariaDB's utf8mb4_bin pads with spaces: `same` and `same ` were one key there.
    let app = TestApp::spawn().await;
    let ids = [
        "same",
        "same ",
        "same  ",
        "caf\u{e9}",         // NFC
        "cafe\u{301}",       // NFD: the same text to a person, other bytes
        "order.7",           // a dot, escaped as =2E in the Message-ID
        "order=2E7",         // … so this one must not collide with it
        "order.7.confirmed", // dots in a row of parts
    ];
    let mut tx = app.begin().await;
    for id in ids {
        tx.enqueue(&app.email_job(id)).await.unwrap();
    }
    tx.commit().await;
    assert_eq!(
        app.unpublished().await,
        ids.len() as i64,
        "one outbox row each"
    );
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    worker
        .stats
        .wait_until(|s| s.sent + s.duplicates >= ids.len() as u64)
        .await;
    relay.stop().await;
    worker.stop().await;
    for id in ids {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id:?}");
        let row = app.notification(id, "welcome").await.unwrap();
        assert_eq!(row.job_id, id, "the row of {id:?} is its own");
        assert_eq!(row.status.as_str(), "sent", "{id:?}");
    }
    assert_eq!(app.smtp.received().len(), ids.len());
}

#[tokio::test(flavor = "current_thread")]
async fn a_claim_the_database_refuses_fails_alone_not_its_whole_group() {
    // Longer than the column on both engines: the database refuses this member's data.
    let app = TestApp::spawn().await;
    let ledger = Ledger::direct(app.db.clone(), Default::default()).grouped(16);
    let overlong = "x".repeat(900);
    let ids: Vec<String> = (0..5)
        .map(|i| format!("group-{i}"))
        .chain([overlong.clone()])
        .collect();
    let requests: Vec<ClaimRequest> = ids
        .iter()
        .map(|id| ClaimRequest {
            job_id: id,
            kind: "welcome",
            message_id: "<group@mailroom.test>",
            token: uuid::Uuid::new_v4(),
            lease: Duration::from_secs(30),
            resend_uncertain: true,
            replay: false,
            recipient: None,
            screen: &[],
        })
        .collect();
    // On one thread every claim is queued before the group writer runs: one group holds all.
    let answers = join_all(requests.iter().map(|r| ledger.claim(r))).await;
    let stats = ledger.stats();
    for (id, answer) in ids.iter().zip(&answers) {
        if id == &overlong {
            let e = answer.as_ref().unwrap_err();
            assert!(is_data_error(e), "a data error, not an outage: {e}");
        } else {
            assert!(
                matches!(answer, Ok(Claim::Claimed { attempt: 1, .. })),
                "{id}: {answer:?}"
            );
        }
    }
    let split = stats.split.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        split, 1,
        "the refused member was in a group, which was split"
    );
}
