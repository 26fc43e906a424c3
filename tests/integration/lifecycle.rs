//! Process lifecycle: graceful shutdown with work in flight, and a broker that drops every
//! connection under load.

use std::collections::HashSet;

use crate::helpers::*;

#[tokio::test]
async fn sigterm_with_50_jobs_in_flight_sends_all_once_and_exits_0() {
    // Each send takes three seconds at the server, so all 50 are in flight when SIGTERM arrives.
    // Three runtime threads: the other worker processes of the suite run on the default one, so
    // this is where tasks settling on several threads at once meet a shutdown.
    let app = TestApp::spawn_with(&["--data-delay", "3.0"]).await;
    for i in 0..50 {
        app.publish(&app.job(&format!("inflight-{i}"))).await;
    }
    let mut worker = app.spawn_worker_process(
        &[
            "--threads",
            "3",
            "--concurrency",
            "64",
            "--prefetch",
            "64",
            "--smtp-connections",
            "64",
            "--smtp-timeout",
            "20s",
            "--lease",
            "30s",
        ],
        &[],
    );
    eventually("50 claims in flight", || async {
        (app.count_status("sending").await == 50).then_some(())
    })
    .await;
    terminate_expecting_exit_0(&app, &mut worker, "worker.log", "worker exits").await;

    let received = app.smtp.received();
    let ids: HashSet<_> = received
        .iter()
        .map(|r| r.message_id.clone().unwrap())
        .collect();
    assert_eq!(received.len(), 50);
    assert_eq!(ids.len(), 50);
    assert_eq!(app.count_status("sent").await, 50);
    assert_eq!(
        app.ready_messages().await,
        0,
        "every delivery was acked before exit"
    );
}

/// A worker stopped over a backlog takes the deliveries the broker sent it before the cancel
/// (its prefetch beyond those in flight) instead of handing them back: each hand-back is a
/// delivery spent towards the work queue's limit, and restarts or scale-downs over a backlog
/// would spend the same jobs' again and again until the broker dead-letters them.
#[tokio::test]
async fn a_worker_stopped_over_a_backlog_hands_back_no_delivery() {
    // 8 sends of 50 ms at once: some 160 a second, so the prefetch stays full for seconds and a
    // loaded machine's slow polls still see it (at 20 ms, 400 jobs could drain between two).
    const JOBS: u32 = 600;
    let app = TestApp::spawn_with(&["--data-delay", "0.05"]).await;
    for i in 0..JOBS {
        app.publish(&app.job(&format!("backlog-{i}"))).await;
    }
    let mut worker = app.spawn_worker_process(&["--concurrency", "8", "--prefetch", "64"], &[]);
    eventually("the worker sending, its prefetch full", || async {
        let sent = app.count_status("sent").await;
        let ready = app.ready_messages().await;
        // 8 in flight and 56 waiting in the worker: 64 delivered and not yet sent.
        (sent >= 40 && i64::from(JOBS - ready) - sent >= 60).then_some(())
    })
    .await;
    terminate_expecting_exit_0(&app, &mut worker, "worker.log", "worker exits").await;

    let sent = app.count_status("sent").await;
    let left = i64::from(app.ready_messages().await);
    assert_eq!(
        sent + left,
        i64::from(JOBS),
        "every job sent or still queued"
    );
    assert!(left > 0, "the stop hit a backlog");
    assert_eq!(app.smtp.received().len() as i64, sent);
    let conn = lapin::Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut redelivered = 0;
    for _ in 0..left {
        let got = ch
            .basic_get(
                app.topology.queue.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
            .expect("a job left in the queue");
        redelivered += usize::from(got.delivery.redelivered);
    }
    assert_eq!(redelivered, 0, "jobs handed back by the stopped worker");
    conn.close(200, "read".into()).await.unwrap();
}

#[tokio::test]
async fn closing_all_broker_connections_under_load_loses_and_duplicates_nothing() {
    let vhost = Vhost::create().await;
    // 0.1 s per send, 4 at a time: about 8 s for all, so the close lands mid-run.
    let app = TestApp::spawn_on(vhost.url.clone(), &["--data-delay", "0.1"]).await;
    let worker = app.start_worker(&["--concurrency", "4"]);
    let total = 300;
    for i in 0..total {
        app.publish(&app.job(&format!("load-{i}"))).await;
    }
    worker.stats.wait_until(|s| s.sent >= 30).await;
    vhost.close_all_connections().await;
    let sent_by_then = app.smtp.received().len();
    assert!(
        sent_by_then < total as usize,
        "the close landed after the last send: it tested nothing"
    );
    // The deliveries in flight lost their channel: their acks fail, the broker hands the
    // copies back, and the ledger turns away those already sent.
    eventually("an ack lost with the connection", || async {
        (worker.stats.snapshot().unsettled >= 1).then_some(())
    })
    .await;
    // The test's own publisher connection went too; only the worker must recover.
    eventually("every job sent", || async {
        (app.count_status("sent").await == total).then_some(())
    })
    .await;
    let received = app.smtp.wait_for(total as usize).await;
    eventually(
        "a copy redelivered after the close acked as a duplicate",
        || async { (worker.stats.snapshot().duplicates >= 1).then_some(()) },
    )
    .await;
    worker.stop().await;
    let ids: HashSet<_> = received
        .iter()
        .map(|r| r.message_id.clone().unwrap())
        .collect();
    assert_eq!(ids.len(), total as usize);
    assert_eq!(app.smtp.received().len(), total as usize, "no duplicates");
    drop(app);
    vhost.delete().await;
}

#[tokio::test]
async fn a_work_queue_deleted_under_a_running_worker_is_declared_again_and_consumed() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("before-delete")).await;
    app.smtp.wait_for(1).await;
    // The broker cancels the consumer; the worker reconnects and declares its topology again.
    app.delete_work_queue().await;
    // Unroutable (and so refused: mandatory) until the queue and its binding are back.
    let job = app.job("after-delete");
    eventually("the work queue declared and bound again", || async {
        app.try_publish(&job).await.then_some(())
    })
    .await;
    app.smtp.wait_for(2).await;
    worker.stop().await;
    assert_eq!(
        app.smtp.count(&app.message_id("after-delete", "welcome")),
        1
    );
}

