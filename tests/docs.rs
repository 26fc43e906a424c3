//! The documentation keeps up with the code: every environment variable a command reads is in
//! docs/OPERATING.md's one configuration table (and nothing there is made up), every metric
//! `/metrics` can serve is in docs/METRICS.md (and nothing there is made up), and every
//! relative link in the Markdown files points at a file that exists.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names in `env = "NAME"` attributes of the command-line parser.
fn variables_in_code() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&Path::new(ROOT).join("src"), &mut files);
    let mut names = BTreeSet::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for piece in text.split("env = \"").skip(1) {
            names.insert(piece.split('"').next().unwrap().to_owned());
        }
    }
    names
}

/// The backquoted names in the first column of the configuration table; a cell may name two
/// (`A` / `B`).
fn variables_in_table() -> BTreeSet<String> {
    let text = fs::read_to_string(Path::new(ROOT).join("docs/OPERATING.md")).unwrap();
    let table = text
        .split("## Configuration")
        .nth(1)
        .expect("docs/OPERATING.md has a Configuration section");
    let mut names = BTreeSet::new();
    for row in table.lines().skip_while(|l| !l.starts_with('|')) {
        if !row.starts_with('|') {
            break;
        }
        let first = row.split('|').nth(1).unwrap_or_default();
        for (i, piece) in first.split('`').enumerate() {
            if i % 2 == 1 {
                names.insert(piece.to_owned());
            }
        }
    }
    names
}

#[test]
fn every_variable_a_command_reads_is_in_the_one_configuration_table() {
    let code = variables_in_code();
    let table = variables_in_table();
    assert!(code.len() > 20, "found only {code:?} in src/");
    let missing: Vec<_> = code.difference(&table).collect();
    assert!(
        missing.is_empty(),
        "read by mailroom, not in docs/OPERATING.md: {missing:?}"
    );
}

#[test]
fn the_configuration_table_names_no_variable_mailroom_does_not_read() {
    let code = variables_in_code();
    // Read by the logging setup (tracing's filter and the colour rule), not by clap.
    let outside_clap = ["RUST_LOG", "NO_COLOR"];
    let invented: Vec<_> = variables_in_table()
        .into_iter()
        .filter(|v| !code.contains(v) && !outside_clap.contains(&v.as_str()))
        .collect();
    assert!(
        invented.is_empty(),
        "in docs/OPERATING.md, read nowhere: {invented:?}"
    );
}

/// The target of every `](target)` in `text` that is not a URL or a bare anchor, without its anchor.
fn relative_links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .map(|rest| rest.split(')').next().unwrap_or_default())
        .map(|target| target.split('#').next().unwrap_or_default().to_owned())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

#[test]
fn every_relative_link_in_the_docs_points_at_a_file_that_exists() {
    let root = Path::new(ROOT);
    let mut docs: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    for entry in fs::read_dir(root.join("docs")).unwrap() {
        docs.push(entry.unwrap().path());
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in docs
        .iter()
        .filter(|d| d.extension().is_some_and(|e| e == "md"))
    {
        let text = fs::read_to_string(doc).unwrap();
        for target in relative_links(&text) {
            checked += 1;
            if !doc.parent().unwrap().join(&target).exists() {
                broken.push(format!("{} -> {target}", doc.display()));
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
}

/// The metric names written as string literals in `src/http/metrics.rs` and
/// `src/http/metrics/`: every `"mailroom_…"` and `"process_…"`.
fn metrics_in_code() -> BTreeSet<String> {
    let dir = Path::new(ROOT).join("src/http");
    let mut files = vec![dir.join("metrics.rs")];
    rust_files(&dir.join("metrics"), &mut files);
    let mut names = BTreeSet::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for piece in text.split('"').skip(1).step_by(2) {
            if is_metric_name(piece) {
                names.insert(piece.to_owned());
            }
        }
    }
    names
}

fn is_metric_name(s: &str) -> bool {
    (s.starts_with("mailroom_") || s.starts_with("process_"))
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The backquoted metric names in the first column of docs/METRICS.md's tables (its other
/// tables name endpoints and commands).
fn metrics_in_docs() -> BTreeSet<String> {
    let text = fs::read_to_string(Path::new(ROOT).join("docs/METRICS.md")).unwrap();
    text.lines()
        .filter_map(|row| row.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|name| is_metric_name(name))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_metric_the_server_serves_is_in_the_metrics_reference_and_nothing_else_is() {
    let code = metrics_in_code();
    let docs = metrics_in_docs();
    assert!(code.len() > 30, "found only {code:?} in src/http/metrics");
    let missing: Vec<_> = code.difference(&docs).collect();
    assert!(
        missing.is_empty(),
        "served by /metrics, not in docs/METRICS.md: {missing:?}"
    );
    let invented: Vec<_> = docs.difference(&code).collect();
    assert!(
        invented.is_empty(),
        "in docs/METRICS.md, served nowhere: {invented:?}"
    );
}

/// `text` with `///` and every run of whitespace made one space: a phrase reads the same
/// wherever a comment or a paragraph wraps it.
fn flowing(text: &str) -> String {
    text.replace("///", " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_record_linger_is_written_as_its_value_wherever_it_is_named() {
    let ms = mailroom::db::group::RECORD_LINGER.as_millis();
    let places = [
        (
            "src/cli/worker.rs",
            format!("a result waits up to {ms} ms for the next claim"),
        ),
        (
            "src/http/metrics/worker.rs",
            format!("waited (at most {ms} ms) to share their commit"),
        ),
        (
            "docs/METRICS.md",
            format!("waited (at most {ms} ms) to share their commit"),
        ),
        (
            "docs/GUARANTEES.md",
            format!("wait up to {ms} ms for the next claim"),
        ),
        (
            "docs/GUARANTEES.md",
            format!("the next one is due within those {ms} ms"),
        ),
        (
            "docs/GUARANTEES.md",
            format!("lengthens window W1 (below) by at most {ms} ms"),
        ),
        (
            "docs/OPERATING.md",
            format!("no record waits up to {ms} ms for a claim"),
        ),
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, phrase) in places {
        let text = flowing(&fs::read_to_string(root.join(file)).unwrap());
        assert!(
            text.contains(&phrase),
            "{file} should say {phrase:?} (RECORD_LINGER is {ms} ms)"
        );
    }
}
