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

/// The partial a template refers to at a line; `None` for a name computed at render time.
type Reference = (Option<String>, Option<usize>);

/// Collects every template's partial references, then checks them all at once.
#[derive(Default)]
pub(super) struct Partials {
    /// Registered partial name → the partials it includes.
    graph: BTreeMap<String, BTreeSet<String>>,
    paths: BTreeMap<String, PathBuf>,
    uses: Vec<(PathBuf, Vec<Reference>)>,
}

impl Partials {
    /// Records a layout or partial, registered as `name`.
    pub fn add_partial(
        &mut self,
        name: &str,
        template: &Template,
        path: &Path,
    ) -> Result<(), TemplateError> {
        let refs = references(template, path)?;
        let includes = refs.iter().filter_map(|(n, _)| n.clone()).collect();
        self.graph.insert(name.to_owned(), includes);
        self.paths.insert(name.to_owned(), path.to_owned());
        self.uses.push((path.to_owned(), refs));
        Ok(())
    }

    /// Records a kind's template.
    pub fn add_template(&mut self, template: &Template, path: &Path) -> Result<(), TemplateError> {
        let refs = references(template, path)?;
        self.uses.push((path.to_owned(), refs));
        Ok(())
    }

    /// Every reference resolves to a registered partial, and none recurses.
    pub fn check(&self) -> Result<(), TemplateError> {
        for (path, refs) in &self.uses {
            for (name, line) in refs {
                let message = match name {
                    None => "a partial name computed at render time is not allowed".to_owned(),
                    Some(n) if n == "@partial-block" => continue,
                    Some(n) if self.graph.contains_key(n) => continue,
                    Some(n) => format!(
                        "partial {n:?} does not exist; shared partials are layouts/<name> and \
                         partials/<name>, one per .hbs file"
                    ),
                };
                return Err(invalid(path, *line, message));
            }
        }
        self.check_cycles()
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
    visit(template, &mut |element, line| {
        if found.is_none() && matches!(element, TemplateElement::HtmlExpression(_)) {
            found = Some(line);
        }
    });
    match found {
        Some(line) => Err(invalid(
            path,
            line,
            "{{{…}}} and {{&…}} skip HTML escaping and are not allowed; use {{…}}".to_owned(),
        )),
        None => Ok(()),
    }
}

/// The partials `template` includes; refuses decorators (`{{#*inline}}`).
fn references(template: &Template, path: &Path) -> Result<Vec<Reference>, TemplateError> {
    let mut refs = Vec::new();
    let mut decorator = None;
    visit(template, &mut |element, line| match element {
        TemplateElement::PartialExpression(d) | TemplateElement::PartialBlock(d) => {
            refs.push((d.name.as_name().map(str::to_owned), line));
        }
        TemplateElement::DecoratorExpression(_) | TemplateElement::DecoratorBlock(_) => {
            decorator.get_or_insert(line);
        }
        _ => {}
    });
    match decorator {
        Some(line) => Err(invalid(
            path,
            line,
            "decorators such as {{#*inline}} are not supported; put a shared piece in \
             partials/<name>.hbs"
                .to_owned(),
        )),
        None => Ok(refs),
    }
}

/// Calls `f` on every element of `template` and its nested blocks, with its line.
fn visit(template: &Template, f: &mut dyn FnMut(&TemplateElement, Option<usize>)) {
    for (index, element) in template.elements.iter().enumerate() {
        f(element, template.mapping.get(index).map(|m| m.0));
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

fn invalid(path: &Path, line: Option<usize>, message: String) -> TemplateError {
    TemplateError::Invalid {
        path: path.to_owned(),
        line,
        message,
    }
}
