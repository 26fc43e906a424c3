//! Passes the git commit of this build to the code, as `MAILROOM_GIT_COMMIT`, for
//! `mailroom_build_info`. An image built without `.git` passes it in the environment
//! (`MAILROOM_GIT_COMMIT=…`); neither gives `unknown`. Also rebuilds the crate when a migration
//! is added: `sqlx::migrate!` embeds `migrations/` but cannot ask Cargo to watch it.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MAILROOM_GIT_COMMIT");
    println!("cargo:rerun-if-changed=migrations");
    let commit = std::env::var("MAILROOM_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // A new commit moves HEAD's reflog (a worktree has its own); rebuild to pick it up.
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rustc-env=MAILROOM_GIT_COMMIT={commit}");
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}
