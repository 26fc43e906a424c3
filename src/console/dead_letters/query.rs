//! The list's query string: the filter form's fields as typed (empty means unset), parsed into
//! a [`Filter`] and a [`Cursor`] with every error named, and the URL of the next page.

use crate::dlq::{Class, Cursor, Filter, States, parse_since};

/// The query of the list: every field as typed in the filter form (empty means unset).
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub(in crate::console) struct ListQuery {
    #[serde(default)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) class: String,
    #[serde(default)]
    pub(super) since: String,
    #[serde(default)]
    pub(super) until: String,
    #[serde(default)]
    pub(super) state: String,
    #[serde(default)]
    pub(super) text: String,
    /// A failure group's key (hex).
    #[serde(default)]
    pub(super) group: String,
    /// The cursor of the page ("older").
    #[serde(default)]
    pub(super) before: String,
}

/// A field as typed, `None` when empty.
pub(super) fn set(field: &str) -> Option<String> {
    let field = field.trim();
    (!field.is_empty()).then(|| field.to_owned())
}

/// The value of a parsed field, its error noted in `errors`.
fn take<T>(errors: &mut Vec<String>, parsed: Option<Result<T, String>>) -> Option<T> {
    match parsed? {
        Ok(value) => Some(value),
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

impl ListQuery {
    /// The filter and cursor it names, or what is wrong with it.
    pub(super) fn parse(&self) -> Result<(Filter, Option<Cursor>), Vec<String>> {
        let mut errors = vec![];
        let e = &mut errors;
        let filter = Filter {
            kind: set(&self.kind),
            class: take(
                e,
                set(&self.class).map(|c| c.parse::<Class>().map_err(|e| e.to_string())),
            ),
            since: take(e, set(&self.since).map(|s| parse_since(&s))),
            until: take(e, set(&self.until).map(|s| parse_since(&s))),
            text: set(&self.text),
            state: take(e, set(&self.state).map(|s| s.parse::<States>())).unwrap_or_default(),
        };
        let cursor = take(e, set(&self.before).map(|c| c.parse::<Cursor>()));
        if errors.is_empty() {
            Ok((filter, cursor))
        } else {
            Err(errors)
        }
    }

    /// This query's URL with `before` set to `cursor`: the next ("older") page.
    pub(super) fn older(&self, cursor: &str) -> String {
        let pairs = [
            ("kind", &self.kind),
            ("class", &self.class),
            ("since", &self.since),
            ("until", &self.until),
            ("state", &self.state),
            ("text", &self.text),
            ("group", &self.group),
        ];
        let mut url = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
            url.append_pair(name, value);
        }
        url.append_pair("before", cursor);
        format!("/console/dead-letters?{}", url.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_older_link_keeps_every_filter_and_a_bad_one_is_named() {
        let q = ListQuery {
            kind: "welcome".into(),
            text: "a b".into(),
            ..ListQuery::default()
        };
        assert_eq!(
            q.older("41"),
            "/console/dead-letters?kind=welcome&text=a+b&before=41"
        );
        let bad = ListQuery {
            class: "nope".into(),
            since: "yesterday".into(),
            ..ListQuery::default()
        };
        assert_eq!(bad.parse().unwrap_err().len(), 2);
        let (filter, cursor) = q.parse().unwrap();
        assert_eq!((filter.state, cursor), (States::Dead, None));
    }
}
