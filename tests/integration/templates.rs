//! `mailroom templates check | preview`, run as the built binary the way CI and template authors
//! run it: the shipped set passes; every missing variable and syntax error is reported, each
//! with its file, line and column; an unknown kind is refused with the kinds that exist.

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
async fn check_names_the_file_line_and_column_of_a_missing_variable() {
    let dir = broken_copy("welcome/text.hbs", |t| {
        with_line(t, 3, "Your plan: {{plan.name}}")
    });
    let out = check(dir.path()).await;
    assert!(!out.status.success());
    let err = out.stderr;
    let at = format!("{}:3:12: ", dir.path().join("welcome/text.hbs").display());
    let line = err.lines().find(|l| l.starts_with(&at));
    assert!(line.is_some_and(|l| l.contains("plan.name")), "{err}");
    let last = err.trim().lines().last().unwrap();
    assert!(
        last.starts_with("error: templates check failed: 1 error in 1 file"),
        "{err}"
    );
}

#[tokio::test]
async fn check_reports_every_broken_template_of_every_kind_and_exits_non_zero() {
    let dir = broken_copy("welcome/text.hbs", |t| {
        with_line(t, 3, "Your plan: {{plan.name}}")
    });
    let edit = |file: &str, edit: &dyn Fn(String) -> String| {
        let path = dir.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, edit(text)).unwrap();
    };
    edit("welcome/subject.fr.hbs", &|t| {
        format!("{} {{{{coupon}}}}", t.trim_end())
    });
    edit("password_reset/html.hbs", &|t| {
        format!("{t}{{{{#each x}}}}\n")
    });
    edit("order_confirmation/html.hbs", &|t| {
        format!("{t}<p>{{{{gift.note}}}}</p>\n")
    });
    let out = check(dir.path()).await;
    assert!(!out.status.success());
    let located = |file: &str| {
        let prefix = format!("{}:", dir.path().join(file).display());
        out.stderr
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .count()
    };
    for file in [
        "welcome/text.hbs",
        "welcome/subject.fr.hbs",
        "password_reset/html.hbs",
        "order_confirmation/html.hbs",
    ] {
        assert_eq!(located(file), 1, "{file}: {}", out.stderr);
    }
    assert!(out.stderr.contains("4 errors in 4 files"), "{}", out.stderr);
    assert!(
        out.stderr.contains("gift.note") && out.stderr.contains("coupon"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn an_unknown_kind_is_refused_with_the_kinds_that_exist() {
    let templates = shipped();
    let dir = templates.to_str().unwrap();
    let kinds = "order_confirmation, password_reset, welcome";
    let out = run_cli(
        &["templates", "check", "--templates", dir, "--kind", "nope"],
        &[],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains(&format!("\"nope\"; the kinds are: {kinds}")),
        "{}",
        out.stderr
    );
    let out = run_cli(&["templates", "preview", "nope", "--templates", dir], &[]).await;
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains(&format!("\"nope\"; the kinds are: {kinds}")),
        "{}",
        out.stderr
    );

    let out = run_cli(
        &[
            "templates",
            "check",
            "--templates",
            dir,
            "--kind",
            "welcome",
        ],
        &[],
    )
    .await;
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.starts_with("ok  welcome\n1 kind checked"),
        "{}",
        out.stdout
    );
}

#[tokio::test]
async fn check_names_the_file_line_and_column_of_a_syntax_error() {
    let dir = broken_copy("order_confirmation/subject.hbs", |t| {
        format!("{}\n{{{{#if order}}}}unclosed\n", t.trim_end())
    });
    let out = check(dir.path()).await;
    assert!(!out.status.success());
    let file = dir.path().join("order_confirmation/subject.hbs");
    // Line 2, at the end of the text, where the block should have been closed.
    let at = format!("{}:2:22: invalid handlebars syntax", file.display());
    assert!(out.stderr.contains(&at), "{}", out.stderr);
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
