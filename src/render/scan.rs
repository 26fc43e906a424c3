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

/// Reads `dir`. Hidden entries are skipped, and so are plain files at the top (a README).
pub(super) fn scan(dir: &Path) -> Result<Tree, TemplateError> {
    let mut tree = Tree {
        shared: Vec::new(),
        kinds: Vec::new(),
    };
    for (name, path) in entries(dir)? {
        if !path.is_dir() {
            continue;
        }
        if SHARED_FOLDERS.contains(&name.as_str()) {
            tree.shared.extend(scan_shared(&name, &path)?);
        } else {
            tree.kinds.push(scan_kind(name, path)?);
        }
    }
    if tree.kinds.is_empty() {
        return Err(TemplateError::Empty {
            dir: dir.to_owned(),
        });
    }
    Ok(tree)
}

/// `layouts/*.hbs` or `partials/*.hbs`; other files are ignored.
fn scan_shared(folder: &str, dir: &Path) -> Result<Vec<Source>, TemplateError> {
    let mut sources = Vec::new();
    for (name, path) in entries(dir)? {
        if path.is_dir() {
            return Err(invalid(path, "sub-folders are not supported here"));
        }
        let Some(stem) = name.strip_suffix(".hbs") else {
            continue;
        };
        if !is_kind_name(stem) {
            let why = "a partial name may hold only A-Z, a-z, 0-9, '_' and '-'";
            return Err(invalid(path, why));
        }
        sources.push(read(format!("{folder}/{name}"), path)?);
    }
    Ok(sources)
}

fn scan_kind(name: String, dir: PathBuf) -> Result<KindDir, TemplateError> {
    if !is_kind_name(&name) {
        let why = "a template folder name is 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-'";
        return Err(invalid(dir, why));
    }
    let (parts, sample) = read_kind_files(&name, &dir)?;
    let missing = |file| TemplateError::MissingFile {
        dir: dir.clone(),
        file,
    };
    for (part, file) in [(Part::Subject, "subject.hbs"), (Part::Html, "html.hbs")] {
        if !parts
            .iter()
            .any(|(p, locale, _)| *p == part && locale.is_none())
        {
            return Err(missing(file));
        }
    }
    let sample = sample.ok_or_else(|| missing("sample.json"))?;
    Ok(KindDir {
        name,
        parts,
        sample,
    })
}

/// A kind folder's templates (part, lowercased locale, text) and its sample, if any.
type KindFiles = (Vec<(Part, Option<String>, Source)>, Option<Source>);

/// The templates and the `sample.json` of the kind folder `dir`, each read; a sub-folder or a
/// `.hbs` file of another name is refused.
fn read_kind_files(name: &str, dir: &Path) -> Result<KindFiles, TemplateError> {
    let mut parts = Vec::new();
    let mut sample = None;
    for (file, path) in entries(dir)? {
        if path.is_dir() {
            let why = "sub-folders are not supported in a template folder";
            return Err(invalid(path, why));
        }
        let rel = format!("{name}/{file}");
        if file == "sample.json" {
            sample = Some(read(rel, path)?);
        } else if file.ends_with(".hbs") {
            let Some((part, locale)) = parse_file_name(&file) else {
                let why = "expected subject.hbs, html.hbs or text.hbs, optionally with a locale \
                           such as html.fr.hbs or html.pt-BR.hbs";
                return Err(invalid(path, why));
            };
            parts.push((part, locale, read(rel, path)?));
        }
    }
    Ok((parts, sample))
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
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Source { rel, path, text }),
        Err(error) => Err(TemplateError::Io { path, error }),
    }
}

fn invalid(path: PathBuf, message: &str) -> TemplateError {
    TemplateError::Invalid {
        path,
        line: None,
        message: message.to_owned(),
    }
}
