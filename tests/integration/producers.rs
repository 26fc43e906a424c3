//! The producer examples (examples/: Python's plain DB-API, Django and SQLAlchemy; Rails'
//! Active Record) against the test's own database: each commits one order with its email,
//! rolls one back, and is run again with the committed order's id; the outbox and the business
//! table hold what they should, and a relay and a worker deliver exactly the committed email
//! to the SMTP server.
//!
//! The Python examples run in a virtualenv made from examples/requirements.txt by Debian's
//! /usr/bin/python3 (package python3-venv), once per run of the suite and cached across runs
//! under `target/tmp/`, keyed by the hash of the requirements file and the Python version. The
//! Ruby one runs on Debian's ruby-activerecord, ruby-pg and ruby-mysql2 (installed by
//! `scripts/services`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::helpers::*;

/// Debian's interpreter, which `scripts/services` gives its `venv` module (python3-venv).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Debian's Ruby, with Active Record from Debian's packages.
const RUBY: &str = "/usr/bin/ruby";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The virtualenv's interpreter. Made once per process (tests wait for the first one, in
/// `OnceLock`), and once per requirements file and Python version across processes: it is
/// built in a directory of its own and renamed into place, so a concurrent run never sees a
/// half-made one.
fn python() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let requirements = examples().join("requirements.txt");
        // Keyed by the requirements and the interpreter they were installed for.
        let mut hash = Sha256::new();
        hash.update(std::fs::read(&requirements).unwrap());
        let interpreter = std::fs::canonicalize(SYSTEM_PYTHON).expect("Debian's python3");
        hash.update(interpreter.as_os_str().as_encoded_bytes());
        let hash = hash.finalize();
        let key: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("python-examples-{key}"));
        if !venv.join("bin/python").exists() {
            make_venv(&requirements, &venv);
        }
        venv
    })
    .join("bin/python")
}

fn make_venv(requirements: &Path, venv: &Path) {
    let building = venv.with_extension(format!("building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    let python = building.join("bin/python");
    run(Command::new(SYSTEM_PYTHON)
        .args(["-m", "venv"])
        .arg(&building))
    .expect("create a virtualenv (Debian: apt-get install python3-venv, as scripts/services does)");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-input", "--only-binary", ":all:", "--requirement"])
        .arg(requirements))
    .expect("pip install examples/requirements.txt (needs PyPI)");
    if std::fs::rename(&building, venv).is_err() {
        // Another run put one there first; it is the same.
        std::fs::remove_dir_all(&building).unwrap();
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        return Ok(());
    }
    Err(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Runs one example for one order; returns its stdout after checking it exited 0 and printed
/// nothing on stderr (no traceback, no warning).
async fn place_order(
    python: &Path,
    app: &TestApp,
    script: &str,
    order: u32,
    rollback: bool,
) -> String {
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(examples().join(script))
        .args([
            "--order-id",
            &order.to_string(),
            "--to",
            "Ada <ada@example.com>",
        ])
        .env("DATABASE_URL", &app.db_url);
    if rollback {
        cmd.arg("--rollback");
    }
    let out = cmd.output().await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stderr.is_empty(),
        "{script}: {stdout}{stderr}"
    );
    stdout
}

/// The whole check for one example, run by `interpreter`, whose business rows go to `table`.
async fn example_sends_the_committed_order_once(interpreter: &Path, script: &str, table: &str) {
    let app = TestApp::spawn().await;
    let run = |order, rollback| place_order(interpreter, &app, script, order, rollback);

    let out = run(7, true).await;
    assert!(out.contains("order 7 rolled back"), "{out}");
    let out = run(8, false).await;
    assert!(
        out.contains("order 8 committed: order-8-confirmation queued"),
        "{out}"
    );
    let out = run(8, false).await;
    assert!(
        out.contains("order 8: job order-8-confirmation already exists; nothing written"),
        "{out}"
    );

    let orders = format!("SELECT count(*) FROM {table} WHERE id = ");
    assert_eq!(app.count(&format!("{orders}8")).await, 1);
    assert_eq!(app.count(&format!("{orders}7")).await, 0);
    let outbox = "SELECT count(*) FROM mailroom_outbox";
    let job = "job_id = 'order-8-confirmation' AND kind = 'order_confirmation'";
    assert_eq!(app.count(&format!("{outbox} WHERE {job}")).await, 1);
    assert_eq!(app.count(outbox).await, 1);

    app.deliver_through_outbox("order-8-confirmation", "order_confirmation")
        .await;
    let received = app.smtp.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].rcpt_tos, ["ada@example.com"]);
    assert_eq!(
        received[0].message_id,
        Some(app.message_id("order-8-confirmation", "order_confirmation"))
    );
    assert!(
        app.notification("order-7-confirmation", "order_confirmation")
            .await
            .is_none()
    );
}

#[tokio::test]
async fn the_db_api_example_sends_a_committed_order_once_and_reports_a_rerun_as_queued() {
    example_sends_the_committed_order_once(&python(), "outbox.py", "orders").await;
}

#[tokio::test]
async fn the_django_example_sends_a_committed_order_once_and_reports_a_rerun_as_queued() {
    example_sends_the_committed_order_once(&python(), "django_outbox.py", "shop_order").await;
}

#[tokio::test]
async fn the_sqlalchemy_example_sends_a_committed_order_once_and_reports_a_rerun_as_queued() {
    example_sends_the_committed_order_once(&python(), "sqlalchemy_outbox.py", "sa_orders").await;
}

#[tokio::test]
async fn the_rails_example_sends_a_committed_order_once_and_reports_a_rerun_as_queued() {
    let ruby = Path::new(RUBY);
    assert!(
        ruby.exists(),
        "apt-get install ruby ruby-activerecord ruby-pg ruby-mysql2 (scripts/services does)"
    );
    example_sends_the_committed_order_once(ruby, "rails_outbox.rb", "rails_orders").await;
}
