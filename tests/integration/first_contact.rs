//! What a newcomer meets first, run as the built binary: a failure is one plain line with its
//! fix, printed once, ending the process with the documented exit code (2 usage, 69 a
//! dependency unavailable, 78 configuration, 1 runtime); a database without the schema is
//! refused at startup; a session that keeps failing backs off.

use std::time::{Duration, Instant};

use clap::Parser as _;
use mailroom::cli::{Cli, Command};
use mailroom::db::Engine;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::helpers::*;

/// The lines of `stderr` that are mailroom's fatal report.
fn error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect()
}

/// `url` with its password or port replaced.
fn altered(url: &str, password: Option<&str>, port: Option<u16>) -> String {
    let mut url = url::Url::parse(url).unwrap();
    if let Some(p) = password {
        url.set_password(Some(p)).unwrap();
    }
    if port.is_some() {
        url.set_port(port).unwrap();
    }
    url.to_string()
}

/// The exit code of a run.
fn code(out: &CliOutput) -> i32 {
    out.status.code().expect("exited, not killed")
}

#[tokio::test]
async fn migrate_with_a_wrong_password_prints_one_plain_line_and_exits_78() {
    let app = TestApp::spawn().await;
    let url = altered(&app.db_url, Some("wrong-password"), None);
    let out = run_cli(&["migrate"], &[("DATABASE_URL", &url)]).await;
    assert_eq!(code(&out), 78, "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    let line = out.stderr.trim_end();
    assert!(
        line.starts_with("error: ")
            && line.contains("refused the login for user mailroom")
            && line.contains("check DATABASE_URL's user and password"),
        "{line}"
    );
    // No colour off a terminal, no line numbers of PostgreSQL's C source.
    assert!(!line.contains('\x1b'), "{line:?}");
    assert!(!line.contains(" at line "), "{line}");
}

#[tokio::test]
async fn a_closed_database_port_is_named_as_refused_at_once_and_exits_69() {
    let app = TestApp::spawn().await;
    let closed = ClosedPort::new();
    let port = closed.port();
    let url = altered(&app.db_url, None, Some(port));
    for args in [&["migrate"][..], &["status", "some-job"]] {
        let started = Instant::now();
        let out = run_cli(args, &[("DATABASE_URL", &url)]).await;
        assert_eq!(code(&out), 69, "{args:?}: {}", out.stderr);
        let lines = error_lines(&out.stderr);
        assert_eq!(lines.len(), 1, "{}", out.stderr);
        assert!(
            lines[0].contains(&format!("127.0.0.1:{port}: connection refused")),
            "{}",
            lines[0]
        );
        // Not the pool's 10 s acquire timeout.
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?}");
    }
}

#[tokio::test]
async fn a_wrong_amqp_password_is_one_line_naming_the_user_and_exits_78() {
    let app = TestApp::spawn().await;
    let url = altered(&app.amqp_url, Some("wrong-password"), None);
    let out = run_cli(
        &["publish", "--kind", "welcome", "--to", "ada@example.com"],
        &[("AMQP_URL", &url)],
    )
    .await;
    assert_eq!(code(&out), 78, "{}", out.stderr);
    // One line in all: not even lapin's own report of the refusal before it.
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    let lines = error_lines(&out.stderr);
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].ends_with("refused the login for user guest: check AMQP_URL's user and password"),
        "{}",
        lines[0]
    );
    assert!(!lines[0].contains("ACCESS_REFUSED"), "{}", lines[0]);
}

/// The environment of a long-running process against `app`, its database at `db_url`.
fn process_env(app: &TestApp) -> Vec<(&'static str, String)> {
    let templates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    vec![
        ("DATABASE_URL", app.db_url.clone()),
        ("AMQP_URL", app.amqp_url.clone()),
        ("MAILROOM_NAMESPACE", app.namespace.clone()),
        (
            "MAILROOM_TEMPLATES",
            templates.to_str().unwrap().to_string(),
        ),
        ("MAILROOM_FROM", "Shop <noreply@shop.example>".to_string()),
        ("SMTP_URL", app.smtp.url()),
        ("MAILROOM_HTTP_ADDR", "127.0.0.1:0".to_string()),
    ]
}

