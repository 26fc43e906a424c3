//! The small holes of issue 12 §5, against real services: a forged replay marker resurrects
//! nothing (counted at the SMTP server), credentials are never sent where they could be read,
//! and `/readyz` keeps one broker connection and tells strangers no broker details.

use std::sync::Arc;
use std::time::Duration;

use lapin::{Connection, options::BasicPublishOptions, types::AMQPValue};
use mailroom::broker;
use mailroom::config::UrlList;
use mailroom::dlq::seal::{ReplayKey, SEAL_HEADER};
use mailroom::http::metrics::Metrics;
use mailroom::http::{self, ApiState, BrokerProbe};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

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

#[tokio::test]
async fn a_forged_replay_marker_does_not_resurrect_a_dead_job_but_mailrooms_replay_does() {
    // 554, not a 5.1.1 that would suppress the address and make the genuine replay unsent.
    let app = TestApp::spawn_with(&["--fail", "RCPT:554:1"]).await;
    let mut worker = app.spawn_worker_process(&[], &[]);
    let job = app.job("forged-replay");
    app.publish(&job).await;
    eventually("the job dead after its 554", || async {
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
    let warnings = app
        .process_log("worker.log")
        .matches(FORGED_WARNING)
        .count();
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
    assert_eq!(
        app.process_log("worker.log")
            .matches(FORGED_WARNING)
            .count(),
        2
    );
}

/// `mailroom dlq replay <id>` with `MAILROOM_REPLAY_KEY`, after ingesting the dead letters
/// (the key in the database is not used then).
async fn replay_with_key(app: &TestApp, id: &str, key: &str) -> CliOutput {
    app.ingest_dead().await;
    let env = [
        ("AMQP_URL", app.amqp_url.as_str()),
        ("MAILROOM_NAMESPACE", app.namespace.as_str()),
        ("MAILROOM_RETRY_DELAYS", TEST_RETRY_DELAYS),
        ("DATABASE_URL", app.db_url.as_str()),
        ("MAILROOM_REPLAY_KEY", key),
    ];
    run_cli(&["dlq", "replay", id], &env).await
}

#[tokio::test]
async fn a_configured_replay_key_must_be_the_same_for_the_replay_and_the_worker() {
    let app = TestApp::spawn_with(&["--fail", "RCPT:554:1"]).await;
    let key = "k".repeat(40);
    let worker = app.start_worker(&["--replay-key", &key]);
    app.publish(&app.job("keyed")).await;
    worker.stats.wait_until(|s| s.dead_lettered == 1).await;

    let refused = run_cli(
        &["dlq", "replay", "keyed"],
        &[
            ("AMQP_URL", app.amqp_url.as_str()),
            ("MAILROOM_NAMESPACE", app.namespace.as_str()),
        ],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("DATABASE_URL"),
        "the rows to replay are in the database: {}",
        refused.stderr
    );
    assert_eq!(app.dead_count().await, 1, "nothing moved");

    let other = replay_with_key(&app, "keyed", &"o".repeat(40)).await;
    assert!(other.status.success(), "{}", other.stderr);
    worker.stats.wait_until(|s| s.dead_lettered == 2).await;
    assert_eq!(
        app.smtp.received().len(),
        0,
        "another key's seal was honoured"
    );

    let same = replay_with_key(&app, "keyed", &key).await;
    assert!(same.status.success(), "{}", same.stderr);
    worker.stats.wait_until(|s| s.sent == 1).await;
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("keyed", "welcome")), 1);
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

/// An API on a port of its own whose readiness probe reaches the broker at `amqp`.
async fn api_probing(app: &TestApp, amqp: &str) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let amqp: UrlList = amqp.parse().unwrap();
    let state = Arc::new(ApiState {
        db: app.db.clone(),
        amqp: amqp.clone(),
        topology: app.topology.clone(),
        templates: None,
        token: Some(TOKEN.into()),
        relay_wake: None,
        metrics: Metrics::default(),
        broker_probe: BrokerProbe::new(amqp, "mailroom test readiness probe"),
        replay_key: None,
    });
    let shutdown = CancellationToken::new();
    tokio::spawn(http::serve(listener, state, shutdown.clone()));
    (base, shutdown)
}

async fn probe(base: &str, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("{base}/readyz"));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// The client ports of the readiness probe's connections in `vhost`, as the broker lists them
/// (the name a client gives its connection is among its `client_properties`).
async fn probe_connections(vhost: &Vhost) -> Vec<String> {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_connections",
            "vhost",
            "peer_port",
            "client_properties",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.splitn(3, '\t').collect();
            let ours = cols.len() == 3
                && cols[0] == vhost.name
                && cols[2].contains("\"mailroom test readiness probe\"");
            ours.then(|| cols[1].to_string())
        })
        .collect()
}

#[tokio::test]
async fn many_readiness_probes_share_one_broker_connection() {
    let vhost = Vhost::create().await;
    let app = TestApp::spawn_on(vhost.url.clone(), &[]).await;
    let (base, shutdown) = api_probing(&app, &vhost.url).await;
    for _ in 0..20 {
        let (code, body) = probe(&base, None).await;
        assert_eq!(code, 200, "{body}");
    }
    let first = probe_connections(&vhost).await;
    assert_eq!(first.len(), 1, "one kept connection: {first:?}");
    for _ in 0..20 {
        assert_eq!(probe(&base, None).await.0, 200);
    }
    assert_eq!(
        probe_connections(&vhost).await,
        first,
        "the same connection"
    );

    // The broker drops it: a later probe opens one new connection and is ready again.
    vhost.close_all_connections().await;
    let second = eventually("a new probe connection", || async {
        assert_eq!(probe(&base, None).await.0, 200);
        let now = probe_connections(&vhost).await;
        (now.len() == 1 && now != first).then_some(now)
    })
    .await;
    for _ in 0..5 {
        assert_eq!(probe(&base, None).await.0, 200);
    }
    assert_eq!(probe_connections(&vhost).await, second);
    shutdown.cancel();
    vhost.delete().await;
}

#[tokio::test]
async fn a_failing_readiness_probe_names_no_broker_user_host_or_vhost_to_strangers() {
    let app = TestApp::spawn().await;
    let vhost = format!(
        "mailroom-missing-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let mut url = url::Url::parse(&amqp_url()).unwrap();
    url.set_path(&format!("/{vhost}"));
    let (base, shutdown) = api_probing(&app, url.as_str()).await;

    let (code, body) = probe(&base, None).await;
    assert_eq!(code, 503, "{body}");
    let parsed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        parsed,
        json!({"status": "unavailable", "checks": {"database": "ok", "broker": "down"}})
    );
    let (_, wrong) = probe(&base, Some("wrong-token")).await;
    assert_eq!(wrong, body);
    for secret in [url.username(), url.host_str().unwrap(), vhost.as_str()] {
        assert!(!body.contains(secret), "{secret:?} in {body}");
    }

    // The operator, with the token, gets the reason.
    let (code, body) = probe(&base, Some(TOKEN)).await;
    assert_eq!(code, 503);
    let parsed: Value = serde_json::from_str(&body).unwrap();
    let why = parsed["details"]["broker"].as_str().unwrap();
    assert!(why.contains(&vhost), "{why}");
    shutdown.cancel();
}
