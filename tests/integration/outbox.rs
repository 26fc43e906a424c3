//! The producer side: the transactional outbox, the relay, and what reaches the SMTP server.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use mailroom::db::Engine;
use mailroom::db::outbox::Enqueued;

use crate::helpers::*;

async fn create_orders_table(app: &TestApp) {
    app.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
        .await;
}

#[tokio::test]
async fn committed_enqueue_sends_one_email_and_rolled_back_enqueue_sends_none() {
    let app = TestApp::spawn().await;
    create_orders_table(&app).await;
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);

    let mut tx = app.begin().await;
    tx.execute("INSERT INTO orders (id) VALUES (1)").await;
    tx.enqueue(&app.email_job("order-1-rolled-back"))
        .await
        .unwrap();
    tx.rollback().await;

    let mut tx = app.begin().await;
    tx.execute("INSERT INTO orders (id) VALUES (2)").await;
    let done = tx
        .enqueue(&app.email_job("order-2-committed"))
        .await
        .unwrap();
    assert!(matches!(done, Enqueued::New(_)));
    // A duplicate inside the same transaction is reported, and leaves the transaction usable.
    let again = tx
        .enqueue(&app.email_job("order-2-committed"))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::AlreadyQueued);
    tx.execute("INSERT INTO orders (id) VALUES (3)").await;
    tx.commit().await;

    app.wait_for_row("order-2-committed", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    relay.stop().await;
    worker.stop().await;
    let received = app.smtp.received();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].message_id,
        Some(app.message_id("order-2-committed", "welcome"))
    );
    assert!(
        app.notification("order-1-rolled-back", "welcome")
            .await
            .is_none()
    );
}

