//! Reading the table: concurrent readers (the CLI and the HTTP API) see the same rows, a cursor
//! pages through every row once while new letters arrive, failure groups count right, the text
//! filter ignores case and takes `%` and `_` literally, and the reads need no broker at all.

use std::collections::BTreeSet;

use mailroom::dlq::{Cursor, Filter};
use serde_json::Value;

use super::{Letter, job_of_kind, letter, publish_dead, table};
use crate::helpers::*;

fn job_ids(page: &Value) -> BTreeSet<String> {
    page["letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["job_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn concurrent_readers_through_the_cli_and_the_http_api_see_the_same_rows() {
    let app = TestApp::spawn().await;
    let letters: Vec<Letter> = (0..5)
        .map(|i| letter(&app.job(&format!("seen-{i}")), "rejected", "550"))
        .collect();
    publish_dead(&app, &letters).await;
    let api = Api::start(&app).await;
    let http = || async {
        let resp = api
            .client
            .get(format!("{}/v1/dlq", api.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        resp.json::<Value>().await.unwrap()
    };
    let cli = || async {
        serde_json::from_str::<Value>(&app.cli(&["dlq", "list", "--json"]).await).unwrap()
    };
    let (a, b, c, d) = tokio::join!(http(), cli(), http(), cli());
    let all: BTreeSet<String> = (0..5).map(|i| format!("seen-{i}")).collect();
    for seen in [&a, &b, &c, &d] {
        assert_eq!(job_ids(seen), all, "{seen}");
    }
    assert_eq!(a["letters"], b["letters"], "one JSON shape for both doors");
    assert_eq!(app.dead_queue_length().await, 0);
}

#[tokio::test]
async fn a_cursor_pages_through_every_row_once_while_new_letters_arrive() {
    let app = TestApp::spawn().await;
    let batch = |from: usize, n: usize| -> Vec<Letter> {
        (from..from + n)
            .map(|i| letter(&app.job(&format!("page-{i:03}")), "rejected", "550"))
            .collect()
    };
    publish_dead(&app, &batch(0, 25)).await;
    let dlq = table(&app);
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None::<Cursor>, 0);
    loop {
        let page = dlq.list(&Filter::default(), cursor, 10).await.unwrap();
        seen.extend(page.letters.iter().map(|e| e.job_id.clone()));
        pages += 1;
        publish_dead(&app, &batch(100 + pages * 5, 5)).await;
        match page.next {
            Some(next) => cursor = Some(next.parse().unwrap()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..25).rev().map(|i| format!("page-{i:03}")).collect();
    assert_eq!(
        seen, expected,
        "each of the first 25 once, newest first, none of the later ones"
    );
    assert_eq!(pages, 3);
    let everything = dlq.list(&Filter::default(), None, 1000).await.unwrap();
    assert_eq!(everything.letters.len(), 40);
}

#[tokio::test]
async fn failure_groups_count_the_letters_of_one_class_and_normalised_reason() {
    let app = TestApp::spawn().await;
    let mut letters = Vec::new();
    for (i, who) in ["ada@example.com", "bob@example.org", "cy@example.net"]
        .iter()
        .enumerate()
    {
        let reason = format!("550 5.1.1 <{who}>: no such user (queue id 8f3a9c2e1{i})");
        letters.push(letter(&app.job(&format!("g-550-{i}")), "rejected", &reason));
    }
    for i in 0..2 {
        let job = job_of_kind(&app, &format!("g-tpl-{i}"), "password_reset");
        letters.push(letter(&job, "template", "variable \"user\" missing"));
    }
    letters.push(letter(
        &app.job("g-552"),
        "rejected",
        "552 5.2.2 mailbox full",
    ));
    publish_dead(&app, &letters).await;

    let out = app.cli(&["dlq", "groups", "--json"]).await;
    let groups: Vec<Value> = serde_json::from_str(&out).unwrap();
    let counts: Vec<(i64, &str)> = groups
        .iter()
        .map(|g| (g["count"].as_i64().unwrap(), g["class"].as_str().unwrap()))
        .collect();
    assert_eq!(counts, [(3, "rejected"), (2, "template"), (1, "rejected")]);
    assert_eq!(
        groups[0]["reason"],
        "550 5.1.1 <<address>>: no such user (queue id #)"
    );
    assert_eq!(
        groups[0]["first_seen"], groups[0]["last_seen"],
        "the same failed-at"
    );
    let group = groups[0]["group"].as_str().unwrap();
    let listed = app.cli(&["dlq", "list", "--json"]).await;
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let in_group = listed["letters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["group"] == group)
        .count();
    assert_eq!(in_group, 3);
    let human = app.cli(&["dlq", "groups", "--class", "template"]).await;
    assert_eq!(human.lines().count(), 2, "a header and one group: {human}");
}

#[tokio::test]
async fn the_text_filter_ignores_case_and_takes_percent_and_underscore_literally() {
    let app = TestApp::spawn().await;
    let mut bob = app.job("t-bob");
    bob["to"] = serde_json::json!(["Bob <Bob.Smith@Example.org>"]);
    publish_dead(
        &app,
        &[
            letter(&app.job("t-pct"), "rejected", "Quota 100% used"),
            letter(&app.job("t-plain"), "rejected", "quota 1000 used"),
            letter(&app.job("t-under"), "template", "user_name missing"),
            letter(&app.job("t-word"), "template", "username missing"),
            letter(&bob, "rejected", "550"),
        ],
    )
    .await;
    let find = |text: &'static str| {
        let app = &app;
        async move {
            let out = app.cli(&["dlq", "list", "--json", "--text", text]).await;
            let page: Value = serde_json::from_str(&out).unwrap();
            job_ids(&page).into_iter().collect::<Vec<_>>()
        }
    };
    assert_eq!(find("100%").await, ["t-pct"]);
    assert_eq!(find("QUOTA").await, ["t-pct", "t-plain"]);
    assert_eq!(find("user_name").await, ["t-under"]);
    assert_eq!(find("bob.smith@EXAMPLE").await, ["t-bob"]);
    assert_eq!(find("T-UNDER").await, ["t-under"], "the job id too");
}

#[tokio::test]
async fn the_reads_need_no_broker_and_work_with_it_unset_or_unreachable() {
    let app = TestApp::spawn().await;
    publish_dead(&app, &[letter(&app.job("no-broker"), "rejected", "550")]).await;
    let templates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    let port = ClosedPort::new();
    let closed = format!("amqp://guest:guest@127.0.0.1:{}/%2f", port.port());
    for amqp in [None, Some(closed.as_str())] {
        let mut env = vec![
            ("DATABASE_URL", app.db_url.as_str()),
            ("MAILROOM_TEMPLATES", templates.to_str().unwrap()),
        ];
        env.extend(amqp.map(|url| ("AMQP_URL", url)));
        for (command, shows) in [
            (&["dlq", "list", "--json"][..], "no-broker"),
            (&["dlq", "groups"], "rejected"),
            (&["dlq", "show", "no-broker"], "no-broker"),
            (&["dlq", "replay", "--all", "--dry-run"], "no-broker"),
        ] {
            let out = run_cli(command, &env).await;
            assert!(
                out.status.success(),
                "{command:?} with AMQP_URL {amqp:?}: {}",
                out.stderr
            );
            assert!(out.stdout.contains(shows), "{command:?}: {}", out.stdout);
        }
    }
}
