//! MySQL/MariaDB: the relay woken by the binary log. The relays here probe rarely (from 200 ms
//! after activity, doubling, up to an hour when idle), and each commit must show up in the
//! relay's count of binary log wake-ups, so a broken stream fails them. (A wake-up can come a
//! moment before InnoDB shows the committed row; the probe after it finds the row.)

use std::sync::atomic::Ordering;

use mailroom::db::Engine;
use mailroom::relay::{RelayStats, WakeupMode};

use crate::helpers::*;

const WHY: &str = "the binary log is MySQL's and MariaDB's (PostgreSQL uses NOTIFY)";

/// A relay that an idle outbox does not move: no probe within an hour once idle.
const NO_PROBES: [&str; 6] = [
    "--relay-poll-min",
    "200ms",
    "--relay-poll",
    "1h",
    "--relay-poll-max",
    "1h",
];

fn load(stats: &RelayStats, pick: fn(&RelayStats) -> &std::sync::atomic::AtomicU64) -> u64 {
    pick(stats).load(Ordering::Relaxed)
}

/// Waits for the relay's first scan (its wake-up source is open by then).
async fn started(relay: &RunningRelay) {
    eventually("the relay's first scan", || async {
        (load(&relay.stats, |s| &s.scans) >= 1).then_some(())
    })
    .await;
}

/// Waits for `n` wake-ups by the binary log.
async fn woken(relay: &RunningRelay, n: u64) {
    eventually(&format!("{n} binary log wake-ups"), || async {
        (load(&relay.stats, |s| &s.woken) >= n).then_some(())
    })
    .await;
}

async fn published(relay: &RunningRelay, n: u64) {
    eventually(&format!("{n} rows published"), || async {
        (relay.published() >= n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_commit_wakes_an_idle_relay_through_the_binary_log() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&NO_PROBES);
    started(&relay).await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Binlog);
    for i in 1..=3 {
        app.enqueue(&app.email_job(&format!("woken-{i}")))
            .await
            .unwrap();
        woken(&relay, i).await;
        published(&relay, i).await;
    }
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn a_transaction_that_commits_after_later_ones_is_published() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&NO_PROBES);
    started(&relay).await;
    let mut early = app.begin().await;
    early
        .enqueue(&app.email_job("early-id-late-commit"))
        .await
        .unwrap();
    app.enqueue(&app.email_job("late-id-early-commit"))
        .await
        .unwrap();
    published(&relay, 1).await;
    early.commit().await;
    woken(&relay, 2).await;
    published(&relay, 2).await;
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn rows_after_a_binary_log_rotation_still_wake_the_relay() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&NO_PROBES);
    started(&relay).await;
    app.enqueue(&app.email_job("before-rotation"))
        .await
        .unwrap();
    woken(&relay, 1).await;
    published(&relay, 1).await;
    app.execute("FLUSH BINARY LOGS").await;
    for i in 2..=3 {
        app.enqueue(&app.email_job(&format!("after-rotation-{i}")))
            .await
            .unwrap();
        woken(&relay, i).await;
        published(&relay, i).await;
    }
    assert_eq!(
        load(&relay.stats, |s| &s.resumed),
        0,
        "the stream followed the rotation without reconnecting"
    );
    relay.stop().await;
}

/// `app`'s database URL with another user.
fn url_as(app: &TestApp, user: &str, password: &str) -> String {
    let mut url = url::Url::parse(&app.db_url).unwrap();
    url.set_username(user).unwrap();
    url.set_password(Some(password)).unwrap();
    url.to_string()
}

#[tokio::test]
async fn without_replication_privileges_the_relay_polls_and_publishes_everything() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let user = format!(
        "norepl_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let schema = url::Url::parse(&app.db_url).unwrap().path()[1..].to_string();
    app.execute(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
        .await;
    app.execute(&format!("GRANT ALL ON `{schema}`.* TO '{user}'@'%'"))
        .await;
    let url = url_as(&app, &user, "pw");
    let relay = app.start_relay(&[
        "--database-url",
        &url,
        "--relay-poll-min",
        "10ms",
        "--relay-poll-max",
        "100ms",
    ]);
    started(&relay).await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Poll);
    let total = 20;
    for i in 0..total {
        app.enqueue(&app.email_job(&format!("polled-{i}")))
            .await
            .unwrap();
    }
    published(&relay, total).await;
    assert_eq!(load(&relay.stats, |s| &s.woken), 0);
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
    app.execute(&format!("DROP USER '{user}'@'%'")).await;
}

#[tokio::test]
#[ignore = "disruptive: restarts the shared MariaDB; scripts/test runs it alone"]
async fn disruptive_binlog_relay_resumes_after_the_database_server_restarts() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&NO_PROBES);
    started(&relay).await;
    app.enqueue(&app.email_job("before-restart")).await.unwrap();
    published(&relay, 1).await;
    let status = tokio::process::Command::new("bash")
        .args(["-c", "/etc/init.d/mariadb restart >/dev/null"])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "restarting MariaDB failed: {status}");
    for i in 2..=3 {
        app.enqueue(&app.email_job(&format!("after-restart-{i}")))
            .await
            .unwrap();
        published(&relay, i).await;
    }
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Binlog);
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}
