//! Live template editing under a running worker: a broken edit is rejected while sending goes
//! on with the last good set; a good edit is used by the next email and its revision is recorded
//! and shown by `status` and the HTTP API.

use std::path::Path;
use std::sync::atomic::Ordering;

use serde_json::Value;

use crate::helpers::*;

fn live_worker_args(dir: &Path) -> Vec<String> {
    vec![
        "--templates".into(),
        dir.to_str().unwrap().into(),
        "--template-reload-interval".into(),
        "100ms".into(),
    ]
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
