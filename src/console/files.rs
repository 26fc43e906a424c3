//! The template directory as the editor sees it: kinds and their locales, the three parts of
//! one kind in one locale, content hashes, and atomic writes.
//!
//! A locale is named by its files (`subject.fr.hbs`); `""` is the default files. A kind or a
//! locale reaches a path only after it was found among the directory's own names, so a URL
//! never names a file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::render::file;

/// The editable parts, in the order the editor shows them.
pub(super) const PARTS: [&str; 3] = ["subject", "html", "text"];

/// One kind's folder and the locales it has files for (`""` first).
#[derive(Debug, Clone)]
pub(super) struct KindFiles {
    pub kind: String,
    pub locales: Vec<String>,
}

/// The kinds of `dir` and their locales, sorted.
pub(super) fn kinds(dir: &Path) -> Vec<KindFiles> {
    let mut kinds: Vec<KindFiles> = names(dir)
        .into_iter()
        .filter(|n| n != "layouts" && n != "partials" && dir.join(n).is_dir())
        .map(|kind| KindFiles {
            locales: locales(&dir.join(&kind)),
            kind,
        })
        .collect();
    kinds.sort_by(|a, b| a.kind.cmp(&b.kind));
    kinds
}

fn names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect()
}

fn locales(folder: &Path) -> Vec<String> {
    let mut locales = vec![String::new()];
    for name in names(folder) {
        let Some(stem) = name.strip_suffix(".hbs") else {
            continue;
        };
        if let Some((part, locale)) = stem.split_once('.')
            && PARTS.contains(&part)
            && !locales.iter().any(|l| l == locale)
        {
            locales.push(locale.to_owned());
        }
    }
    locales[1..].sort();
    locales
}

/// The `(kind, locale)` a URL names, when the directory has it; `default` is `""`.
pub(super) fn find(dir: &Path, kind: &str, locale: &str) -> Option<(String, String)> {
    let locale = if locale == "default" { "" } else { locale };
    kinds(dir)
        .into_iter()
        .find(|k| k.kind == kind)
        .and_then(|k| k.locales.into_iter().find(|l| l == locale))
        .map(|l| (kind.to_owned(), l))
}

/// How a locale appears in URLs.
pub(super) fn url_locale(locale: &str) -> &str {
    if locale.is_empty() { "default" } else { locale }
}

/// The file of `part` in `locale`: `html.hbs`, `html.fr.hbs`.
pub(super) fn part_file(part: &str, locale: &str) -> String {
    if locale.is_empty() {
        format!("{part}.hbs")
    } else {
        format!("{part}.{locale}.hbs")
    }
}

/// The subject, HTML and text of a kind in a locale.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub(super) struct Parts {
    pub subject: String,
    pub html: String,
    #[serde(default)]
    pub text: String,
}

impl Parts {
    fn get(&self, part: &str) -> &str {
        match part {
            "subject" => &self.subject,
            "html" => &self.html,
            _ => &self.text,
        }
    }

    /// SHA-256 (hex) of the three parts, each with its length, so no two splits collide.
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        for part in PARTS {
            let text = self.get(part);
            hasher.update((text.len() as u64).to_be_bytes());
            hasher.update(text.as_bytes());
        }
        hex::encode(hasher.finalize())
    }
}

