//! Refusals at load time: each names the file, and the line where there is one.

use super::{fixture, fixture_with, load_error};
use crate::render::{TemplateError, Templates};

#[test]
fn syntax_error_names_file_and_line() {
    let text = load_error(&[("k/html.hbs", "<p>\n  Hello {{#if name}}\n</p>\n")]);
    assert!(text.starts_with("<dir>/k/html.hbs line "), "{text}");
    let text = load_error(&[("k/text.hbs", "one\ntwo {{name}\n")]);
    assert!(
        text.starts_with("<dir>/k/text.hbs line 2: invalid handlebars syntax"),
        "{text}"
    );
}

#[test]
fn sample_that_does_not_render_names_sample_and_template() {
    let text = load_error(&[("k/html.hbs", "<p>Hello</p>\n<p>{{nmae}}</p>\n")]);
    assert_eq!(
        text,
        "<dir>/k/sample.json does not render: template \"k\" html.hbs line 2: \
         variable \"nmae\" not found in the job data"
    );
}

#[test]
fn sample_is_rendered_with_every_locale_variant() {
    let text = load_error(&[("k/html.de.hbs", "<p>Hallo {{vorname}}</p>")]);
    assert_eq!(
        text,
        "<dir>/k/sample.json does not render with locale \"de\": template \"k\" html.de.hbs \
         line 1: variable \"vorname\" not found in the job data"
    );
}

#[test]
fn sample_whose_subject_has_a_newline_is_refused() {
    let text = load_error(&[("k/subject.hbs", "Hello\n{{name}}\n")]);
    assert!(
        text.contains("a line feed (U+000A) at character 6"),
        "{text}"
    );
}

#[test]
fn kind_folder_without_its_required_files_is_refused() {
    for (missing, file) in [
        ("k/html.hbs", "html.hbs"),
        ("k/subject.hbs", "subject.hbs"),
        ("k/sample.json", "sample.json"),
    ] {
        let files: Vec<_> = super::MINIMAL
            .into_iter()
            .filter(|(rel, _)| *rel != missing)
            .collect();
        let dir = fixture(&files);
        let error = Templates::load(dir.path()).unwrap_err();
        assert!(
            matches!(&error, TemplateError::MissingFile { file: f, .. } if *f == file),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .ends_with(&format!("/k: template folder has no {file}"))
        );
    }
}

#[test]
fn unescaped_output_in_html_is_refused() {
    let text = load_error(&[("k/html.hbs", "<p>\n{{{name}}}</p>")]);
    assert!(text.starts_with("<dir>/k/html.hbs line 2: {{{…}}} and {{&…}} skip HTML escaping"));
    let text = load_error(&[("partials/x.hbs", "{{& name}}")]);
    assert!(
        text.starts_with("<dir>/partials/x.hbs line 1: {{{…}}}"),
        "{text}"
    );
}

#[test]
fn misspelt_partial_is_refused() {
    let text = load_error(&[(
        "k/html.hbs",
        "<p>Hello {{name}}</p>\n{{#> layouts/bsae}}<p>x</p>{{/layouts/bsae}}",
    )]);
    assert!(
        text.starts_with("<dir>/k/html.hbs line 2: partial \"layouts/bsae\" does not exist"),
        "{text}"
    );
}

#[test]
fn partials_that_include_each_other_are_refused() {
    let text = load_error(&[
        ("partials/a.hbs", "{{> partials/b}}"),
        ("partials/b.hbs", "{{> partials/a}}"),
    ]);
    assert_eq!(
        text,
        "<dir>/partials/a.hbs: partials include each other in a loop: \
         partials/a → partials/b → partials/a"
    );
}

#[test]
fn partial_named_at_render_time_is_refused() {
    let text = load_error(&[(
        "k/html.hbs",
        "<p>{{name}}</p>\n{{> (lookup this \"name\")}}",
    )]);
    assert_eq!(
        text,
        "<dir>/k/html.hbs line 2: a partial name computed at render time is not allowed"
    );
}

#[test]
fn inline_partials_are_refused() {
    let text = load_error(&[(
        "k/html.hbs",
        "{{#*inline \"row\"}}{{> row}}{{/inline}}{{> row}}",
    )]);
    assert!(
        text.contains("decorators such as {{#*inline}} are not supported"),
        "{text}"
    );
}

