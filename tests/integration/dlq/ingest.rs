//! Ingesting `<ns>.dead` into the table: never a letter lost between the queue and the table
//! (a worker killed between the insert and the ack), one row per letter however often it is
//! delivered, the bytes kept exactly, an oversize letter that never blocks the queue, and a
//! database outage that only pauses ingesting.

use lapin::types::{AMQPValue, ByteArray, LongString};
use mailroom::broker;
use mailroom::db::dead_letters::LetterQuery;
use mailroom::dlq::{MAX_STORED_BODY, decode_properties};

use super::{Letter, letter, publish_to_dlx};
use crate::helpers::*;

async fn rows(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM mailroom_dead_letters")
        .await
}

fn worker_log(app: &TestApp) -> String {
    std::fs::read_to_string(app.dir.path().join("worker.log")).unwrap_or_default()
}

#[tokio::test]
async fn a_letter_is_never_lost_when_the_ingesting_worker_is_killed_between_insert_and_ack() {
    let app = TestApp::spawn().await;
    publish_to_dlx(&app, &[letter(&app.job("in-flight"), "rejected", "550")]).await;
    let failpoint = [("MAILROOM_FAILPOINTS", "dlq.after_insert=pause")];
    let mut worker = app.spawn_worker_process(&[], &failpoint);
    eventually(
        "the row committed, its letter delivered and not acked",
        || async {
            let paused = worker_log(&app).contains("failpoint: pausing");
            (paused && rows(&app).await == 1 && app.dead_queue_length().await == 0).then_some(())
        },
    )
    .await;
    worker.kill().await.unwrap();
    eventually("the unacked letter back in the queue", || async {
        (app.dead_queue_length().await == 1).then_some(())
    })
    .await;
    assert_eq!(rows(&app).await, 1, "the killed worker's row stays");

    let out = app.cli(&["dlq", "ingest"]).await;
    assert!(
        out.contains("ingested 0 dead letters (1 already stored)"),
        "{out}"
    );
    assert_eq!(app.dead_queue_length().await, 0);
    assert_eq!(rows(&app).await, 1, "exactly one row");
}

#[tokio::test]
async fn mailroom_run_ingests_the_dead_letter_queue_as_it_fills() {
    let app = TestApp::spawn().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut run = app.spawn_run_process(&["--http-addr", &addr]);
    eventually("run consuming the dead-letter queue", || async {
        (app.dead_consumers().await == 1).then_some(())
    })
    .await;
    publish_to_dlx(&app, &[letter(&app.job("by-run"), "rejected", "550")]).await;
    eventually("the letter in the table, none in the queue", || async {
        (rows(&app).await == 1 && app.dead_queue_length().await == 0).then_some(())
    })
    .await;
    terminate(&run).await;
    run.wait().await.unwrap();
    eventually("no consumer left", || async {
        (app.dead_consumers().await == 0).then_some(())
    })
    .await;
}

fn with_headers(mut l: Letter, headers: &[(&str, AMQPValue)]) -> Letter {
    l.props = broker::with_headers(&l.props, headers);
    l
}

#[tokio::test]
async fn a_letter_delivered_twice_is_one_row_and_the_same_job_dead_again_is_another() {
    let app = TestApp::spawn().await;
    let first = || letter(&app.job("twice"), "rejected", "550");
    publish_to_dlx(&app, &[first()]).await;
    assert_eq!(app.ingest_dead().await.ingested, 1);
    let redelivered = with_headers(first(), &[("x-delivery-count", AMQPValue::LongLongInt(2))]);
    publish_to_dlx(&app, &[first(), redelivered]).await;
    let again = app.ingest_dead().await;
    assert_eq!((again.ingested, again.duplicates), (0, 2));
    assert_eq!(rows(&app).await, 1);

    let after_replay = with_headers(
        first(),
        &[(broker::REPLAY_HEADER, AMQPValue::LongLongInt(1))],
    );
    publish_to_dlx(&app, &[after_replay]).await;
    assert_eq!(app.ingest_dead().await.ingested, 1);
    assert_eq!(rows(&app).await, 2);
}