#[tokio::test]
async fn enqueueing_the_same_key_twice_is_a_no_op_and_sends_once() {
    let app = TestApp::spawn().await;
    let job = app.email_job("twice");
    assert!(matches!(app.enqueue(&job).await.unwrap(), Enqueued::New(_)));
    assert_eq!(app.enqueue(&job).await.unwrap(), Enqueued::AlreadyQueued);
    app.deliver_through_outbox("twice", "welcome").await;
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn invalid_jobs_are_refused_at_enqueue_naming_the_field() {
    let app = TestApp::spawn().await;
    let mut job = app.email_job("bad-address");
    job.to = vec!["not an address".into()];
    let err = app.enqueue(&job).await.unwrap_err();
    assert!(err.to_string().contains("to[0]"), "{err}");
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn a_notification_wakes_the_relay_long_before_its_fallback_poll() {
    if !runs_on(
        Engine::Postgres,
        "LISTEN/NOTIFY is PostgreSQL's (MySQL polls, tested below)",
    ) {
        return;
    }
    let app = TestApp::spawn().await;
    // The trigger is off where the migrations found the WAL followable (tests/integration/wal.rs).
    app.execute("ALTER TABLE mailroom_outbox ENABLE TRIGGER mailroom_outbox_notify")
        .await;
    let worker = app.start_worker(&[]);
    // With a one-hour fallback poll, only NOTIFY can deliver this job within the test's patience.
    let relay = app.start_relay(&["--relay-poll", "1h", "--relay-wakeup", "notify"]);
    relay.wait_started().await;
    assert_eq!(
        relay.stats.wakeup_mode(),
        mailroom::relay::WakeupMode::Notify
    );
    app.enqueue(&app.email_job("notified")).await.unwrap();
    app.smtp.wait_for(1).await;
    relay.stop().await;
    worker.stop().await;
}

#[tokio::test]
async fn an_idle_mysql_relay_polls_without_locks_and_picks_up_a_new_row() {
    if !runs_on(
        Engine::MySql,
        "the adaptive poll is MySQL's (PostgreSQL uses NOTIFY)",
    ) {
        return;
    }
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&["--relay-poll-min", "10ms", "--relay-poll-max", "100ms"]);
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    eventually("the relay's first scan", || async {
        (load(&relay.stats.scans) >= 1).then_some(())
    })
    .await;
    let scans = load(&relay.stats.scans);
    let probes = load(&relay.stats.probes);
    eventually("five idle polls", || async {
        (load(&relay.stats.probes) >= probes + 5).then_some(())
    })
    .await;
    assert_eq!(
        load(&relay.stats.scans),
        scans,
        "an idle poll is a lock-free probe, not a locking scan"
    );
    app.enqueue(&app.email_job("polled")).await.unwrap();
    app.smtp.wait_for(1).await;
    assert!(load(&relay.stats.scans) > scans);
    relay.stop().await;
    worker.stop().await;
}

#[tokio::test]
async fn a_row_committed_after_a_later_id_was_published_is_still_published() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    let mut tx = app.begin().await;
    tx.enqueue(&app.email_job("early-id-late-commit"))
        .await
        .unwrap();
    app.enqueue(&app.email_job("late-id-early-commit"))
        .await
        .unwrap();
    app.wait_for_row("late-id-early-commit", "welcome", "later row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    tx.commit().await;
    app.wait_for_row("early-id-late-commit", "welcome", "earlier row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 2);
}

#[tokio::test]
async fn two_relays_on_5000_rows_send_every_job_exactly_once() {
    let app = TestApp::spawn().await;
    let total = 5000;
    let mut tx = app.begin().await;
    for i in 0..total {
        tx.enqueue(&app.email_job(&format!("bulk-{i}")))
            .await
            .unwrap();
    }
    tx.commit().await;
    let a = app.start_relay(&["--relay-batch", "100"]);
    let b = app.start_relay(&["--relay-batch", "100"]);
    let worker = app.start_worker(&["--concurrency", "32", "--prefetch", "64"]);
    // Every job at the server: distinct Message-IDs, since a resend inside its window (below)
    // adds a copy, not a job.
    let distinct = || {
        app.smtp
            .received()
            .iter()
            .map(|r| r.message_id.clone().unwrap())
            .collect::<HashSet<_>>()
    };
    eventually_within(
        std::time::Duration::from_secs(300),
        "every job at the SMTP server",
        || async { (distinct().len() >= total).then_some(()) },
    )
    .await;
    eventually("both relays idle with everything published", || async {
        (app.unpublished().await == 0).then_some(())
    })
    .await;
    let (a_stats, b_stats) = (a.stats.clone(), b.stats.clone());
    let worker_stats = worker.stats.clone();
    a.stop().await;
    b.stop().await;
    worker.stop().await;
    // Read once stopped: a relay counts a batch after its commit.
    let published = [a_stats, b_stats]
        .iter()
        .map(|s| s.published.load(Ordering::Relaxed))
        .sum::<u64>();
    let open_windows = worker_stats.open_windows.load(Ordering::Relaxed);
    assert_eq!(
        published, total as u64,
        "no row was published by both relays"
    );
    assert_eq!(distinct().len(), total);
    // On a starved machine a reply can outlast the 2 s SMTP timeout after the final dot (W2):
    // the worker resends, with the same Message-ID. Each extra copy needs a window the worker
    // counted; an unexplained one fails.
    let extra = app.smtp.received().len() - total;
    assert!(
        extra as u64 <= open_windows,
        "{extra} extra emails, but only {open_windows} sends left their window open"
    );
}

#[tokio::test]
async fn relay_killed_between_confirm_and_mark_publishes_again_and_sends_once() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    app.enqueue(&app.email_job("relay-crash")).await.unwrap();
    let mut crashing =
        app.spawn_relay_process(&[], &[("MAILROOM_FAILPOINTS", "relay.after_confirm=abort")]);
    let status = tokio::time::timeout(PATIENCE, crashing.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success(), "the failpoint aborted the relay");
    assert_eq!(
        app.unpublished().await,
        1,
        "the confirm arrived but the mark never committed"
    );

    let relay = app.start_relay(&[]);
    eventually("the row published by the second relay", || async {
        (app.unpublished().await == 0).then_some(())
    })
    .await;
    worker
        .stats
        .wait_until(|s| s.sent == 1 && s.duplicates == 1)
        .await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("relay-crash", "welcome")), 1);
}

