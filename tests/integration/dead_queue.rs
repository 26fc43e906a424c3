//! The dead-letter queue's type: `<ns>.dead` is a quorum queue; a broker that still holds the
//! classic one of older versions keeps working with it, and `mailroom broker
//! migrate-dead-queue` moves it to a quorum queue without losing a letter, even when it is
//! killed halfway and run again. Each test runs on a virtual host of its own.

use lapin::{Connection, options::*, types::FieldTable};
use mailroom::broker::{self, DeadQueue};
use mailroom::config::UrlList;

use crate::helpers::*;

/// Replaces the app's quorum `<ns>.dead` by a classic one bound to the DLX, as older versions
/// declared it.
async fn make_dead_queue_classic(app: &TestApp, conn: &Connection) {
    let ch = conn.create_channel().await.unwrap();
    let t = &app.topology;
    ch.queue_delete(t.dead.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(t.dead.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    ch.queue_bind(
        t.dead.as_str().into(),
        t.dlx.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

/// Publishes dead letters `letter-1` … `letter-n` to the DLX, as a worker does.
async fn publish_letters(app: &TestApp, conn: &Connection, n: usize) {
    let ch = broker::confirm_channel(conn).await.unwrap();
    for i in 1..=n {
        let id = format!("letter-{i}");
        let job = app.job(&id);
        let props = broker::with_headers(
            &broker::job_properties(&id, "welcome", 1),
            &broker::dead_letter_headers("550 no such user", "rejected", 1),
        );
        broker::publish_confirmed(
            &ch,
            &app.topology.dlx,
            "welcome",
            job.to_string().as_bytes(),
            props,
        )
        .await
        .unwrap();
    }
}

/// Messages ready in `queue`, or `None` when it does not exist.
async fn length(conn: &Connection, queue: &str) -> Option<u32> {
    let ch = conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .ok()
        .map(|q| q.message_count())
}

async fn dead_queue_type(app: &TestApp, conn: &Connection) -> Option<DeadQueue> {
    let declared = broker::declare_topology(conn, &app.topology).await.unwrap();
    declared.dead_queue
}

#[tokio::test]
async fn a_classic_dead_queue_is_kept_and_still_receives_letters() {
    let vhost = Vhost::create().await;
    let app = TestApp::spawn_on(vhost.url.clone(), &[]).await;
    let conn = Connection::connect(&vhost.url, Default::default())
        .await
        .unwrap();
    make_dead_queue_classic(&app, &conn).await;

    let declared = broker::declare_topology(&conn, &app.topology)
        .await
        .unwrap();
    assert_eq!(declared.dead_queue, Some(DeadQueue::Classic));
    assert!(declared.complete(), "{:?}", declared.missing);
    publish_letters(&app, &conn, 2).await;
    assert_eq!(length(&conn, &app.topology.dead).await, Some(2));
    assert_eq!(app.ingest_dead().await.ingested, 2);
    drop(app);
    vhost.delete().await;
}

#[tokio::test]
async fn migrating_the_dead_queue_loses_no_letter_when_killed_mid_drain_and_run_again() {
    let vhost = Vhost::create().await;
    let app = TestApp::spawn_on(vhost.url.clone(), &[]).await;
    let conn = Connection::connect(&vhost.url, Default::default())
        .await
        .unwrap();
    make_dead_queue_classic(&app, &conn).await;
    publish_letters(&app, &conn, 5).await;
    let holding = broker::migrate::holding_queue(&app.topology);

    // Killed after letter-3's copy is confirmed, before the original is acked.
    let armed = format!("{}@letter-3=abort", broker::migrate::MID_DRAIN);
    let killed = app
        .cli_with_env(
            &["broker", "migrate-dead-queue"],
            &[("MAILROOM_FAILPOINTS", &armed)],
        )
        .await;
    assert!(!killed.status.success(), "{}", killed.stderr);
    assert_eq!(length(&conn, &holding).await, Some(3), "letters 1-3 copied");
    assert_eq!(
        length(&conn, &app.topology.dead).await,
        Some(3),
        "letters 3-5 left"
    );

    let out = app.cli(&["broker", "migrate-dead-queue"]).await;
    assert!(out.contains("is a quorum queue now"), "{out}");
    assert_eq!(length(&conn, &holding).await, None, "holding queue deleted");
    assert_eq!(dead_queue_type(&app, &conn).await, Some(DeadQueue::Quorum));
    // Letter 3 twice (copied, then moved again as it was never acked): one row.
    assert_eq!(length(&conn, &app.topology.dead).await, Some(6));
    let drained = app.ingest_dead().await;
    assert_eq!(
        (drained.ingested, drained.duplicates),
        (5, 1),
        "{drained:?}"
    );

    let again = app.cli(&["broker", "migrate-dead-queue"]).await;
    assert!(again.contains("is a quorum queue already"), "{again}");
    drop(app);
    vhost.delete().await;
}

#[tokio::test]
async fn a_migration_interrupted_after_the_classic_queue_is_gone_finishes_on_the_next_run() {
    let vhost = Vhost::create().await;
    let app = TestApp::spawn_on(vhost.url.clone(), &[]).await;
    let conn = Connection::connect(&vhost.url, Default::default())
        .await
        .unwrap();
    let urls: UrlList = vhost.url.parse().unwrap();
    // A run stopped between steps 3 and 4: the letters wait in the holding queue, which is
    // still bound to the DLX, and <ns>.dead is already quorum (a worker redeclared it).
    let holding = broker::migrate::holding_queue(&app.topology);
    let ch = conn.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let mut quorum = FieldTable::default();
    quorum.insert("x-queue-type".into(), broker::text_value("quorum"));
    ch.queue_declare(holding.as_str().into(), durable, quorum)
        .await
        .unwrap();
    ch.queue_bind(
        holding.as_str().into(),
        app.topology.dlx.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish_letters(&app, &conn, 4).await;
    app.ingest_dead().await;

    let done = broker::migrate::migrate_dead_queue(&urls, &app.topology)
        .await
        .unwrap();
    assert_eq!(
        (done.was_classic, done.from_holding),
        (false, 4),
        "{done:?}"
    );
    assert_eq!(length(&conn, &holding).await, None);
    let drained = app.ingest_dead().await;
    assert_eq!(
        (drained.ingested, drained.duplicates),
        (0, 4),
        "{drained:?}"
    );
    drop(app);
    vhost.delete().await;
}
