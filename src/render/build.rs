//! From files read to a checked [`Templates`]: compiles each file, runs the lint checks,
//! registers the results in the HTML and plain registries, hashes the revision, and renders
//! every kind's sample.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use handlebars::Handlebars;
use handlebars::template::Template;
use serde_json::Value;

use super::helpers::UrlHelper;
use super::lint::{self, Partials};
use super::scan::{KindDir, Part, Source, Tree};
use super::{Kind, RenderError, TemplateError, Templates, Variants};

/// Compiles and checks `tree`, then proves every kind renders its sample. `errors` holds what
/// scanning found; every further error is added, and any error at all refuses the set.
pub(super) fn build(
    tree: Tree,
    mut errors: Vec<TemplateError>,
) -> Result<Templates, Vec<TemplateError>> {
    let mut html = registry(true);
    let mut plain = registry(false);
    let mut partials = Partials::default();
    for source in &tree.shared {
        let name = source.rel.trim_end_matches(".hbs");
        let template = match compile(name, source, &source.text) {
            Ok(template) => template,
            Err(e) => {
                errors.push(e);
                // Registered empty, so the kinds that use it still render and show their own errors.
                partials.add_broken(name, &source.path);
                Template::new()
            }
        };
        errors.extend(lint::no_raw_output(&template, &source.path).err());
        errors.extend(partials.add_partial(name, &template, &source.path).err());
        html.register_template(name, template.clone());
        plain.register_template(name, template);
    }
    let mut kinds = BTreeMap::new();
    for dir in &tree.kinds {
        let kind = build_kind(dir, &mut html, &mut plain, &mut partials, &mut errors);
        kinds.insert(dir.name.clone(), kind);
    }
    errors.extend(partials.check());
    let templates = Templates {
        html,
        plain,
        kinds,
        revision: revision(&tree),
    };
    if !partials.may_recurse() {
        errors.extend(check_samples(&templates, &tree));
    }
    if errors.is_empty() {
        Ok(templates)
    } else {
        Err(errors)
    }
}

/// A strict registry; `escape_html` for the HTML part, plain text otherwise.
fn registry(escape_html: bool) -> Handlebars<'static> {
    let mut registry = Handlebars::new();
    registry.set_strict_mode(true);
    if !escape_html {
        registry.register_escape_fn(handlebars::no_escape);
    }
    // `{{log}}` would copy job data (names, addresses) into the service's own log.
    registry.unregister_helper("log");
    registry.register_helper("url", Box::new(UrlHelper));
    registry
}

