//! Reading one dead letter: who it was for, why it died, when, and after how many attempts, from
//! the headers the worker sets (`x-mailroom-*`) or, for messages the broker dead-lettered itself
//! (delivery limit), from RabbitMQ's `x-death`. Also the headers a replayed copy carries.
//! Pure functions over a delivery, so the whole mapping is unit-tested.

use chrono::{DateTime, TimeZone, Utc};
use lapin::{
    BasicProperties,
    message::Delivery,
    types::{AMQPValue, FieldTable, ShortString},
};
use lettre::message::Mailbox;
use serde_json::{Value, json};

use super::Class;
use crate::broker;
use crate::job::{MAX_KIND_LEN, mask_email};

/// Headers of a failure, dropped from a replayed copy so that it starts afresh.
const FAILURE_HEADERS: &[&str] = &[
    broker::ERROR_HEADER,
    broker::ERROR_CLASS_HEADER,
    broker::ATTEMPTS_HEADER,
    broker::FAILED_AT_HEADER,
    broker::LAST_ERROR_HEADER,
    broker::DELAY_HEADER,
    "x-death",
    "x-first-death-reason",
    "x-first-death-queue",
    "x-first-death-exchange",
    "x-last-death-reason",
    "x-last-death-queue",
    "x-last-death-exchange",
    "x-delivery-count",
];

/// What a listing needs of one dead letter, read from its body and headers; the reason and the
/// recipient in full (they are searched), masked only when shown ([`masked_recipient`]).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Facts {
    pub job_id: String,
    pub kind: String,
    /// The first `to` address as written in the job; `None` when the body has none.
    pub recipient: Option<String>,
    /// How many `to` addresses the job has.
    pub recipients: i32,
    pub class: String,
    pub reason: String,
    pub attempts: Option<i64>,
    pub failed_at: Option<DateTime<Utc>>,
    pub replays: i64,
}

/// Reads the facts of a dead letter.
pub(super) fn facts(d: &Delivery) -> Facts {
    let props = &d.properties;
    let body: Option<Value> = serde_json::from_slice(&d.data).ok();
    let body_str = |key: &str| {
        body.as_ref()
            .and_then(|b| b.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let job_id = props
        .message_id()
        .as_ref()
        .map(|m| m.to_string())
        .or_else(|| body_str("job_id"))
        .unwrap_or_else(|| "?".into());
    // The kind becomes the routing key of a replay: only a plausible one is taken from the body
    // or headers (an AMQP routing key is at most 255 bytes); the routing key itself always fits.
    let plausible = |k: &String| !k.is_empty() && k.len() <= MAX_KIND_LEN;
    let kind = body_str("kind")
        .filter(plausible)
        .or_else(|| text_header(props, broker::KIND_HEADER).filter(plausible))
        .or_else(|| Some(d.routing_key.to_string()).filter(|k| !k.is_empty()))
        .unwrap_or_else(|| "?".into());
    let (class, reason) = cause(props);
    let to = body
        .as_ref()
        .and_then(|b| b.get("to"))
        .and_then(Value::as_array);
    Facts {
        job_id,
        kind,
        recipient: to
            .and_then(|list| list.first())
            .and_then(Value::as_str)
            .map(str::to_owned),
        recipients: to.map_or(0, |l| i32::try_from(l.len()).unwrap_or(i32::MAX)),
        class,
        reason,
        attempts: broker::int_header(props, broker::ATTEMPTS_HEADER)
            .or_else(|| broker::int_header(props, "x-delivery-count")),
        failed_at: failed_at(props),
        replays: broker::int_header(props, broker::REPLAY_HEADER).unwrap_or(0),
    }
}

/// The error class and reason: the worker's headers, else what the broker recorded.
fn cause(props: &BasicProperties) -> (String, String) {
    if let Some(class) = text_header(props, broker::ERROR_CLASS_HEADER) {
        let reason = text_header(props, broker::ERROR_HEADER).unwrap_or_default();
        return (class, reason);
    }
    let Some(death) = deaths(props).into_iter().next() else {
        return (
            Class::Unknown.to_string(),
            "no x-mailroom-error or x-death header".into(),
        );
    };
    let why = text_header(props, "x-first-death-reason").unwrap_or(death.reason.clone());
    // The broker dead-letters for the delivery limit (a job that crashes workers), and for a
    // worker's reject without requeue (the worker could not reach the dead-letter exchange).
    let class = if why == "delivery_limit" {
        Class::Poison
    } else {
        Class::Broker
    };
    let reason = format!(
        "dead-lettered by RabbitMQ: {why} in queue {} ({}×)",
        death.queue, death.count
    );
    (class.to_string(), reason)
}

/// `a***@example.com`, with `+N` for further recipients; `?` when the job has none.
pub(super) fn masked_recipient(first: Option<&str>, count: i32) -> String {
    let Some(first) = first else {
        return "?".into();
    };
    let masked = match first.parse::<Mailbox>() {
        Ok(m) => mask_email(m.email.as_ref()),
        Err(_) => "(invalid address)".into(),
    };
    match count {
        ..=1 => masked,
        n => format!("{masked} +{}", n - 1),
    }
}

fn failed_at(props: &BasicProperties) -> Option<DateTime<Utc>> {
    if let Some(at) = text_header(props, broker::FAILED_AT_HEADER)
        && let Ok(at) = DateTime::parse_from_rfc3339(&at)
    {
        return Some(at.with_timezone(&Utc));
    }
    deaths(props)
        .into_iter()
        .find_map(|d| d.time)
        .or_else(|| props.timestamp().and_then(timestamp))
}

/// One entry of RabbitMQ's `x-death` header (newest first).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Death {
    pub reason: String,
    pub queue: String,
    pub exchange: String,
    pub count: i64,
    pub time: Option<DateTime<Utc>>,
    pub routing_keys: Vec<String>,
}

/// The parsed `x-death` entries of a message, newest first.
pub(super) fn deaths(props: &BasicProperties) -> Vec<Death> {
    let Some(AMQPValue::FieldArray(list)) = header(props, "x-death") else {
        return vec![];
    };
    list.as_slice()
        .iter()
        .filter_map(|v| match v {
            AMQPValue::FieldTable(t) => Some(death(t)),
            _ => None,
        })
        .collect()
}

fn death(t: &FieldTable) -> Death {
    let get = |k: &str| t.inner().get(k);
    let text = |k: &str| get(k).and_then(as_text).unwrap_or_default();
    let routing_keys = match get("routing-keys") {
        Some(AMQPValue::FieldArray(keys)) => keys.as_slice().iter().filter_map(as_text).collect(),
        _ => vec![],
    };
    Death {
        reason: text("reason"),
        queue: text("queue"),
        exchange: text("exchange"),
        count: get("count").and_then(as_int).unwrap_or(1),
        time: match get("time") {
            Some(AMQPValue::Timestamp(t)) => timestamp(*t),
            _ => None,
        },
        routing_keys,
    }
}

/// Every header of a message as JSON: tables as objects, timestamps as RFC 3339 text.
pub(super) fn headers_json(props: &BasicProperties) -> serde_json::Map<String, Value> {
    props
        .headers()
        .as_ref()
        .map(|t| {
            t.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), value_json(v)))
                .collect()
        })
        .unwrap_or_default()
}

