use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::job::MAX_JOB_BYTES;

fn job(value: serde_json::Value) -> EmailJob {
    from_value(value).unwrap()
}

fn base() -> serde_json::Value {
    json!({
        "job_id": "order-1042", "kind": "welcome", "to": ["ada@example.com"],
        "data": { "total": 19.9, "n": 3 }, "created_at": "2026-11-30T12:00:00Z"
    })
}

fn field_of(err: JobError) -> String {
    match err {
        JobError::Invalid { field, .. } => field,
        other => panic!("expected an invalid field, got {other}"),
    }
}

fn with_data(data: serde_json::Value) -> EmailJob {
    let mut v = base();
    v["data"] = data;
    job(v)
}

#[test]
fn the_admitted_body_is_what_the_worker_decodes() {
    let admitted = admit(job(base()), None).unwrap();
    let decoded = EmailJob::decode(&admitted.body).unwrap();
    assert_eq!(decoded.job, admitted.valid.job);
}

#[test]
fn a_database_respelling_gives_the_same_published_bytes() {
    let door = admit(with_data(json!({"b": 1e2, "a": [1.50, 1e19, -0.0]})), None).unwrap();
    // As PostgreSQL's JSONB prints it: spaces, keys by length, numbers in plain digits.
    let stored = r#"{"bcc": [], "to": ["ada@example.com"], "cc": [], "kind": "welcome",
        "data": {"a": [1.5, 10000000000000000000, 0.0], "b": 100.0}, "job_id": "order-1042",
        "locale": null, "headers": {}, "reply_to": null, "created_at": "2026-11-30T12:00:00Z"}"#;
    let relay = admit_stored(stored, None).unwrap();
    assert_eq!(
        String::from_utf8(relay.body).unwrap(),
        String::from_utf8(door.body).unwrap()
    );
}

#[test]
fn a_job_one_byte_over_the_limit_is_refused_naming_its_largest_field() {
    let fits = |pad: usize| with_data(json!({ "text": "x".repeat(pad) }));
    let overhead = wire_body(fits(0)).unwrap().len();
    let exact = admit(fits(MAX_JOB_BYTES - overhead), None).unwrap();
    assert_eq!(exact.body.len(), MAX_JOB_BYTES);
    let err = admit(fits(MAX_JOB_BYTES - overhead + 1), None).unwrap_err();
    assert!(err.to_string().contains("65537 bytes"), "{err}");
    assert_eq!(field_of(err), "data");
}

#[test]
fn an_unknown_kind_is_refused_when_templates_are_known() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    let templates = Templates::load(&dir).unwrap();
    assert!(admit(job(base()), Some(&templates)).is_ok());
    let mut v = base();
    v["kind"] = "no_such_kind".into();
    let err = admit(job(v.clone()), Some(&templates)).unwrap_err();
    assert_eq!(field_of(err), "kind");
    assert!(admit(job(v), None).is_ok(), "without templates any kind");
}

#[test]
fn shape_errors_name_their_field() {
    let mut v = base();
    v["to"] = json!([1]);
    assert_eq!(field_of(from_value(v).unwrap_err()), "to[0]");
    assert!(matches!(parse(b"hello"), Err(JobError::Malformed(_))));
}

#[test]
fn a_nul_in_data_and_huge_numbers_are_refused_naming_data() {
    let nul = admit(with_data(json!({ "a": "x\u{0}y" })), None).unwrap_err();
    assert_eq!(field_of(nul), "data");
    let huge = admit(with_data(json!({ "a": 1e20 })), None).unwrap_err();
    assert_eq!(field_of(huge), "data");
}

#[test]
fn same_request_ignores_spelling_and_created_at_but_not_values() {
    let a = job(base());
    let mut v = base();
    v["created_at"] = serde_json::Value::Null;
    v["cc"] = json!([]);
    assert!(same_request(&a, &job(v)));
    let mut other = base();
    other["data"]["n"] = json!(4);
    assert!(!same_request(&a, &job(other)));
}

proptest! {
    /// Whatever numbers a producer sends, the admitted body parses back to itself.
    #[test]
    fn admitted_bodies_are_fixed_points(xs in proptest::collection::vec(any::<f64>(), 0..8)) {
        let data: Vec<serde_json::Value> = xs.iter().map(|x| json!(x)).collect();
        if let Ok(admitted) = admit(with_data(json!({ "xs": data })), None) {
            let again = wire_body(parse(&admitted.body).unwrap()).unwrap();
            prop_assert_eq!(again, admitted.body);
        }
    }
}

#[test]
fn a_new_job_already_past_its_expiry_is_refused_and_a_stored_one_is_let_through() {
    let mut v = base();
    v["expires_at"] = json!("2020-01-01T00:00:00Z");
    let err = admit(job(v.clone()), None).unwrap_err();
    assert_eq!(field_of(err), "expires_at");
    // The relay's view of a row that expired while it waited: the worker records it expired.
    let relayed = admit_stored(&v.to_string(), None).unwrap();
    assert!(relayed.job().expires_at.is_some());
}

#[test]
fn a_schedule_survives_the_canonical_bytes_and_an_unset_one_adds_nothing() {
    let mut v = base();
    v["send_at"] = json!("2099-01-01T00:00:00+01:00");
    v["expires_at"] = json!("2099-01-02T00:00:00Z");
    let admitted = admit(job(v), None).unwrap();
    let decoded = EmailJob::decode(&admitted.body).unwrap().job;
    assert_eq!(
        decoded.send_at.unwrap().to_rfc3339(),
        "2098-12-31T23:00:00+00:00"
    );
    let plain = admit(job(base()), None).unwrap();
    let text = String::from_utf8(plain.body).unwrap();
    assert!(
        !text.contains("send_at") && !text.contains("expires_at"),
        "{text}"
    );
}

#[test]
fn a_job_that_expires_before_it_is_due_is_refused_naming_expires_at() {
    let mut v = base();
    v["send_at"] = json!("2099-01-02T00:00:00Z");
    v["expires_at"] = json!("2099-01-02T00:00:00Z");
    assert_eq!(field_of(admit(job(v), None).unwrap_err()), "expires_at");
}
