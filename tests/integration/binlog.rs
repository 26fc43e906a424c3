//! MySQL/MariaDB: the relay woken by the binary log. The relays here probe rarely (from 200 ms
//! after activity, doubling, up to an hour when idle), and each commit must show up in the
//! relay's count of binary log wake-ups, so a broken stream fails them. (A wake-up can come a
//! moment before InnoDB shows the committed row; the probe after it finds the row.)

use mailroom::db::Engine;
use mailroom::relay::WakeupMode;
use sqlx::MySqlPool;

use crate::helpers::*;

const WHY: &str = "the binary log is MySQL's and MariaDB's (PostgreSQL follows the WAL)";

#[tokio::test]
async fn a_commit_wakes_an_idle_relay_through_the_binary_log() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&RELAY_NO_PROBES);
    relay.wait_started().await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Binlog);
    for i in 1..=3 {
        app.enqueue(&app.email_job(&format!("woken-{i}")))
            .await
            .unwrap();
        relay.wait_woken(i, "binary log").await;
        relay.wait_published(i).await;
    }
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn a_relay_whose_url_requires_tls_follows_the_binary_log_encrypted() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let port = url::Url::parse(&app.db_url).unwrap().port().unwrap_or(3306);
    let sep = if app.db_url.contains('?') { '&' } else { '?' };
    // The control first: on loopback the default ssl-mode goes in the clear, and the proxy
    // sees the job's id in the stream (and in the relay's read of the row).
    for (query, encrypted) in [("", false), ("ssl-mode=required", true)] {
        let proxy = FaultProxy::start(port).await;
        let mut url = proxy.url_through(&app.db_url);
        if !query.is_empty() {
            url = format!("{url}{sep}{query}");
        }
        let mut args = RELAY_NO_PROBES.to_vec();
        args.extend(["--database-url", &url]);
        let relay = app.start_relay(&args);
        relay.wait_started().await;
        assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Binlog, "{query:?}");
        let id = format!("order-{}-confidential", uuid::Uuid::new_v4().simple());
        app.enqueue(&app.email_job(&id)).await.unwrap();
        relay.wait_woken(1, "binary log").await;
        relay.wait_published(1).await;
        relay.stop().await;
        assert!(
            proxy.forwarded() >= 2,
            "the pool and the stream both went through the proxy"
        );
        assert_eq!(
            proxy.carried(&id),
            !encrypted,
            "the job's id crossed in the clear with {query:?}"
        );
    }
}

#[tokio::test]
async fn a_transaction_that_commits_after_later_ones_is_published() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
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
    relay.wait_woken(2, "binary log").await;
    relay.wait_published(2).await;
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}

#[tokio::test]
async fn rows_after_a_binary_log_rotation_still_wake_the_relay() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let relay = app.start_relay(&RELAY_NO_PROBES);
    relay.wait_started().await;
    app.enqueue(&app.email_job("before-rotation"))
        .await
        .unwrap();
    relay.wait_woken(1, "binary log").await;
    relay.wait_published(1).await;
    app.execute("FLUSH BINARY LOGS").await;
    for i in 2..=3 {
        app.enqueue(&app.email_job(&format!("after-rotation-{i}")))
            .await
            .unwrap();
        relay.wait_woken(i, "binary log").await;
        relay.wait_published(i).await;
    }
    assert_eq!(
        relay.count(|s| &s.resumed),
        0,
        "the stream followed the rotation without reconnecting"
    );
    relay.stop().await;
}

/// Outbox commits faster than `--relay-stream-pause-above` make the relay close its binary log
/// stream: the server's dump thread for it ends (nothing reads and sends the producers'
/// transactions) while the relay probes and publishes every row. The relay's gauge says so even
/// while the relay is held in a batch (a broker that does not answer). Once the producers stop
/// and the outbox is quiet, the relay opens the stream again, and it wakes the relay for the
/// next commits.
#[tokio::test]
async fn a_burst_of_commits_pauses_the_binary_log_stream_and_a_quiet_outbox_opens_it_again() {
    if !runs_on(Engine::MySql, WHY) {
        return;
    }
    let app = TestApp::spawn().await;
    let (relay, broker) = app.start_relay_pausing_at_100().await;
    relay.wait_started().await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Binlog);
    let db = MySqlPool::connect(&app.db_url).await.unwrap();
    // The relay's stream connects to the test's own database, as its pool does.
    let dump_threads = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM information_schema.processlist
             WHERE db = DATABASE() AND command = 'Binlog Dump'",
        )
        .fetch_one(&db)
        .await
        .unwrap()
    };
    relay
        .pauses_under_a_burst_and_reopens(&app, &broker, "binary log", dump_threads)
        .await;
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
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
    relay.wait_started().await;
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Poll);
    let total = 20;
    for i in 0..total {
        app.enqueue(&app.email_job(&format!("polled-{i}")))
            .await
            .unwrap();
    }
    relay.wait_published(total).await;
    assert_eq!(relay.count(|s| &s.woken), 0);
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
    let relay = app.start_relay(&RELAY_NO_PROBES);
    relay.wait_started().await;
    app.enqueue(&app.email_job("before-restart")).await.unwrap();
    relay.wait_published(1).await;
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
        relay.wait_published(i).await;
    }
    assert_eq!(relay.stats.wakeup_mode(), WakeupMode::Binlog);
    relay.stop().await;
    assert_eq!(app.unpublished().await, 0);
}
