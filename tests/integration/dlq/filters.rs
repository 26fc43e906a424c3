//! The class filter, the same through both doors: `mailroom dlq list | replay | purge --class`
//! and `/v1/dlq?class=` / `POST /v1/dlq/purge {"class": …}` take exactly the classes mailroom
//! writes, and refuse any other with the list of them.

use mailroom::dlq::Class;
use serde_json::{Value, json};

use super::{Letter, job_of_kind, letter, listed, publish_dead};
use crate::helpers::*;

/// Two `template` dead letters around a `rejected` one.
fn mixed(app: &TestApp) -> Vec<Letter> {
    vec![
        letter(&app.job("t-1"), "template", "missing variable"),
        letter(&app.job("r-1"), "rejected", "550"),
        letter(
            &job_of_kind(app, "t-2", "password_reset"),
            "template",
            "missing variable",
        ),
    ]
}

fn assert_lists_every_class(text: &str) {
    for class in Class::ALL {
        assert!(text.contains(class.as_str()), "{class} missing: {text}");
    }
}

#[tokio::test]
async fn purge_by_class_removes_exactly_that_class() {
    let app = TestApp::spawn().await;
    publish_dead(&app, &mixed(&app)).await;

    let out = app
        .cli_output(&["dlq", "purge", "--class", "template", "--yes", "--json"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["purged"], 2, "{report}");
    assert_eq!(report["examined"], 2, "only the selected rows: {report}");
    assert_eq!(listed(&app).await, ["r-1"]);
}

#[tokio::test]
async fn an_unknown_class_is_refused_with_the_classes_and_touches_nothing() {
    let app = TestApp::spawn().await;
    publish_dead(&app, &mixed(&app)).await;

    for command in [
        &["dlq", "list", "--class", "bogus"][..],
        &["dlq", "replay", "--class", "bogus"],
        &["dlq", "purge", "--class", "bogus", "--yes"],
    ] {
        let out = app.cli_output(command).await;
        assert_eq!(out.status.code(), Some(2), "{command:?}: {}", out.stderr);
        assert!(out.stderr.contains("'bogus'"), "{}", out.stderr);
        assert_lists_every_class(&out.stderr);
    }
    let out = app
        .cli_output(&["dlq", "list", "--class", "template"])
        .await;
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        out.stdout.lines().count(),
        3,
        "a header and two: {}",
        out.stdout
    );
    assert_eq!(listed(&app).await, ["t-1", "r-1", "t-2"]);
}

#[tokio::test]
async fn the_http_api_takes_the_same_classes_and_refuses_others_with_a_400() {
    let app = TestApp::spawn().await;
    publish_dead(&app, &mixed(&app)).await;
    let api = Api::start(&app).await;
    let get = |query: &'static str| {
        let req = api.client.get(format!("{}/v1/dlq?{query}", api.base));
        async move {
            let resp = req.bearer_auth(TOKEN).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let purge = |body: Value| {
        let req = api.client.post(format!("{}/v1/dlq/purge", api.base));
        async move {
            let resp = req.bearer_auth(TOKEN).json(&body).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };

    let (code, refused) = get("class=bogus").await;
    assert_eq!(code, 400, "{refused}");
    assert_eq!(refused["field"], "class");
    assert_lists_every_class(refused["error"].as_str().unwrap());
    let (code, refused) = purge(json!({ "class": "bogus" })).await;
    assert_eq!(code, 400, "{refused}");
    assert_lists_every_class(refused["error"].as_str().unwrap());
    assert_eq!(listed(&app).await, ["t-1", "r-1", "t-2"], "nothing purged");

    let (code, templates) = get("class=template").await;
    assert_eq!(code, 200);
    assert_eq!(
        templates["letters"].as_array().unwrap().len(),
        2,
        "{templates}"
    );
    let (code, report) = purge(json!({ "class": "rejected" })).await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["purged"], 1);
    assert_eq!(listed(&app).await, ["t-1", "t-2"]);
}
