//! Operating a running mailroom: live template edits (a broken one is rejected while sending goes
//! on, a good one is used by the next email and its revision is recorded), `/metrics` counters
//! moving with real jobs, and the dead-letter queue over HTTP.

use std::path::Path;
use std::sync::atomic::Ordering;

use mailroom::metrics::Metrics;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::http::{Api, TOKEN};
use crate::templates::{copy_dir, shipped};

/// A copy of the shipped templates that a test may edit under a running worker.
fn editable_templates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&shipped(), dir.path());
    dir
}

fn live_worker_args(dir: &Path) -> Vec<String> {
    vec![
        "--templates".into(),
        dir.to_str().unwrap().into(),
        "--template-reload-interval".into(),
        "100ms".into(),
    ]
}

fn subject(email: &Received) -> String {
    email
        .data
        .lines()
        .find_map(|l| l.strip_prefix("Subject: "))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_broken_template_edit_is_rejected_and_sending_goes_on_with_the_last_good_set() {
    let app = TestApp::spawn().await;
    let dir = editable_templates();
    let args = live_worker_args(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (worker, live) = app.start_live_worker(&args);
    let good = live.current().revision().to_owned();

    let subject_file = dir.path().join("welcome/subject.hbs");
    std::fs::write(&subject_file, "Welcome {{no_such_variable}}\n").unwrap();
    eventually("the broken edit to be rejected", || async {
        (live.reloads_failed.load(Ordering::Relaxed) == 1).then_some(())
    })
    .await;
    // The same broken state is reported once, not on every tick.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(live.reloads_failed.load(Ordering::Relaxed), 1);
    assert_eq!(live.current().revision(), good);

    app.publish(&app.job("while-broken")).await;
    let got = app.smtp.wait_for(1).await;
    assert_eq!(subject(&got[0]), "Welcome to Acme Cloud, Ada!");
    let row = app
        .wait_for_row("while-broken", "welcome", "sent", |n| {
            n.status.as_str() == "sent"
        })
        .await;
    assert_eq!(row.template_revision.as_deref(), Some(good.as_str()));
    worker.stop().await;
}

#[tokio::test]
async fn a_good_template_edit_is_used_by_the_next_email_and_its_revision_shows_in_status() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let dir = editable_templates();
    let args = live_worker_args(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (worker, live) = app.start_live_worker(&args);
    let before = live.current().revision().to_owned();
    app.publish(&app.job("before-edit")).await;
    app.smtp.wait_for(1).await;

    let subject_file = dir.path().join("welcome/subject.hbs");
    std::fs::write(&subject_file, "Edited: your {{product_name}} account\n").unwrap();
    let after = eventually("the edit to be loaded", || async {
        let now = live.current().revision().to_owned();
        (now != before).then_some(now)
    })
    .await;
    assert_eq!(live.reloads_ok.load(Ordering::Relaxed), 1);

    app.publish(&app.job("after-edit")).await;
    let got = app.smtp.wait_for(2).await;
    let second = got
        .iter()
        .find(|r| r.message_id.as_deref() == Some(&app.message_id("after-edit", "welcome")))
        .expect("the second email");
    assert_eq!(subject(second), "Edited: your Acme Cloud account");
    app.wait_for_row("after-edit", "welcome", "sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;

    let out = app
        .cli(&["status", "after-edit", "welcome", "--json"])
        .await;
    let status: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(status["template_revision"], after.as_str());
    let out = app.cli(&["status", "before-edit"]).await;
    assert!(out.contains(&format!("templates {before}")), "{out}");
    let over_http = api.status("after-edit", "welcome").await;
    assert_eq!(over_http["template_revision"], after.as_str());
    worker.stop().await;
}

/// The value of the sample `series` (name with labels, exactly as printed) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

async fn scrape(api: &Api) -> String {
    let resp = api
        .client
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let kind = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    resp.text().await.unwrap()
}

#[tokio::test]
async fn metrics_count_jobs_as_they_are_sent_retried_and_dead_lettered() {
    let app = TestApp::spawn_with(&["--fail", "DATA:451:1"]).await;
    let (worker, live) = app.start_live_worker(&[]);
    let relay = app.start_relay(&[]);
    let metrics = Metrics {
        worker: Some(worker.stats.clone()),
        relay: Some(relay.stats.clone()),
        templates: Some(live.clone()),
        db: Some(app.db.clone()),
    };
    let api = Api::start_with(&app, live.clone(), metrics).await;
    let text = scrape(&api).await;
    assert_eq!(sample(&text, "mailroom_sent_total"), Some(0.0));
    assert_eq!(sample(&text, "mailroom_relay_lag_seconds"), Some(0.0));
    let revision = format!(
        "mailroom_template_revision{{revision=\"{}\"}}",
        live.current().revision()
    );
    assert_eq!(sample(&text, &revision), Some(1.0));

    // Through the outbox: the first attempt meets a 451, is retried, then sent.
    let mut tx = app.db.postgres().begin().await.unwrap();
    mailroom::db::outbox::enqueue(&mut tx, &app.email_job("m-1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Not JSON at all: dead-lettered as invalid.
    app.publish_raw("welcome", "m-bad", b"not json").await;
    worker
        .stats
        .wait_until(|s| s.sent == 1 && s.dead_lettered == 1)
        .await;

    let text = scrape(&api).await;
    let expect = [
        ("mailroom_received_total", 3.0),
        ("mailroom_sent_total", 1.0),
        ("mailroom_retried_total", 1.0),
        ("mailroom_duplicates_skipped_total", 0.0),
        (
            "mailroom_dead_lettered_total{kind=\"welcome\",class=\"invalid\"}",
            1.0,
        ),
        ("mailroom_in_flight", 0.0),
        ("mailroom_smtp_duration_seconds_count", 2.0),
        ("mailroom_end_to_end_seconds_count", 1.0),
        ("mailroom_relay_published_total", 1.0),
        ("mailroom_relay_refused_total", 0.0),
        ("mailroom_relay_lag_seconds", 0.0),
        ("mailroom_template_reloads_total{result=\"failed\"}", 0.0),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    relay.stop().await;

    // With the relay stopped, a row waiting for a minute shows as lag.
    let mut tx = app.db.postgres().begin().await.unwrap();
    mailroom::db::outbox::enqueue(&mut tx, &app.email_job("m-2"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query(
        "UPDATE mailroom_outbox SET created_at = now() - interval '1 minute' WHERE job_id = 'm-2'",
    )
    .execute(app.db.postgres())
    .await
    .unwrap();
    let lag = sample(&scrape(&api).await, "mailroom_relay_lag_seconds").unwrap();
    assert!((60.0..120.0).contains(&lag), "{lag}");
    worker.stop().await;
}

/// A loopback port free right now, for a process that must be told its address.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_worker_process_serves_metrics_on_its_own_address_and_reloads_on_sighup() {
    let app = TestApp::spawn().await;
    let dir = editable_templates();
    let addr = format!("127.0.0.1:{}", free_port());
    let templates = dir.path().to_str().unwrap();
    // Polling once an hour: only the SIGHUP can make this worker see the edit in time.
    let worker = app.spawn_worker_process(
        &[
            "--templates",
            templates,
            "--template-reload-interval",
            "1h",
            "--metrics-addr",
            &addr,
        ],
        &[],
    );
    let client = reqwest::Client::new();
    let scrape = || async {
        let resp = client
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .ok()?;
        resp.text().await.ok()
    };
    let text = eventually("the worker's metrics listener", scrape).await;
    assert_eq!(sample(&text, "mailroom_received_total"), Some(0.0));

    std::fs::write(
        dir.path().join("welcome/subject.hbs"),
        "Reloaded on SIGHUP, {{user.name}}\n",
    )
    .unwrap();
    let pid = worker.id().unwrap().to_string();
    let hup = tokio::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .await
        .unwrap();
    assert!(hup.success());
    eventually("the reload to be counted", || async {
        let text = scrape().await?;
        (sample(&text, "mailroom_template_reloads_total{result=\"ok\"}") == Some(1.0)).then_some(())
    })
    .await;

    app.publish(&app.job("after-hup")).await;
    let got = app.smtp.wait_for(1).await;
    assert_eq!(subject(&got[0]), "Reloaded on SIGHUP, Ada");
    eventually("sent counted", || async {
        (sample(&scrape().await?, "mailroom_sent_total") == Some(1.0)).then_some(())
    })
    .await;
    terminate(&worker).await;
}

#[tokio::test]
async fn mailroom_run_reports_worker_and_relay_counters_on_its_http_metrics() {
    let app = TestApp::spawn().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["run".to_string()];
    args.extend(app.worker_args(&["--relay-poll", "1s", "--http-addr", &addr]));
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(if std::env::var_os("TEST_LOG").is_some() {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut tx = app.db.postgres().begin().await.unwrap();
    mailroom::db::outbox::enqueue(&mut tx, &app.email_job("run-1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    app.smtp.wait_for(1).await;
    let client = reqwest::Client::new();
    let text = eventually("sent and published counted", || async {
        let resp = client
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .ok()?;
        let text = resp.text().await.ok()?;
        (sample(&text, "mailroom_sent_total") == Some(1.0)).then_some(text)
    })
    .await;
    assert_eq!(sample(&text, "mailroom_relay_published_total"), Some(1.0));
    assert_eq!(sample(&text, "mailroom_relay_lag_seconds"), Some(0.0));
    assert_eq!(
        sample(&text, "mailroom_end_to_end_seconds_count"),
        Some(1.0)
    );
    terminate(&run).await;
}

async fn dlq_get(api: &Api, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = api.client.get(format!("{}{path}", api.base));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn dlq_post(api: &Api, path: &str, body: Value, token: Option<&str>) -> (u16, Value) {
    let mut req = api.client.post(format!("{}{path}", api.base)).json(&body);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test]
async fn dead_letters_are_listed_and_replayed_over_http_only_with_the_token() {
    // The first attempt is refused for good (550): the job is dead-lettered as `rejected`.
    let app = TestApp::spawn_with(&["--fail", "RCPT:550:1"]).await;
    let worker = app.start_worker(&[]);
    let api = Api::start(&app).await;
    app.publish(&app.job("d-1")).await;
    app.wait_for_row("d-1", "welcome", "dead", |n| n.status.as_str() == "dead")
        .await;

    let (code, _) = dlq_get(&api, "/v1/dlq", None).await;
    assert_eq!(code, 401);
    let (code, _) = dlq_get(&api, "/v1/dlq", Some("wrong")).await;
    assert_eq!(code, 401);
    let listed = eventually("the dead letter listed", || async {
        let (code, list) = dlq_get(&api, "/v1/dlq", Some(TOKEN)).await;
        assert_eq!(code, 200, "{list}");
        (list.as_array().unwrap().len() == 1).then_some(list)
    })
    .await;
    assert_eq!(listed[0]["job_id"], "d-1");
    assert_eq!(listed[0]["class"], "rejected");
    assert_eq!(listed[0]["recipient"], "a***@example.com");
    let (_, none) = dlq_get(&api, "/v1/dlq?class=invalid&since=1h", Some(TOKEN)).await;
    assert_eq!(none, json!([]));
    let (_, summary) = dlq_get(&api, "/v1/dlq?summary=true", Some(TOKEN)).await;
    assert_eq!(summary["by_kind"]["welcome"], 1);
    let (code, shown) = dlq_get(&api, "/v1/dlq/d-1", Some(TOKEN)).await;
    assert_eq!(code, 200);
    assert_eq!(shown[0]["notification"]["status"], "dead");
    let (code, _) = dlq_get(&api, "/v1/dlq/nope", Some(TOKEN)).await;
    assert_eq!(code, 404);

    let select = json!({ "ids": ["d-1"] });
    let (code, _) = dlq_post(&api, "/v1/dlq/replay", select.clone(), None).await;
    assert_eq!(code, 401);
    let (code, err) = dlq_post(&api, "/v1/dlq/replay", json!({}), Some(TOKEN)).await;
    assert_eq!(code, 400, "{err}");
    let dry = json!({ "ids": ["d-1"], "dry_run": true });
    let (code, previews) = dlq_post(&api, "/v1/dlq/replay", dry, Some(TOKEN)).await;
    assert_eq!(code, 200, "{previews}");
    assert_eq!(previews[0]["subject"], "Welcome to Acme Cloud, Ada!");
    assert_eq!(previews[0]["status"], "dead");
    assert_eq!(app.smtp.received().len(), 0, "a dry run sends nothing");

    let (code, report) = dlq_post(&api, "/v1/dlq/replay", select, Some(TOKEN)).await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["moved"], 1);
    app.smtp.wait_for(1).await;
    assert_eq!(app.smtp.count(&app.message_id("d-1", "welcome")), 1);
    let (_, left) = dlq_get(&api, "/v1/dlq", Some(TOKEN)).await;
    assert_eq!(left, json!([]));
    // A body without a JSON content type, as `curl -d` sends it, is read all the same.
    let resp = api
        .client
        .post(format!("{}/v1/dlq/purge", api.base))
        .bearer_auth(TOKEN)
        .body(r#"{"all": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let report: Value = resp.json().await.unwrap();
    assert_eq!(report["purged"], 0);
    worker.stop().await;
}
