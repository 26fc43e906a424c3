//! Declaration isolation: a queue the broker refuses to declare (arguments that conflict with
//! the queue already there, a home node that is down) keeps only itself out of service. The
//! relay still publishes and the worker still sends; the process reports the missing part on
//! `/metrics` and `/readyz`, and declares it as soon as the broker takes it. A process that
//! reconnects only looks its topology up; when the broker lost it (a reset), it declares it all
//! again.

use std::time::Duration;

use lapin::{Connection, options::*, types::FieldTable};

use crate::helpers::*;

/// Replaces `queue` by a classic queue: arguments that conflict with what mailroom declares.
async fn make_conflicting(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(queue.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, FieldTable::default())
        .await
        .unwrap();
}

fn missing_series(part: &str) -> String {
    format!("mailroom_topology_missing{{part=\"{part}\"}} 1")
}

#[tokio::test]
async fn a_retry_tier_the_broker_refuses_leaves_relay_and_worker_working_and_is_reported() {
    let vhost = Vhost::create().await;
    let app = TestApp::spawn_on(vhost.url.clone(), &[]).await;
    let conn = Connection::connect(&vhost.url, Default::default())
        .await
        .unwrap();
    let tier = app.topology.retry_queue(app.topology.retry_delays[1]);
    make_conflicting(&conn, &tier).await;
    let part = format!("queue {tier}");

    let addr = format!("127.0.0.1:{}", free_port());
    let worker = app.spawn_worker_process(&["--metrics-addr", &addr], &[]);
    let relay = app.spawn_relay_process(&[], &[]);
    for i in 0..3 {
        app.enqueue(&app.email_job(&format!("isolated-{i}")))
            .await
            .unwrap();
    }
    let got = app.smtp.wait_for(3).await;
    assert_eq!(got.len(), 3);

    let metrics = eventually("the missing tier on /metrics", || async {
        scrape_metrics(&addr)
            .await
            .filter(|t| t.contains(&missing_series(&part)))
    })
    .await;
    assert!(!metrics.contains(&missing_series(&format!("queue {}", app.topology.dead))));
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status().as_u16(), 200, "still ready: it works");
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["missing"], serde_json::json!([part]), "{body}");

    // Once the conflicting queue is gone, the tier is declared in the background.
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(tier.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    eventually("the tier declared again", || async {
        scrape_metrics(&addr)
            .await
            .filter(|t| t.contains("# TYPE mailroom_topology_missing") && !t.contains(&part))
    })
    .await;
    terminate(&worker).await;
    terminate(&relay).await;
    drop(app);
    vhost.delete().await;
}

/// A reconnect looks the exchanges and the work queue up (passive declarations) instead of
/// declaring them. A broker that lost them between two sessions (a reset node, a vhost made
/// again) answers the lookup NOT_FOUND, and the process must then declare everything, or no
/// session would ever start again. The worker runs alone, so that nobody else declares the
/// topology for it.
#[tokio::test]
async fn after_a_broker_reset_a_reconnect_declares_the_topology_again() {
    const FALLBACK: &str = "the topology is not all there";
    const CONSUMING: &str = "consuming queue=";
    let vhost = Vhost::create().await;
    let app = TestApp::spawn_on(vhost.url.clone(), &[]).await;
    let worker = app.spawn_worker_process(&[], &[]);
    app.publish(&app.job("before-reset")).await;
    app.smtp.wait_for(1).await;
    let worker_log = || std::fs::read_to_string(app.dir.path().join("worker.log")).unwrap();
    assert!(!worker_log().contains(FALLBACK), "nothing was missing yet");
    assert_eq!(worker_log().matches(CONSUMING).count(), 1);

    vhost.reset().await;
    let again = tokio::time::timeout(PATIENCE, async {
        while worker_log().matches(CONSUMING).count() < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert!(
        again.await.is_ok(),
        "the worker consuming again; its log:\n{}",
        worker_log()
    );
    assert!(
        worker_log().contains(FALLBACK),
        "the lookup failed and the worker declared the topology: {}",
        worker_log()
    );
    // The app's own connection went with the old vhost: publish on a new one.
    let conn = Connection::connect(&vhost.url, Default::default())
        .await
        .unwrap();
    let publisher = mailroom::broker::confirm_channel(&conn).await.unwrap();
    let job = app.job("after-reset");
    mailroom::broker::publish_confirmed(
        &publisher,
        &app.topology.exchange,
        "welcome",
        job.to_string().as_bytes(),
        mailroom::broker::job_properties("after-reset", "welcome", 1),
    )
    .await
    .expect("the exchange and the work queue are back");
    app.smtp.wait_for(2).await;
    for job in ["before-reset", "after-reset"] {
        assert_eq!(app.smtp.count(&app.message_id(job, "welcome")), 1, "{job}");
    }
    let ch = conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(
        app.topology.dead.as_str().into(),
        passive,
        FieldTable::default(),
    )
    .await
    .expect("the dead-letter queue declared again");
    terminate(&worker).await;
    drop(app);
    vhost.delete().await;
}
