//! The container image's recipe, checked without a Docker daemon: the Dockerfile says what an
//! operator relies on (a stripped binary, a health check, ports, labels, a pinned base), the
//! .dockerignore keeps the build context small without leaving out what the build copies, and
//! the build stage's sources are a workspace cargo loads with the locked dependencies.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dockerfile() -> String {
    std::fs::read_to_string(repo().join("Dockerfile")).unwrap()
}

/// The Dockerfile's instructions, continuation lines joined, comments and heredoc bodies left out.
fn instructions() -> Vec<String> {
    let mut out = Vec::new();
    let mut heredoc: Option<String> = None;
    let mut current = String::new();
    for line in dockerfile().lines() {
        if let Some(end) = &heredoc {
            if line == end {
                heredoc = None;
            }
            continue;
        }
        if current.is_empty() && (line.trim_start().starts_with('#') || line.trim().is_empty()) {
            continue;
        }
        current.push_str(line.trim_end_matches('\\').trim());
        current.push(' ');
        if line.ends_with('\\') {
            continue;
        }
        if let Some(at) = current.find("<<'") {
            heredoc = current[at + 3..].split('\'').next().map(str::to_string);
        }
        out.push(std::mem::take(&mut current).trim().to_string());
    }
    out
}

/// The instructions of the stage named `name` (`FROM … AS name`).
fn stage(name: &str) -> Vec<String> {
    let all = instructions();
    let start = all
        .iter()
        .position(|i| i.starts_with("FROM ") && i.ends_with(&format!(" AS {name}")))
        .unwrap_or_else(|| panic!("no stage {name}"));
    let end = all[start + 1..]
        .iter()
        .position(|i| i.starts_with("FROM "))
        .map_or(all.len(), |n| start + 1 + n);
    all[start..end].to_vec()
}

/// The sources of the stage's `COPY` instructions from the build context.
fn copied_sources(stage: &[String]) -> Vec<String> {
    stage
        .iter()
        .filter(|i| i.starts_with("COPY ") && !i.contains("--from=") && !i.contains("<<"))
        .flat_map(|i| {
            let words: Vec<&str> = i.split_whitespace().skip(1).collect();
            words[..words.len() - 1]
                .iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_image_ships_a_stripped_binary_with_a_health_check_ports_labels_and_a_pinned_base() {
    let build = stage("build").join("\n");
    assert!(build.contains("cargo build --release --locked"), "{build}");
    assert!(build.contains("objcopy --only-keep-debug"), "{build}");
    assert!(
        build.contains("objcopy --strip-debug --add-gnu-debuglink"),
        "{build}"
    );

    let runtime = stage("runtime");
    let base = &runtime[0];
    let digest = base
        .split("@sha256:")
        .nth(1)
        .unwrap_or("")
        .split(' ')
        .next()
        .unwrap();
    assert!(
        digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "the runtime base is pinned by digest: {base}"
    );
    let has = |prefix: &str| runtime.iter().find(|i| i.starts_with(prefix)).cloned();
    let healthcheck = has("HEALTHCHECK ").expect("a HEALTHCHECK");
    assert!(healthcheck.contains(" CMD "), "{healthcheck}");
    let expose = has("EXPOSE ").expect("EXPOSE");
    let metrics = has("ENV MAILROOM_METRICS_ADDR=").expect("the metrics listener is on by default");
    let port = metrics.rsplit(':').next().unwrap();
    assert!(
        expose.split_whitespace().any(|p| p == port),
        "{expose} vs {metrics}"
    );
    assert!(expose.split_whitespace().any(|p| p == "8080"), "{expose}");
    let labels = has("LABEL ").expect("OCI labels");
    for key in [
        "title",
        "description",
        "licenses",
        "version",
        "revision",
        "created",
    ] {
        let label = format!("org.opencontainers.image.{key}=");
        assert!(labels.contains(&label), "{label} missing: {labels}");
    }
    assert!(
        labels.contains(digest),
        "base.digest names the pinned base: {labels}"
    );
    assert_eq!(has("USER ").as_deref(), Some("USER 10001:10001"));
    assert!(
        has("COPY --from=build /out/mailroom ").is_some(),
        "the stripped binary"
    );
}

/// Whether `.dockerignore` leaves `path` out of the build context (its last matching pattern
/// decides). Enough of Docker's syntax for this file: `dir/`, an exact path, `*.ext` at the root.
fn ignored(patterns: &[String], path: &str) -> bool {
    let mut out = false;
    for pattern in patterns {
        let (exclude, p) = match pattern.strip_prefix('!') {
            Some(p) => (false, p),
            None => (true, pattern.as_str()),
        };
        let p = p.trim_end_matches('/');
        let hit = if let Some(ext) = p.strip_prefix('*') {
            !path.contains('/') && path.ends_with(ext)
        } else {
            path == p || path.starts_with(&format!("{p}/"))
        };
        if hit {
            out = exclude;
        }
    }
    out
}

#[test]
fn the_dockerignore_leaves_out_target_tests_benches_git_and_docs_but_not_what_the_build_copies() {
    let text = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let patterns: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    for left_out in [
        "target/release/mailroom",
        "tests/integration/main.rs",
        "benches/bench.rs",
    ] {
        assert!(
            ignored(&patterns, left_out),
            "{left_out} is in the build context"
        );
    }
    for left_out in [".git/HEAD", "docs/DEPLOY.md", "examples/outbox.py"] {
        assert!(
            ignored(&patterns, left_out),
            "{left_out} is in the build context"
        );
    }
    let mut copied = copied_sources(&stage("build"));
    copied.extend(copied_sources(&stage("runtime")));
    assert!(copied.iter().any(|c| c == "src"), "{copied:?}");
    for source in copied {
        let source = source.trim_start_matches("./");
        assert!(
            !ignored(&patterns, source),
            "COPY {source}, but .dockerignore leaves it out"
        );
    }
}

#[test]
fn the_build_stage_sources_load_as_a_workspace_with_the_locked_dependencies() {
    let build = stage("build");
    let context = tempfile::tempdir().unwrap();
    for source in copied_sources(&build) {
        copy(&repo().join(&source), &context.path().join(&source));
    }
    // The stubs the build stage makes for the workspace's other members.
    let stubs = build
        .iter()
        .find_map(|i| i.split("touch ").nth(1))
        .expect("the build stage stubs the other members' sources");
    for stub in stubs.split_whitespace() {
        let stub = context.path().join(stub);
        std::fs::create_dir_all(stub.parent().unwrap()).unwrap();
        std::fs::write(stub, "").unwrap();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .current_dir(context.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    if from.is_file() {
        std::fs::copy(from, to).unwrap();
        return;
    }
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        copy(&entry.path(), &to.join(entry.file_name()));
    }
}