#[test]
fn misnamed_files_and_folders_are_refused() {
    let text = load_error(&[("k/htm.hbs", "x")]);
    assert!(text.starts_with("<dir>/k/htm.hbs: expected subject.hbs, html.hbs or text.hbs"));
    let text = load_error(&[("k/html.pt_BR.hbs", "x")]);
    assert!(
        text.starts_with("<dir>/k/html.pt_BR.hbs: expected"),
        "{text}"
    );
    let text = load_error(&[("bad kind/html.hbs", "x")]);
    assert!(
        text.starts_with("<dir>/bad kind: a template folder name"),
        "{text}"
    );
    let text = load_error(&[("k/sample.json", "[1, 2]")]);
    assert!(
        text.ends_with("a sample must be a JSON object, like a job's data"),
        "{text}"
    );
}

#[test]
fn stray_files_and_hidden_entries_are_ignored() {
    let dir = fixture_with(&[
        ("README.md", "# templates"),
        ("k/notes.txt", "draft"),
        ("k/.html.hbs.swp", "{{{"),
        (".git/HEAD", "ref"),
    ]);
    assert_eq!(Templates::load(dir.path()).unwrap().kinds(), ["k"]);
}

#[test]
fn empty_or_absent_directory_is_refused() {
    let dir = fixture(&[("README.md", "nothing here")]);
    let error = Templates::load(dir.path()).unwrap_err();
    assert!(matches!(error, TemplateError::Empty { .. }), "{error}");

    let error = Templates::load(&dir.path().join("absent")).unwrap_err();
    assert!(matches!(error, TemplateError::Io { .. }), "{error}");
    assert!(error.to_string().starts_with("cannot read "), "{error}");
}

#[test]
fn check_reports_every_error_of_every_template_with_line_and_column() {
    let dir = fixture_with(&[
        ("k/text.hbs", "Hello\n  {{nmae}}\n"),
        ("k/html.fr.hbs", "<p>\n  {{#if name}}\n</p>\n"),
        ("j/subject.hbs", "Hi {{first}}\n"),
        (
            "j/html.hbs",
            "<p>{{name}}</p>\n<p>{{{raw}}}</p>\n<p>{{last}}</p>\n",
        ),
        ("j/sample.json", r#"{"name": "Ada"}"#),
        ("partials/x.hbs", "{{> partials/nope}}"),
    ]);
    let errors = Templates::check(dir.path()).unwrap_err();
    let located: Vec<String> = errors
        .iter()
        .map(|e| {
            e.located()
                .replace(&dir.path().display().to_string(), "<dir>")
        })
        .collect();
    assert_eq!(
        located,
        [
            "<dir>/j/html.hbs:2:4: {{{…}}} and {{&…}} skip HTML escaping and are not allowed; use {{…}}",
            "<dir>/k/html.fr.hbs:4:1: invalid handlebars syntax: expected escape, expression, \
             html_expression, decorator_expression, partial_expression, invert_tag, \
             invert_chain_tag, helper_block_start, helper_block_end, decorator_block_start, \
             partial_block_start, raw_block_start, hbs_comment, or hbs_comment_compact",
            "<dir>/partials/x.hbs:1:1: partial \"partials/nope\" does not exist; shared partials are \
             layouts/<name> and partials/<name>, one per .hbs file",
            "<dir>/j/subject.hbs:1:4: variable \"first\" not found in the job data (rendering sample.json)",
            "<dir>/j/html.hbs:3:4: variable \"last\" not found in the job data (rendering sample.json)",
            "<dir>/k/text.hbs:2:3: variable \"nmae\" not found in the job data (rendering sample.json)",
        ],
        "{located:#?}"
    );
    let first = Templates::load(dir.path()).unwrap_err();
    assert_eq!(
        first.to_string(),
        errors[0].to_string(),
        "load refuses with the first"
    );
}

#[test]
fn a_broken_file_hides_no_error_of_the_others() {
    let dir = fixture_with(&[
        ("k/subject.hbs", "Hello {{nmae}}\n"),
        ("k/html.hbs", "<p>{{also_missing}}</p>\n"),
        ("partials/broken.hbs", "{{#if x}}"),
        ("bad name/html.hbs", ""),
        ("m/html.hbs", "<p>x</p>"),
    ]);
    let errors = Templates::check(dir.path()).unwrap_err();
    let text: Vec<String> = errors.iter().map(|e| e.located()).collect();
    let has = |needle: &str| text.iter().any(|t| t.contains(needle));
    assert!(has("bad name: a template folder name"), "{text:#?}");
    assert!(has("m: template folder has no subject.hbs"), "{text:#?}");
    assert!(has("m: template folder has no sample.json"), "{text:#?}");
    assert!(has("partials/broken.hbs:"), "{text:#?}");
    assert!(has("k/subject.hbs:1:7: variable \"nmae\""), "{text:#?}");
    assert!(
        has("k/html.hbs:1:4: variable \"also_missing\""),
        "{text:#?}"
    );
    assert_eq!(errors.len(), 6, "{text:#?}");
}