/// Runs `mailroom <command>` against `app`, which must end by itself.
async fn run_process(app: &TestApp, command: &str) -> CliOutput {
    let env = process_env(app);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    tokio::time::timeout(PATIENCE, run_cli(&[command], &env))
        .await
        .unwrap_or_else(|_| panic!("mailroom {command} refuses at startup instead of running"))
}

#[tokio::test]
async fn every_process_and_status_refuse_a_database_without_the_schema_naming_migrate() {
    let app = TestApp::spawn().await;
    app.execute("DROP TABLE _sqlx_migrations").await;
    for command in ["relay", "worker", "serve", "run"] {
        let out = run_process(&app, command).await;
        assert_eq!(code(&out), 69, "{command}: {}", out.stderr);
        let lines = error_lines(&out.stderr);
        assert_eq!(lines.len(), 1, "{command}: {}", out.stderr);
        assert!(
            lines[0].contains("has no mailroom schema: run `mailroom migrate`"),
            "{command}: {}",
            lines[0]
        );
    }
    let status = app.cli_output(&["status", "some-job"]).await;
    assert_eq!(code(&status), 69, "{}", status.stderr);
    assert!(
        status.stderr.contains("run `mailroom migrate`"),
        "{}",
        status.stderr
    );
}

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused_by_processes_and_migrate_with_78() {
    let app = TestApp::spawn().await;
    let checksum = match engine() {
        Engine::Postgres => "decode('00', 'hex')",
        Engine::MySql => "X'00'",
    };
    app.execute(&format!(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'from the future', TRUE, {checksum}, 1)"
    ))
    .await;
    let out = run_process(&app, "relay").await;
    assert_eq!(code(&out), 78, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("migrated by a newer mailroom (migrations 99990101000000"),
        "{}",
        out.stderr
    );
    let out = app.cli_output(&["migrate"]).await;
    assert_eq!(code(&out), 78, "{}", out.stderr);
    assert!(out.stderr.contains("newer mailroom"), "{}", out.stderr);
}

#[tokio::test]
async fn a_relay_whose_sessions_keep_failing_backs_off_instead_of_reconnecting_at_once() {
    let app = TestApp::spawn().await;
    // Every session connects, then fails at its first scan of the outbox.
    let drop = match engine() {
        Engine::Postgres => "DROP TABLE mailroom_outbox CASCADE",
        Engine::MySql => "DROP TABLE mailroom_outbox",
    };
    app.execute(drop).await;
    let started = Instant::now();
    let relay = app.start_relay(&[]);
    let sessions = |n: u64| {
        relay
            .stats
            .sessions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= n
    };
    eventually("five failing sessions", || async {
        sessions(5).then_some(())
    })
    .await;
    // Four waits between five sessions, doubling from 200 ms: at least 3 s. A backoff reset
    // by every connect would wait 200–400 ms each time, under 1.6 s in all.
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(3), "five sessions in {took:?}");
    relay.stop().await;
}

#[tokio::test]
async fn a_worker_waiting_for_a_broker_that_is_down_never_says_a_session_ended() {
    let app = TestApp::spawn().await;
    let closed = ClosedPort::new();
    let down = altered(&app.amqp_url, None, Some(closed.port()));
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .arg("worker")
        .args(app.worker_args(&["--amqp-url", &down]))
        .env_remove("DATABASE_URL")
        .env("MAILROOM_LOG_FORMAT", "json")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start mailroom worker");
    let stderr = worker.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let waiting = "cannot start a broker session; retrying";
    while seen
        .iter()
        .filter(|l: &&String| l.contains(waiting))
        .count()
        < 3
    {
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("the worker keeps logging its attempts")
            .unwrap()
            .expect("the worker keeps running while the broker is down");
        seen.push(line);
    }
    terminate(&worker).await;
    let all = seen.join("\n");
    assert!(!all.contains("session ended"), "{all}");
    assert!(all.contains("connection refused"), "{all}");
}

