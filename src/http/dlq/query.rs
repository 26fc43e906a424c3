//! What the `/v1/dlq` endpoints take: the listing's query parameters and the body of a replay
//! or purge, each turned into the [`crate::dlq`] value it names, or a 400 naming the field.

use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::super::error;
use crate::dlq::{Class, Cursor, Filter, Selection, SelectionArgs, States, parse_since};

/// Query parameters of the listing and the groups, as the CLI's filters.
#[derive(Debug, Default, Deserialize)]
pub(in crate::http) struct ListQuery {
    kind: Option<String>,
    class: Option<String>,
    /// RFC 3339 time or a duration ago (`2h`).
    since: Option<String>,
    until: Option<String>,
    text: Option<String>,
    /// The former name of `text`.
    grep: Option<String>,
    state: Option<String>,
    cursor: Option<String>,
    pub(super) limit: Option<usize>,
    #[serde(default)]
    pub(super) summary: bool,
}

/// Query parameters of `show`.
#[derive(Debug, Default, Deserialize)]
pub(in crate::http) struct ShowQuery {
    /// Email addresses in full instead of masked.
    #[serde(default)]
    pub(super) reveal: bool,
}

/// The body of a replay or purge: exactly one selection.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::http) struct SelectionBody {
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    rows: Vec<i64>,
    group: Option<String>,
    kind: Option<String>,
    class: Option<String>,
    text: Option<String>,
    since: Option<String>,
    until: Option<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    pub(super) dry_run: bool,
    #[serde(default)]
    pub(super) delete: bool,
}

type Refused = Box<Response>;

fn bad(field: &str, message: &str) -> Refused {
    Box::new(error(StatusCode::BAD_REQUEST, Some(field), message))
}

/// The class a filter names, if any; an unknown one is a 400 that lists the classes.
fn class(given: Option<&str>) -> Result<Option<Class>, Refused> {
    given
        .map(str::parse::<Class>)
        .transpose()
        .map_err(|e| bad("class", &e.to_string()))
}

fn time(
    field: &str,
    given: Option<&str>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, Refused> {
    given
        .map(parse_since)
        .transpose()
        .map_err(|e| bad(field, &e))
}

impl ListQuery {
    /// The filter and the cursor these parameters name.
    pub(super) fn filter(&self) -> Result<(Filter, Option<Cursor>), Refused> {
        let state = match &self.state {
            Some(s) => s.parse::<States>().map_err(|e| bad("state", &e))?,
            None => States::Dead,
        };
        let cursor = self
            .cursor
            .as_deref()
            .map(str::parse::<Cursor>)
            .transpose()
            .map_err(|e| bad("cursor", &e))?;
        let filter = Filter {
            kind: self.kind.clone(),
            class: class(self.class.as_deref())?,
            since: time("since", self.since.as_deref())?,
            until: time("until", self.until.as_deref())?,
            text: self.text.clone().or_else(|| self.grep.clone()),
            state,
        };
        Ok((filter, cursor))
    }
}

/// The body as JSON whatever its Content-Type (`curl -d` sends a form type), as `/v1/emails`,
/// and the one selection it names.
pub(super) fn parse(body: &[u8]) -> Result<(SelectionBody, Selection), Refused> {
    let body: SelectionBody = serde_json::from_slice(body)
        .map_err(|e| bad("body", &format!("body is not a selection: {e}")))?;
    let args = SelectionArgs {
        rows: body.rows.clone(),
        jobs: body.ids.clone(),
        group: body.group.clone(),
        filter: Filter {
            kind: body.kind.clone(),
            class: class(body.class.as_deref())?,
            text: body.text.clone(),
            since: time("since", body.since.as_deref())?,
            until: time("until", body.until.as_deref())?,
            state: States::Dead,
        },
        all: body.all,
    };
    let selection = Selection::one_of(args)
        .map_err(|why| Box::new(error(StatusCode::BAD_REQUEST, None, &why.to_string())))?;
    Ok((body, selection))
}
