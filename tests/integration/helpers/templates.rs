//! Template directories for tests: the shipped set, copies a test may break or edit under a
//! running worker, and the subject line of an email as the SMTP server received it.

use std::path::{Path, PathBuf};

use mailroom_test_kit::smtp::Received;

/// The templates the repository ships (`templates/`).
pub fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("templates")
}

/// Copies the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A copy of the shipped templates that a test may edit under a running worker.
pub fn editable_templates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&shipped(), dir.path());
    dir
}

/// The `Subject:` header of an email as the SMTP server received it.
pub fn subject(email: &Received) -> String {
    email
        .data
        .lines()
        .find_map(|l| l.strip_prefix("Subject: "))
        .unwrap_or_default()
        .to_string()
}