// A frozen node (SIGSTOP) accepts TCP connections in its kernel and never answers: the next
// node of the list must be tried once the handshake has had its time.
#[tokio::test]
async fn a_node_that_accepts_connections_but_never_answers_is_passed_over_for_the_next() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let frozen = altered(&amqp_url(), None, Some(port));
    let urls: mailroom::config::UrlList = format!("{frozen},{}", amqp_url()).parse().unwrap();
    let started = Instant::now();
    let conn = tokio::time::timeout(
        mailroom::broker::CONNECT_TIMEOUT + PATIENCE,
        mailroom::broker::connect(&urls, "first_contact test"),
    )
    .await
    .expect("connect gives up on the silent node")
    .expect("and connects to the next one");
    assert!(conn.status().connected());
    let took = started.elapsed();
    assert!(
        took >= mailroom::broker::CONNECT_STAGGER,
        "the silent node had its head start: {took:?}"
    );
    // The next node was tried beside the silent one, not after the silent one's whole timeout
    // (a reconnect after a node froze waited that long).
    assert!(
        took < mailroom::broker::CONNECT_TIMEOUT,
        "the next node waited for the silent one's timeout: {took:?}"
    );
    holding.abort();
}

// A node that answers only after another one won (a slow node, a handshake stuck behind a
// frozen peer) completes a connection nobody holds: it must be closed, not left open on the
// node for as long as the process lives.
#[tokio::test]
async fn a_node_that_answers_after_another_won_has_its_connection_closed() {
    let slow = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = slow.local_addr().unwrap().port();
    let broker = url::Url::parse(&amqp_url()).unwrap();
    let broker = format!(
        "{}:{}",
        broker.host_str().unwrap(),
        broker.port().unwrap_or(5672)
    );
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    // Holds the client until released, then passes the bytes both ways until mailroom's side
    // ends (closed, or reset while the broker still talks); answers how many bytes each way.
    let proxy = tokio::spawn(async move {
        let (client, _) = slow.accept().await.unwrap();
        released.await.unwrap();
        let node = tokio::net::TcpStream::connect(&broker).await.unwrap();
        let (client_in, client_out) = client.into_split();
        let (node_in, node_out) = node.into_split();
        let down = tokio::spawn(pipe(node_in, client_out));
        let up = pipe(client_in, node_out).await;
        (up, down.await.unwrap())
    });
    let late = altered(&amqp_url(), None, Some(port));
    let urls: mailroom::config::UrlList = format!("{late},{}", amqp_url()).parse().unwrap();
    let conn = tokio::time::timeout(
        mailroom::broker::CONNECT_TIMEOUT,
        mailroom::broker::connect(&urls, "first_contact late answer test"),
    )
    .await
    .expect("the next node answers")
    .expect("and connects");
    assert!(conn.status().connected());
    assert!(!proxy.is_finished(), "the slow node was still holding");

    release.send(()).unwrap();
    let (from_client, to_client) = tokio::time::timeout(PATIENCE, proxy)
        .await
        .expect("the late connection was closed by mailroom")
        .unwrap();
    // The handshake went through in full (Start, Tune, Open-Ok one way; the protocol header,
    // Start-Ok, Tune-Ok, Open and Close the other), then mailroom closed it.
    assert!(
        to_client > 100 && from_client > 100,
        "the late handshake completed: {to_client} bytes to mailroom, {from_client} from it"
    );
    assert!(conn.status().connected(), "the winner stays open");
}

/// Copies `from` to `to` until `from` ends or either fails; returns the bytes copied.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut buf, mut copied) = ([0u8; 4096], 0);
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        copied += n;
    }
    let _ = to.shutdown().await;
    copied
}

