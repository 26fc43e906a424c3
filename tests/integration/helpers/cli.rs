//! The built `mailroom` binary run as an operator runs it, against a test's world or none.

use std::path::Path;
use std::process::Stdio;

use tokio::process::Command as Process;

use super::app::{TEST_RETRY_DELAYS, TestApp};

impl TestApp {
    /// Runs `mailroom <args>` against this test's world, returning stdout; fails on exit ≠ 0.
    pub async fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args).await;
        assert!(out.status.success(), "mailroom {args:?}: {}", out.stderr);
        out.stdout
    }

    /// Runs `mailroom <args>` against this app's broker namespace and database, with the
    /// shipped templates, through the environment (so any subcommand takes them); unlike
    /// [`TestApp::cli`], returns the exit status and stderr too, for commands expected to fail.
    pub async fn cli_output(&self, args: &[&str]) -> CliOutput {
        self.cli_with_env(args, &[]).await
    }

    /// [`TestApp::cli_output`] with `extra` variables in its environment (a failpoint).
    pub async fn cli_with_env(&self, args: &[&str], extra: &[(&str, &str)]) -> CliOutput {
        let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let env = [
            ("AMQP_URL", self.amqp_url.as_str()),
            ("MAILROOM_NAMESPACE", self.namespace.as_str()),
            ("MAILROOM_RETRY_DELAYS", TEST_RETRY_DELAYS),
            ("DATABASE_URL", self.db_url.as_str()),
            ("MAILROOM_TEMPLATES", templates.to_str().unwrap()),
        ];
        let env: Vec<_> = env.iter().chain(extra).copied().collect();
        run_cli(args, &env).await
    }
}

/// What a run of the `mailroom` binary printed, and how it ended.
#[derive(Debug)]
pub struct CliOutput {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// How long one CLI command may run in a test.
const CLI_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs the built `mailroom` binary with `args` and `env` (and nothing from the caller's
/// environment that mailroom reads).
pub async fn run_cli(args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    let mut cmd = Process::new(env!("CARGO_BIN_EXE_mailroom"));
    for var in [
        "DATABASE_URL",
        "AMQP_URL",
        "MAILROOM_NAMESPACE",
        "MAILROOM_TEMPLATES",
        "MAILROOM_FROM",
        "MAILROOM_MESSAGE_ID_DOMAIN",
        "MAILROOM_REPLAY_KEY",
    ] {
        cmd.env_remove(var);
    }
    let run = cmd
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    // A command that does not end fails its test, naming itself, instead of holding the suite.
    let out = tokio::time::timeout(CLI_PATIENCE, run)
        .await
        .unwrap_or_else(|_| panic!("mailroom {args:?} did not exit within {CLI_PATIENCE:?}"))
        .expect("run the mailroom binary");
    CliOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