#[tokio::test]
async fn a_relay_whose_listener_backend_is_terminated_still_relays() {
    if !runs_on(
        mailroom::db::Engine::Postgres,
        "LISTEN/NOTIFY is PostgreSQL's",
    ) {
        return;
    }
    let app = TestApp::spawn().await;
    // Where the relay can follow the WAL the migrations turned the trigger off; a relay that
    // cannot (a remote server, a user without REPLICATION) has it on and listens.
    app.execute("ALTER TABLE mailroom_outbox ENABLE TRIGGER mailroom_outbox_notify")
        .await;
    let worker = app.start_worker(&[]);
    // A one-hour ceiling between probes: only notifications can bring these rows out in time.
    let relay = app.start_relay(&["--relay-poll", "1h", "--relay-wakeup", "notify"]);
    app.enqueue(&app.email_job("before-kill")).await.unwrap();
    app.smtp.wait_for(1).await;
    assert_eq!(
        relay.stats.wakeup_mode(),
        mailroom::relay::WakeupMode::Notify
    );
    // An operator's or a failover's kill of the listening backend.
    eventually("the listener's backend terminated", || async {
        let killed = app
            .count(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND query LIKE 'LISTEN%') AS t",
            )
            .await;
        (killed >= 1).then_some(())
    })
    .await;
    app.enqueue(&app.email_job("after-kill")).await.unwrap();
    app.smtp.wait_for(2).await;
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("after-kill", "welcome")), 1);
}