fn value_json(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => json!(b),
        AMQPValue::Float(f) => json!(f),
        AMQPValue::Double(f) => json!(f),
        AMQPValue::DecimalValue(d) => json!(format!("{d:?}")),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_json).collect()),
        AMQPValue::FieldTable(t) => Value::Object(
            t.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), value_json(v)))
                .collect(),
        ),
        AMQPValue::Timestamp(t) => timestamp(*t).map_or(json!(t), |at| json!(at.to_rfc3339())),
        AMQPValue::ByteArray(b) => json!(String::from_utf8_lossy(b.as_slice())),
        AMQPValue::Void => Value::Null,
        other => as_int(other)
            .map(|i| json!(i))
            .or_else(|| as_text(other).map(Value::String))
            .unwrap_or(Value::Null),
    }
}

/// The properties of a replayed copy: the same message id, content type and job headers, the
/// failure headers removed, the attempt reset to 1 and the replay counted.
pub(super) fn replay_properties(props: &BasicProperties) -> BasicProperties {
    let replays = broker::int_header(props, broker::REPLAY_HEADER).unwrap_or(0) + 1;
    let mut headers = FieldTable::default();
    for (name, value) in props
        .headers()
        .as_ref()
        .map(|t| t.inner().iter())
        .into_iter()
        .flatten()
    {
        if !FAILURE_HEADERS.contains(&name.as_str()) {
            headers.insert(name.clone(), value.clone());
        }
    }
    headers.insert(
        ShortString::from(broker::ATTEMPT_HEADER),
        AMQPValue::LongLongInt(1),
    );
    headers.insert(
        ShortString::from(broker::REPLAY_HEADER),
        AMQPValue::LongLongInt(replays),
    );
    props.clone().with_headers(headers)
}

fn header<'a>(props: &'a BasicProperties, name: &str) -> Option<&'a AMQPValue> {
    props.headers().as_ref()?.inner().get(name)
}

fn text_header(props: &BasicProperties, name: &str) -> Option<String> {
    header(props, name).and_then(as_text)
}

fn as_text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

fn as_int(v: &AMQPValue) -> Option<i64> {
    crate::broker::int_value(v)
}

fn timestamp(secs: u64) -> Option<DateTime<Utc>> {
    Utc.timestamp_opt(i64::try_from(secs).ok()?, 0).single()
}

#[cfg(test)]
mod tests;
