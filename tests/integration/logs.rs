//! What the real binary logs, read back from its stderr: one flat JSON object per line with the
//! documented field names (docs/LOGGING.md), one line per delivery outcome, the uncertain
//! window's markers at DEBUG and only once the final dot goes out, an access log for the API,
//! span fields once in the text format, no colour off a terminal, and a second `migrate`
//! without PostgreSQL's notices.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Map, Value};
use tokio::process::{Child, Command};

use crate::helpers::*;

/// Starts `mailroom <command> <args>` with stderr into `log` (a file: not a terminal), in
/// `format`, with `rust_log` as its filter (`None`: the default) and colour not forbidden.
fn spawn(
    command: &str,
    args: &[String],
    log: &Path,
    format: &str,
    rust_log: Option<&str>,
) -> Child {
    let file = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailroom"));
    cmd.arg(command)
        .args(args)
        .env("MAILROOM_LOG_FORMAT", format)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env_remove("DATABASE_URL");
    if let Some(filter) = rust_log {
        cmd.env("RUST_LOG", filter);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .kill_on_drop(true)
        .spawn()
        .expect("start mailroom")
}

/// Stops a process with SIGTERM and returns what it logged.
async fn stop(mut child: Child, log: &Path) -> String {
    terminate(&child).await;
    child.wait().await.unwrap();
    std::fs::read_to_string(log).unwrap()
}

/// Waits until the log at `path` has a line containing every one of `needles`.
async fn wait_for_line(path: &Path, needles: &[&str]) {
    let what = format!("a log line with {needles:?}");
    eventually(&what, || async {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
            .then_some(())
    })
    .await;
}

/// Every line of a JSON log, parsed; a line that is not one JSON object fails the test.
fn json_lines(text: &str) -> Vec<Map<String, Value>> {
    text.lines()
        .map(|l| match serde_json::from_str(l) {
            Ok(Value::Object(map)) => map,
            _ => panic!("not one JSON object per line: {l}"),
        })
        .collect()
}

fn log_path(app: &TestApp, name: &str) -> PathBuf {
    app.dir.path().join(name)
}

#[tokio::test]
async fn json_logs_are_flat_with_one_outcome_line_per_delivery_and_an_access_log() {
    let app = TestApp::spawn().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = app.worker_args(&[]);
    args.extend(["--http-addr", &addr, "--relay-poll", "1s"].map(String::from));
    let log = log_path(&app, "run.log");
    let run = spawn("run", &args, &log, "json", None);
    let client = reqwest::Client::new();
    let base = format!("http://{addr}");
    eventually("the API answers", || async {
        let r = client.get(format!("{base}/healthz")).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    let job = app.job("logs-json-1");
    let response = client
        .post(format!("{base}/v1/emails?note=ada@example.com"))
        .json(&job)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    app.smtp.wait_for(1).await;
    wait_for_line(&log, &[r#""outcome":"sent""#]).await;
    let text = stop(run, &log).await;

    assert!(!text.contains('\x1b'), "colour in a log file:\n{text}");
    assert!(
        !text.contains("ada@example.com"),
        "an address in the log:\n{text}"
    );
    let lines = json_lines(&text);
    for line in &lines {
        let keys: Vec<&str> = line.keys().map(String::as_str).collect();
        for key in ["timestamp", "level", "target", "message"] {
            assert!(keys.contains(&key), "no `{key}` in {line:?}");
        }
        assert!(
            !keys.contains(&"spans") && !keys.contains(&"fields"),
            "{line:?}"
        );
    }
    let ours: Vec<_> = lines
        .iter()
        .filter(|l| l.get("job_id") == Some(&Value::from("logs-json-1")))
        .collect();
    let info: Vec<_> = ours.iter().filter(|l| l["level"] == "INFO").collect();
    assert_eq!(info.len(), 1, "one INFO line for the delivery: {ours:#?}");
    let sent = info[0];
    assert_eq!(sent["outcome"], "sent", "{sent:?}");
    assert_eq!(sent["kind"], "welcome");
    assert_eq!(sent["attempt"], 1);
    assert_eq!(sent["span"], "delivery");
    assert_eq!(sent["target"], "mailroom::worker::settle");
    assert!(
        sent["smtp_reply"].as_str().unwrap().starts_with("250"),
        "{sent:?}"
    );
    assert!(sent["smtp_ms"].as_f64().unwrap() > 0.0, "{sent:?}");
    assert!(
        sent["to"].as_str().unwrap().contains('*'),
        "masked: {sent:?}"
    );

    let access: Vec<_> = lines
        .iter()
        .filter(|l| l["target"] == "mailroom::http::access")
        .collect();
    let [post] = &access[..] else {
        panic!("one access line (the probes log at DEBUG): {access:#?}")
    };
    assert_eq!(post["method"], "POST");
    assert_eq!(post["path"], "/v1/emails", "no query string: {post:?}");
    assert_eq!(post["status"], 202);
    assert_eq!(post["level"], "INFO");
    assert!(post["duration_ms"].as_f64().is_some(), "{post:?}");
}

#[tokio::test]
async fn a_request_id_is_in_the_access_line_and_in_every_line_its_handler_writes() {
    let app = TestApp::spawn().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = app.worker_args(&[]);
    args.extend(["--http-addr", &addr].map(String::from));
    let log = log_path(&app, "request-id.log");
    let run = spawn(
        "run",
        &args,
        &log,
        "json",
        Some("info,mailroom::http=debug"),
    );
    let client = reqwest::Client::new();
    let base = format!("http://{addr}");
    eventually("the API answers", || async {
        let r = client.get(format!("{base}/healthz")).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    let response = client
        .post(format!("{base}/v1/emails"))
        .header("x-request-id", "req-log-1")
        .json(&app.job("logs-request-id"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    assert_eq!(response.headers()["x-request-id"], "req-log-1");
    let response = client
        .get(format!("{base}/v1/nowhere"))
        .send()
        .await
        .unwrap();
    let generated = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    wait_for_line(&log, &[r#""status":404"#]).await;
    let text = stop(run, &log).await;

    let lines = json_lines(&text);
    let of = |id: &str| -> Vec<_> {
        lines
            .iter()
            .filter(|l| l.get("request_id") == Some(&Value::from(id)))
            .collect()
    };
    let ours = of("req-log-1");
    let access: Vec<_> = ours
        .iter()
        .filter(|l| l["target"] == "mailroom::http::access")
        .collect();
    assert_eq!(access.len(), 1, "{ours:#?}");
    assert_eq!(access[0]["status"], 202);
    let handler: Vec<_> = ours
        .iter()
        .filter(|l| l["message"] == "job enqueued")
        .collect();
    assert_eq!(
        handler.len(),
        1,
        "the handler's line carries the id: {ours:#?}"
    );
    assert_eq!(handler[0]["span"], "request");
    assert_eq!(handler[0]["job_id"], "logs-request-id");
    let unknown = of(&generated);
    assert_eq!(unknown.len(), 1, "{text}");
    assert_eq!(unknown[0]["path"], "(no route)");
}

#[tokio::test]
async fn text_logs_name_each_span_field_once_and_open_the_window_at_the_final_dot() {
    let app = TestApp::spawn().await;
    let log = log_path(&app, "text.log");
    let filter = Some("info,mailroom::window=debug");
    let worker = spawn("worker", &app.worker_args(&[]), &log, "text", filter);
    app.publish(&app.job("logs-text-1")).await;
    app.smtp.wait_for(1).await;
    wait_for_line(&log, &["outcome=\"sent\""]).await;
    let text = stop(worker, &log).await;

    assert!(!text.contains('\x1b'), "colour in a log file:\n{text}");
    let sent = text
        .lines()
        .find(|l| l.contains("outcome=\"sent\""))
        .unwrap();
    assert_eq!(sent.matches("job_id=").count(), 1, "{sent}");
    assert_eq!(sent.matches("attempt=").count(), 1, "{sent}");
    assert!(
        sent.contains(r#"job_id="logs-text-1" kind="welcome""#),
        "{sent}"
    );
    let windows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("mailroom::window"))
        .map(|l| {
            l.split("window=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(windows, ["sending", "accepted", "closed"], "\n{text}");
    for l in text.lines().filter(|l| l.contains("mailroom::window")) {
        assert!(l.contains("DEBUG"), "window markers are DEBUG: {l}");
    }
}

#[tokio::test]
async fn a_refused_smtp_connection_opens_no_window_and_names_the_server() {
    let app = TestApp::spawn().await;
    let port = ClosedPort::new();
    let closed = format!("127.0.0.1:{}", port.port());
    let smtp = format!("smtp://{closed}");
    let log = log_path(&app, "refused.log");
    let filter = Some("info,mailroom::window=debug");
    let args = app.worker_args(&["--smtp-url", &smtp]);
    let worker = spawn("worker", &args, &log, "json", filter);
    app.publish(&app.job("logs-refused-1")).await;
    wait_for_line(&log, &[r#""outcome":"retry""#]).await;
    let text = stop(worker, &log).await;

    let lines = json_lines(&text);
    let retry = lines
        .iter()
        .find(|l| l.get("outcome") == Some(&Value::from("retry")))
        .unwrap();
    assert_eq!(retry["job_id"], "logs-refused-1");
    assert_eq!(retry["level"], "INFO");
    let reason = retry["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("SMTP server {closed}")),
        "{reason}"
    );
    assert!(retry["delay_ms"].as_u64().is_some(), "{retry:?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.get("window") == Some(&Value::from("sending"))),
        "a window opened without a final dot:\n{text}"
    );
}

#[tokio::test]
async fn a_second_migrate_prints_no_sqlx_notice_and_no_colour_into_a_pipe() {
    let app = TestApp::spawn().await; // its database is migrated once already
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .arg("migrate")
        .env("DATABASE_URL", &app.db_url)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("MAILROOM_LOG_FORMAT")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("sqlx"),
        "sqlx logged on a second migrate:\n{stderr}"
    );
    assert!(!stderr.contains("already exists"), "{stderr}");
    assert!(!out.stderr.contains(&0x1b), "colour into a pipe:\n{stderr}");
    assert!(stderr.contains("migrations applied"), "{stderr}");
}
