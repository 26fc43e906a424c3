//! Faults that take a shared service down: RabbitMQ SIGKILLed mid-batch, the database crashed
//! under load. Each test really kills the server process and starts it again with
//! `scripts/services`, so the suite's other tests must not run meanwhile: they are `#[ignore]`d
//! here and `scripts/test` runs them alone, one at a time
//! (`cargo test --test integration disruptive -- --ignored --test-threads=1`).

use std::collections::HashSet;
use std::time::Duration;

use mailroom::db::Engine;

use crate::helpers::*;

/// How long a whole faulted run may take to drain.
const DRAIN: Duration = Duration::from_secs(300);

async fn sh(script: &str) {
    let status = tokio::process::Command::new("bash")
        .args(["-c", script])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "`{script}` failed: {status}");
}

/// SIGKILLs the processes named `name` (a pgrep pattern) and waits until they are gone (a
/// supervisor such as mysqld_safe may start a new one meanwhile: that is not waited for).
async fn kill_process(name: &str) {
    sh(&format!(
        "pids=$(pgrep -x '{name}'); [ -n \"$pids\" ]; kill -KILL $pids; \
         for p in $pids; do while kill -0 $p 2>/dev/null; do sleep 0.1; done; done"
    ))
    .await;
}

/// SIGKILLs the broker's Erlang VM: no clean shutdown, no chance to flush anything.
async fn kill_broker() {
    kill_process("beam.smp").await;
}

/// Crashes the suite's database server: PostgreSQL's immediate stop (every backend killed, WAL
/// recovery at the next start), or SIGKILL for MariaDB/MySQL.
async fn crash_database() {
    match engine() {
        Engine::Postgres => {
            sh("pg_ctlcluster $(pg_lsclusters -h | awk 'NR==1 {print $1, $2}') stop -m immediate")
                .await
        }
        Engine::MySql => kill_process("mariadbd|mysqld").await,
    }
}

/// Starts whatever is not running (the suite's own service script).
async fn restart_services() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services");
    sh(&format!("{} >/dev/null", script.display())).await;
}

async fn enqueue_bulk(app: &TestApp, prefix: &str, total: usize) {
    let mut tx = app.begin().await;
    for i in 0..total {
        tx.enqueue(&app.email_job(&format!("{prefix}-{i}")))
            .await
            .unwrap();
    }
    tx.commit().await;
}

/// Every job reached the SMTP server exactly once, and nothing is left behind.
async fn assert_each_sent_once(app: &TestApp, total: usize) {
    let received = app.smtp.wait_for_within(total, DRAIN).await;
    eventually_within(DRAIN, "every row recorded as sent", || async {
        (app.count_status("sent").await == total as i64).then_some(())
    })
    .await;
    assert_eq!(app.unpublished().await, 0);
    let ids: HashSet<_> = received.iter().map(|r| r.message_id.clone()).collect();
    assert_eq!(ids.len(), total, "every job arrived");
    assert_eq!(app.smtp.received().len(), total, "and none twice");
}

#[tokio::test]
#[ignore = "disruptive: SIGKILLs the shared RabbitMQ; scripts/test runs it alone"]
async fn disruptive_broker_killed_mid_batch_loses_nothing_and_sends_each_once() {
    let app = TestApp::spawn().await;
    let total = 3000;
    enqueue_bulk(&app, "broker-kill", total).await;
    let worker = app.start_worker(&["--concurrency", "32", "--prefetch", "64"]);
    let relay = app.start_relay(&["--relay-batch", "100"]);
    eventually("the relay in the middle of the outbox", || async {
        (relay.published() >= 500).then_some(())
    })
    .await;
    kill_broker().await;
    restart_services().await;
    assert_each_sent_once(&app, total).await;
    relay.stop().await;
    worker.stop().await;
}

#[tokio::test]
#[ignore = "disruptive: crashes the shared database server; scripts/test runs it alone"]
async fn disruptive_database_crashed_under_load_loses_nothing_and_sends_each_once() {
    let app = TestApp::spawn().await;
    let total = 1500;
    enqueue_bulk(&app, "db-crash", total).await;
    let worker = app.start_worker(&["--concurrency", "32", "--prefetch", "64"]);
    let relay = app.start_relay(&["--relay-batch", "100"]);
    eventually("sending under way", || async {
        (worker.stats.snapshot().sent >= 200).then_some(())
    })
    .await;
    crash_database().await;
    restart_services().await;
    assert_each_sent_once(&app, total).await;
    relay.stop().await;
    worker.stop().await;
}
