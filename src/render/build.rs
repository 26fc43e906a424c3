//! From files read to a checked [`Templates`]: compiles each file, runs the lint checks,
//! registers the results in the HTML and plain registries, hashes the revision, and renders
//! every kind's sample.

use std::collections::BTreeMap;

use handlebars::Handlebars;
use handlebars::template::Template;
use serde_json::Value;

use super::helpers::UrlHelper;
use super::lint::{self, Partials};
use super::scan::{KindDir, Part, Source, Tree};
use super::{Kind, TemplateError, Templates, Variants};

/// Compiles and checks `tree`, then proves every kind renders its sample.
pub(super) fn build(tree: Tree) -> Result<Templates, TemplateError> {
    let mut html = registry(true);
    let mut plain = registry(false);
    let mut partials = Partials::default();
    for source in &tree.shared {
        let name = source.rel.trim_end_matches(".hbs");
        let template = compile(name, source, &source.text)?;
        lint::no_raw_output(&template, &source.path)?;
        partials.add_partial(name, &template, &source.path)?;
        html.register_template(name, template.clone());
        plain.register_template(name, template);
    }
    let mut kinds = BTreeMap::new();
    for dir in &tree.kinds {
        let kind = build_kind(dir, &mut html, &mut plain, &mut partials)?;
        kinds.insert(dir.name.clone(), kind);
    }
    partials.check()?;
    let templates = Templates {
        html,
        plain,
        kinds,
        revision: revision(&tree),
    };
    check_samples(&templates, &tree)?;
    Ok(templates)
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

fn build_kind(
    dir: &KindDir,
    html: &mut Handlebars<'static>,
    plain: &mut Handlebars<'static>,
    partials: &mut Partials,
) -> Result<Kind, TemplateError> {
    let mut kind = Kind {
        subject: Variants::default(),
        html: Variants::default(),
        text: Variants::default(),
        sample: parse_sample(&dir.sample)?,
    };
    for (part, locale, source) in &dir.parts {
        // A subject file's final newline is the editor's, not part of the header.
        let text = match part {
            Part::Subject => source.text.trim(),
            Part::Html | Part::Text => &source.text,
        };
        let template = compile(&source.rel, source, text)?;
        partials.add_template(&template, &source.path)?;
        let (registry, variants) = match part {
            Part::Subject => (&mut *plain, &mut kind.subject),
            Part::Text => (&mut *plain, &mut kind.text),
            Part::Html => {
                lint::no_raw_output(&template, &source.path)?;
                (&mut *html, &mut kind.html)
            }
        };
        take_slot(variants, locale.as_deref(), source)?;
        registry.register_template(&source.rel, template);
    }
    Ok(kind)
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

/// Renders every kind with its sample, once per locale it has a variant for and once without.
fn check_samples(templates: &Templates, tree: &Tree) -> Result<(), TemplateError> {
    for dir in &tree.kinds {
        let kind = &templates.kinds[&dir.name];
        let locales = std::iter::once(None).chain(kind.locales().into_iter().map(Some));
        for locale in locales {
            if let Err(error) = templates.render(&dir.name, locale, &kind.sample) {
                return Err(TemplateError::Sample {
                    path: dir.sample.path.clone(),
                    locale: locale.map(str::to_owned),
                    error: Box::new(error),
                });
            }
        }
    }
    Ok(())
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
        message: message.to_owned(),
    }
}
