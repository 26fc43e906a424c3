//! Hostile input, end to end through the worker's own pure steps (decode and validate,
//! render, build the MIME message), with proptest: never a panic, never an injected header,
//! never a script in the HTML part, and a clear error whenever something is refused. Then the
//! secrets: a sentinel password in every URL must never reach a log line, stdout or stderr,
//! not even when every connection fails.

use std::path::Path;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use lettre::message::Mailbox;
use mailroom::job::EmailJob;
use mailroom::render::Templates;
use proptest::prelude::*;
use serde_json::json;

use crate::helpers::*;

fn templates() -> &'static Templates {
    static T: OnceLock<Templates> = OnceLock::new();
    T.get_or_init(|| {
        Templates::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("templates")).unwrap()
    })
}

const INJECTIONS: [&str; 6] = [
    "\r\nBcc: evil@evil.example",
    "\nBcc: evil@evil.example",
    "\rBcc: evil@evil.example",
    "\r\nX-Evil: injected",
    "\u{85}X-Evil: injected",
    "\r\n\r\n<script>alert(1)</script>",
];

/// Text weighted towards what breaks headers and HTML.
fn hostile() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        any::<String>(),
        proptest::sample::select(INJECTIONS.to_vec()).prop_map(str::to_string),
        Just("<script>alert(1)</script>".to_string()),
        Just("\"><img src=x onerror=alert(1)>".to_string()),
        Just("=?utf-8?q?X-Evil=3A_1?=".to_string()),
        Just("ada@example.com".to_string()),
    ];
    proptest::collection::vec(piece, 1..4).prop_map(|v| v.concat())
}

/// Where the hostile text goes in an otherwise valid job.
fn place(field: usize, text: &str) -> serde_json::Value {
    let mut job = json!({
        "job_id": "hostile", "kind": "welcome",
        "to": ["Ada <ada@example.com>"],
        "data": {
            "product_name": "Acme", "user": { "name": "Ada" },
            "getting_started_url": "https://acme.example/start",
            "support_email": "support@acme.example"
        }
    });
    match field {
        0 => job["to"] = json!([format!("{text} <ada@example.com>")]),
        1 => job["to"] = json!([text]),
        2 => job["cc"] = json!([format!("\"{text}\" <cc@example.com>")]),
        3 => job["reply_to"] = json!(text),
        4 => job["data"]["user"]["name"] = json!(text),
        5 => job["data"]["product_name"] = json!(text),
        6 => job["headers"] = json!({ "X-Campaign": text }),
        7 => job["headers"] = json!({ text: "1" }),
        8 => job["job_id"] = json!(text),
        _ => job["locale"] = json!(text),
    }
    job
}

