//! Checks on compiled templates that handlebars itself does not make:
//! - no `{{{raw}}}` or `{{&raw}}` in HTML, layouts or partials: they skip escaping;
//! - every `{{> partial}}` names a file under `layouts/` or `partials/`; handlebars would
//!   silently render a misspelt `{{#> layouts/bsae}}` block without its layout;
//! - no partial includes itself through others, and no inline partials (`{{#*inline}}`), whose
//!   self-reference is harder to see: such recursion overflows the stack and aborts the process,
//!   so it must be refused at load, before a reload reaches the running worker.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use handlebars::template::{Template, TemplateElement};

use super::TemplateError;

/// Where in a file: line and column, from handlebars' mapping.
type At = Option<(usize, usize)>;

/// The partial a template refers to, and where; `None` for a name computed at render time.
type Reference = (Option<String>, At);

/// Collects every template's partial references, then checks them all at once.
#[derive(Default)]
pub(super) struct Partials {
    /// Registered partial name → the partials it includes.
    graph: BTreeMap<String, BTreeSet<String>>,
    paths: BTreeMap<String, PathBuf>,
    uses: Vec<(PathBuf, Vec<Reference>)>,
    /// Whether a template holds a decorator, which may include itself.
    decorators: bool,
}

impl Partials {
    /// Records a layout or partial, registered as `name`.
    pub fn add_partial(
        &mut self,
        name: &str,
        template: &Template,
        path: &Path,
    ) -> Result<(), TemplateError> {
        let refs = self
            .references(template, path)
            .inspect_err(|_| self.add_broken(name, path))?;
        let includes = refs.iter().filter_map(|(n, _)| n.clone()).collect();
        self.graph.insert(name.to_owned(), includes);
        self.paths.insert(name.to_owned(), path.to_owned());
        self.uses.push((path.to_owned(), refs));
        Ok(())
    }

    /// Records a kind's template.
    pub fn add_template(&mut self, template: &Template, path: &Path) -> Result<(), TemplateError> {
        let refs = self.references(template, path)?;
        self.uses.push((path.to_owned(), refs));
        Ok(())
    }

    /// Records a layout or partial that did not compile, so references to it are not reported
    /// as missing on top of its own error.
    pub fn add_broken(&mut self, name: &str, path: &Path) {
        self.graph.insert(name.to_owned(), BTreeSet::new());
        self.paths.insert(name.to_owned(), path.to_owned());
    }

    /// Every reference that resolves to no registered partial, and a loop if there is one.
    pub fn check(&self) -> Vec<TemplateError> {
        let mut errors = Vec::new();
        for (path, refs) in &self.uses {
            for (name, at) in refs {
                let message = match name {
                    None => "a partial name computed at render time is not allowed".to_owned(),
                    Some(n) if n == "@partial-block" => continue,
                    Some(n) if self.graph.contains_key(n) => continue,
                    Some(n) => format!(
                        "partial {n:?} does not exist; shared partials are layouts/<name> and \
                         partials/<name>, one per .hbs file"
                    ),
                };
                errors.push(invalid(path, *at, message));
            }
        }
        errors.extend(self.check_cycles().err());
        errors
    }

    /// Whether rendering could recurse without end (a decorator, or partials in a loop): then
    /// no sample may be rendered, as the recursion would overflow the stack and abort.
    pub fn may_recurse(&self) -> bool {
        self.decorators || self.check_cycles().is_err()
    }

    /// [`references`], noting a decorator.
    fn references(
        &mut self,
        template: &Template,
        path: &Path,
    ) -> Result<Vec<Reference>, TemplateError> {
        let refs = references(template, path);
        self.decorators |= refs.is_err();
        refs
    }

    fn check_cycles(&self) -> Result<(), TemplateError> {
        let mut done = BTreeSet::new();
        for start in self.graph.keys() {
            let mut trail = Vec::new();
            if let Some(cycle) = self.find_cycle(start, &mut trail, &mut done) {
                let message = format!("partials include each other in a loop: {cycle}");
                return Err(invalid(&self.paths[start], None, message));
            }
        }
        Ok(())
    }

    /// Depth-first search; `trail` is the current path, `done` the nodes proven loop-free.
    fn find_cycle<'a>(
        &'a self,
        node: &'a str,
        trail: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(at) = trail.iter().position(|n| *n == node) {
            let mut cycle = trail[at..].to_vec();
            cycle.push(node);
            return Some(cycle.join(" → "));
        }
        if done.contains(node) {
            return None;
        }
        trail.push(node);
        for next in self.graph.get(node).into_iter().flatten() {
            if let Some(cycle) = self.find_cycle(next, trail, done) {
                return Some(cycle);
            }
        }
        trail.pop();
        done.insert(node);
        None
    }
}

/// Refuses `{{{x}}}` and `{{&x}}`, which write job data into HTML unescaped.
pub(super) fn no_raw_output(template: &Template, path: &Path) -> Result<(), TemplateError> {
    let mut found = None;
    visit(template, &mut |element, at| {
        if found.is_none() && matches!(element, TemplateElement::HtmlExpression(_)) {
            found = Some(at);
        }
    });
    match found {
        Some(at) => Err(invalid(
            path,
            at,
            "{{{…}}} and {{&…}} skip HTML escaping and are not allowed; use {{…}}".to_owned(),
        )),
        None => Ok(()),
    }
}

/// The partials `template` includes; refuses decorators (`{{#*inline}}`).
fn references(template: &Template, path: &Path) -> Result<Vec<Reference>, TemplateError> {
    let mut refs = Vec::new();
    let mut decorator = None;
    visit(template, &mut |element, at| match element {
        TemplateElement::PartialExpression(d) | TemplateElement::PartialBlock(d) => {
            refs.push((d.name.as_name().map(str::to_owned), at));
        }
        TemplateElement::DecoratorExpression(_) | TemplateElement::DecoratorBlock(_) => {
            decorator.get_or_insert(at);
        }
        _ => {}
    });
    match decorator {
        Some(at) => Err(invalid(
            path,
            at,
            "decorators such as {{#*inline}} are not supported; put a shared piece in \
             partials/<name>.hbs"
                .to_owned(),
        )),
        None => Ok(refs),
    }
}

/// Calls `f` on every element of `template` and its nested blocks, with its line and column.
fn visit(template: &Template, f: &mut dyn FnMut(&TemplateElement, At)) {
    for (index, element) in template.elements.iter().enumerate() {
        f(element, template.mapping.get(index).map(|m| (m.0, m.1)));
        let nested: Vec<&Template> = match element {
            TemplateElement::HelperBlock(h)
            | TemplateElement::Expression(h)
            | TemplateElement::HtmlExpression(h) => {
                h.template.iter().chain(h.inverse.iter()).collect()
            }
            TemplateElement::DecoratorBlock(d)
            | TemplateElement::DecoratorExpression(d)
            | TemplateElement::PartialBlock(d)
            | TemplateElement::PartialExpression(d) => d.template.iter().collect(),
            _ => Vec::new(),
        };
        for inner in nested {
            visit(inner, f);
        }
    }
}

fn invalid(path: &Path, at: At, message: String) -> TemplateError {
    TemplateError::Invalid {
        path: path.to_owned(),
        line: at.map(|(line, _)| line),
        column: at.map(|(_, column)| column),
        message,
    }
}
