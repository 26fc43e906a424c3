//! PostgreSQL: the relay woken by the WAL (a temporary logical slot). The relays here probe
//! rarely (from 200 ms after activity, doubling, up to an hour when idle), and each commit
//! must show up in the relay's count of wake-ups, so a broken stream fails them. They need
//! the server `scripts/services` sets up: `wal_level = logical` and the `REPLICATION`
//! attribute for the test user.

use mailroom::db::Engine;
use mailroom::relay::WakeupMode;
use sqlx::PgPool;

use crate::helpers::*;

const WHY: &str = "the WAL is PostgreSQL's (MySQL/MariaDB follow the binary log)";

/// The test database, for the queries the helpers do not have.
async fn pool(app: &TestApp) -> PgPool {
    PgPool::connect(&app.db_url).await.unwrap()
}

/// The test app on a server whose WAL the relay can follow; fails, saying what to set up,
/// on one it cannot.
async fn app_on_logical_server() -> Option<TestApp> {
    if !runs_on(Engine::Postgres, WHY) {
        return None;
    }
    let app = TestApp::spawn().await;
    let (level, replication): (String, bool) = sqlx::query_as(
        "SELECT current_setting('wal_level'),
                (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)",
    )
    .fetch_one(&pool(&app).await)
    .await
    .unwrap();
    assert!(
        level == "logical" && replication,
        "wal_level is {level}, REPLICATION {replication}: run scripts/services (it sets \
         wal_level = logical and grants REPLICATION to the test user)"
    );
    Some(app)
}

#[tokio::test]
async fn a_commit_wakes_an_idle_relay_through_the_wal() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    let relay = app.start_relay(&RELAY_NO_PROBES);
    relay.wait_started().await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Wal);
    for i in 1..=3 {
        app.enqueue(&app.email_job(&format!("woken-{i}")))
            .await
            .unwrap();
        relay.wait_woken(i, "WAL").await;
        relay.wait_published(i).await;
    }
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}

/// A URL that asks for TLS still gets the WAL wake-up (not the NOTIFY fallback), and the
/// server's WAL sender for the relay's slot runs on an encrypted link: the stream is as
/// protected as the relay's pool, whether the URL checks the certificate or not.
#[tokio::test]
async fn a_url_that_asks_for_tls_gets_the_wal_stream_over_tls() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    let pg = pool(&app).await;
    let ssl: String = sqlx::query_scalar("SHOW ssl").fetch_one(&pg).await.unwrap();
    assert_eq!(
        ssl, "on",
        "the test server needs ssl = on (Debian's default, with its snakeoil certificate)"
    );
    let cert: String = sqlx::query_scalar("SHOW ssl_cert_file")
        .fetch_one(&pg)
        .await
        .unwrap();
    let variants = [
        "sslmode=require".to_string(),
        format!("sslmode=verify-ca&sslrootcert={cert}"),
    ];
    for (i, query) in variants.iter().enumerate() {
        let url = format!("{}?{query}", app.db_url);
        let mut args = RELAY_NO_PROBES.to_vec();
        args.extend(["--database-url", &url]);
        let relay = app.start_relay(&args);
        relay.wait_started().await;
        assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Wal, "{query}");
        // The previous relay's WAL sender may take a moment to exit.
        eventually(&format!("{query}: one WAL sender, on TLS"), || async {
            let (senders, encrypted): (i64, i64) = sqlx::query_as(
                "SELECT count(*), count(*) FILTER (WHERE s.ssl)
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.backend_type = 'walsender' AND a.datname = current_database()",
            )
            .fetch_one(&pg)
            .await
            .unwrap();
            ((senders, encrypted) == (1, 1)).then_some(())
        })
        .await;
        app.enqueue(&app.email_job(&format!("over-tls-{i}")))
            .await
            .unwrap();
        relay.wait_woken(1, "WAL over TLS").await;
        relay.wait_published(1).await;
        relay.stop().await;
    }
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn the_migrations_leave_producers_no_trigger_where_the_wal_is_followed() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    let enabled: String = sqlx::query_scalar(
        "SELECT tgenabled::text FROM pg_trigger
         WHERE tgrelid = 'mailroom_outbox'::regclass AND tgname = 'mailroom_outbox_notify'",
    )
    .fetch_one(&pool(&app).await)
    .await
    .unwrap();
    assert_eq!(enabled, "D", "the NOTIFY trigger is disabled");
}

