//! Reading a template directory into memory: which files exist, what each one is, and their
//! text. Names are checked here so that a typo (`htm.hbs`, `html.pt_BR.hbs`, a folder with no
//! `html.hbs`) is an error at load, not a part that silently never renders.

use std::fs;
use std::path::{Path, PathBuf};

use super::TemplateError;

/// Folders under the template directory that hold shared partials rather than a kind.
const SHARED_FOLDERS: [&str; 2] = ["layouts", "partials"];

/// Same rule as a job's `kind`, so every folder is reachable and nothing else is.
const MAX_KIND_LEN: usize = 64;

/// Every file of a template directory, read.
pub(super) struct Tree {
    /// Layouts and partials; `rel` is e.g. `layouts/base.hbs`.
    pub shared: Vec<Source>,
    pub kinds: Vec<KindDir>,
}

/// One file's text and where it came from.
pub(super) struct Source {
    /// Path relative to the template directory with `/` separators, e.g. `welcome/html.fr.hbs`.
    pub rel: String,
    pub path: PathBuf,
    pub text: String,
}

/// Which of a kind's templates a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Subject,
    Html,
    Text,
}

/// The files of one kind's folder.
pub(super) struct KindDir {
    pub name: String,
    /// Each template with its lowercased locale (`None` for the default file).
    pub parts: Vec<(Part, Option<String>, Source)>,
    pub sample: Source,
}

/// Reads `dir`: the tree of every folder that reads well, and the errors of the others (each
/// bad file and each missing one). Hidden entries are skipped, and so are plain files at the
/// top (a README). Only a directory that cannot be read, or holds no kind, fails outright.
pub(super) fn scan(dir: &Path) -> Result<(Tree, Vec<TemplateError>), TemplateError> {
    let mut tree = Tree {
        shared: Vec::new(),
        kinds: Vec::new(),
    };
    let mut errors = Vec::new();
    for (name, path) in entries(dir)? {
        if !path.is_dir() {
            continue;
        }
        if SHARED_FOLDERS.contains(&name.as_str()) {
            tree.shared.extend(scan_shared(&name, &path, &mut errors));
        } else {
            match scan_kind(name, path) {
                Ok(kind) => tree.kinds.push(kind),
                Err(kind_errors) => errors.extend(kind_errors),
            }
        }
    }
    if tree.kinds.is_empty() && errors.is_empty() {
        return Err(TemplateError::Empty {
            dir: dir.to_owned(),
        });
    }
    Ok((tree, errors))
}

/// `layouts/*.hbs` or `partials/*.hbs`; other files are ignored, bad ones go to `errors`.
fn scan_shared(folder: &str, dir: &Path, errors: &mut Vec<TemplateError>) -> Vec<Source> {
    let mut sources = Vec::new();
    let found = match entries(dir) {
        Ok(found) => found,
        Err(e) => {
            errors.push(e);
            return sources;
        }
    };
    for (name, path) in found {
        if path.is_dir() {
            errors.push(invalid(path, "sub-folders are not supported here"));
            continue;
        }
        let Some(stem) = name.strip_suffix(".hbs") else {
            continue;
        };
        if !is_kind_name(stem) {
            let why = "a partial name may hold only A-Z, a-z, 0-9, '_' and '-'";
            errors.push(invalid(path, why));
            continue;
        }
        match read(format!("{folder}/{name}"), path) {
            Ok(source) => sources.push(source),
            Err(e) => errors.push(e),
        }
    }
    sources
}

/// One kind's folder, or every reason it cannot be one.
fn scan_kind(name: String, dir: PathBuf) -> Result<KindDir, Vec<TemplateError>> {
    if !is_kind_name(&name) {
        let why = "a template folder name is 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-'";
        return Err(vec![invalid(dir, why)]);
    }
    let (parts, sample, mut errors) = read_kind_files(&name, &dir);
    for (part, file) in [(Part::Subject, "subject.hbs"), (Part::Html, "html.hbs")] {
        let has = |(p, locale, _): &(Part, Option<String>, Source)| *p == part && locale.is_none();
        if !parts.iter().any(has) {
            let dir = dir.clone();
            errors.push(TemplateError::MissingFile { dir, file });
        }
    }
    if sample.is_none() {
        let file = "sample.json";
        errors.push(TemplateError::MissingFile { dir, file });
    }
    match sample {
        Some(sample) if errors.is_empty() => Ok(KindDir {
            name,
            parts,
            sample,
        }),
        _ => Err(errors),
    }
}