/// A relay whose marks wait the longest hold for company, and that never probes meanwhile
/// (a probe commits held marks first): only the deadline, a full batch or the end commits.
const HOLD_THROUGH_THE_TEST: [&str; 6] = [
    "--relay-commit-hold",
    "10s",
    "--relay-poll-min",
    "30s",
    "--relay-poll",
    "30s",
];

/// Marks that wait for company: with a hold longer than the test, a row committed on its own is
/// published at once (in the queue) while its mark is uncommitted and locked, every published
/// row stays locked or committed (never free for another relay), and the three wake-ups'
/// batches share commits, made when the hold ends. (Normally one commit; a machine so loaded
/// that a step takes longer than the hold may make two.)
#[tokio::test]
async fn rows_committed_apart_are_published_at_once_and_their_marks_share_commits() {
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&HOLD_THROUGH_THE_TEST);
    eventually("the relay's first scan", || async {
        (relay.stats.scans.load(Ordering::Relaxed) >= 1).then_some(())
    })
    .await;
    assert_ne!(
        relay.stats.wakeup_mode(),
        mailroom::relay::WakeupMode::Poll,
        "a stream wakes it"
    );
    for i in 0..3u32 {
        app.enqueue(&app.email_job(&format!("held-{i}")))
            .await
            .unwrap();
        eventually("the row published", || async {
            (app.ready_messages().await == i + 1).then_some(())
        })
        .await;
        if i == 0 {
            // Its hold began with its mark: far from its end.
            assert_eq!(
                app.unpublished().await,
                1,
                "published before its mark committed"
            );
        }
        assert!(
            app.unlocked_unpublished_ids().await.is_empty(),
            "every published row is held locked or committed"
        );
    }
    eventually("the held marks committed when the hold ended", || async {
        (app.unpublished().await == 0).then_some(())
    })
    .await;
    let stats = &relay.stats;
    assert_eq!(
        stats.batches.load(Ordering::Relaxed),
        3,
        "a batch per wake-up"
    );
    let commits = stats.commits.load(Ordering::Relaxed);
    assert!(
        (1..3).contains(&commits),
        "three wake-ups' batches shared commits: {commits}"
    );
    assert_eq!(stats.published.load(Ordering::Relaxed), 3);
    relay.stop().await;
}

/// A server that ends transactions left idle sooner than the hold: the relay holds its marks
/// for half the server's limit instead (1 s of 2), so its session survives, every row is
/// published once, and the marks commit long before the 10 s asked for. Held for the full 10 s,
/// the server would end the session after 2 s and the rows would be published again.
#[tokio::test]
async fn a_hold_longer_than_the_server_lets_a_transaction_idle_is_cut_to_half_its_limit() {
    if !runs_on(
        Engine::Postgres,
        "a session's idle-transaction limit is set by the URL only on PostgreSQL; \
         MariaDB's is read in outbox::the_servers_limit_on_open_transactions_is_read_per_session",
    ) {
        return;
    }
    let app = TestApp::spawn().await;
    let sep = if app.db_url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}options[idle_in_transaction_session_timeout]=2000",
        app.db_url
    );
    let mut args = HOLD_THROUGH_THE_TEST.to_vec();
    args.extend(["--database-url", &url]);
    let relay = app.start_relay(&args);
    relay.wait_started().await;
    for i in 0..2u32 {
        app.enqueue(&app.email_job(&format!("limited-{i}")))
            .await
            .unwrap();
        // Within the 10 s hold asked for: only the bound commits it this soon.
        eventually_within(
            std::time::Duration::from_secs(6),
            "the mark committed within half the server's limit",
            || async { (app.unpublished().await == 0).then_some(()) },
        )
        .await;
        assert_eq!(app.ready_messages().await, i + 1, "each row published once");
    }
    let stats = &relay.stats;
    assert_eq!(
        stats.sessions.load(Ordering::Relaxed),
        1,
        "the session survived"
    );
    assert_eq!(stats.published.load(Ordering::Relaxed), 2);
    assert_eq!(stats.commits.load(Ordering::Relaxed), 2);
    relay.stop().await;
}