/// A worker stopped while RabbitMQ is cut off (a partition: nothing answers, no socket closes)
/// does not wait for lapin to give the connection up (two missed heartbeats, 120 s with
/// RabbitMQ's default): its goodbyes to the broker are bounded, the delivery in flight is still
/// sent and recorded within the grace, and it exits 0. The ack never reached the broker, so the
/// job comes back, and the next worker acks it as a duplicate: one email.
#[tokio::test]
async fn a_worker_stopped_during_a_broker_partition_finishes_in_flight_and_exits() {
    let app = TestApp::spawn_with(&["--data-delay", "1.5"]).await;
    let proxy = FaultProxy::in_front_of(&app.amqp_url).await;
    let url = proxy.url_through(&app.amqp_url);
    let mut worker = app.spawn_worker_process(&["--amqp-url", &url], &[]);
    app.publish(&app.job("in-flight")).await;
    eventually("the job being sent", || async {
        (app.count_status("sending").await == 1).then_some(())
    })
    .await;
    proxy.set(Fault::Blackhole);
    terminate_expecting_exit_0(
        &app,
        &mut worker,
        "worker.log",
        "the worker exits without waiting for the heartbeat",
    )
    .await;
    assert_eq!(
        app.count_status("sent").await,
        1,
        "the delivery in flight finished within the grace"
    );
    let log = app.process_log("worker.log");
    assert!(
        log.contains("did not answer the consumer's cancel"),
        "{log}"
    );

    // The reset drops whatever the worker wrote into the partition, its ack included.
    proxy.set(Fault::Reset);
    let worker = app.start_worker(&[]);
    worker.stats.wait_until(|s| s.duplicates == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("in-flight", "welcome")), 1);
}

/// The relay's goodbye is bounded as the worker's: stopped while RabbitMQ is cut off, it
/// exits 0 without waiting for lapin's heartbeat.
#[tokio::test]
async fn a_relay_stopped_during_a_broker_partition_exits() {
    let app = TestApp::spawn().await;
    let proxy = FaultProxy::in_front_of(&app.amqp_url).await;
    let url = proxy.url_through(&app.amqp_url);
    let mut relay = app.spawn_relay_process(&["--amqp-url", &url], &[]);
    app.enqueue(&app.email_job("relayed")).await.unwrap();
    eventually("the row published", || async {
        (app.ready_messages().await == 1).then_some(())
    })
    .await;
    proxy.set(Fault::Blackhole);
    terminate_expecting_exit_0(
        &app,
        &mut relay,
        "relay.log",
        "the relay exits without waiting for the heartbeat",
    )
    .await;
    assert_eq!(app.unpublished().await, 0);
}

/// A worker stopped while its database is cut off does not wait for TCP to give its
/// statements up (minutes): its last heartbeat is given up after its patience, and it exits 0.
#[tokio::test]
async fn a_worker_stopped_during_a_database_partition_exits() {
    let app = TestApp::spawn().await;
    let db_port = url::Url::parse(&app.db_url).unwrap().port().unwrap();
    let proxy = FaultProxy::start(db_port).await;
    let url = proxy.url_through(&app.db_url);
    // A short grace: a delivery still settling when the partition lands waits that long.
    let args = ["--database-url", &url, "--shutdown-grace", "2s"];
    let mut worker = app.spawn_worker_process(&args, &[]);
    app.publish(&app.job("before")).await;
    eventually("the job sent", || async {
        (app.count_status("sent").await == 1).then_some(())
    })
    .await;
    proxy.set(Fault::Blackhole);
    let expected = "the worker exits though its database does not answer";
    let log = terminate_expecting_exit_0(&app, &mut worker, "worker.log", expected).await;
    assert!(
        log.contains("the last heartbeat was not written within"),
        "{log}"
    );
}

/// A relay stopped while its batch never gets past the confirm (held there forever by a
/// failpoint, as by a statement that waits on a database cut off) exits within its stop
/// patience and says so; the row it published and did not mark is published again by the next
/// relay and sent once.
#[tokio::test]
async fn a_relay_stopped_while_its_batch_is_stuck_exits_within_its_patience() {
    let app = TestApp::spawn().await;
    let held = [("MAILROOM_FAILPOINTS", "relay.after_confirm=pause")];
    let mut relay = app.spawn_relay_process(&[], &held);
    app.enqueue(&app.email_job("stuck")).await.unwrap();
    eventually(
        "the row published, its batch held before the mark",
        || async {
            let paused = app.paused_at_failpoint("relay.log");
            (paused && app.ready_messages().await == 1).then_some(())
        },
    )
    .await;
    let log = terminate_expecting_exit_0(
        &app,
        &mut relay,
        "relay.log",
        "the relay exits though its batch never returns",
    )
    .await;
    let said = format!(
        "the relay did not stop within {:?}",
        mailroom::relay::STOP_PATIENCE
    );
    assert!(log.contains(&said), "{log}");
    assert_eq!(app.unpublished().await, 1, "the mark never committed");

    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    worker.stats.wait_until(|s| s.sent == 1).await;
    eventually("the row published again and marked", || async {
        (app.unpublished().await == 0).then_some(())
    })
    .await;
    relay.stop().await;
    worker.stats.wait_until(|s| s.duplicates == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("stuck", "welcome")), 1);
}