#[tokio::test]
async fn a_transaction_that_commits_after_later_ones_is_published_from_the_wal() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    let relay = app.start_relay(&RELAY_NO_PROBES);
    relay.wait_started().await;
    let mut early = app.begin().await;
    early
        .enqueue(&app.email_job("early-id-late-commit"))
        .await
        .unwrap();
    app.enqueue(&app.email_job("late-id-early-commit"))
        .await
        .unwrap();
    relay.wait_published(1).await;
    early.commit().await;
    relay.wait_woken(2, "WAL").await;
    relay.wait_published(2).await;
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn a_killed_wal_connection_is_reopened_and_no_row_is_lost() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    let relay = app.start_relay(&RELAY_NO_PROBES);
    relay.wait_started().await;
    app.enqueue(&app.email_job("before-kill")).await.unwrap();
    relay.wait_woken(1, "WAL").await;
    relay.wait_published(1).await;
    let db = pool(&app).await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
         WHERE database = current_database() AND slot_name LIKE 'mailroom_relay_%'
           AND active_pid IS NOT NULL) AS t",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(killed, 1, "one WAL sender for the relay");
    // Committed while the stream is down: found by the rescan after it reopens.
    app.enqueue(&app.email_job("while-down")).await.unwrap();
    eventually("the stream reopened", || async {
        (relay.count(|s| &s.resumed) >= 1).then_some(())
    })
    .await;
    relay.wait_published(2).await;
    let before = relay.count(|s| &s.woken);
    app.enqueue(&app.email_job("after-reopen")).await.unwrap();
    relay.wait_woken(before + 1, "WAL").await;
    relay.wait_published(3).await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Wal);
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}

/// Commits `n` rows one by one and waits until the relay published them all.
async fn publishes_everything(app: &TestApp, relay: &RunningRelay, prefix: &str, n: u64) {
    for i in 0..n {
        app.enqueue(&app.email_job(&format!("{prefix}-{i}")))
            .await
            .unwrap();
    }
    relay.wait_published(n).await;
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn without_the_publication_the_relay_falls_back_to_notify_where_the_trigger_is_on() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    app.execute("DROP PUBLICATION mailroom_outbox_wakeup").await;
    app.execute("ALTER TABLE mailroom_outbox ENABLE TRIGGER mailroom_outbox_notify")
        .await;
    let relay = app.start_relay(&RELAY_NO_PROBES);
    relay.wait_started().await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Notify);
    for i in 1..=3 {
        app.enqueue(&app.email_job(&format!("notified-{i}")))
            .await
            .unwrap();
        relay.wait_woken(i, "WAL").await;
        relay.wait_published(i).await;
    }
    relay.stop().await;
}

#[tokio::test]
async fn without_the_publication_or_the_trigger_the_relay_polls_and_publishes_everything() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    app.execute("DROP PUBLICATION mailroom_outbox_wakeup").await;
    app.execute("ALTER TABLE mailroom_outbox DISABLE TRIGGER mailroom_outbox_notify")
        .await;
    let relay = app.start_relay(&["--relay-poll-min", "10ms", "--relay-poll-max", "100ms"]);
    relay.wait_started().await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Poll);
    publishes_everything(&app, &relay, "polled", 20).await;
    assert_eq!(relay.count(|s| &s.woken), 0);
    relay.stop().await;
}

#[tokio::test]
async fn several_relays_follow_the_wal_each_with_a_slot_of_its_own() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    let relays = [
        app.start_relay(&RELAY_NO_PROBES),
        app.start_relay(&RELAY_NO_PROBES),
    ];
    for relay in &relays {
        relay.wait_started().await;
        assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Wal);
    }
    let slots: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_replication_slots
         WHERE database = current_database() AND temporary AND active",
    )
    .fetch_one(&pool(&app).await)
    .await
    .unwrap();
    assert_eq!(slots, 2);
    let total = 10;
    for i in 0..total {
        app.enqueue(&app.email_job(&format!("shared-{i}")))
            .await
            .unwrap();
    }
    eventually("every row published once", || async {
        (relays.iter().map(|r| r.published()).sum::<u64>() >= total).then_some(())
    })
    .await;
    for relay in relays {
        relay.stop().await;
    }
    assert_eq!(app.unpublished().await, 0);
    let db = pool(&app).await;
    eventually(
        "the stopped relays' slots gone: nothing retained",
        || async {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
            )
            .fetch_one(&db)
            .await
            .unwrap();
            (left == 0).then_some(())
        },
    )
    .await;
}

/// The relay's slots on the test database, as the server lists them.
async fn relay_slots(db: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_replication_slots
         WHERE database = current_database() AND slot_name LIKE 'mailroom_relay_%'",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

/// Outbox commits faster than `--relay-stream-pause-above` make the relay close its WAL stream:
/// the server no longer lists its slot (nothing decodes the producers' transactions) while the
/// relay probes and publishes every row. The relay's gauge says so even while the relay is held
/// in a batch (a broker that does not answer). Once the producers stop and the outbox is quiet,
/// the relay opens a new slot, and its stream wakes the relay for the next commits.
#[tokio::test]
async fn a_burst_of_commits_pauses_the_wal_stream_and_a_quiet_outbox_opens_it_again() {
    let Some(app) = app_on_logical_server().await else {
        return;
    };
    let (relay, broker) = app.start_relay_pausing_at_100().await;
    relay.wait_started().await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Wal);
    let db = pool(&app).await;
    relay
        .pauses_under_a_burst_and_reopens(&app, &broker, "WAL", || relay_slots(&db))
        .await;
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}