/// One kind's templates compiled and registered; a file that fails adds its error and is left
/// out, so a locale variant falls back to the default and the other files are still checked.
fn build_kind(
    dir: &KindDir,
    html: &mut Handlebars<'static>,
    plain: &mut Handlebars<'static>,
    partials: &mut Partials,
    errors: &mut Vec<TemplateError>,
) -> Kind {
    let sample = parse_sample(&dir.sample).unwrap_or_else(|e| {
        errors.push(e);
        Value::Null
    });
    let mut kind = Kind {
        subject: Variants::default(),
        html: Variants::default(),
        text: Variants::default(),
        sample,
    };
    for (part, locale, source) in &dir.parts {
        // A subject file's final newline is the editor's, not part of the header.
        let text = match part {
            Part::Subject => source.text.trim(),
            Part::Html | Part::Text => &source.text,
        };
        let template = match compile(&source.rel, source, text) {
            Ok(template) => template,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        errors.extend(partials.add_template(&template, &source.path).err());
        let (registry, variants) = match part {
            Part::Subject => (&mut *plain, &mut kind.subject),
            Part::Text => (&mut *plain, &mut kind.text),
            Part::Html => {
                errors.extend(lint::no_raw_output(&template, &source.path).err());
                (&mut *html, &mut kind.html)
            }
        };
        match take_slot(variants, locale.as_deref(), source) {
            Ok(()) => registry.register_template(&source.rel, template),
            Err(e) => errors.push(e),
        }
    }
    kind
}

/// Names `source` as the template of its part and locale; one file per part and locale.
fn take_slot(
    variants: &mut Variants,
    locale: Option<&str>,
    source: &Source,
) -> Result<(), TemplateError> {
    let slot = match locale {
        Some(tag) => variants.locales.entry(tag.to_string()).or_default(),
        None => variants.default.get_or_insert_default(),
    };
    if !slot.is_empty() {
        return Err(invalid(
            source,
            "another file already has this part and locale",
        ));
    }
    slot.clone_from(&source.rel);
    Ok(())
}

fn compile(name: &str, source: &Source, text: &str) -> Result<Template, TemplateError> {
    Template::compile_with_name(text, name.to_owned()).map_err(|e| TemplateError::Syntax {
        path: source.path.clone(),
        line: e.pos().map(|(line, _)| line),
        column: e.pos().map(|(_, column)| column),
        message: e.reason().to_string(),
    })
}

fn parse_sample(source: &Source) -> Result<Value, TemplateError> {
    let sample: Value =
        serde_json::from_str(&source.text).map_err(|error| TemplateError::SampleJson {
            path: source.path.clone(),
            error,
        })?;
    if !sample.is_object() {
        return Err(invalid(
            source,
            "a sample must be a JSON object, like a job's data",
        ));
    }
    Ok(sample)
}

/// Renders every template of every kind with the kind's sample: each part on its own, so an
/// error in the subject does not hide one in the HTML; each file once, picked as a job without
/// a locale and then one per locale the kind has would pick it. A kind whose sample.json did
/// not parse is skipped (its error is already reported).
fn check_samples(templates: &Templates, tree: &Tree) -> Vec<TemplateError> {
    let mut errors = Vec::new();
    for dir in &tree.kinds {
        let kind = &templates.kinds[&dir.name];
        if !kind.sample.is_object() {
            continue;
        }
        let mut rendered = BTreeSet::new();
        let locales = std::iter::once(None).chain(kind.locales().into_iter().map(Some));
        for locale in locales {
            let chain = super::locale_chain(locale);
            for (registry, variants) in [
                (&templates.plain, &kind.subject),
                (&templates.html, &kind.html),
                (&templates.plain, &kind.text),
            ] {
                let Some(name) = variants.pick(&chain) else {
                    continue;
                };
                if !rendered.insert(name) {
                    continue;
                }
                let is_subject = std::ptr::eq(variants, &kind.subject);
                if let Err(error) = render_part(registry, &dir.name, name, &kind.sample, is_subject)
                {
                    errors.push(TemplateError::Sample {
                        path: dir.sample.path.clone(),
                        locale: locale.map(str::to_owned),
                        template: failed_file(tree, &dir.name, &error, name),
                        error: Box::new(error),
                    });
                }
            }
        }
    }
    errors
}

/// One template of `kind` rendered with `sample`; a subject also goes through the header check.
fn render_part(
    registry: &Handlebars<'static>,
    kind: &str,
    name: &str,
    sample: &Value,
    is_subject: bool,
) -> Result<(), RenderError> {
    let text = registry
        .render(name, sample)
        .map_err(|e| super::error::from_handlebars(kind, name, &e))?;
    if is_subject {
        super::checked_subject(kind, Some(text))?;
    }
    Ok(())
}

/// The path of the file a render error happened in: the kind's own, or a shared layout or
/// partial it includes; else the template rendered (`name`).
fn failed_file(tree: &Tree, kind: &str, error: &RenderError, name: &str) -> PathBuf {
    let rel = match error {
        RenderError::Template { file, .. }
            if file.starts_with("layouts/") || file.starts_with("partials/") =>
        {
            file.clone()
        }
        RenderError::Template { file, .. } => format!("{kind}/{file}"),
        _ => name.to_owned(),
    };
    let kind_sources = tree
        .kinds
        .iter()
        .flat_map(|k| k.parts.iter().map(|(_, _, s)| s));
    tree.shared
        .iter()
        .chain(kind_sources)
        .find(|s| s.rel == rel || s.rel == name)
        .map(|s| s.path.clone())
        .unwrap_or_else(|| PathBuf::from(rel))
}

/// FNV-1a (64 bit) over every file's relative path and bytes, in path order: stable across
/// processes and machines, unlike std's randomly keyed hasher.
fn revision(tree: &Tree) -> String {
    let mut sources: Vec<&Source> = tree.shared.iter().collect();
    for dir in &tree.kinds {
        sources.extend(dir.parts.iter().map(|(_, _, source)| source));
        sources.push(&dir.sample);
    }
    sources.sort_by(|a, b| a.rel.cmp(&b.rel));
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for source in sources {
        let len = (source.text.len() as u64).to_le_bytes();
        // The length and separator keep ("a", "bc") and ("ab", "c") apart.
        for field in [source.rel.as_bytes(), &[0], &len, source.text.as_bytes()] {
            for &byte in field {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    format!("{hash:016x}")
}

fn invalid(source: &Source, message: &str) -> TemplateError {
    TemplateError::Invalid {
        path: source.path.clone(),
        line: None,
        column: None,
        message: message.to_owned(),
    }
}
