//! The small holes of issue 12 §5, against real services: a forged replay marker resurrects
//! nothing (counted at the SMTP server), and credentials are never sent where they could be
//! read.

use std::time::Duration;

use lapin::{Connection, options::BasicPublishOptions, types::AMQPValue};
use mailroom::broker;
use mailroom::dlq::seal::{ReplayKey, SEAL_HEADER};
use serde_json::Value;

use crate::helpers::*;

/// What the worker logs for each copy whose replay marker has no valid seal.
const FORGED_WARNING: &str = "replay marker without a valid seal";

/// Publishes `job` to the main exchange as a replayed copy would look, with `seal` (if any).
async fn publish_as_replay(app: &TestApp, job: &Value, seal: Option<&str>) {
    let id = job["job_id"].as_str().unwrap();
    let kind = job["kind"].as_str().unwrap();
    let mut headers = vec![(broker::REPLAY_HEADER, AMQPValue::LongLongInt(1))];
    if let Some(seal) = seal {
        headers.push((SEAL_HEADER, broker::text_value(seal)));
    }
    let props = broker::with_headers(&broker::job_properties(id, kind, 1), &headers);
    let conn = Connection::connect(&app.amqp_url, Default::default())
        .await
        .unwrap();
    let ch = broker::confirm_channel(&conn).await.unwrap();
    let confirm = ch
        .basic_publish(
            app.topology.exchange.as_str().into(),
            kind.into(),
            BasicPublishOptions::default(),
            job.to_string().as_bytes(),
            props,
        )
        .await
        .unwrap();
    assert!(confirm.await.unwrap().is_ack());
    let _ = conn.close(200, "published".into()).await;
}

fn worker_log(app: &TestApp) -> String {
    std::fs::read_to_string(app.dir.path().join("worker.log")).unwrap_or_default()
}

#[tokio::test]
async fn a_forged_replay_marker_does_not_resurrect_a_dead_job_but_mailrooms_replay_does() {
    let app = TestApp::spawn_with(&["--fail", "RCPT:550:1"]).await;
    let mut worker = app.spawn_worker_process(&[], &[]);
    let job = app.job("forged-replay");
    app.publish(&job).await;
    eventually("the job dead after its 550", || async {
        (app.dead_count().await == 1).then_some(())
    })
    .await;

    // Anyone who may publish: the marker alone, and the marker with a seal of another key.
    publish_as_replay(&app, &job, None).await;
    let wrong = ReplayKey::generate().seal(1, job.to_string().as_bytes());
    publish_as_replay(&app, &job, Some(&wrong)).await;
    eventually(
        "both forged copies dead-lettered again, or one sent",
        || async { (app.dead_count().await == 3 || !app.smtp.received().is_empty()).then_some(()) },
    )
    .await;
    assert_eq!(app.smtp.received().len(), 0, "a forged copy was sent");
    let row = app.notification("forged-replay", "welcome").await.unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("dead", 1));
    let warnings = worker_log(&app).matches(FORGED_WARNING).count();
    assert_eq!(warnings, 2, "one WARN per forged delivery");

    // mailroom's own replay (the key comes from the database, as the worker's does).
    let out = app.cli_output(&["dlq", "replay", "forged-replay"]).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("moved 3"), "{}", out.stdout);
    app.smtp.wait_for(1).await;
    eventually("every replayed copy settled", || async {
        let row = app.notification("forged-replay", "welcome").await?;
        let settled = row.status.as_str() == "sent"
            && app.ready_messages().await == 0
            && app.dead_count().await == 0;
        settled.then_some(())
    })
    .await;
    terminate(&worker).await;
    worker.wait().await.unwrap();
    assert_eq!(
        app.smtp.count(&app.message_id("forged-replay", "welcome")),
        1
    );
    assert_eq!(worker_log(&app).matches(FORGED_WARNING).count(), 2);
}

#[tokio::test]
async fn a_worker_refuses_to_start_when_its_smtp_password_could_travel_in_clear_text() {
    let app = TestApp::spawn().await;
    for url in [
        "smtp://ada:s3cret@mail.example:587?tls=opportunistic",
        "smtp://ada:s3cret@mail.example:25",
    ] {
        let mut args = vec!["worker".to_string()];
        args.extend(app.worker_args(&["--smtp-url", url]));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = tokio::time::timeout(Duration::from_secs(30), run_cli(&args, &[]))
            .await
            .expect("the worker refuses at startup instead of running");
        assert!(!out.status.success(), "{url}");
        assert!(
            out.stderr.contains("SMTP_URL") && out.stderr.contains("refusing to send the password"),
            "{url}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);
    }
}
