//! Errors of loading and rendering templates. Their text goes into log lines and dead-letter
//! headers that operators read, so it names the kind, file, line and variable, and never carries
//! rendered content or data values.

use std::io;
use std::path::PathBuf;

use handlebars::RenderErrorReason;

/// Why one job's email could not be rendered. Every variant is permanent for that job: the same
/// data and templates fail the same way on retry.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The set has no folder for this kind.
    #[error("no template for kind {kind:?}")]
    UnknownKind { kind: String },
    /// A template failed on this data, most often a variable the job data lacks.
    #[error("template {kind:?} {file}{}: {message}", at_line(.line))]
    Template {
        kind: String,
        /// The file within the kind's folder (`html.fr.hbs`), or a shared one (`layouts/base.hbs`).
        file: String,
        line: Option<usize>,
        column: Option<usize>,
        /// E.g. `variable "order.total" not found in the job data`.
        message: String,
    },
    /// The rendered subject holds CR, LF or another control character.
    #[error(
        "template {kind:?} rendered a subject containing {what}; refused, as it could inject mail headers"
    )]
    HeaderInjection {
        kind: String,
        /// E.g. `a line feed (U+000A) at character 17`.
        what: String,
    },
}

/// Why a template directory was refused. The previous set, if any, stays in use.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    /// Handlebars could not parse the file.
    #[error("{}{}: {message}", path.display(), at_line(.line))]
    Syntax {
        path: PathBuf,
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    /// The file parses but is not allowed: an unknown or recursive partial, unescaped output in
    /// HTML, a misnamed file or folder, a sample that is not an object.
    #[error("{}{}: {message}", path.display(), at_line(.line))]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    /// A kind folder lacks `subject.hbs`, `html.hbs` or `sample.json`.
    #[error("{}: template folder has no {file}", dir.display())]
    MissingFile { dir: PathBuf, file: &'static str },
    #[error("{}: not valid JSON: {error}", path.display())]
    SampleJson {
        path: PathBuf,
        error: serde_json::Error,
    },
    /// A kind does not render its own `sample.json`.
    #[error("{} does not render{}: {error}", path.display(), for_locale(.locale))]
    Sample {
        path: PathBuf,
        locale: Option<String>,
        error: Box<RenderError>,
        /// The template file that failed (the kind's own, or a shared layout or partial).
        template: PathBuf,
    },
    #[error("{}: no template folders found", dir.display())]
    Empty { dir: PathBuf },
}

impl TemplateError {
    /// The error as a compiler states it, `path:line:column: message`, for `templates check`
    /// and editors that jump to it: a sample that does not render points at the template line
    /// that failed.
    pub fn located(&self) -> String {
        let (path, line, column, message) = match self {
            TemplateError::Syntax {
                path,
                line,
                column,
                message,
            }
            | TemplateError::Invalid {
                path,
                line,
                column,
                message,
            } => (path, *line, *column, message.clone()),
            TemplateError::SampleJson { path, error } => (
                path,
                Some(error.line()),
                Some(error.column()),
                format!("not valid JSON: {error}"),
            ),
            TemplateError::Sample {
                locale,
                error,
                template,
                ..
            } => {
                let (line, column, what) = match error.as_ref() {
                    RenderError::Template {
                        line,
                        column,
                        message,
                        ..
                    } => (*line, *column, message.clone()),
                    other => (None, None, other.to_string()),
                };
                let with = for_locale(locale);
                let message = format!("{what} (rendering sample.json{with})");
                (template, line, column, message)
            }
            other => return other.to_string(),
        };
        let at: String = [line, column]
            .into_iter()
            .map_while(|n| n.map(|n| format!(":{n}")))
            .collect();
        format!("{}{at}: {message}", path.display())
    }

    /// The file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            TemplateError::Io { path, .. }
            | TemplateError::Syntax { path, .. }
            | TemplateError::Invalid { path, .. }
            | TemplateError::SampleJson { path, .. } => path,
            TemplateError::Sample { template, .. } => template,
            TemplateError::MissingFile { dir, .. } | TemplateError::Empty { dir } => dir,
        }
    }
}

fn at_line(line: &Option<usize>) -> String {
    line.map(|n| format!(" line {n}")).unwrap_or_default()
}

fn for_locale(locale: &Option<String>) -> String {
    locale
        .as_ref()
        .map(|l| format!(" with locale {l:?}"))
        .unwrap_or_default()
}

/// Converts a handlebars failure while rendering registry template `name` of `kind`.
pub(super) fn from_handlebars(
    kind: &str,
    name: &str,
    error: &handlebars::RenderError,
) -> RenderError {
    let failed_in = error.template_name.as_deref().unwrap_or(name);
    RenderError::Template {
        kind: kind.to_owned(),
        file: file_of(kind, failed_in),
        line: error.line_no,
        column: error.column_no,
        message: describe(error.reason()),
    }
}

/// Registry names are `<kind>/<file>` for a kind's templates and `layouts/<name>` or
/// `partials/<name>` for shared ones.
fn file_of(kind: &str, name: &str) -> String {
    match name
        .strip_prefix(kind)
        .and_then(|rest| rest.strip_prefix('/'))
    {
        Some(file) => file.to_owned(),
        None => format!("{name}.hbs"),
    }
}

fn describe(reason: &RenderErrorReason) -> String {
    match reason {
        RenderErrorReason::MissingVariable(Some(path)) => {
            format!("variable {path:?} not found in the job data")
        }
        RenderErrorReason::MissingVariable(None) => {
            "a value a helper needs is missing from the job data".to_owned()
        }
        other => other.to_string(),
    }
}