/// The worker's arguments as parsed by the binary, against this test's world: `extra` pairs
/// override the defaults, `flags` are added.
fn worker_config(app: &TestApp, extra: &[&str], flags: &[&str]) -> Result<Cli, clap::Error> {
    let mut argv = vec!["mailroom".to_string(), "worker".to_string()];
    argv.extend(app.worker_args(extra));
    argv.extend(flags.iter().map(|f| f.to_string()));
    Cli::try_parse_from(argv)
}

/// Why building that worker fails, if it does.
fn build_error(app: &TestApp, extra: &[&str], flags: &[&str]) -> Option<String> {
    let Command::Worker(args) = worker_config(app, extra, flags).unwrap().command else {
        unreachable!()
    };
    args.build().err().map(|e| mailroom::exit::one_line(&e))
}

#[tokio::test]
async fn a_plain_smtp_url_to_a_remote_host_is_refused_unless_allowed() {
    let app = TestApp::spawn().await;
    let remote = ["--smtp-url", "smtp://mail.example:25"];
    let refused = build_error(&app, &remote, &[]).expect("refused");
    assert!(refused.contains("plain text to mail.example"), "{refused}");
    assert_eq!(build_error(&app, &remote, &["--allow-plain-smtp"]), None);
    let tls = ["--smtp-url", "smtps://mail.example"];
    assert_eq!(build_error(&app, &tls, &[]), None);
}

#[tokio::test]
async fn a_from_without_an_address_and_a_prefetch_below_the_concurrency_are_said_precisely() {
    let app = TestApp::spawn().await;
    let from = worker_config(&app, &["--from", "Shop"], &[])
        .unwrap_err()
        .to_string();
    assert!(
        from.contains("--from must be an email address such as `Shop <shop@example.com>`"),
        "{from}"
    );
    let prefetch = build_error(&app, &["--concurrency", "8", "--prefetch", "4"], &[]).unwrap();
    assert!(
        prefetch.starts_with("--prefetch 4 is below --concurrency 8"),
        "{prefetch}"
    );
    let equal = ["--concurrency", "8", "--prefetch", "8"];
    assert_eq!(build_error(&app, &equal, &[]), None);
}

#[tokio::test]
async fn a_ledger_retention_shorter_than_a_late_copy_is_refused_naming_the_minimum() {
    let app = TestApp::spawn().await;
    let short = build_error(&app, &["--ledger-retention", "1d"], &[]).expect("refused");
    assert!(
        short.starts_with("MAILROOM_LEDGER_RETENTION 1day is shorter than the 30days"),
        "{short}"
    );
    assert!(short.contains("use at least 30days"), "{short}");
    assert_eq!(build_error(&app, &["--ledger-retention", "31d"], &[]), None);
    assert_eq!(build_error(&app, &["--ledger-retention", "0s"], &[]), None);
}

#[tokio::test]
async fn each_class_of_failure_exits_with_its_documented_code() {
    let app = TestApp::spawn().await;
    let usage = app.cli_output(&["status", "--no-such-flag"]).await;
    assert_eq!(code(&usage), 2, "{}", usage.stderr);
    let runtime = app.cli_output(&["status", "no-such-job"]).await;
    assert_eq!(code(&runtime), 1, "{}", runtime.stderr);
    assert_eq!(error_lines(&runtime.stderr).len(), 1, "{}", runtime.stderr);
    let mut env = process_env(&app);
    env.push(("MAILROOM_PREFETCH", "1".to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let config = run_cli(&["worker"], &env).await;
    assert_eq!(code(&config), 78, "{}", config.stderr);
    let closed = ClosedPort::new();
    let down = altered(&app.db_url, None, Some(closed.port()));
    let unavailable = run_cli(&["status", "x"], &[("DATABASE_URL", &down)]).await;
    assert_eq!(code(&unavailable), 69, "{}", unavailable.stderr);
}