/// What the worker renders for `kind` in `locale`: each part's own file, else the default
/// file (empty when neither exists, as for a kind without a text part).
pub(super) fn effective(dir: &Path, kind: &str, locale: &str) -> io::Result<Parts> {
    let folder = dir.join(kind);
    let read = |part: &str| -> io::Result<String> {
        for file in [part_file(part, locale), part_file(part, "")] {
            match file::read_to_string(&folder.join(file)) {
                Ok(text) => return Ok(text),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(String::new())
    };
    Ok(Parts {
        subject: read("subject")?,
        html: read("html")?,
        text: read("text")?,
    })
}

/// The files a save of `draft` over `current` (both [`effective`]) writes: a changed part
/// goes to the locale's own file, created when it falls back today.
pub(super) fn changed_files(
    folder: &Path,
    locale: &str,
    current: &Parts,
    draft: &Parts,
) -> Vec<(PathBuf, String)> {
    PARTS
        .iter()
        .filter(|part| current.get(part) != draft.get(part))
        .map(|part| {
            (
                folder.join(part_file(part, locale)),
                draft.get(part).to_owned(),
            )
        })
        .collect()
}

/// Replaces `path` with `bytes` so that a reader sees the old file or the new one, never a part:
/// a hidden temporary file in the same directory (the loader skips dot files), written and
/// synced, renamed over the file, then the directory synced so the rename survives a crash.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut file = File::create_new(&temp)?;
        file.write_all(bytes)?;
        if let Ok(meta) = fs::metadata(path) {
            file.set_permissions(meta.permissions())?;
        }
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written?;
    File::open(dir)?.sync_all()
}

/// A hash of every visible file under `dir` (paths and bytes, or what [`file::identity`] takes
/// of a file the loader would not read): changes when any file does.
pub(super) fn fingerprint(dir: &Path) -> String {
    let mut files = Vec::new();
    walk(dir, true, &mut files);
    files.sort();
    let mut hasher = Sha256::new();
    for path in files {
        hasher.update(path.to_string_lossy().as_bytes());
        hasher.update(file::identity(&path).unwrap_or_default());
    }
    hex::encode(&hasher.finalize()[..8])
}

/// As the reload's fingerprint walks (`render/live.rs`): the top's folders are entered, a
/// deeper one counts by its path alone, so a symlink loop cannot make the walk endless.
fn walk(dir: &Path, descend: bool, out: &mut Vec<PathBuf>) {
    for name in names(dir) {
        let path = dir.join(name);
        if descend && path.is_dir() {
            walk(&path, false, out);
        } else {
            out.push(path);
        }
    }
}

/// Copies the visible files of `from` into `to` (a scratch copy for a draft): the top's
/// folders with their files; a deeper folder (the loader's error) is copied empty, never
/// followed.
pub(super) fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    copy_level(from, to, true)
}

fn copy_level(from: &Path, to: &Path, descend: bool) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for name in names(from) {
        let (source, target) = (from.join(&name), to.join(&name));
        if source.is_dir() {
            if descend {
                copy_level(&source, &target, false)?;
            } else {
                fs::create_dir_all(&target)?;
            }
        } else {
            // Read as the loader reads: a FIFO or a device here fails the copy, never blocks it.
            let bytes = file::read(&source)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", source.display())))?;
            fs::write(&target, bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("templates")
    }

    #[test]
    fn kinds_and_locales_come_from_the_files() {
        let kinds = kinds(&shipped());
        let welcome = kinds.iter().find(|k| k.kind == "welcome").unwrap();
        assert_eq!(welcome.locales, ["", "fr"]);
        assert!(
            !kinds
                .iter()
                .any(|k| k.kind == "layouts" || k.kind == "partials")
        );
    }

    #[test]
    fn a_url_names_only_what_the_directory_has() {
        let dir = shipped();
        assert_eq!(
            find(&dir, "welcome", "default"),
            Some(("welcome".into(), "".into()))
        );
        assert!(find(&dir, "welcome", "de").is_none());
        assert!(find(&dir, "../welcome", "default").is_none());
        assert!(find(&dir, "layouts", "default").is_none());
    }

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("mailroom-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("subject.hbs");
        fs::write(&path, "old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(names(&dir), ["subject.hbs"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_hash_tells_where_one_part_ends() {
        let a = Parts {
            subject: "ab".into(),
            html: "c".into(),
            text: String::new(),
        };
        let b = Parts {
            subject: "a".into(),
            html: "bc".into(),
            text: String::new(),
        };
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn a_fifo_in_the_directory_fails_a_draft_copy_and_changes_the_fingerprint_unread() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("k")).unwrap();
        fs::write(dir.path().join("k/subject.hbs"), "Hi\n").unwrap();
        let before = fingerprint(dir.path());
        let fifo = dir.path().join("k/html.hbs");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        // Each of these read the FIFO and waited for a writer forever.
        assert_ne!(fingerprint(dir.path()), before);
        let e = copy_tree(dir.path(), &dir.path().join("copy")).unwrap_err();
        assert!(
            e.to_string().contains("html.hbs: not a regular file"),
            "{e}"
        );
        let e = effective(dir.path(), "k", "").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn symlink_loops_end_the_walk_and_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("k")).unwrap();
        fs::write(dir.path().join("k/subject.hbs"), "Hi\n").unwrap();
        let before = fingerprint(dir.path());
        std::os::unix::fs::symlink(".", dir.path().join("k/a")).unwrap();
        std::os::unix::fs::symlink(".", dir.path().join("k/b")).unwrap();
        // Followed, each of these went 2^41 folders deep.
        assert_ne!(fingerprint(dir.path()), before);
        let scratch = tempfile::tempdir().unwrap();
        let copy = scratch.path().join("copy");
        copy_tree(dir.path(), &copy).unwrap();
        assert!(copy.join("k/subject.hbs").is_file());
        assert!(copy.join("k/a").is_dir() && names(&copy.join("k/a")).is_empty());
    }
}