/// What bounds the relay's hold: the smallest limit the server puts on a transaction left open,
/// read from the session (PostgreSQL's idle-transaction timeout; MariaDB's idle-transaction
/// timeouts and `wait_timeout`, MySQL's only one).
#[tokio::test]
async fn the_servers_limit_on_open_transactions_is_read_per_session() {
    use sqlx::Executor;
    let app = TestApp::spawn().await;
    let settings: &[(&str, u64)] = match engine() {
        Engine::Postgres => &[("SET idle_in_transaction_session_timeout = 1500", 1500)],
        Engine::MySql => &[
            ("SET SESSION idle_transaction_timeout = 3", 3000),
            ("SET SESSION idle_write_transaction_timeout = 4", 4000),
            ("SET SESSION wait_timeout = 2", 2000),
        ],
    };
    for &(set, ms) in settings {
        let db = match engine() {
            Engine::Postgres => mailroom::db::Database::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .after_connect(move |c, _| {
                        Box::pin(async move { c.execute(set).await.map(|_| ()) })
                    })
                    .connect(&app.db_url)
                    .await
                    .unwrap(),
            ),
            Engine::MySql => mailroom::db::Database::MySql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(1)
                    .after_connect(move |c, _| {
                        Box::pin(async move { c.execute(set).await.map(|_| ()) })
                    })
                    .connect(&app.db_url)
                    .await
                    .unwrap(),
            ),
        };
        assert_eq!(
            db.transaction_idle_limit().await.unwrap(),
            Some(std::time::Duration::from_millis(ms)),
            "{set}"
        );
    }
}

/// A relay killed while its marks are held: the rows of both batches it published are published
/// again by the next relay, and each email is sent once.
#[tokio::test]
async fn a_relay_killed_while_its_marks_are_held_publishes_them_again_and_sends_once() {
    let app = TestApp::spawn().await;
    let mut held = app.spawn_relay_process(&HOLD_THROUGH_THE_TEST, &[]);
    for (i, id) in ["held-a", "held-b"].into_iter().enumerate() {
        app.enqueue(&app.email_job(id)).await.unwrap();
        eventually("the row published", || async {
            (app.ready_messages().await as usize == i + 1).then_some(())
        })
        .await;
    }
    // Both, unless a step took longer than the hold on a loaded machine: then the last one.
    let uncommitted = app.unpublished().await;
    assert!(uncommitted >= 1, "the kill hits marks still held");
    assert!(
        app.unlocked_unpublished_ids().await.is_empty(),
        "held rows are locked"
    );
    held.kill().await.unwrap();

    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    let again = u64::try_from(uncommitted).unwrap();
    worker
        .stats
        .wait_until(|s| s.sent == 2 && s.duplicates == again)
        .await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.unpublished().await, 0);
    for id in ["held-a", "held-b"] {
        assert_eq!(
            app.smtp.count(&app.message_id(id, "welcome")),
            1,
            "{id} sent once"
        );
    }
}

/// The relay claims and writes the next batch while the broker confirms the previous one and
/// its marks commit. Held after its first batch's confirms (before the mark), the relay has
/// written a second batch of other rows, and holds the locks of both and of nothing else.
#[tokio::test]
async fn the_next_batch_is_claimed_and_written_while_the_previous_one_is_settled() {
    let app = TestApp::spawn().await;
    let (batch, total) = (100, 300);
    let mut tx = app.begin().await;
    for i in 0..total {
        tx.enqueue(&app.email_job(&format!("overlap-{i:03}")))
            .await
            .unwrap();
    }
    tx.commit().await;
    let mut held = app.spawn_relay_process(
        &["--relay-batch", &batch.to_string()],
        &[("MAILROOM_FAILPOINTS", "relay.after_confirm=pause")],
    );
    eventually(
        "two batches written while the first is held before its mark",
        || async { (app.ready_messages().await >= 2 * batch).then_some(()) },
    )
    .await;
    assert_eq!(app.unpublished().await, total as i64, "no mark committed");
    let all: Vec<i64> = app.unlocked_unpublished_ids().await;
    assert_eq!(
        all.len(),
        (total - 2 * batch) as usize,
        "the held relay locks exactly its two batches"
    );

    // The two batches are the first 200 rows, each once: the second claim skipped the first's.
    let conn = lapin::Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut ids = Vec::new();
    while let Some(got) = ch
        .basic_get(
            app.topology.queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        let job: serde_json::Value = serde_json::from_slice(&got.delivery.data).unwrap();
        ids.push(job["job_id"].as_str().unwrap().to_string());
    }
    let _ = conn.close(200, "taken".into()).await;
    let expected: Vec<String> = (0..2 * batch).map(|i| format!("overlap-{i:03}")).collect();
    assert_eq!(ids, expected, "the first 200 rows, in order, each once");

    // Killed while held: nothing was marked, so a relay publishes all 300 and each is sent once.
    held.kill().await.unwrap();
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    worker.stats.wait_until(|s| s.sent == total as u64).await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.unpublished().await, 0);
    assert_eq!(app.smtp.received().len(), total as usize);
}

