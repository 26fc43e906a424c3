//! Tests of the template set: the shipped templates (snapshots, escaping, locales), every
//! refusal at render and at load, and a property test of the subject's header safety.

mod failures;
mod live;
mod loading;
mod props;
mod shipped;

use std::fs;
use std::path::Path;
use std::sync::LazyLock;

use serde_json::Value;
use tempfile::TempDir;

use super::{RenderedEmail, Templates};

/// The repository's `templates/`, found from the manifest so the working directory is irrelevant.
static SHIPPED: LazyLock<Templates> = LazyLock::new(|| {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    Templates::load(&dir).unwrap_or_else(|e| panic!("shipped templates do not load: {e}"))
});

fn shipped() -> &'static Templates {
    &SHIPPED
}

/// A kind's sample with one field replaced, addressed like a JSON pointer (`/user/name`).
fn sample_with(kind: &str, pointer: &str, value: Value) -> Value {
    let mut data = shipped().sample(kind).unwrap().clone();
    *data.pointer_mut(pointer).unwrap() = value;
    data
}

/// A kind's sample with one field removed.
fn sample_without(kind: &str, parent: &str, field: &str) -> Value {
    let mut data = shipped().sample(kind).unwrap().clone();
    data.pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .unwrap()
        .remove(field);
    data
}

/// A smallest valid kind, `k`, to build fixtures from.
const MINIMAL: [(&str, &str); 3] = [
    ("k/subject.hbs", "Hello {{name}}\n"),
    ("k/html.hbs", "<p>Hello {{name}}</p>\n"),
    ("k/sample.json", r#"{"name": "Ada"}"#),
];

/// A template directory holding `files` (relative path, content).
fn fixture(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (rel, content) in files {
        let path = dir.path().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
    dir
}

/// `MINIMAL` with `files` added, or replacing its own.
fn fixture_with(files: &[(&str, &str)]) -> TempDir {
    let mut all: Vec<(&str, &str)> = MINIMAL
        .into_iter()
        .filter(|(rel, _)| !files.iter().any(|(r, _)| r == rel))
        .collect();
    all.extend_from_slice(files);
    fixture(&all)
}

/// Loads `MINIMAL` plus `files`, expecting a refusal; returns its text with the temporary
/// directory shown as `<dir>`.
fn load_error(files: &[(&str, &str)]) -> String {
    let dir = fixture_with(files);
    let error = Templates::load(dir.path()).unwrap_err();
    error
        .to_string()
        .replace(&dir.path().display().to_string(), "<dir>")
}

/// One rendered email as a snapshot: subject, text part, HTML part.
fn show(email: &RenderedEmail) -> String {
    let text = email.text.as_deref().unwrap_or("(no text part)");
    format!(
        "Subject: {}\n\n----- text -----\n{}\n----- html -----\n{}",
        email.subject, text, email.html
    )
}
