//! One validation at every door (issue 12, part 4): what the HTTP API, the CLI, the Rust API
//! and the relay let in is exactly what the worker accepts, measured on the bytes the worker
//! reads; what gets past them anyway (raw SQL, a direct publish) ends `dead`/`invalid` in the
//! ledger with a dead letter, so `status` tells the truth. Emails are counted at the SMTP
//! server.

use mailroom::db::outbox;
use mailroom::job::{EmailJob, MAX_JOB_BYTES};
use serde_json::{Value, json};

use crate::helpers::*;

/// Posts `body` as it is, with an optional Idempotency-Key; returns status, content type, JSON.
async fn post_raw(api: &Api, key: Option<&str>, body: Vec<u8>) -> (u16, String, Value) {
    let mut req = api
        .client
        .post(format!("{}/v1/emails", api.base))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let resp = req.send().await.unwrap();
    let code = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    (
        code,
        ctype,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// A welcome job whose data carries `pad` extra bytes in a string.
fn padded(app: &TestApp, job_id: &str, pad: usize) -> Value {
    let mut job = app.job(job_id);
    job["data"]["padding"] = json!("x".repeat(pad));
    job
}

fn assert_problem(code: u16, ctype: &str, body: &Value, status: u16, field: Option<&str>) {
    assert_eq!(code, status, "{body}");
    assert_eq!(ctype, "application/problem+json");
    assert_eq!(body["status"], status);
    assert!(body["type"].as_str().unwrap().starts_with("tag:mailroom"));
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    if let Some(field) = field {
        assert_eq!(body["field"], field, "{body}");
    }
}

#[tokio::test]
async fn enqueue_and_publish_of_an_unknown_kind_exit_non_zero_naming_the_field() {
    let app = TestApp::spawn().await;
    for command in ["enqueue", "publish"] {
        let out = app
            .cli_output(&[command, "--kind", "no_such_kind", "--to", "ada@example.com"])
            .await;
        assert!(!out.status.success(), "{command}: {out:?}");
        // The error on one line, printed once.
        let lines: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        assert_eq!(lines.len(), 1, "{}", out.stderr);
        let line = lines[0];
        assert!(
            line.contains("`kind`") && line.contains("no_such_kind"),
            "{line}"
        );
    }
    assert_eq!(app.unpublished().await, 0, "nothing was written");
    assert_eq!(app.ready_messages().await, 0, "nothing was published");
}

#[tokio::test]
async fn a_200_kb_job_is_refused_by_http_and_by_the_cli_naming_data() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let big = padded(&app, "big-1", 200 * 1024);
    let (code, ctype, body) = post_raw(&api, None, big.to_string().into_bytes()).await;
    assert_problem(code, &ctype, &body, 413, None);

    let file = app.dir.path().join("big.json");
    std::fs::write(&file, big["data"].to_string()).unwrap();
    let data = format!("@{}", file.display());
    let out = app
        .cli_output(&[
            "enqueue",
            "--kind",
            "welcome",
            "--to",
            "ada@example.com",
            "--data",
            &data,
        ])
        .await;
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("`data`") && out.stderr.contains("65536"),
        "{}",
        out.stderr
    );
    assert_eq!(app.unpublished().await, 0, "nothing was written");
}

#[tokio::test]
async fn the_http_body_limit_is_the_job_limit_and_the_published_size_is_what_counts() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    // Padded with spaces to exactly the limit: read, and small once serialised.
    let mut body = app.job("at-limit").to_string().into_bytes();
    body.resize(MAX_JOB_BYTES, b' ');
    let (code, _, answer) = post_raw(&api, None, body.clone()).await;
    assert_eq!(code, 202, "{answer}");
    body.push(b' ');
    let (code, ctype, answer) = post_raw(&api, None, body).await;
    assert_problem(code, &ctype, &answer, 413, None);

    // A compact body under the limit whose published form (defaults written) is over it.
    let compact = app.job("over").to_string().len();
    let over = padded(&app, "over", MAX_JOB_BYTES - compact - 40);
    let raw = over.to_string().into_bytes();
    assert!(raw.len() <= MAX_JOB_BYTES);
    let (code, ctype, answer) = post_raw(&api, None, raw).await;
    assert_problem(code, &ctype, &answer, 422, Some("data"));
    assert_eq!(app.count("SELECT count(*) FROM mailroom_outbox").await, 1);
}

#[tokio::test]
async fn a_job_exactly_at_the_limit_passes_every_door_and_is_sent_once() {
    let app = TestApp::spawn().await;
    let mut value = padded(&app, "exact", 0);
    // Numbers a database re-spells: the published bytes must not change size.
    value["data"]["numbers"] = json!([1e2, 1.50, 1e19, -0.0, 0.1, 123456789.123]);
    let job: EmailJob = serde_json::from_value(value.clone()).unwrap();
    let base = outbox::admit_for_outbox(&job, None).unwrap().body.len();
    value["data"]["padding"] = json!("x".repeat(MAX_JOB_BYTES - base));
    let job: EmailJob = serde_json::from_value(value).unwrap();
    assert_eq!(
        outbox::admit_for_outbox(&job, None).unwrap().body.len(),
        MAX_JOB_BYTES
    );
    app.enqueue(&job).await.unwrap();
    app.deliver_through_outbox("exact", "welcome").await;
    assert_eq!(app.smtp.received().len(), 1);

    let mut over = job.clone();
    over.job_id = "exact-plus-one".into();
    over.data["padding"] = json!("x".repeat(MAX_JOB_BYTES - base + 1));
    let err = app.enqueue(&over).await.unwrap_err();
    assert!(err.to_string().contains("`data`"), "{err}");
}

