//! The network between the worker and each service breaks mid-load: a TCP fault proxy
//! ([`FaultProxy`]) resets every connection or partitions it, then heals. Every job is still
//! sent; a second copy is allowed only where the README's uncertain window allows it (the
//! job needed more than one claim because a reply or a record was lost), never elsewhere.

use std::time::Duration;

use crate::helpers::*;

const JOBS: usize = 60;

fn ids(prefix: &str) -> Vec<String> {
    (0..JOBS).map(|i| format!("{prefix}-{i}")).collect()
}

async fn publish_all(app: &TestApp, ids: &[String]) {
    for id in ids {
        app.publish(&app.job(id)).await;
    }
}

/// Waits until every job is `sent`, then checks the emails: each job at least once, and more
/// than once only if its row shows a retried attempt (the documented window). Returns the
/// jobs sent twice.
async fn assert_all_sent(app: &TestApp, ids: &[String]) -> Vec<String> {
    eventually_within(
        Duration::from_secs(120),
        &format!("{} rows sent", ids.len()),
        || async { (app.count_status("sent").await == ids.len() as i64).then_some(()) },
    )
    .await;
    let mut twice = Vec::new();
    for id in ids {
        let n = app.smtp.count(&app.message_id(id, "welcome"));
        assert!(n >= 1, "{id} was never sent");
        if n > 1 {
            let row = app.notification(id, "welcome").await.unwrap();
            assert!(
                row.attempts > 1,
                "{id} sent {n} times on a single claim: a duplicate outside the window"
            );
            twice.push(id.clone());
        }
    }
    assert_eq!(app.smtp.received().len(), ids.len() + twice.len());
    twice
}

#[tokio::test]
async fn smtp_connections_reset_then_partitioned_mid_load_every_job_is_sent() {
    let app = TestApp::spawn().await;
    let proxy = FaultProxy::start(app.smtp.port).await;
    let url = proxy.url_through(&app.smtp.url());
    let worker = app.start_worker(&["--smtp-url", &url]);
    let ids = ids("smtp-net");
    publish_all(&app, &ids).await;

    app.smtp.wait_for(5).await;
    // A slow network first: every chunk late, well within the send timeout.
    proxy.set(Fault::Delay(Duration::from_millis(50)));
    app.smtp.wait_for(10).await;
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set(Fault::Pass);
    app.smtp.wait_for(25).await;
    // Longer than --smtp-timeout (2s): sends in flight time out as uncertain and are resent.
    proxy.set(Fault::Blackhole);
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.set(Fault::Pass);

    let twice = assert_all_sent(&app, &ids).await;
    eprintln!("sent twice in the uncertain window: {twice:?}");
    worker.stop().await;
    app.drain_duplicates().await;
}

#[tokio::test]
async fn broker_connection_reset_then_partitioned_mid_load_every_job_is_sent_once() {
    let app = TestApp::spawn().await;
    let amqp_port = url::Url::parse(&app.amqp_url)
        .unwrap()
        .port_or_known_default()
        .unwrap();
    let proxy = FaultProxy::start(amqp_port).await;
    let url = proxy.url_through(&app.amqp_url);
    let worker = app.start_worker(&["--amqp-url", &url]);
    let ids = ids("broker-net");
    publish_all(&app, &ids).await;

    app.smtp.wait_for(10).await;
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set(Fault::Pass);
    app.smtp.wait_for(25).await;
    proxy.set(Fault::Blackhole);
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.set(Fault::Pass);

    let twice = assert_all_sent(&app, &ids).await;
    assert!(
        twice.is_empty(),
        "the broker's faults never reach SMTP: {twice:?}"
    );
    worker.stop().await;
    app.drain_duplicates().await;
}

#[tokio::test]
async fn database_connections_reset_then_partitioned_mid_load_every_job_is_sent_once() {
    let app = TestApp::spawn().await;
    let pg_port = url::Url::parse(&app.db_url).unwrap().port().unwrap_or(5432);
    let proxy = FaultProxy::start(pg_port).await;
    let url = proxy.url_through(&app.db_url);
    let worker = app.start_worker(&["--database-url", &url]);
    let ids = ids("db-net");
    publish_all(&app, &ids).await;

    app.smtp.wait_for(10).await;
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Pass);
    app.smtp.wait_for(25).await;
    // Shorter than half the lease: a `sent` record stuck behind it is retried, not given up.
    proxy.set(Fault::Blackhole);
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set(Fault::Pass);

    let twice = assert_all_sent(&app, &ids).await;
    assert!(
        twice.is_empty(),
        "a short database outage is absorbed by retrying the record: {twice:?}"
    );
    worker.stop().await;
    app.drain_duplicates().await;
}

/// The relay trusts its pooled connections (no ping before each use, so an idle relay costs one
/// statement per probe): a connection the network killed must cost one failed turn, not the
/// relay.
#[tokio::test]
async fn a_relay_whose_database_connections_were_reset_publishes_the_next_rows() {
    let app = TestApp::spawn().await;
    let db_port = url::Url::parse(&app.db_url).unwrap().port().unwrap();
    let proxy = FaultProxy::start(db_port).await;
    let url = proxy.url_through(&app.db_url);
    let relay = app.start_relay(&["--database-url", &url, "--relay-poll", "200ms"]);
    app.enqueue(&app.email_job("before-reset")).await.unwrap();
    eventually("the first row is published", || async {
        (app.unpublished().await == 0).then_some(())
    })
    .await;
    assert!(proxy.open() > 0, "the relay's pool keeps its connections");

    proxy.set(Fault::Reset);
    eventually("every connection through the proxy is reset", || async {
        (proxy.open() == 0).then_some(())
    })
    .await;
    proxy.set(Fault::Pass);
    app.enqueue(&app.email_job("after-reset")).await.unwrap();
    eventually("the row committed after the reset is published", || async {
        (app.unpublished().await == 0).then_some(())
    })
    .await;
    assert_eq!(relay.published(), 2);
    relay.stop().await;
}