#[tokio::test]
async fn unroutable_rows_stay_unpublished_with_a_reason_until_the_queue_is_back() {
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&[]);
    // After the relay declared the topology at start, so it does not heal the damage at once.
    eventually("the relay's first scan", || async {
        (relay.stats.scans.load(std::sync::atomic::Ordering::Relaxed) >= 1).then_some(())
    })
    .await;
    app.delete_work_queue().await;
    app.enqueue(&app.email_job("unroutable")).await.unwrap();
    let status = eventually("a refused publish", || async {
        let s = mailroom::status::job_status(&app.db, "unroutable", Some("welcome"))
            .await
            .unwrap();
        s.into_iter().find(|s| s.publish_attempts > 0)
    })
    .await;
    assert_eq!(
        status.state, "queued",
        "the refused row is unpublished again"
    );
    assert_eq!(
        status.publish_attempts, 1,
        "one refused publish, counted once"
    );
    assert!(status.last_error.unwrap().contains("unroutable"));

    // A worker declares the topology again when it starts, as after any broker incident.
    let worker = app.start_worker(&[]);
    app.wait_for_row("unroutable", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn published_rows_past_retention_are_deleted_in_batches_and_others_kept() {
    let app = TestApp::spawn().await;
    // More than one retention statement's worth (1,000), so the batches loop.
    let total = 1500;
    let mut tx = app.begin().await;
    for i in 0..total {
        tx.enqueue(&app.email_job(&format!("old-{i}")))
            .await
            .unwrap();
    }
    tx.commit().await;
    // A parked row was never published: retention must leave it for the operator.
    app.execute(
        "INSERT INTO mailroom_outbox (job_id, kind, payload, parked_at)
         VALUES ('parked', 'welcome', '{}', CURRENT_TIMESTAMP)",
    )
    .await;
    let relay = app.start_relay(&["--outbox-retention", "2s"]);
    eventually("every row published", || async {
        (relay.published() == total as u64).then_some(())
    })
    .await;
    eventually(
        "published rows deleted once past the retention age",
        || async { (app.count("SELECT count(*) FROM mailroom_outbox").await == 1).then_some(()) },
    )
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM mailroom_outbox WHERE job_id = 'parked'")
            .await,
        1
    );
    // The counter moves after the statement commits, so await it too.
    eventually("the relay counted every deleted row", || async {
        let deleted = relay
            .stats
            .deleted
            .load(std::sync::atomic::Ordering::Relaxed);
        (deleted == total as u64).then_some(())
    })
    .await;
    relay.stop().await;
}

