//! Acting on rows: a whole failure group replayed sends each job once; purge marks rows,
//! `--delete` deletes them, and the retention deletes replayed and purged rows past it while
//! every row still dead stays.

use serde_json::Value;

use super::{letter, listed, publish_dead};
use crate::helpers::*;

#[tokio::test]
async fn replaying_a_failure_group_sends_each_of_its_jobs_once() {
    let app = TestApp::spawn().await;
    let mut letters = Vec::new();
    for i in 0..3 {
        let reason = format!("550 5.1.1 <ada@example.com>: no such user (id 77aa00bb9{i})");
        letters.push(letter(&app.job(&format!("grp-{i}")), "rejected", &reason));
    }
    letters.push(letter(&app.job("other"), "rejected", "552 mailbox full"));
    publish_dead(&app, &letters).await;
    let groups: Vec<Value> =
        serde_json::from_str(&app.cli(&["dlq", "groups", "--json"]).await).unwrap();
    assert_eq!(groups[0]["count"], 3);
    let group = groups[0]["group"].as_str().unwrap();

    let out = app
        .cli_output(&["dlq", "replay", "--group", group, "--json", "--by", "ops"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        (report["examined"].as_i64(), report["moved"].as_i64()),
        (Some(3), Some(3))
    );
    let worker = app.start_worker(&[]);
    worker.stats.wait_until(|s| s.sent == 3).await;
    worker.stop().await;
    for i in 0..3 {
        let id = format!("grp-{i}");
        assert_eq!(app.smtp.count(&app.message_id(&id, "welcome")), 1, "{id}");
    }
    assert_eq!(app.smtp.received().len(), 3);
    assert_eq!(listed(&app).await, ["other"]);
    let replayed = app
        .cli(&["dlq", "list", "--state", "replayed", "--json"])
        .await;
    let replayed: Value = serde_json::from_str(&replayed).unwrap();
    for e in replayed["letters"].as_array().unwrap() {
        assert_eq!(e["replayed_by"], "ops");
        assert_eq!(e["replay_result"], "published");
        assert!(e["replayed_at"].is_string());
    }
}

#[tokio::test]
async fn purge_marks_delete_deletes_and_the_retention_keeps_every_dead_row() {
    let app = TestApp::spawn().await;
    let ids = ["r-dead", "r-marked", "r-deleted", "r-replayed"];
    let letters: Vec<_> = ids
        .iter()
        .map(|id| letter(&app.job(id), "rejected", "550"))
        .collect();
    publish_dead(&app, &letters).await;
    app.cli(&["dlq", "purge", "r-marked", "--yes"]).await;
    let out = app
        .cli(&["dlq", "purge", "r-deleted", "--yes", "--delete"])
        .await;
    assert!(out.contains("deleted 1"), "{out}");
    app.cli(&["dlq", "replay", "r-replayed"]).await;
    let all = || async {
        let out = app.cli(&["dlq", "list", "--state", "all", "--json"]).await;
        let page: Value = serde_json::from_str(&out).unwrap();
        let mut states: Vec<(String, String)> = page["letters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["job_id"].as_str().unwrap().into(),
                    e["state"].as_str().unwrap().into(),
                )
            })
            .collect();
        states.sort();
        states
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        all().await,
        [
            pair("r-dead", "dead"),
            pair("r-marked", "purged"),
            pair("r-replayed", "replayed")
        ]
    );

    let out = app.cli(&["dlq", "ingest"]).await;
    assert!(
        out.contains("deleted 0 past the retention"),
        "the default keeps them: {out}"
    );
    let out = app
        .cli(&["dlq", "ingest", "--dead-letter-retention", "0s"])
        .await;
    assert!(out.contains("deleted 2 past the retention"), "{out}");
    assert_eq!(
        all().await,
        [pair("r-dead", "dead")],
        "a dead row is kept whatever its age"
    );
}
