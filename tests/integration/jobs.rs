//! Every job findable, with its timeline (`mailroom::jobs`, `GET /v1/jobs`), on the engine of
//! `MAILROOM_TEST_ENGINE`: attempts with their SMTP replies in order, a dead job, the recipient
//! search's case rules (claimed jobs and jobs still in the outbox), a 200-byte CJK id, and
//! paging that returns each job once.

use std::collections::BTreeSet;

use mailroom::jobs::{self, Search, Timeline};
use serde_json::{Value, json};

use crate::helpers::*;

async fn timeline(app: &TestApp, job_id: &str) -> Timeline {
    jobs::timeline(&app.db, job_id, "welcome", true)
        .await
        .unwrap()
        .expect("the job has a timeline")
}

fn attempts(t: &Timeline) -> Vec<&jobs::Event> {
    t.events.iter().filter(|e| e.event == "attempt").collect()
}

async fn found(app: &TestApp, search: Search) -> Vec<String> {
    let page = jobs::search(&app.db, &search).await.unwrap();
    page.jobs.into_iter().map(|j| j.job_id).collect()
}

#[tokio::test]
async fn a_job_that_failed_twice_then_was_sent_shows_three_attempts_with_their_replies_in_order() {
    failed_twice_then_sent(&[]).await;
}

#[tokio::test]
async fn the_attempts_are_the_same_when_each_ledger_write_goes_alone() {
    failed_twice_then_sent(&["--ledger-group", "1"]).await;
}

/// A job whose first two DATA commands get 451, through a worker started with `worker_args`.
async fn failed_twice_then_sent(worker_args: &[&str]) {
    let app = TestApp::spawn_with(&["--fail", "DATA:451:2"]).await;
    let worker = app.start_worker(worker_args);
    app.publish(&app.job("timeline-flaky")).await;
    app.wait_for_row("timeline-flaky", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    worker.stop().await;

    let t = timeline(&app, "timeline-flaky").await;
    assert_eq!(t.status.state, "sent");
    let tried = attempts(&t);
    assert_eq!(tried.len(), 3, "{:#?}", t.events);
    let numbers: Vec<_> = tried.iter().map(|e| e.attempt).collect();
    assert_eq!(numbers, [Some(1), Some(2), Some(3)]);
    let outcomes: Vec<_> = tried.iter().map(|e| e.outcome.as_deref()).collect();
    assert_eq!(outcomes, [Some("failed"), Some("failed"), Some("sent")]);
    for failed in &tried[..2] {
        let said = format!("{:?} {:?}", failed.smtp_reply, failed.error);
        assert!(said.contains("451"), "{failed:?}");
        assert!(failed.claimed_at.is_some() && failed.at >= failed.claimed_at);
    }
    assert!(tried[2].smtp_reply.as_deref().unwrap().starts_with("250"));
    assert!(tried[0].at <= tried[1].at && tried[1].at <= tried[2].at);
    // Published straight to the broker: created at its first claim, never published by us.
    let names: Vec<_> = t.events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names.first(), Some(&"created"));
    assert_eq!(names.last(), Some(&"sent"));
    assert!(!names.contains(&"published"), "{names:?}");
}

