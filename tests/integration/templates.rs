//! `mailroom templates check | preview`, run as the built binary the way CI and template authors
//! run it: the shipped set passes; a missing variable or a syntax error fails with file and line.

use std::path::Path;

use crate::helpers::*;

/// A copy of the shipped templates with `file` (relative) rewritten by `edit`.
fn broken_copy(file: &str, edit: impl FnOnce(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&shipped(), dir.path());
    let path = dir.path().join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(text)).unwrap();
    dir
}

/// Replaces line `n` (1-based) of `text`.
fn with_line(text: String, n: usize, line: &str) -> String {
    let mut lines: Vec<&str> = text.lines().collect();
    lines[n - 1] = line;
    lines.join("\n") + "\n"
}

async fn check(dir: &Path) -> CliOutput {
    run_cli(
        &["templates", "check", "--templates", dir.to_str().unwrap()],
        &[],
    )
    .await
}

#[tokio::test]
async fn check_passes_on_the_shipped_templates() {
    let out = check(&shipped()).await;
    assert!(out.status.success(), "{}", out.stderr);
    for kind in ["order_confirmation", "password_reset", "welcome"] {
        assert!(
            out.stdout.contains(&format!("ok  {kind}")),
            "{}",
            out.stdout
        );
    }
    assert!(out.stdout.contains("revision"), "{}", out.stdout);
}

#[tokio::test]
async fn check_names_the_file_and_line_of_a_missing_variable() {
    let dir = broken_copy("welcome/text.hbs", |t| {
        with_line(t, 3, "Your plan: {{plan.name}}")
    });
    let out = check(dir.path()).await;
    assert!(!out.status.success());
    let err = out.stderr;
    assert!(err.contains("text.hbs line 3"), "{err}");
    assert!(err.contains("plan.name"), "{err}");
    let last = err.trim().lines().last().unwrap();
    assert!(last.starts_with("error: templates check failed: "), "{err}");
    assert!(
        last.contains("welcome/") && last.contains("text.hbs line 3"),
        "{err}"
    );
}

#[tokio::test]
async fn check_names_the_file_and_line_of_a_syntax_error() {
    let dir = broken_copy("order_confirmation/subject.hbs", |t| {
        format!("{}\n{{{{#if order}}}}unclosed\n", t.trim_end())
    });
    let out = check(dir.path()).await;
    assert!(!out.status.success());
    assert!(out.stderr.contains("subject.hbs"), "{}", out.stderr);
    assert!(out.stderr.contains("line"), "{}", out.stderr);
}

#[tokio::test]
async fn preview_as_eml_carries_the_deterministic_message_id_and_both_parts() {
    let templates = shipped();
    let args = [
        "templates",
        "preview",
        "welcome",
        "--format",
        "eml",
        "--templates",
        templates.to_str().unwrap(),
        "--from",
        "Shop <noreply@shop.example>",
        "--job-id",
        "user-7-welcome",
    ];
    let out = run_cli(&args, &[]).await;
    assert!(out.status.success(), "{}", out.stderr);
    let eml = out.stdout;
    assert!(
        eml.contains("Message-ID: <user-7-welcome.welcome@shop.example>"),
        "{eml}"
    );
    assert!(
        eml.contains("Subject: Welcome to Acme Cloud, Ada!"),
        "{eml}"
    );
    assert!(eml.contains("multipart/alternative"), "{eml}");
    assert!(
        eml.contains("text/plain") && eml.contains("text/html"),
        "{eml}"
    );

    let fr = [
        "templates",
        "preview",
        "welcome",
        "--locale",
        "fr",
        "--templates",
    ];
    let out = run_cli(&[&fr[..], &[templates.to_str().unwrap()]].concat(), &[]).await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.starts_with("Subject: "), "{}", out.stdout);
}