#[tokio::test]
async fn enqueue_and_status_commands_walk_a_job_to_sent() {
    let app = TestApp::spawn().await;
    let out = app
        .cli(&[
            "enqueue",
            "--kind",
            "welcome",
            "--to",
            "Ada <ada@example.com>",
            "--job-id",
            "cli-1",
            "--data",
            &app.job("x")["data"].to_string(),
        ])
        .await;
    assert!(out.contains("cli-1 queued"), "{out}");
    let out = app.cli(&["status", "cli-1"]).await;
    assert!(out.contains("cli-1 welcome: queued"), "{out}");
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    app.wait_for_row("cli-1", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    let out = app.cli(&["status", "cli-1", "welcome", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["state"], "sent");
    assert_eq!(json["attempts"], 1);
    assert!(json["published_at"].is_string());
    relay.stop().await;
    worker.stop().await;
}

/// On PostgreSQL (the floor is its own: InnoDB purges the index entries of published rows), an
/// app with a worker and a relay that scans from the first row every `full_every`.
async fn floor_app(full_every: &str) -> Option<(TestApp, RunningWorker, RunningRelay)> {
    if !runs_on(
        Engine::Postgres,
        "the floor skips PostgreSQL's index entries of published rows; InnoDB purges them",
    ) {
        return None;
    }
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&["--relay-full-scan-every", full_every]);
    Some((app, worker, relay))
}

/// Enqueues three jobs named `prefix-N`, waits until they were sent and until `relay`'s scans
/// start past the last of them; returns its outbox id.
async fn published_under_the_floor(app: &TestApp, relay: &RunningRelay, prefix: &str) -> i64 {
    let sent = app.smtp.received().len() + 3;
    let mut last = 0;
    for i in 0..3 {
        let job = app.email_job(&format!("{prefix}-{i}"));
        let Enqueued::New(id) = app.enqueue(&job).await.unwrap() else {
            panic!("a new row")
        };
        last = id;
    }
    app.smtp.wait_for(sent).await;
    eventually("the floor past the published rows", || async {
        (relay.stats.scan_floor.load(Ordering::Relaxed) > last).then_some(())
    })
    .await;
    last
}

#[tokio::test]
async fn the_scans_floor_rises_past_published_rows_and_never_past_an_id_not_yet_committed() {
    // No full scan in this test: only the floor can find the late row.
    let Some((app, worker, relay)) = floor_app("1h").await else {
        return;
    };
    let floor = || relay.stats.scan_floor.load(Ordering::Relaxed);
    let steps = || relay.count(|s| &s.floor_steps);
    published_under_the_floor(&app, &relay, "before").await;

    // A producer holds an id and has not committed; a later id commits and is published.
    let mut tx = app.begin().await;
    let Enqueued::New(early) = tx
        .enqueue(&app.email_job("early-id-late-commit"))
        .await
        .unwrap()
    else {
        panic!("a new row")
    };
    app.enqueue(&app.email_job("late-id-early-commit"))
        .await
        .unwrap();
    app.wait_for_row("late-id-early-commit", "welcome", "later row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    // A round of the floor begins after a row was published and ends in its next step at the
    // earliest: two steps give it the chance to rise past the open transaction's id.
    let taken = steps();
    eventually("two more steps of the floor", || async {
        (steps() >= taken + 2).then_some(())
    })
    .await;
    assert!(
        floor() <= early,
        "the floor ({}) rose past id {early}, held by a transaction not yet committed",
        floor()
    );
    tx.commit().await;
    app.wait_for_row("early-id-late-commit", "welcome", "earlier row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    eventually("the floor past every row", || async {
        (floor() > early + 1).then_some(())
    })
    .await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 5);
}

#[tokio::test]
async fn a_row_unparked_below_the_scans_floor_is_published_by_the_next_full_scan() {
    let Some((app, worker, relay)) = floor_app("1s").await else {
        return;
    };
    let floor = || relay.stats.scan_floor.load(Ordering::Relaxed);
    // A row the relay gave up on (parked), then rows published after it.
    let mut tx = app.begin().await;
    let Enqueued::New(parked) = tx.enqueue(&app.email_job("parked")).await.unwrap() else {
        panic!("a new row")
    };
    tx.execute(&format!(
        "UPDATE mailroom_outbox SET parked_at = now() WHERE id = {parked}"
    ))
    .await;
    tx.commit().await;
    let last = published_under_the_floor(&app, &relay, "after").await;
    assert!(floor() > parked && last > parked);
    // An operator clears `parked_at`, as docs/PRODUCERS.md says: only a full scan looks below
    // the floor.
    app.execute(&format!(
        "UPDATE mailroom_outbox SET parked_at = NULL WHERE id = {parked}"
    ))
    .await;
    app.wait_for_row("parked", "welcome", "the unparked row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 4);
}