#[tokio::test]
async fn a_dead_job_shows_dead_with_its_class_and_reason() {
    let app = TestApp::spawn_with(&["--fail", "RCPT:550"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("timeline-dead")).await;
    app.dead_letters(1).await;
    worker.stop().await;

    let t = timeline(&app, "timeline-dead").await;
    assert_eq!(t.status.state, "dead");
    let last = t.events.last().unwrap();
    assert_eq!(last.event, "dead", "{:#?}", t.events);
    assert_eq!(last.class.as_deref(), Some("rejected"));
    assert!(last.error.as_deref().unwrap().contains("550"));
    let tried = attempts(&t);
    assert_eq!(tried.len(), 1);
    assert_eq!(tried[0].outcome.as_deref(), Some("dead"));
    let dead = found(
        &app,
        Search {
            state: Some("dead".into()),
            ..Search::default()
        },
    )
    .await;
    assert_eq!(dead, ["timeline-dead"]);
}

#[tokio::test]
async fn the_recipient_search_ignores_the_domains_case_and_not_the_local_parts() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&[]);
    let mut job = app.job("recipient-1");
    job["to"] = json!(["Ada Lovelace <Ada.Lovelace@Example.COM>"]);
    app.publish(&job).await;
    app.wait_for_row("recipient-1", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    worker.stop().await;

    let by = |recipient: &str| Search {
        recipient: Some(recipient.into()),
        reveal: true,
        ..Search::default()
    };
    assert_eq!(
        found(&app, by("Ada.Lovelace@example.com")).await,
        ["recipient-1"]
    );
    assert_eq!(
        found(&app, by("Ada.Lovelace@EXAMPLE.com")).await,
        ["recipient-1"]
    );
    assert!(found(&app, by("ada.lovelace@example.com")).await.is_empty());
    assert!(found(&app, by("Ada.Lovelace@example.org")).await.is_empty());
    // An internationalised domain is one domain in either of its forms and any case.
    let worker = app.start_worker(&[]);
    let mut job = app.job("recipient-idn");
    job["to"] = json!(["jm@Müller.de"]);
    app.publish(&job).await;
    app.wait_for_row("recipient-idn", "welcome", "row sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    worker.stop().await;
    for spelling in ["jm@müller.de", "jm@MÜLLER.DE", "jm@xn--mller-kva.de"] {
        assert_eq!(
            found(&app, by(spelling)).await,
            ["recipient-idn"],
            "{spelling}"
        );
    }
    let page = jobs::search(&app.db, &Search::default()).await.unwrap();
    let masked = |id: &str| {
        let job = page.jobs.iter().find(|j| j.job_id == id).unwrap();
        job.recipient.clone()
    };
    assert_eq!(masked("recipient-1").as_deref(), Some("A***@example.com"));
    assert_eq!(masked("recipient-idn").as_deref(), Some("j***@müller.de"));
}

#[tokio::test]
async fn a_job_no_worker_claimed_yet_is_found_by_recipient_pending_published_or_written_in_sql() {
    let app = TestApp::spawn().await;
    let mut pending = app.email_job("outbox-pending");
    pending.to = vec!["Ada Lovelace <Ada.Lovelace@Example.COM>".into()];
    app.enqueue(&pending).await.unwrap();
    let mut published = app.email_job("outbox-published");
    published.to = vec![
        "Ada.Lovelace@EXAMPLE.com".into(),
        "other@example.com".into(),
    ];
    app.enqueue(&published).await.unwrap();
    app.execute(
        "UPDATE mailroom_outbox SET published_at = created_at WHERE job_id = 'outbox-published'",
    )
    .await;
    // A producer in another language writes the row itself.
    app.execute(
        r#"INSERT INTO mailroom_outbox (job_id, kind, payload) VALUES ('outbox-sql', 'welcome',
           '{"job_id": "outbox-sql", "kind": "welcome", "to": ["Ada.Lovelace@example.com"]}')"#,
    )
    .await;
    app.enqueue(&app.email_job("outbox-someone-else"))
        .await
        .unwrap();

    let by = |recipient: &str| Search {
        recipient: Some(recipient.into()),
        ..Search::default()
    };
    let mut ids = found(&app, by("Ada.Lovelace@example.com")).await;
    ids.sort();
    assert_eq!(ids, ["outbox-pending", "outbox-published", "outbox-sql"]);
    assert!(found(&app, by("ada.lovelace@example.com")).await.is_empty());
    let page = jobs::search(&app.db, &by("Ada.Lovelace@example.com"))
        .await
        .unwrap();
    let states: BTreeSet<_> = page.jobs.iter().map(|j| j.state.as_str()).collect();
    assert_eq!(states, BTreeSet::from(["pending", "published"]));
    assert!(
        page.jobs
            .iter()
            .all(|j| j.recipient.as_deref() == Some("A***@example.com"))
    );
}

#[tokio::test]
async fn a_job_with_a_200_byte_cjk_id_is_found_by_its_id_and_by_a_prefix() {
    let app = TestApp::spawn().await;
    let id = format!("{}ab", "注".repeat(66));
    assert_eq!(id.len(), 200);
    let worker = app.start_worker(&[]);
    app.publish(&app.job(&id)).await;
    app.wait_for_row(&id, "welcome", "row sent", |n| n.status.as_str() == "sent")
        .await;
    worker.stop().await;

    let exact = Search {
        job_id: Some(id.clone()),
        ..Search::default()
    };
    assert_eq!(found(&app, exact).await, vec![id.clone()]);
    let prefix = format!("{}*", "注".repeat(30));
    let by_prefix = Search {
        job_id: Some(prefix),
        ..Search::default()
    };
    assert_eq!(found(&app, by_prefix).await, vec![id.clone()]);
    let other = Search {
        job_id: Some(format!("{}*", "注".repeat(67))),
        ..Search::default()
    };
    assert!(found(&app, other).await.is_empty());
    assert_eq!(attempts(&timeline(&app, &id).await).len(), 1);
}

