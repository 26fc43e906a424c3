//! The JSON log format: one flat object per line, so that Loki, Elasticsearch or `jq` can query
//! any field by its name. tracing-subscriber's own JSON format nests the span's fields (under
//! `span`, and again under `spans`); this one writes them beside the event's.
//!
//! Every line starts with these keys, always present, in this order:
//! - `timestamp`: RFC 3339 in UTC with microseconds (`2026-12-01T13:21:36.123456Z`);
//! - `level`: `TRACE`, `DEBUG`, `INFO`, `WARN` or `ERROR`;
//! - `target`: the module that logged it (`mailroom::worker::settle`), or a named stream such
//!   as `mailroom::http::access` and `mailroom::window`;
//! - `message`: the human sentence.
//!
//! Then, when the event happened inside a span, `span` (the innermost span's name, such as
//! `delivery`), and then the fields of the spans (outermost first, inner ones winning) and of
//! the event (winning over the spans'), sorted by name. A field named like one of the keys
//! above never replaces it.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The keys every line starts with, in order, which no field may replace.
pub const LEADING_KEYS: [&str; 4] = ["timestamp", "level", "target", "message"];

/// The event formatter of `--log-format json`; spans' fields must be recorded with
/// [`JsonFields`], so that they can be read back here.
pub struct FlatJson;

impl<S> FormatEvent<S, JsonFields> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut fields = BTreeMap::new();
        let mut span = None;
        if let Some(scope) = ctx.event_scope() {
            for s in scope.from_root() {
                if let Some(recorded) = s.extensions().get::<FormattedFields<JsonFields>>()
                    && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(recorded)
                {
                    fields.extend(map);
                }
                span = Some(s.name());
            }
        }
        event.record(&mut Fields(&mut fields));
        let message = fields
            .remove("message")
            .unwrap_or(Value::String(String::new()));
        let leading = [
            Value::String(timestamp()),
            Value::String(meta.level().to_string()),
            Value::String(meta.target().to_string()),
            message,
        ];
        let mut line = String::with_capacity(256);
        line.push('{');
        for (key, value) in LEADING_KEYS.iter().zip(&leading) {
            entry(&mut line, key, value);
        }
        if let Some(name) = span {
            entry(&mut line, "span", &Value::String(name.to_string()));
        }
        let shadows = |key: &str| LEADING_KEYS.contains(&key) || (span.is_some() && key == "span");
        for (key, value) in fields.iter().filter(|(k, _)| !shadows(k)) {
            entry(&mut line, key, value);
        }
        line.push('}');
        writeln!(writer, "{line}")
    }
}

/// Appends `"key":value` to an object being written, with the comma before all but the first.
fn entry(line: &mut String, key: &str, value: &Value) {
    if !line.ends_with('{') {
        line.push(',');
    }
    // A string and a `Value` always serialize.
    let _ = write!(line, "{}:{}", Value::from(key), value);
}

fn timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Collects an event's fields as JSON values; `log.*` fields (the `log` crate's metadata,
/// already in `target` and `level`) are left out.
struct Fields<'a>(&'a mut BTreeMap<String, Value>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        if !field.name().starts_with("log.") {
            self.0.insert(field.name().to_string(), value);
        }
    }
}

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let number = serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number);
        self.put(field, number);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// A writer that keeps what the subscriber wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// The lines `log` writes through the JSON format, parsed.
    fn lines(log: impl FnOnce()) -> Vec<(String, serde_json::Map<String, Value>)> {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| match serde_json::from_str(l) {
                Ok(Value::Object(map)) => (l.to_string(), map),
                _ => panic!("not a JSON object: {l}"),
            })
            .collect()
    }

    #[test]
    fn span_fields_are_flattened_once_beside_the_events() {
        let lines = lines(|| {
            let span =
                tracing::info_span!("delivery", job_id = tracing::field::Empty, kind = "welcome");
            let _entered = span.enter();
            span.record("job_id", "j-1");
            span.record("job_id", "j-2");
            tracing::info!(outcome = "sent", smtp_ms = 1.5, "sent");
        });
        let [(raw, line)] = &lines[..] else {
            panic!("{lines:?}")
        };
        let keys: Vec<&str> = line.keys().map(String::as_str).collect();
        assert!(
            raw.starts_with(r#"{"timestamp":""#),
            "the leading keys come first: {raw}"
        );
        assert_eq!(raw.matches("job_id").count(), 1, "{raw}");
        assert_eq!(line["job_id"], "j-2");
        assert_eq!(line["kind"], "welcome");
        assert_eq!(line["span"], "delivery");
        assert_eq!(line["outcome"], "sent");
        assert_eq!(line["smtp_ms"], 1.5);
        assert_eq!(line["message"], "sent");
        assert_eq!(line["level"], "INFO");
        assert!(
            !keys.contains(&"spans") && !keys.contains(&"fields"),
            "{raw}"
        );
    }

    #[test]
    fn a_field_never_replaces_a_leading_key_and_an_event_without_span_has_none() {
        let lines = lines(|| tracing::warn!(target: "mailroom::x", level = 3, "careful"));
        let (raw, line) = &lines[0];
        assert_eq!(line["level"], "WARN", "{raw}");
        assert_eq!(line["target"], "mailroom::x");
        assert!(!line.contains_key("span"), "{raw}");
        assert!(
            chrono::DateTime::parse_from_rfc3339(line["timestamp"].as_str().unwrap()).is_ok(),
            "{raw}"
        );
    }
}