/// A kind folder's templates (part, lowercased locale, text), its sample if any, and the
/// errors of its other files.
type KindFiles = (
    Vec<(Part, Option<String>, Source)>,
    Option<Source>,
    Vec<TemplateError>,
);

/// The templates and the `sample.json` of the kind folder `dir`, each read; a sub-folder or a
/// `.hbs` file of another name is an error, and the other files are still read.
fn read_kind_files(name: &str, dir: &Path) -> KindFiles {
    let (mut parts, mut sample, mut errors) = (Vec::new(), None, Vec::new());
    let found = match entries(dir) {
        Ok(found) => found,
        Err(e) => return (parts, sample, vec![e]),
    };
    for (file, path) in found {
        if path.is_dir() {
            let why = "sub-folders are not supported in a template folder";
            errors.push(invalid(path, why));
            continue;
        }
        let rel = format!("{name}/{file}");
        if file == "sample.json" {
            match read(rel, path) {
                Ok(source) => sample = Some(source),
                Err(e) => errors.push(e),
            }
        } else if file.ends_with(".hbs") {
            let Some((part, locale)) = parse_file_name(&file) else {
                let why = "expected subject.hbs, html.hbs or text.hbs, optionally with a locale \
                           such as html.fr.hbs or html.pt-BR.hbs";
                errors.push(invalid(path, why));
                continue;
            };
            match read(rel, path) {
                Ok(source) => parts.push((part, locale, source)),
                Err(e) => errors.push(e),
            }
        }
    }
    (parts, sample, errors)
}

/// `html.pt-BR.hbs` → `(Html, Some("pt-br"))`.
fn parse_file_name(file: &str) -> Option<(Part, Option<String>)> {
    let stem = file.strip_suffix(".hbs")?;
    let (part, locale) = match stem.split_once('.') {
        Some((part, locale)) => (part, Some(locale)),
        None => (stem, None),
    };
    let part = match part {
        "subject" => Part::Subject,
        "html" => Part::Html,
        "text" => Part::Text,
        _ => return None,
    };
    match locale {
        Some(tag) if !is_locale(tag) => None,
        _ => Some((part, locale.map(str::to_ascii_lowercase))),
    }
}

fn is_kind_name(name: &str) -> bool {
    (1..=MAX_KIND_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A language tag as a job may carry it: `fr`, `pt-BR`, `zh-Hant-TW`.
fn is_locale(tag: &str) -> bool {
    let mut subtags = tag.split('-');
    let language = subtags.next().unwrap_or_default();
    (2..=3).contains(&language.len())
        && language.bytes().all(|b| b.is_ascii_alphabetic())
        && subtags
            .all(|s| (1..=8).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A directory's entries as sorted `(name, path)`, without hidden ones (editor swap files).
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, TemplateError> {
    let io = |error| TemplateError::Io {
        path: dir.to_owned(),
        error,
    };
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            return Err(invalid(path, "file name is not valid UTF-8"));
        };
        if !name.starts_with('.') {
            found.push((name.to_owned(), path));
        }
    }
    found.sort();
    Ok(found)
}

fn read(rel: String, path: PathBuf) -> Result<Source, TemplateError> {
    match super::file::read_to_string(&path) {
        Ok(text) => Ok(Source { rel, path, text }),
        Err(error) => Err(TemplateError::Io { path, error }),
    }
}

fn invalid(path: PathBuf, message: &str) -> TemplateError {
    TemplateError::Invalid {
        path,
        line: None,
        column: None,
        message: message.to_owned(),
    }
}