/// Inserts an outbox row as a producer writing raw SQL would.
async fn insert_raw(app: &TestApp, job_id: &str, kind: &str, payload: &Value) {
    let text = payload.to_string().replace('\'', "''");
    app.execute(&format!(
        "INSERT INTO mailroom_outbox (job_id, kind, payload) VALUES ('{job_id}', '{kind}', '{text}')"
    ))
    .await;
}

#[tokio::test]
async fn raw_sql_rows_that_fail_validation_end_dead_and_invalid_and_nothing_is_sent() {
    let app = TestApp::spawn().await;
    let mut unknown = app.job("raw-kind");
    unknown["kind"] = json!("no_such_kind");
    insert_raw(&app, "raw-kind", "no_such_kind", &unknown).await;
    insert_raw(
        &app,
        "raw-big",
        "welcome",
        &padded(&app, "raw-big", 200 * 1024),
    )
    .await;
    let mut bad = app.job("raw-address");
    bad["to"] = json!(["not an address"]);
    insert_raw(&app, "raw-address", "welcome", &bad).await;
    insert_raw(&app, "raw-good", "welcome", &app.job("raw-good")).await;

    let worker = app.start_worker(&[]);
    let relay = app.start_relay(&[]);
    for (id, kind, why) in [
        ("raw-kind", "no_such_kind", "unknown kind"),
        ("raw-big", "welcome", "65536"),
        ("raw-address", "welcome", "to[0]"),
    ] {
        let row = app
            .wait_for_row(id, kind, "refused row recorded dead", |n| {
                n.status.as_str() == "dead"
            })
            .await;
        assert!(row.last_error.as_deref().unwrap().contains(why), "{row:?}");
        let status = app.cli(&["status", id, kind]).await;
        assert!(status.contains(": dead"), "{status}");
    }
    app.wait_for_row("raw-good", "welcome", "valid row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    let letters = app.dead_letters(3).await;
    assert!(
        letters
            .iter()
            .all(|l| l.header("x-mailroom-error-class").as_deref() == Some("invalid"))
    );
    relay.stop().await;
    worker.stop().await;
    assert_eq!(app.smtp.received().len(), 1, "only the valid row was sent");
    assert_eq!(invalid_rows(&app).await, 3);
}

/// Rows with a `dead`/`invalid` ledger row.
async fn invalid_rows(app: &TestApp) -> i64 {
    app.count(
        "SELECT count(*) FROM sent_notifications WHERE status = 'dead' AND error_class = 'invalid'",
    )
    .await
}

#[tokio::test]
async fn a_refused_copy_of_a_sent_job_leaves_its_row_sent() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("sent-1")).await;
    app.wait_for_row("sent-1", "welcome", "sent", |n| n.status.as_str() == "sent")
        .await;
    let mut copy = app.job("sent-1");
    copy["to"] = json!(["not an address"]);
    app.publish(&copy).await;
    app.dead_letters(1).await;
    worker.stop().await;
    let row = app.notification("sent-1", "welcome").await.unwrap();
    assert_eq!(row.status.as_str(), "sent");
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn a_batch_past_the_byte_bound_is_cut_and_every_row_still_published_and_sent() {
    let app = TestApp::spawn().await;
    for i in 0..6 {
        let job: EmailJob =
            serde_json::from_value(padded(&app, &format!("heavy-{i}"), 20_000)).unwrap();
        app.enqueue(&job).await.unwrap();
    }
    let relay = app.start_relay(&["--relay-batch-bytes", "50000"]);
    eventually("all published", || async {
        (app.unpublished().await == 0).then_some(())
    })
    .await;
    let cut = relay.stats.cut.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        cut >= 2,
        "6 rows of 20 KB in batches of 50 KB were cut {cut} times"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM mailroom_outbox WHERE publish_attempts <> 1")
            .await,
        0,
        "each row counts the one publish that sent it, not the cuts that put it off"
    );
    let worker = app.start_worker(&[]);
    app.smtp.wait_for(6).await;
    worker.stop().await;
    relay.stop().await;
    assert_eq!(app.smtp.received().len(), 6);
}

#[tokio::test]
async fn an_idempotency_key_reused_with_another_body_is_422_and_a_disagreeing_job_id_is_400() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let mut body = app.job("ignored");
    body.as_object_mut().unwrap().remove("job_id");
    body.as_object_mut().unwrap().remove("created_at");
    let (code, _, first) = post_raw(&api, Some("idem-1"), body.to_string().into_bytes()).await;
    assert_eq!(code, 202, "{first}");

    // The same job spelled otherwise (spacing, key order, explicit defaults) is a retry.
    let mut same = serde_json::to_string_pretty(&body).unwrap();
    same = same.replacen('{', r#"{ "cc": [], "headers": {},"#, 1);
    let (code, _, again) = post_raw(&api, Some("idem-1"), same.into_bytes()).await;
    assert_eq!(code, 202, "{again}");
    assert_eq!(again["duplicate"], true);

    let mut other = body.clone();
    other["data"]["user"]["name"] = json!("Grace");
    let (code, ctype, problem) =
        post_raw(&api, Some("idem-1"), other.to_string().into_bytes()).await;
    assert_problem(code, &ctype, &problem, 422, Some("Idempotency-Key"));

    let mut named = body.clone();
    named["job_id"] = json!("something-else");
    let (code, ctype, problem) =
        post_raw(&api, Some("idem-2"), named.to_string().into_bytes()).await;
    assert_problem(code, &ctype, &problem, 400, Some("Idempotency-Key"));
    assert_eq!(app.count("SELECT count(*) FROM mailroom_outbox").await, 1);
}
