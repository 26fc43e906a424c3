//! The whole `/metrics` output of a real `mailroom run`, after a job went through, checked by a
//! real parser (`promtool check metrics`: the text format, and its lint rules: help texts,
//! `_total` counters, units), and the names the shipped dashboard (deploy/grafana/mailroom.json)
//! and alerts (deploy/prometheus/alerts.yml) use checked against it, so they cannot drift.
//!
//! promtool comes with Debian's `prometheus` package; .ci/run installs it when missing.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use crate::helpers::*;

/// Starts `mailroom run`, sends one job through it, and returns its `/metrics` text once the
/// job is counted.
async fn scrape_after_one_job(app: &TestApp) -> (tokio::process::Child, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let run = app.spawn_run_process(&["--http-addr", &addr]);
    app.enqueue(&app.email_job("expo-1")).await.unwrap();
    app.smtp.wait_for(1).await;
    let text = eventually("the job counted and the queues read", || async {
        let text = scrape_metrics(&addr).await?;
        let counted = text.contains("mailroom_sent_total{kind=\"welcome\"} 1\n");
        (counted && text.contains("mailroom_queue_messages{")).then_some(text)
    })
    .await;
    (run, text)
}

/// Runs `promtool check metrics` on `text`; its complaints when it has any.
async fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`; .ci/run installs it)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// Every series name `text` can hold: each family of a `# TYPE` line, with a histogram's
/// `_bucket`, `_sum` and `_count`.
fn exposed_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        names.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Every `mailroom_…` and `process_…` name in a file's text.
fn names_used(text: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut used = BTreeSet::new();
    for prefix in ["mailroom_", "process_"] {
        for (at, _) in text.match_indices(prefix) {
            if text[..at].chars().next_back().is_some_and(word) {
                continue;
            }
            let end = text[at..].find(|c| !word(c)).map_or(text.len(), |n| at + n);
            used.insert(text[at..end].to_string());
        }
    }
    used
}

#[tokio::test]
async fn the_whole_metrics_output_passes_promtool_and_has_every_name_the_dashboard_and_alerts_use()
{
    let app = TestApp::spawn().await;
    let (run, text) = scrape_after_one_job(&app).await;
    terminate(&run).await;

    if let Err(complaints) = promtool_check(&text).await {
        panic!("promtool check metrics:\n{complaints}\nin\n{text}");
    }
    let exposed = exposed_names(&text);
    for family in [
        "mailroom_build_info",
        "process_cpu_seconds_total",
        "mailroom_smtp_circuit_open",
    ] {
        assert!(exposed.contains(family), "{family} in\n{text}");
    }
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    for file in ["grafana/mailroom.json", "prometheus/alerts.yml"] {
        let used = names_used(&std::fs::read_to_string(deploy.join(file)).unwrap());
        assert!(used.len() >= 5, "{file} uses {used:?}");
        let missing: Vec<_> = used.difference(&exposed).collect();
        assert!(
            missing.is_empty(),
            "{file} uses {missing:?}, not in\n{text}"
        );
    }
}

#[test]
fn names_are_found_whole_and_only_at_a_word_start() {
    let used =
        names_used(r#"rate(mailroom_sent_total{kind="a"}[5m]) / x_mailroom_no + process_open_fds"#);
    let want: BTreeSet<String> = ["mailroom_sent_total", "process_open_fds"]
        .map(String::from)
        .into();
    assert_eq!(used, want);
    let exposed = exposed_names("# TYPE h_seconds histogram\n# TYPE c_total counter\n");
    assert!(
        exposed.contains("h_seconds_bucket") && exposed.contains("c_total"),
        "{exposed:?}"
    );
}
