//! Ingesting `<ns>.dead` into the table: never a letter lost between the queue and the table
//! (a worker killed between the insert and the ack), one row per letter however often it is
//! delivered, the bytes kept exactly, an oversize letter that never blocks the queue, and a
//! database outage that only pauses ingesting.

use lapin::types::{AMQPValue, ByteArray, LongString};
use mailroom::broker;
use mailroom::db::Engine;
use mailroom::db::dead_letters::LetterQuery;
use mailroom::dlq::{MAX_STORED_BODY, decode_properties};

use super::{Letter, letter, publish_to_dlx};
use crate::helpers::*;

async fn rows(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM mailroom_dead_letters")
        .await
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
            let paused = app.paused_at_failpoint("worker.log");
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

/// lapin was seen to leave an ack handed to it as a broker restart broke the connection
/// unresolved for good: the ingester waited on it for the rest of its process's life, stored no
/// other letter, and kept the process from exiting. Held at `dlq.in_ack` (inside the ack's
/// bound) for an hour, the first ack stands for that one.
#[tokio::test]
async fn an_ack_that_never_completes_ends_the_session_and_ingesting_goes_on() {
    let app = TestApp::spawn().await;
    publish_to_dlx(&app, &[letter(&app.job("stuck-ack"), "rejected", "550")]).await;
    let failpoint = [("MAILROOM_FAILPOINTS", "dlq.in_ack=delay-once:1h")];
    let mut worker = app.spawn_worker_process(&[], &failpoint);
    eventually("the first letter stored, its ack held", || async {
        let held = app
            .process_log("worker.log")
            .contains("failpoint: delaying");
        (held && rows(&app).await == 1).then_some(())
    })
    .await;
    eventually("the held ack given up", || async {
        app.process_log("worker.log")
            .contains("stored dead letters was not written within")
            .then_some(())
    })
    .await;
    publish_to_dlx(&app, &[letter(&app.job("after"), "rejected", "550")]).await;
    eventually("the next letter stored by the same worker", || async {
        (rows(&app).await == 2 && app.dead_queue_length().await == 0).then_some(())
    })
    .await;
    terminate_expecting_exit_0(&app, &mut worker, "worker.log", "the worker exits").await;
    // Whatever the stop handed back is stored already: one row per letter.
    let out = app.cli(&["dlq", "ingest"]).await;
    assert!(out.contains("ingested 0 dead letters"), "{out}");
    assert_eq!(rows(&app).await, 2, "one row per letter");
}

/// A stop never waits on the ingester for longer than its patience: held forever between a
/// row's commit and its ack, the ingester is dropped, the worker exits 0, and the broker takes
/// the letter back when the connection goes.
#[tokio::test]
async fn a_worker_stops_on_sigterm_while_its_ingester_is_stuck() {
    let app = TestApp::spawn().await;
    publish_to_dlx(&app, &[letter(&app.job("stuck"), "rejected", "550")]).await;
    let failpoint = [("MAILROOM_FAILPOINTS", "dlq.after_insert=pause")];
    let mut worker = app.spawn_worker_process(&[], &failpoint);
    eventually("the row committed and the ingester stuck", || async {
        let paused = app.paused_at_failpoint("worker.log");
        (paused && rows(&app).await == 1).then_some(())
    })
    .await;
    let log = terminate_expecting_exit_0(
        &app,
        &mut worker,
        "worker.log",
        "the worker exits though its ingester never returns",
    )
    .await;
    let said = format!(
        "dead-letter ingest did not stop within {:?}",
        mailroom::dlq::ingest::STOP_PATIENCE
    );
    assert!(log.contains(&said), "{log}");
    eventually("the letter back in the queue", || async {
        (app.dead_queue_length().await == 1).then_some(())
    })
    .await;
    assert_eq!(rows(&app).await, 1);
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

/// The ingester's log, with each retry of a held group at DEBUG.
const RETRIES_LOGGED: (&str, &str) = ("RUST_LOG", "info,mailroom::dlq::ingest=debug");

/// Waits until the worker's ingester has tried `tries` times to store the letter it holds,
/// asserting at every look that the letter is still in its hand: one consumer, nothing ready
/// in the queue, no row. A letter handed back is a delivery spent; on RabbitMQ 4 a letter of
/// `<ns>.dead` is dropped after 20 of them.
async fn held_through(app: &TestApp, tries: u32) {
    let retried = format!("tries={tries}");
    eventually(
        &format!("{tries} tries to store the held letter"),
        || async {
            assert_eq!(
                app.dead_consumers().await,
                1,
                "the ingester's consumer left"
            );
            assert_eq!(
                app.dead_queue_length().await,
                0,
                "the letter was handed back to the queue"
            );
            assert_eq!(rows(app).await, 0);
            app.process_log("worker.log")
                .contains(&retried)
                .then_some(())
        },
    )
    .await;
}

/// What the worker's log says of the pause: one WARN when it began, one INFO when it ended.
fn assert_one_pause(app: &TestApp) {
    let log = app.process_log("worker.log");
    assert_eq!(log.matches("dead-letter ingest paused").count(), 1, "{log}");
    assert_eq!(
        log.matches("dead-letter ingest resumed").count(),
        1,
        "{log}"
    );
}

#[tokio::test]
async fn a_database_outage_holds_the_letters_in_hand_and_stores_them_once_it_ends() {
    let app = TestApp::spawn().await;
    let proxy = FaultProxy::in_front_of(&app.db_url).await;
    let url = proxy.url_through(&app.db_url);
    let mut worker = app.spawn_worker_process(&["--database-url", &url], &[RETRIES_LOGGED]);
    eventually("the ingester consuming", || async {
        (app.dead_consumers().await == 1).then_some(())
    })
    .await;
    proxy.set(Fault::Reset);
    publish_to_dlx(&app, &[letter(&app.job("outage"), "rejected", "550")]).await;
    eventually("the pause begun", || async {
        app.process_log("worker.log")
            .contains("dead-letter ingest paused")
            .then_some(())
    })
    .await;
    held_through(&app, 3).await;

    proxy.set(Fault::Pass);
    eventually("the letter ingested once the database is back", || async {
        (rows(&app).await == 1 && app.dead_queue_length().await == 0).then_some(())
    })
    .await;
    assert_one_pause(&app);
    worker.kill().await.unwrap();
    assert_eq!(rows(&app).await, 1);
}

/// Makes the test's database refuse every insert into the table with a trigger that raises:
/// a database that answers but takes no rows (read-only after a failover, a full disk, a
/// revoked grant).
async fn refuse_rows(app: &TestApp) {
    let refuse = match engine() {
        Engine::Postgres => vec![
            "CREATE FUNCTION refuse_dead_letters() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'the table takes no rows'; END $$",
            "CREATE TRIGGER refuse BEFORE INSERT ON mailroom_dead_letters \
             FOR EACH ROW EXECUTE FUNCTION refuse_dead_letters()",
        ],
        Engine::MySql => vec![
            "CREATE TRIGGER refuse BEFORE INSERT ON mailroom_dead_letters FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the table takes no rows'",
        ],
    };
    for sql in refuse {
        app.execute(sql).await;
    }
}

/// Ends [`refuse_rows`].
async fn take_rows(app: &TestApp) {
    app.execute(match engine() {
        Engine::Postgres => "DROP TRIGGER refuse ON mailroom_dead_letters",
        Engine::MySql => "DROP TRIGGER refuse",
    })
    .await;
}

/// A database that answers but refuses the rows: the letters are held, not handed back again
/// and again (each time a delivery spent) in a loop of pauses and resumes.
#[tokio::test]
async fn a_database_that_answers_but_refuses_the_rows_holds_the_letters_without_a_loop() {
    let app = TestApp::spawn().await;
    refuse_rows(&app).await;
    let mut worker = app.spawn_worker_process(&[], &[RETRIES_LOGGED]);
    eventually("the ingester consuming", || async {
        (app.dead_consumers().await == 1).then_some(())
    })
    .await;
    publish_to_dlx(&app, &[letter(&app.job("refused"), "rejected", "550")]).await;
    held_through(&app, 4).await;

    take_rows(&app).await;
    eventually("the letter ingested once the rows are taken", || async {
        (rows(&app).await == 1 && app.dead_queue_length().await == 0).then_some(())
    })
    .await;
    assert_one_pause(&app);
    worker.kill().await.unwrap();
}

/// `mailroom dlq ingest` against a database that refuses the rows fails with the database's
/// reason and leaves the letters in the queue for the next run.
#[tokio::test]
async fn dlq_ingest_refused_by_the_database_says_why_and_leaves_the_letters_queued() {
    let app = TestApp::spawn().await;
    let letters: Vec<_> = (0..3)
        .map(|i| letter(&app.job(&format!("cron-{i}")), "rejected", "550"))
        .collect();
    publish_to_dlx(&app, &letters).await;
    refuse_rows(&app).await;
    let out = app.cli_output(&["dlq", "ingest"]).await;
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("storing dead letter")
            && out.stderr.contains("the table takes no rows"),
        "{}",
        out.stderr
    );
    eventually("every letter back in the queue", || async {
        (app.dead_queue_length().await == 3).then_some(())
    })
    .await;
    assert_eq!(rows(&app).await, 0);

    take_rows(&app).await;
    let out = app.cli(&["dlq", "ingest"]).await;
    assert!(out.contains("ingested 3 dead letters"), "{out}");
    assert_eq!(app.dead_queue_length().await, 0);
    assert_eq!(rows(&app).await, 3);
}