#[tokio::test]
async fn body_and_headers_survive_byte_for_byte_into_the_table_and_out_of_a_replay() {
    let app = TestApp::spawn().await;
    let mut odd = letter(&app.job("odd-bytes"), "invalid", "not JSON");
    odd.body = b"\xff\xfe\x00{not json}\r\n\x80".to_vec();
    let odd = with_headers(
        odd,
        &[
            (
                "bytes",
                AMQPValue::ByteArray(ByteArray::from(vec![0u8, 255, 128, 10])),
            ),
            ("text", AMQPValue::LongString(LongString::from("é\u{0}ü"))),
        ],
    );
    let mut big = letter(&app.job("big-body"), "invalid", "too big");
    big.body = (0..3 * 1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let sent = [
        (odd.body.clone(), odd.props.clone()),
        (big.body.clone(), big.props.clone()),
    ];
    publish_to_dlx(&app, &[odd, big]).await;
    assert_eq!(app.ingest_dead().await.ingested, 2);

    let query = LetterQuery {
        payload: true,
        ..LetterQuery::default()
    };
    let mut stored = app.db.dead_letters(&query).await.unwrap();
    stored.reverse();
    for ((body, props), row) in sent.iter().zip(&stored) {
        assert!(row.body == *body, "{}: the body changed", row.job_id);
        assert_eq!(row.body_size, body.len() as i64);
        assert_eq!(
            &decode_properties(&row.properties).unwrap(),
            props,
            "{}",
            row.job_id
        );
    }

    let id = stored[0].id.to_string();
    let out = app.cli_output(&["dlq", "replay", "--id", &id]).await;
    assert!(out.status.success(), "{}", out.stderr);
    let copy = take_from_work_queue(&app).await;
    assert!(copy.body == sent[0].0, "the replayed body changed");
    let original = DeadLetter {
        body: vec![],
        properties: sent[0].1.clone(),
    };
    for name in ["bytes", "text", "x-mailroom-kind"] {
        assert!(original.header(name).is_some(), "{name}");
        assert_eq!(copy.header(name), original.header(name), "{name}");
    }
    assert_eq!(copy.header("x-mailroom-replay").as_deref(), Some("1"));
    assert_eq!(
        copy.header("x-mailroom-error"),
        None,
        "the failure headers are dropped"
    );
}

/// The next message of the work queue (a replayed copy: no worker runs).
async fn take_from_work_queue(app: &TestApp) -> DeadLetter {
    let conn = lapin::Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = app.topology.queue.as_str();
    let got = eventually("the replayed copy in the work queue", || async {
        let get = lapin::options::BasicGetOptions { no_ack: true };
        ch.basic_get(queue.into(), get).await.unwrap()
    })
    .await;
    let _ = conn.close(200, "taken".into()).await;
    DeadLetter {
        body: got.delivery.data.clone(),
        properties: got.delivery.properties.clone(),
    }
}

#[tokio::test]
async fn an_oversize_letter_is_stored_in_part_and_never_blocks_the_queue() {
    let app = TestApp::spawn().await;
    let mut huge = letter(&app.job("huge"), "invalid", "oversize");
    huge.body = vec![b'x'; MAX_STORED_BODY + 1];
    let after = letter(&app.job("after-huge"), "rejected", "550");
    publish_to_dlx(&app, &[huge, after]).await;
    assert_eq!(app.ingest_dead().await.ingested, 2);
    assert_eq!(
        app.dead_queue_length().await,
        0,
        "nothing stuck at the head"
    );

    let out = app.cli(&["dlq", "list", "--json"]).await;
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let huge = listed["letters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["job_id"] == "huge")
        .unwrap()
        .clone();
    assert_eq!(huge["truncated"], true);
    assert_eq!(huge["body_size"], MAX_STORED_BODY + 1);
    let id = huge["id"].to_string();
    let out = app.cli_output(&["dlq", "replay", "--id", &id]).await;
    assert!(
        !out.status.success(),
        "an oversize letter cannot be replayed"
    );
    assert!(out.stdout.contains("oversize"), "{}", out.stdout);
    assert_eq!(app.ready_messages().await, 0, "nothing published");
    assert_eq!(app.dead_count().await, 2, "both stay dead");
}

#[tokio::test]
async fn a_database_outage_pauses_ingesting_and_its_end_resumes_it_losing_nothing() {
    let app = TestApp::spawn().await;
    let port = url::Url::parse(&app.db_url).unwrap().port().unwrap();
    let proxy = FaultProxy::start(port).await;
    proxy.set(Fault::Reset);
    let url = proxy.url_through(&app.db_url).parse().unwrap();
    let db = mailroom::db::Database::connect_lazy(&url, 2).unwrap();
    let ingester = mailroom::dlq::ingest::Ingester::new(
        app.amqp_url.parse().unwrap(),
        app.topology.clone(),
        db,
        std::time::Duration::from_secs(3600),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(ingester.run(stop.clone()));
    eventually("the ingester consuming", || async {
        (app.dead_consumers().await == 1).then_some(())
    })
    .await;
    publish_to_dlx(&app, &[letter(&app.job("outage"), "rejected", "550")]).await;
    eventually(
        "paused: no consumer, the letter back in the queue",
        || async {
            let paused = app.dead_consumers().await == 0 && app.dead_queue_length().await == 1;
            paused.then_some(())
        },
    )
    .await;
    assert_eq!(rows(&app).await, 0);

    proxy.set(Fault::Pass);
    eventually("the letter ingested once the database is back", || async {
        (rows(&app).await == 1 && app.dead_queue_length().await == 0).then_some(())
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(rows(&app).await, 1);
}
