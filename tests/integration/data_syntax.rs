//! `--data`, one syntax on every command that takes it (`enqueue`, `publish`, `templates
//! preview`), as curl reads `-d`: inline JSON, `@path`, or `@-` for standard input; the bare
//! path `preview` took before still works, with a note.

use std::process::Stdio;

use mailroom::db::Engine;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::helpers::*;

/// The welcome sample's data with the user named `name`.
fn data_named(app: &TestApp, name: &str) -> Value {
    let mut data = app.job("-")["data"].clone();
    data["user"]["name"] = name.into();
    data
}

/// Runs `mailroom <args>` against `app`'s world with `input` on standard input.
async fn with_stdin(app: &TestApp, args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .args(args)
        .env_remove("MAILROOM_TEMPLATES")
        .env("DATABASE_URL", &app.db_url)
        .env("AMQP_URL", &app.amqp_url)
        .env("MAILROOM_NAMESPACE", &app.namespace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// How many outbox rows of `job_id` carry a user named `name` in their data.
async fn rows_named(app: &TestApp, job_id: &str, name: &str) -> i64 {
    let field = match engine() {
        Engine::Postgres => "payload->'data'->'user'->>'name'".to_owned(),
        Engine::MySql => "JSON_UNQUOTE(JSON_EXTRACT(payload, '$.data.user.name'))".to_owned(),
    };
    app.count(&format!(
        "SELECT count(*) FROM mailroom_outbox WHERE job_id = '{job_id}' AND {field} = '{name}'"
    ))
    .await
}

#[tokio::test]
async fn enqueue_takes_data_inline_from_a_file_and_from_standard_input() {
    let app = TestApp::spawn().await;
    let enqueue = |id: &'static str, data: String| {
        let args = [
            "enqueue",
            "--kind",
            "welcome",
            "--to",
            "ada@example.com",
            "--job-id",
            id,
        ];
        let mut args: Vec<String> = args.map(String::from).to_vec();
        args.extend(["--data".into(), data]);
        args
    };

    let inline = enqueue("inline", data_named(&app, "Inline").to_string());
    let inline: Vec<&str> = inline.iter().map(String::as_str).collect();
    app.cli(&inline).await;
    let file = app.dir.path().join("data.json");
    std::fs::write(&file, data_named(&app, "Filed").to_string()).unwrap();
    let filed = enqueue("filed", format!("@{}", file.display()));
    let filed: Vec<&str> = filed.iter().map(String::as_str).collect();
    app.cli(&filed).await;
    let piped = enqueue("piped", "@-".into());
    let piped: Vec<&str> = piped.iter().map(String::as_str).collect();
    let (ok, _, stderr) = with_stdin(&app, &piped, &data_named(&app, "Piped").to_string()).await;
    assert!(ok, "{stderr}");

    assert_eq!(rows_named(&app, "inline", "Inline").await, 1);
    assert_eq!(rows_named(&app, "filed", "Filed").await, 1);
    assert_eq!(rows_named(&app, "piped", "Piped").await, 1);
}

#[tokio::test]
async fn data_that_is_neither_json_nor_a_file_is_a_usage_error_that_says_how() {
    let app = TestApp::spawn().await;
    let out = app
        .cli_output(&[
            "enqueue",
            "--kind",
            "welcome",
            "--to",
            "ada@example.com",
            "--data",
            "data.json",
        ])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("@path"), "{}", out.stderr);
    let out = app
        .cli_output(&[
            "publish",
            "--kind",
            "welcome",
            "--to",
            "ada@example.com",
            "--data",
            "@/nonexistent.json",
        ])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("reading /nonexistent.json"),
        "{}",
        out.stderr
    );
    assert_eq!(app.unpublished().await, 0, "nothing was written");
    assert_eq!(app.ready_messages().await, 0, "nothing was published");
}

#[tokio::test]
async fn preview_takes_data_as_enqueue_does_and_still_reads_a_bare_path() {
    let app = TestApp::spawn().await;
    let templates = shipped();
    let preview = [
        "templates",
        "preview",
        "welcome",
        "--templates",
        templates.to_str().unwrap(),
        "--data",
    ];
    let subject = |stdout: &str, name: &str| {
        let want = format!("Subject: Welcome to Acme Cloud, {name}!");
        assert!(stdout.starts_with(&want), "{stdout}");
    };

    let inline = data_named(&app, "Inline").to_string();
    let out = run_cli(&[&preview[..], &[&inline]].concat(), &[]).await;
    assert!(out.status.success(), "{}", out.stderr);
    subject(&out.stdout, "Inline");

    let file = app.dir.path().join("data.json");
    std::fs::write(&file, data_named(&app, "Filed").to_string()).unwrap();
    let at = format!("@{}", file.display());
    let out = run_cli(&[&preview[..], &[&at]].concat(), &[]).await;
    assert!(out.status.success(), "{}", out.stderr);
    subject(&out.stdout, "Filed");
    assert!(out.stderr.is_empty(), "{}", out.stderr);

    let bare = file.display().to_string();
    let out = run_cli(&[&preview[..], &[&bare]].concat(), &[]).await;
    assert!(out.status.success(), "{}", out.stderr);
    subject(&out.stdout, "Filed");
    assert!(
        out.stderr.contains(&format!("write --data @{bare}")),
        "{}",
        out.stderr
    );

    let piped = data_named(&app, "Piped").to_string();
    let (ok, stdout, stderr) = with_stdin(&app, &[&preview[..], &["@-"]].concat(), &piped).await;
    assert!(ok, "{stderr}");
    subject(&stdout, "Piped");
}