/// A relay stopped while its database is cut off (a statement waiting on it waits for TCP to
/// give up, minutes: the relay was seen still running 210 s after SIGTERM) exits 0, through its
/// stop patience or, when the statement was a new connection's, the pool's own timeout; what it
/// published is still sent once.
#[tokio::test]
async fn a_relay_stopped_during_a_database_partition_exits() {
    let app = TestApp::spawn().await;
    let db_port = url::Url::parse(&app.db_url).unwrap().port().unwrap();
    let proxy = FaultProxy::start(db_port).await;
    let url = proxy.url_through(&app.db_url);
    // Polled every 100 ms: a probe goes into the partition at once.
    let poll = [
        "--database-url",
        &url,
        "--relay-poll",
        "100ms",
        "--relay-poll-max",
        "100ms",
    ];
    let mut relay = app.spawn_relay_process(&poll, &[]);
    app.enqueue(&app.email_job("relayed")).await.unwrap();
    eventually("the row published", || async {
        (app.ready_messages().await == 1).then_some(())
    })
    .await;
    proxy.set(Fault::Blackhole);
    eventually(
        "a statement of the relay, or its answer, held in the partition",
        || async { (proxy.held() > 0).then_some(()) },
    )
    .await;
    terminate_expecting_exit_0(
        &app,
        &mut relay,
        "relay.log",
        "the relay exits though its statement never returns",
    )
    .await;

    proxy.set(Fault::Reset);
    let worker = app.start_worker(&[]);
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("relayed", "welcome")), 1);
}

/// `mailroom serve` stopped while a request waits on a database that does not answer exits
/// within its patience: the request's connection is closed unanswered instead of holding the
/// stop for TCP's minutes.
#[tokio::test]
async fn serve_stopped_with_a_request_held_in_a_database_partition_exits() {
    let app = TestApp::spawn().await;
    let db_port = url::Url::parse(&app.db_url).unwrap().port().unwrap();
    let proxy = FaultProxy::start(db_port).await;
    let url = proxy.url_through(&app.db_url);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve = app.spawn_serve_process(&addr, &["--database-url", &url]);
    let status_url = format!("http://{addr}/v1/emails/held/welcome");
    eventually("serve answering", || async {
        let r = reqwest::get(&status_url).await.ok()?;
        (r.status() == 404).then_some(())
    })
    .await;
    proxy.set(Fault::Blackhole);
    let request = tokio::spawn(reqwest::get(status_url.clone()));
    eventually(
        "the request's statement, or its answer, held in the partition",
        || async { (proxy.held() > 0).then_some(()) },
    )
    .await;
    terminate_expecting_exit_0(
        &app,
        &mut serve,
        "",
        "serve exits though a request of its waits on the database",
    )
    .await;
    let answered = request.await.unwrap();
    assert!(answered.is_err(), "no answer: {answered:?}");
}

/// A delivery held past the shutdown grace (paused after its claim, as by a statement or a
/// send that never returns) holds the stop for one grace, counted from the SIGTERM: the stop
/// used to give what was left a second grace after the first had run out.
#[tokio::test]
async fn a_delivery_held_past_the_grace_holds_the_stop_for_one_grace_only() {
    let app = TestApp::spawn().await;
    let grace = std::time::Duration::from_secs(8);
    let grace_flag = format!("{}s", grace.as_secs());
    let held = [("MAILROOM_FAILPOINTS", "worker.after_claim=pause")];
    let mut worker = app.spawn_worker_process(&["--shutdown-grace", &grace_flag], &held);
    app.publish(&app.job("held")).await;
    eventually("the delivery held after its claim", || async {
        app.paused_at_failpoint("worker.log").then_some(())
    })
    .await;
    let sigterm = std::time::Instant::now();
    let log = terminate_expecting_exit_0(
        &app,
        &mut worker,
        "worker.log",
        "the worker gives up the held delivery after its grace",
    )
    .await;
    let took = sigterm.elapsed();
    assert!(
        took >= grace,
        "stopped after {took:?}, before its grace\n{log}"
    );
    assert!(
        took < 2 * grace,
        "stopped {took:?} after SIGTERM: a second grace for the same delivery\n{log}"
    );
    assert_eq!(
        log.matches("shutdown grace period over").count(),
        1,
        "{log}"
    );
    assert_eq!(app.count_status("sent").await, 0);
}

