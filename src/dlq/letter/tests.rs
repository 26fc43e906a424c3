use lapin::types::{FieldArray, LongString};
use serde_json::json;

use super::*;

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn delivery(body: serde_json::Value, headers: &[(&str, AMQPValue)]) -> Delivery {
    let mut d = Delivery::mock(
        1,
        "x".into(),
        "welcome".into(),
        false,
        body.to_string().into(),
    );
    let mut table = FieldTable::default();
    for (k, v) in headers {
        table.insert(ShortString::from(*k), v.clone());
    }
    d.properties = broker::job_properties("job-1", "welcome", 3).with_headers(table);
    d
}

fn job() -> serde_json::Value {
    json!({"job_id": "job-1", "kind": "welcome",
           "to": ["Ada <ada@example.com>", "bob@example.com"], "data": {}})
}

fn worker_headers() -> Vec<(&'static str, AMQPValue)> {
    vec![
        (broker::KIND_HEADER, text("welcome")),
        (broker::ATTEMPT_HEADER, AMQPValue::LongLongInt(3)),
        (
            "x-mailroom-error",
            text("permanent SMTP failure: 550 5.1.1 <ada@example.com> unknown"),
        ),
        ("x-mailroom-error-class", text("rejected")),
        ("x-mailroom-attempts", AMQPValue::LongLongInt(3)),
        ("x-mailroom-failed-at", text("2026-11-30T12:00:00.000Z")),
    ]
}

fn x_death(reason: &str) -> AMQPValue {
    let mut t = FieldTable::default();
    t.insert("reason".into(), text(reason));
    t.insert("queue".into(), text("mailroom.email"));
    t.insert("exchange".into(), text("mailroom"));
    t.insert("count".into(), AMQPValue::LongLongInt(1));
    t.insert("time".into(), AMQPValue::Timestamp(1_796_040_000));
    t.insert(
        "routing-keys".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![text("welcome")])),
    );
    AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(t)]))
}

#[test]
fn a_worker_dead_letter_reads_from_the_mailroom_headers_with_addresses_masked() {
    let e = facts(&delivery(job(), &worker_headers()));
    assert_eq!(e.job_id, "job-1");
    assert_eq!(e.kind, "welcome");
    assert_eq!(e.recipient.as_deref(), Some("Ada <ada@example.com>"));
    assert_eq!(
        masked_recipient(e.recipient.as_deref(), e.recipients),
        "a***@example.com +1"
    );
    assert_eq!(e.class, "rejected");
    assert_eq!(
        crate::job::mask_addresses(&e.reason),
        "permanent SMTP failure: 550 5.1.1 <a***@example.com> unknown"
    );
    assert_eq!(e.attempts, Some(3));
    assert_eq!(
        e.failed_at.unwrap().to_rfc3339(),
        "2026-11-30T12:00:00+00:00"
    );
    assert_eq!(e.replays, 0);
}

#[test]
fn a_message_dead_lettered_by_the_delivery_limit_is_poison_with_the_brokers_reason() {
    let headers = [
        ("x-death", x_death("delivery_limit")),
        ("x-first-death-reason", text("delivery_limit")),
    ];
    let e = facts(&delivery(job(), &headers));
    assert_eq!(e.class, "poison");
    assert!(e.reason.contains("delivery_limit"), "{}", e.reason);
    assert!(e.reason.contains("mailroom.email"), "{}", e.reason);
    assert_eq!(e.failed_at.unwrap().timestamp(), 1_796_040_000);
    let deaths = deaths(&delivery(job(), &headers).properties);
    assert_eq!(deaths[0].routing_keys, vec!["welcome".to_string()]);
}

#[test]
fn a_body_that_is_not_json_still_lists_with_its_message_id_and_kind_header() {
    let mut d = delivery(json!(null), &worker_headers());
    d.data = b"not json".to_vec();
    let e = facts(&d);
    assert_eq!((e.job_id.as_str(), e.kind.as_str()), ("job-1", "welcome"));
    assert_eq!(masked_recipient(e.recipient.as_deref(), e.recipients), "?");
}

#[test]
fn an_overlong_kind_in_the_body_falls_back_to_the_routing_key() {
    let mut body = job();
    body["kind"] = "k".repeat(300).into();
    let e = facts(&delivery(body, &[]));
    assert_eq!(e.kind, "welcome");
}

#[test]
fn a_replayed_copy_keeps_its_identity_and_drops_the_failure() {
    let mut headers = worker_headers();
    headers.push(("x-death", x_death("delivery_limit")));
    headers.push((broker::REPLAY_HEADER, AMQPValue::LongLongInt(1)));
    let props = replay_properties(&delivery(job(), &headers).properties);
    assert_eq!(props.message_id().as_ref().unwrap().as_str(), "job-1");
    assert_eq!(broker::int_header(&props, broker::ATTEMPT_HEADER), Some(1));
    assert_eq!(broker::int_header(&props, broker::REPLAY_HEADER), Some(2));
    let names: Vec<String> = headers_json(&props).keys().cloned().collect();
    assert_eq!(
        names,
        [
            broker::ATTEMPT_HEADER,
            broker::KIND_HEADER,
            broker::REPLAY_HEADER
        ]
    );
}

#[test]
fn headers_render_as_readable_json() {
    let d = delivery(job(), &[("x-death", x_death("rejected"))]);
    let h = headers_json(&d.properties);
    assert_eq!(h["x-death"][0]["reason"], "rejected");
    assert_eq!(h["x-death"][0]["time"], "2026-11-30T12:00:00+00:00");
    assert_eq!(h["x-death"][0]["count"], 1);
}

#[test]
fn only_things_shaped_like_addresses_are_masked() {
    assert_eq!(
        crate::job::mask_addresses(
            "550 <bob.smith@mail.example.org>: no; user@host kept, a@b.c masked"
        ),
        "550 <b***@mail.example.org>: no; user@host kept, a***@b.c masked"
    );
}