/// The header block of a formatted message, as lines.
fn header_lines(formatted: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(formatted);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.split("\r\n").map(str::to_string).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_decode_to_a_job_or_a_clear_error(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Err(e) = EmailJob::decode(&body) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn hostile_text_in_any_field_never_injects_a_header_or_a_script(field in 0usize..10, text in hostile()) {
        let body = place(field, &text).to_string();
        let job = match EmailJob::decode(body.as_bytes()) {
            Ok(job) => job,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let rendered = match templates().render(&job.job.kind, job.job.locale.as_deref(), &job.job.data) {
            Ok(r) => r,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        prop_assert!(!rendered.html.to_ascii_lowercase().contains("<script"), "script in the HTML part");
        prop_assert!(!rendered.html.contains("<img src=x"), "markup in the HTML part");
        let from: Mailbox = "Shop <noreply@shop.example>".parse().unwrap();
        let message = match mailroom::smtp::build_message(&from, "shop.example", &job, &rendered) {
            Ok(m) => m,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let lines = header_lines(&message.formatted());
        for line in &lines {
            let lower = line.to_ascii_lowercase();
            prop_assert!(!lower.starts_with("bcc:"), "Bcc header: {:?}", line);
            prop_assert!(!lower.starts_with("x-evil:"), "injected header: {:?}", line);
            prop_assert!(!line.contains('\r') && !line.contains('\n'));
        }
        let recipients: Vec<String> = message.envelope().to().iter().map(|a| a.to_string()).collect();
        prop_assert!(
            recipients.iter().all(|r| !r.contains("evil.example")),
            "envelope {:?}", recipients
        );
    }
}

const SENTINEL: &str = "S3ntinel-Pa55word-x9";

/// Runs `mailroom <args>` with `env` for `run_for`, then kills it; returns stdout + stderr.
async fn run_and_capture(args: &[&str], env: &[(&str, &str)], run_for: Duration) -> String {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("SMTP_URL")
        .envs(env.iter().copied())
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    if tokio::time::timeout(run_for, child.wait()).await.is_err() {
        child.start_kill().unwrap();
    }
    let out = child.wait_with_output().await.unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn a_sentinel_password_never_appears_in_any_output_even_when_connections_fail() {
    let app = TestApp::spawn().await;
    let closed = ClosedPort::new();
    let unreachable = closed.port();
    let mut db_wrong_password = url::Url::parse(&app.db_url).unwrap();
    db_wrong_password.set_password(Some(SENTINEL)).unwrap();
    let mut amqp_wrong_password = url::Url::parse(&app.amqp_url).unwrap();
    amqp_wrong_password.set_password(Some(SENTINEL)).unwrap();
    let db_down = format!("postgres://mailroom:{SENTINEL}@127.0.0.1:{unreachable}/mailroom");
    let amqp_down = format!("amqp://guest:{SENTINEL}@127.0.0.1:{unreachable}/%2f");
    let smtp_down = format!("smtp://user:{SENTINEL}@127.0.0.1:{unreachable}");
    let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    let templates = templates.to_str().unwrap();
    let ns = app.namespace.as_str();
    let common = [
        ("MAILROOM_FROM", "Shop <noreply@shop.example>"),
        ("MAILROOM_TEMPLATES", templates),
        ("MAILROOM_NAMESPACE", ns),
        ("MAILROOM_RETRY_DELAYS", TEST_RETRY_DELAYS),
    ];
    let short = Duration::from_secs(4);
    type Case<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, String)>);
    let cases: Vec<Case> = vec![
        (
            "worker, everything unreachable",
            vec!["worker"],
            vec![
                ("DATABASE_URL", db_down.clone()),
                ("AMQP_URL", amqp_down.clone()),
                ("SMTP_URL", smtp_down.clone()),
            ],
        ),
        (
            "worker, wrong passwords on live services",
            vec!["worker"],
            vec![
                ("DATABASE_URL", db_wrong_password.to_string()),
                ("AMQP_URL", amqp_wrong_password.to_string()),
                ("SMTP_URL", smtp_down.clone()),
            ],
        ),
        (
            "worker, SMTP down under a live broker and database",
            vec!["worker"],
            vec![
                ("DATABASE_URL", app.db_url.clone()),
                ("AMQP_URL", app.amqp_url.clone()),
                ("SMTP_URL", smtp_down.clone()),
            ],
        ),
        (
            "relay, unreachable",
            vec!["relay"],
            vec![
                ("DATABASE_URL", db_down.clone()),
                ("AMQP_URL", amqp_down.clone()),
            ],
        ),
        (
            "relay, wrong passwords",
            vec!["relay"],
            vec![
                ("DATABASE_URL", db_wrong_password.to_string()),
                ("AMQP_URL", amqp_wrong_password.to_string()),
            ],
        ),
        (
            "migrate",
            vec!["migrate"],
            vec![("DATABASE_URL", db_wrong_password.to_string())],
        ),
        (
            "status",
            vec!["status", "some-job", "welcome"],
            vec![("DATABASE_URL", db_down.clone())],
        ),
        (
            "enqueue",
            vec!["enqueue", "--kind", "welcome", "--to", "ada@example.com"],
            vec![("DATABASE_URL", db_wrong_password.to_string())],
        ),
        (
            "dlq list",
            vec!["dlq", "list"],
            vec![("AMQP_URL", amqp_wrong_password.to_string())],
        ),
        (
            "worker --help",
            vec!["worker", "--help"],
            vec![
                ("DATABASE_URL", db_down.clone()),
                ("AMQP_URL", amqp_down.clone()),
                ("SMTP_URL", smtp_down.clone()),
            ],
        ),
    ];
    // The text format and the JSON one each get the whole list.
    for format in ["text", "json"] {
        for (what, args, urls) in &cases {
            let mut env: Vec<(&str, &str)> = common.to_vec();
            env.push(("MAILROOM_LOG_FORMAT", format));
            env.extend(urls.iter().map(|(k, v)| (*k, v.as_str())));
            if what.contains("SMTP down") {
                // A job for the worker with a live broker, so its SMTP failures get logged.
                app.publish(&app.job(&format!("sentinel-{format}"))).await;
            }
            let run_for = if what.contains("SMTP down") {
                Duration::from_secs(10)
            } else {
                short
            };
            let output = run_and_capture(args, &env, run_for).await;
            if format == "text" && what.starts_with("worker") && !what.contains("help") {
                // The failing connections were logged: the test looked at real error lines.
                assert!(
                    output.to_lowercase().contains("error") || output.contains("WARN"),
                    "{what} ({format}): no error logged:\n{}",
                    output
                        .lines()
                        .filter(|l| !l.contains("DEBUG"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
            assert!(
                !output.contains(SENTINEL),
                "{what} ({format}) printed the password:\n{output}"
            );
        }
    }
}