/// Whatever holds a worker's stop, it exits within its grace and its bounded goodbyes
/// (`worker::STOP_BEYOND_GRACE`) and says so: here the stop is held forever after the drain.
#[tokio::test]
async fn a_worker_whose_stop_is_held_exits_within_its_bound() {
    let app = TestApp::spawn().await;
    let held = [("MAILROOM_FAILPOINTS", "worker.stopping=pause")];
    let mut worker = app.spawn_worker_process(&["--shutdown-grace", "1s"], &held);
    app.publish(&app.job("before")).await;
    eventually("the job sent", || async {
        (app.count_status("sent").await == 1).then_some(())
    })
    .await;
    let log = terminate_expecting_exit_0(
        &app,
        &mut worker,
        "worker.log",
        "the worker exits though its stop is held",
    )
    .await;
    assert!(log.contains("failpoint: pausing"), "{log}");
    let said = format!(
        "the worker did not stop within {:?}",
        std::time::Duration::from_secs(1) + mailroom::worker::STOP_BEYOND_GRACE
    );
    assert!(log.contains(&said), "{log}");
}

/// Blocking work that outlives a stop (here a check of the template directory, parked on its
/// thread as on a hung mount) does not hold the exit: the process gives it 2 s and says so.
/// Dropping the runtime waited for it without end.
#[tokio::test]
async fn a_worker_whose_template_check_hangs_still_sends_and_exits() {
    let app = TestApp::spawn().await;
    let held = [("MAILROOM_FAILPOINTS", "templates.check=pause")];
    let args = ["--template-reload-interval", "100ms"];
    let mut worker = app.spawn_worker_process(&args, &held);
    eventually("the template check parked on its thread", || async {
        app.paused_at_failpoint("worker.log").then_some(())
    })
    .await;
    app.publish(&app.job("sent-meanwhile")).await;
    eventually("the job sent while the check hangs", || async {
        (app.count_status("sent").await == 1).then_some(())
    })
    .await;
    let log = terminate_expecting_exit_0(
        &app,
        &mut worker,
        "worker.log",
        "the worker exits though its template check never ends",
    )
    .await;
    assert!(
        log.contains("did not end within 2s of the stop; exiting without it"),
        "{log}"
    );
}

/// A worker cut off from RabbitMQ without anything being closed (a partition: nothing is reset,
/// nothing arrives) holds the deliveries it took only until the broker misses two of its
/// heartbeats. mailroom asks for a 10 s heartbeat, so another worker sends the job about 20 s
/// after the cut; with RabbitMQ's default of 60 s the job waited 120 s.
#[tokio::test]
async fn the_job_a_worker_cut_off_from_rabbitmq_held_is_sent_by_another_within_its_heartbeats() {
    let app = TestApp::spawn().await;
    let proxy = FaultProxy::in_front_of(&app.amqp_url).await;
    let url = proxy.url_through(&app.amqp_url);
    let held = [("MAILROOM_FAILPOINTS", "worker.before_claim=pause")];
    let mut cut_off = app.spawn_worker_process(&["--amqp-url", &url], &held);
    app.publish(&app.job("held")).await;
    eventually("the delivery held before its claim", || async {
        app.paused_at_failpoint("worker.log").then_some(())
    })
    .await;
    proxy.set(Fault::Blackhole);
    let cut = std::time::Instant::now();
    let worker = app.start_worker(&[]);
    let two_beats = 2 * mailroom::broker::HEARTBEAT;
    eventually_within(
        two_beats + std::time::Duration::from_secs(30),
        "the held job sent by the other worker",
        || async { (app.count_status("sent").await == 1).then_some(()) },
    )
    .await;
    let took = cut.elapsed();
    assert!(
        took >= mailroom::broker::HEARTBEAT / 2,
        "sent {took:?} after the cut: before the broker could have missed a heartbeat"
    );
    worker.stop().await;
    cut_off.kill().await.unwrap();
    assert_eq!(app.smtp.count(&app.message_id("held", "welcome")), 1);
}
