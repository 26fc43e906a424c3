//! `/metrics` with real jobs: the counters move as jobs are sent, retried and dead-lettered (by
//! kind, a made-up kind counted as `other`), the relay's lag and backlog show a waiting row, the
//! queue depths come from the broker, and the real `worker --metrics-addr` and `run` processes
//! serve them (the worker also reloading its templates on SIGHUP).

use std::sync::Arc;

use mailroom::http::metrics::{Metrics, QueueDepths};

use crate::helpers::*;

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
    let urls = app.amqp_url.parse().unwrap();
    let metrics = Metrics {
        worker: Some(worker.stats.clone()),
        relay: Some(relay.stats.clone()),
        templates: Some(live.clone()),
        db: Some(app.db.clone()),
        queues: Some(Arc::new(QueueDepths::new(
            urls,
            app.topology.clone(),
            "test depths",
        ))),
    };
    let api = Api::start_with(&app, live.clone(), metrics).await;
    let text = scrape(&api).await;
    // Every template kind has its series before its first job.
    assert_eq!(
        sample(&text, "mailroom_sent_total{kind=\"welcome\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&text, "mailroom_relay_lag_seconds"), Some(0.0));
    assert_eq!(sample(&text, "mailroom_outbox_pending_rows"), Some(0.0));
    let revision = format!(
        "mailroom_template_info{{revision=\"{}\"}}",
        live.current().revision()
    );
    assert_eq!(sample(&text, &revision), Some(1.0));
    assert_eq!(sample(&text, "mailroom_smtp_circuit_open"), Some(0.0));

    // Through the outbox: the first attempt meets a 451, is retried, then sent.
    app.enqueue(&app.email_job("m-1")).await.unwrap();
    // Not JSON at all: dead-lettered as invalid.
    app.publish_raw("welcome", "m-bad", b"not json").await;
    // A kind no template has: counted as `other`, never under the name the publisher chose.
    let mut made_up = app.job("m-made-up");
    made_up["kind"] = "made-up-kind-7f3a".into();
    app.publish(&made_up).await;
    worker
        .stats
        .wait_until(|s| s.sent == 1 && s.dead_lettered == 2)
        .await;

    let text = scrape(&api).await;
    // The broker's at-least-once dead-lettering out of a retry tier may hand a retried job back
    // twice: the copy is counted as received and skipped, so those two counters are bounds.
    let at_least = [
        ("mailroom_received_total", 4.0),
        ("mailroom_retried_total{kind=\"welcome\"}", 1.0),
        // m-1: claim, record `failed`, claim, record `sent`; each in some group commit.
        ("mailroom_ledger_writes_total", 4.0),
        ("mailroom_ledger_groups_total", 1.0),
        // m-1 twice (a copy handed back twice would wait and claim a third time).
        ("mailroom_delivery_step_seconds_count{step=\"place\"}", 2.0),
        ("mailroom_delivery_step_seconds_count{step=\"claim\"}", 2.0),
    ];
    for (series, low) in at_least {
        let value = sample(&text, series).unwrap_or_else(|| panic!("{series} in\n{text}"));
        assert!(value >= low, "{series} = {value} in\n{text}");
    }
    let expect = [
        ("mailroom_sent_total{kind=\"welcome\"}", 1.0),
        (
            "mailroom_dead_lettered_total{kind=\"welcome\",class=\"invalid\"}",
            1.0,
        ),
        (
            "mailroom_dead_lettered_total{kind=\"other\",class=\"invalid\"}",
            1.0,
        ),
        ("mailroom_in_flight", 0.0),
        ("mailroom_smtp_waiting", 0.0),
        (
            "mailroom_smtp_duration_seconds_count{kind=\"welcome\"}",
            2.0,
        ),
        ("mailroom_end_to_end_seconds_count", 1.0),
        // Only m-1's two claims reach a connection, and record `failed`, then `sent`.
        (
            "mailroom_delivery_step_seconds_count{step=\"connection\"}",
            2.0,
        ),
        ("mailroom_delivery_step_seconds_count{step=\"record\"}", 2.0),
        ("mailroom_relay_published_total", 1.0),
        ("mailroom_relay_refused_total", 0.0),
        ("mailroom_relay_lag_seconds", 0.0),
        ("mailroom_template_reloads_total{result=\"failed\"}", 0.0),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    assert!(!text.contains("made-up-kind"), "{text}");
    // A claim and a record are commits: they take time, and every one fits the buckets (a
    // copy handed back twice claims a third time: the count, not a fixed 2).
    for step in ["claim", "record"] {
        let series = |part: &str| format!("mailroom_delivery_step_seconds_{part}");
        let sum = sample(&text, &format!("{}{{step=\"{step}\"}}", series("sum")));
        assert!(sum.is_some_and(|s| s > 0.0), "{step}: {sum:?} in\n{text}");
        let count = sample(&text, &format!("{}{{step=\"{step}\"}}", series("count")));
        let within = sample(
            &text,
            &format!("{}{{step=\"{step}\",le=\"180\"}}", series("bucket")),
        );
        assert!(count.is_some_and(|c| c >= 2.0), "{step}: {count:?}");
        assert_eq!(within, count, "{step} in\n{text}");
    }
    // The broker's counts: nothing waits, the worker consumes, two dead letters.
    assert_eq!(
        sample(&text, "mailroom_queue_messages{queue=\"work\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "mailroom_queue_consumers{queue=\"work\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "mailroom_queue_messages{queue=\"dead\"}"),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "mailroom_queue_messages{queue=\"retry\",tier=\"200ms\"}"
        ),
        Some(0.0)
    );
    relay.stop().await;

    // With the relay stopped, a row waiting for a minute shows as lag.
    app.enqueue(&app.email_job("m-2")).await.unwrap();
    app.execute(match engine() {
        mailroom::db::Engine::Postgres => {
            "UPDATE mailroom_outbox SET created_at = now() - interval '1 minute' WHERE job_id = 'm-2'"
        }
        mailroom::db::Engine::MySql => {
            "UPDATE mailroom_outbox SET created_at = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE WHERE job_id = 'm-2'"
        }
    })
    .await;
    let text = scrape(&api).await;
    let lag = sample(&text, "mailroom_relay_lag_seconds").unwrap();
    assert!((60.0..120.0).contains(&lag), "{lag}");
    assert_eq!(sample(&text, "mailroom_outbox_pending_rows"), Some(1.0));
    assert_eq!(sample(&text, "mailroom_outbox_parked_rows"), Some(0.0));
    worker.stop().await;
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
    let scrape = || scrape_metrics(&addr);
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
        let series = "mailroom_sent_total{kind=\"welcome\"}";
        (sample(&scrape().await?, series) == Some(1.0)).then_some(())
    })
    .await;
    terminate(&worker).await;
}

#[tokio::test]
async fn mailroom_run_reports_worker_and_relay_counters_on_its_http_metrics() {
    let app = TestApp::spawn().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let run = app.spawn_run_process(&["--http-addr", &addr]);
    app.enqueue(&app.email_job("run-1")).await.unwrap();
    app.smtp.wait_for(1).await;
    let text = eventually("sent and published counted", || async {
        let text = scrape_metrics(&addr).await?;
        (sample(&text, "mailroom_sent_total{kind=\"welcome\"}") == Some(1.0)).then_some(text)
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
