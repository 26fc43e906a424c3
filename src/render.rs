//! Rendering: turns a job's kind, locale and data into a subject, an HTML part and an optional
//! text part, using the Handlebars templates of one directory (docs/OPERATING.md, "Templates").
//!
//! ```text
//! templates/<kind>/subject.hbs, html.hbs, text.hbs (optional), sample.json
//! templates/<kind>/subject.fr.hbs, html.fr.hbs, text.fr.hbs   locale variants, each optional
//! templates/layouts/*.hbs, templates/partials/*.hbs           shared: {{> partials/footer}}
//! ```
//!
//! Two registries: the HTML part escapes every `{{value}}`; the subject and text part are plain
//! text and do not (no `&amp;` in a subject). Both are strict: a variable missing from the job data
//! is an error, never an empty string. Loading compiles every file, refuses constructs that would
//! bypass escaping or recurse, and renders every kind with its `sample.json`, so a set that loads
//! renders any job whose data has the sample's shape. Rendering looks the kind up in memory only:
//! a kind name never becomes a path.
//!
//! Loading is the only I/O. [`LiveTemplates`] picks up edits without a restart: it calls
//! [`Templates::load`] again when the directory changes and swaps the shared `Arc` only when it
//! succeeds; the last good set keeps sending meanwhile.

mod build;
mod error;
pub mod file;
mod helpers;
mod lint;
mod live;
mod scan;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use handlebars::{Context, Handlebars};
use serde_json::Value;

pub use error::{RenderError, TemplateError};
pub use live::LiveTemplates;

/// A compiled, validated set of templates loaded from one directory.
pub struct Templates {
    /// Registry of the HTML parts, layouts and partials, with HTML escaping.
    html: Handlebars<'static>,
    /// Registry of the subjects and text parts (and the same layouts and partials), unescaped.
    plain: Handlebars<'static>,
    kinds: BTreeMap<String, Kind>,
    revision: String,
}

// The worker shares one set across tokio tasks in an `Arc`; fail the build, not the deploy.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<Templates>();
};

/// One email as rendered, ready to become a MIME message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedEmail {
    /// Trimmed, and free of control characters.
    pub subject: String,
    pub html: String,
    /// `None` when the kind has no text template for this locale or the default one.
    pub text: Option<String>,
}

/// The templates of one kind, as registry names, and its sample data.
struct Kind {
    subject: Variants,
    html: Variants,
    text: Variants,
    sample: Value,
}

/// Registry names of one part of a kind: the default file and its locale variants.
#[derive(Default)]
struct Variants {
    default: Option<String>,
    /// Keyed by lowercased language tag, e.g. `pt-br`.
    locales: BTreeMap<String, String>,
}

impl Variants {
    /// The most specific variant in `chain`, else the default.
    fn pick(&self, chain: &[String]) -> Option<&str> {
        chain
            .iter()
            .find_map(|tag| self.locales.get(tag))
            .or(self.default.as_ref())
            .map(String::as_str)
    }
}

impl Kind {
    /// Every locale any part of this kind has a variant for.
    fn locales(&self) -> BTreeSet<&str> {
        [&self.subject, &self.html, &self.text]
            .into_iter()
            .flat_map(|v| v.locales.keys().map(String::as_str))
            .collect()
    }
}

impl Templates {
    /// Loads every `<dir>/<kind>/` folder, plus `<dir>/layouts/*.hbs` and `<dir>/partials/*.hbs`,
    /// compiles all, then renders every kind with its `sample.json` (every locale variant too) in
    /// strict mode; any failure is an error naming the file (and line where handlebars gives one).
    pub fn load(dir: &Path) -> Result<Templates, TemplateError> {
        Templates::check(dir).map_err(|mut errors| errors.swap_remove(0))
    }

    /// [`Templates::load`], with every error instead of the first: each file that does not
    /// read, compile or pass the checks, and each template that does not render its kind's
    /// sample (every part on its own), in the order `load` meets them. For `templates check`.
    pub fn check(dir: &Path) -> Result<Templates, Vec<TemplateError>> {
        let (tree, errors) = scan::scan(dir).map_err(|e| vec![e])?;
        build::build(tree, errors)
    }

    /// The kinds this set can render, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.kinds.keys().cloned().collect()
    }

    /// Whether `kind` has templates in this set.
    pub fn contains(&self, kind: &str) -> bool {
        self.kinds.contains_key(kind)
    }

    /// Renders one email. `locale` picks a variant per part (`pt-BR` falls back to `pt`, then to
    /// the default file); `data` is the job's data object, given to the templates as it is.
    pub fn render(
        &self,
        kind: &str,
        locale: Option<&str>,
        data: &Value,
    ) -> Result<RenderedEmail, RenderError> {
        let templates = self
            .kinds
            .get(kind)
            .ok_or_else(|| RenderError::UnknownKind {
                kind: kind.to_owned(),
            })?;
        let chain = locale_chain(locale);
        // One copy of the data for the three parts (`Handlebars::render` copies it for each).
        let context = Context::from(data.clone());
        let part = |registry: &Handlebars<'static>, variants: &Variants| {
            variants
                .pick(&chain)
                .map(|name| {
                    registry
                        .render_with_context(name, &context)
                        .map_err(|e| error::from_handlebars(kind, name, &e))
                })
                .transpose()
        };
        // `load` guarantees a default subject and html, so `unwrap_or_default` never applies.
        let subject = checked_subject(kind, part(&self.plain, &templates.subject)?)?;
        let html = part(&self.html, &templates.html)?.unwrap_or_default();
        let text = part(&self.plain, &templates.text)?;
        Ok(RenderedEmail {
            subject,
            html,
            text,
        })
    }

    /// The sample data of one kind (from `sample.json`).
    pub fn sample(&self, kind: &str) -> Option<&Value> {
        self.kinds.get(kind).map(|k| &k.sample)
    }

    /// Content hash (16 hex digits of FNV-1a over every file read, sorted by path) identifying
    /// this revision of the template set; equal directories give equal revisions.
    pub fn revision(&self) -> &str {
        &self.revision
    }
}

impl fmt::Debug for Templates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Templates")
            .field("kinds", &self.kinds.keys().collect::<Vec<_>>())
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

/// `Some("pt-BR")` → `["pt-br", "pt"]`: the tags to try, most specific first.
fn locale_chain(locale: Option<&str>) -> Vec<String> {
    let mut tag = locale
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
        .replace('_', "-");
    let mut chain = Vec::new();
    while !tag.is_empty() {
        chain.push(tag.clone());
        tag.truncate(tag.rfind('-').unwrap_or(0));
    }
    chain
}

/// Refuses a subject holding any control character, then trims it. The subject template itself
/// is trimmed at load, so a CR or LF here came from the data (or a multi-line template) and is
/// refused rather than stripped: stripping would hide the attempt.
fn checked_subject(kind: &str, subject: Option<String>) -> Result<String, RenderError> {
    let subject = subject.unwrap_or_default();
    if let Some((at, c)) = subject.chars().enumerate().find(|(_, c)| c.is_control()) {
        let name = match c {
            '\r' => "a carriage return",
            '\n' => "a line feed",
            '\0' => "a NUL",
            '\t' => "a tab",
            _ => "a control character",
        };
        return Err(RenderError::HeaderInjection {
            kind: kind.to_owned(),
            what: format!("{name} (U+{:04X}) at character {}", u32::from(c), at + 1),
        });
    }
    Ok(subject.trim().to_owned())
}
