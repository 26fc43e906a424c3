//! The network between the worker and each service breaks mid-load: a TCP fault proxy
//! ([`FaultProxy`]) resets every connection or partitions it, then heals. Every job is still
//! sent; a second copy is allowed only where the README's uncertain window allows it (the
//! job needed more than one claim because a reply or a record was lost), never elsewhere.

use std::time::Duration;

use crate::helpers::*;

const JOBS: usize = 60;

/// Each send takes this long at the server, so the faults land on a worker still busy.
const SLOW_SERVER: &[&str] = &["--data-delay", "0.2"];

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

/// The state of the run when a fault landed.
struct Landed {
    received: usize,
    retried: u64,
    duplicates: u64,
    forwarded: usize,
}

/// Switches `proxy` to `fault` once it would land on work in flight: emails still to send and
/// deliveries being processed (unacked). Between retry tiers every remaining job can sit in a
/// delay queue for a moment, so this waits for a delivery to be in flight; a fault after the
/// last send would test nothing, and fails here.
async fn land(app: &TestApp, worker: &RunningWorker, proxy: &FaultProxy, fault: Fault) -> Landed {
    let what = format!("a delivery in flight for {fault:?} to land on");
    eventually(&what, || async {
        let received = app.smtp.received().len();
        assert!(
            received < JOBS,
            "{fault:?} would land on no work: all {JOBS} were sent before it"
        );
        (worker.stats.in_flight() > 0).then_some(())
    })
    .await;
    let s = worker.stats.snapshot();
    let landed = Landed {
        received: app.smtp.received().len(),
        retried: s.retried,
        duplicates: s.duplicates,
        forwarded: proxy.forwarded(),
    };
    proxy.set(fault);
    landed
}

/// Sends the fault broke were retried.
async fn retried_since(worker: &RunningWorker, landed: &Landed, what: &str) {
    eventually(what, || async {
        (worker.stats.snapshot().retried > landed.retried).then_some(())
    })
    .await;
}

/// The worker opened new connections through the proxy.
async fn reconnected_since(proxy: &FaultProxy, landed: &Landed, what: &str) {
    eventually(what, || async {
        (proxy.forwarded() > landed.forwarded).then_some(())
    })
    .await;
}

/// While the fault held, at most `most` more emails went out (those already past the faulted
/// service), far fewer than an unfaulted worker sends meanwhile.
fn held_back(app: &TestApp, landed: &Landed, most: usize, what: &str) {
    let during = app.smtp.received().len() - landed.received;
    assert!(during <= most, "{what}: {during} emails sent while it held");
}

#[tokio::test]
async fn smtp_connections_reset_then_partitioned_mid_load_every_job_is_sent() {
    let app = TestApp::spawn_with(SLOW_SERVER).await;
    let proxy = FaultProxy::start(app.smtp.port).await;
    let url = proxy.url_through(&app.smtp.url());
    let worker = app.start_worker(&["--smtp-url", &url]);
    let ids = ids("smtp-net");
    publish_all(&app, &ids).await;

    app.smtp.wait_for(5).await;
    // A slow network first: every chunk late, well within the send timeout.
    proxy.set(Fault::Delay(Duration::from_millis(50)));
    app.smtp.wait_for(10).await;
    let reset = land(&app, &worker, &proxy, Fault::Reset).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set(Fault::Pass);
    retried_since(&worker, &reset, "a send the reset broke retried").await;
    app.smtp.wait_for(25).await;
    // Longer than --smtp-timeout (2s): sends in flight time out as uncertain and are resent.
    let partition = land(&app, &worker, &proxy, Fault::Blackhole).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // At most the sends whose final dot had crossed already.
    held_back(&app, &partition, 8, "the SMTP partition");
    proxy.set(Fault::Pass);
    retried_since(&worker, &partition, "a send that timed out retried").await;

    let twice = assert_all_sent(&app, &ids).await;
    eprintln!("sent twice in the uncertain window: {twice:?}");
    worker.stop().await;
    app.drain_duplicates().await;
}

#[tokio::test]
async fn broker_connection_reset_then_partitioned_mid_load_every_job_is_sent_once() {
    let app = TestApp::spawn_with(SLOW_SERVER).await;
    let proxy = FaultProxy::in_front_of(&app.amqp_url).await;
    let url = proxy.url_through(&app.amqp_url);
    // A prefetch of one delivery per slot: every new delivery crosses the proxy.
    let worker = app.start_worker(&["--amqp-url", &url, "--prefetch", "8"]);
    let ids = ids("broker-net");
    publish_all(&app, &ids).await;

    app.smtp.wait_for(10).await;
    let reset = land(&app, &worker, &proxy, Fault::Reset).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set(Fault::Pass);
    reconnected_since(&proxy, &reset, "the worker reconnected").await;
    // The deliveries in flight at the reset lost their acks; their copies came back.
    eventually("a redelivered copy acked as a duplicate", || async {
        (worker.stats.snapshot().duplicates > reset.duplicates).then_some(())
    })
    .await;
    app.smtp.wait_for(25).await;
    let partition = land(&app, &worker, &proxy, Fault::Blackhole).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Only the deliveries already prefetched can be sent; 3 s would send all the rest.
    held_back(&app, &partition, 8, "the broker partition");
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
    let app = TestApp::spawn_with(SLOW_SERVER).await;
    let pg_port = url::Url::parse(&app.db_url).unwrap().port().unwrap_or(5432);
    let proxy = FaultProxy::start(pg_port).await;
    let url = proxy.url_through(&app.db_url);
    let worker = app.start_worker(&["--database-url", &url]);
    let ids = ids("db-net");
    publish_all(&app, &ids).await;

    app.smtp.wait_for(10).await;
    let reset = land(&app, &worker, &proxy, Fault::Reset).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Pass);
    reconnected_since(&proxy, &reset, "the worker's pool reconnected").await;
    app.smtp.wait_for(25).await;
    // Shorter than half the lease: a `sent` record stuck behind it is retried, not given up.
    let partition = land(&app, &worker, &proxy, Fault::Blackhole).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Every send needs a claim first: only the 8 deliveries (--concurrency) past theirs.
    held_back(&app, &partition, 8, "the database partition");
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
    // Counted by the relay once its commit returned: a reset between the row's commit and the
    // reply to it would leave the row published and the count at 0 (the test's race, not the
    // relay's).
    eventually("the first row is published", || async {
        (relay.published() == 1).then_some(())
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
        (relay.published() == 2).then_some(())
    })
    .await;
    assert_eq!(app.unpublished().await, 0);
    relay.stop().await;
}