#[tokio::test]
async fn paging_returns_every_job_once_newest_first_even_with_equal_times() {
    let app = TestApp::spawn().await;
    let mut tx = app.begin().await;
    for i in 0..5 {
        tx.enqueue(&app.email_job(&format!("page-same-{i}")))
            .await
            .unwrap();
    }
    tx.commit().await;
    for i in 0..4 {
        app.enqueue(&app.email_job(&format!("page-{i}")))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let search = Search {
            limit: Some(2),
            cursor: cursor.take(),
            ..Search::default()
        };
        let page = jobs::search(&app.db, &search).await.unwrap();
        assert!(page.jobs.len() <= 2);
        seen.extend(
            page.jobs
                .iter()
                .map(|j| (j.created_at, j.job_id.clone(), j.state.clone())),
        );
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let ids: BTreeSet<_> = seen.iter().map(|(_, id, _)| id.clone()).collect();
    assert_eq!((seen.len(), ids.len()), (9, 9), "{seen:#?}");
    assert!(
        seen.windows(2).all(|w| w[0].0 >= w[1].0),
        "newest first: {seen:#?}"
    );
    assert!(seen.iter().all(|(_, _, state)| state == "pending"));
    let pending = Search {
        state: Some("pending".into()),
        job_id: Some("page-same-*".into()),
        ..Search::default()
    };
    assert_eq!(found(&app, pending).await.len(), 5);
}

#[tokio::test]
async fn the_http_api_pages_jobs_shows_a_timeline_and_refuses_a_bad_filter_naming_it() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    for i in 0..3 {
        app.enqueue(&app.email_job(&format!("http-job-{i}")))
            .await
            .unwrap();
    }
    let get = |path: String| {
        api.client
            .get(format!("{}{path}", api.base))
            .bearer_auth(TOKEN)
            .send()
    };
    let first: Value = get("/v1/jobs?limit=2&job_id=http-job-*".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(first["jobs"].as_array().unwrap().len(), 2, "{first}");
    let cursor = first["next_cursor"].as_str().unwrap();
    let second: Value = get(format!(
        "/v1/jobs?limit=2&job_id=http-job-*&cursor={cursor}"
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(second["jobs"].as_array().unwrap().len(), 1, "{second}");
    assert!(second["next_cursor"].is_null());

    let resp = get("/v1/jobs?state=lost".into()).await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let problem: Value = resp.json().await.unwrap();
    assert_eq!(problem["field"], "state", "{problem}");
    let resp = get("/v1/jobs?colour=red".into()).await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);

    let t: Value = get("/v1/jobs/http-job-0/welcome/timeline".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(t["state"], "queued", "{t}");
    assert_eq!(t["events"][0]["event"], "created", "{t}");
    let resp = get("/v1/jobs/nope/welcome/timeline".into()).await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
}

#[tokio::test]
async fn the_cli_searches_and_shows_a_job_in_text_and_json() {
    let app = TestApp::spawn().await;
    app.enqueue(&app.email_job("cli-job-1")).await.unwrap();
    let text = app.cli(&["jobs", "search", "--job-id", "cli-job-*"]).await;
    assert!(
        text.contains("cli-job-1") && text.contains("pending"),
        "{text}"
    );
    let json: Value = serde_json::from_str(
        &app.cli(&["jobs", "search", "--state", "pending", "--json"])
            .await,
    )
    .unwrap();
    assert_eq!(json["jobs"][0]["job_id"], "cli-job-1", "{json}");
    let shown = app.cli(&["jobs", "show", "cli-job-1", "welcome"]).await;
    assert!(shown.contains("created"), "{shown}");
    let refused = app.cli_output(&["jobs", "search", "--state", "lost"]).await;
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("`state`"), "{}", refused.stderr);
}
