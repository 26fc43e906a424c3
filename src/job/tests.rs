use proptest::prelude::*;

use super::*;

fn job(json: serde_json::Value) -> Result<ValidJob, JobError> {
    EmailJob::decode(json.to_string().as_bytes())
}

fn base() -> serde_json::Value {
    serde_json::json!({
        "job_id": "order-1042-confirmation", "kind": "order_confirmation",
        "to": ["Ada <ada@example.com>"], "cc": [], "bcc": [], "reply_to": null,
        "locale": "en", "data": { "order_id": 1042, "total": "19.90" },
        "headers": {}, "created_at": "2026-11-30T12:00:00Z"
    })
}

fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
    let mut j = base();
    j[field] = value;
    j
}

fn field_of(err: JobError) -> String {
    match err {
        JobError::Invalid { field, .. } => field,
        other => panic!("expected an invalid field, got {other}"),
    }
}

#[test]
fn the_design_example_decodes() {
    let v = job(base()).unwrap();
    assert_eq!(v.to[0].email.to_string(), "ada@example.com");
    assert_eq!(v.to[0].name.as_deref(), Some("Ada"));
}

#[test]
fn not_json_and_wrong_shape_are_malformed() {
    assert!(matches!(
        EmailJob::decode(b"hello"),
        Err(JobError::Malformed(_))
    ));
    assert!(matches!(
        job(with("to", "ada@example.com".into())),
        Err(JobError::Malformed(_))
    ));
    assert!(matches!(
        job(with("too", serde_json::json!([]))),
        Err(JobError::Malformed(_))
    ));
}

#[test]
fn oversized_body_is_refused_before_parsing() {
    let body = vec![b' '; MAX_JOB_BYTES + 1];
    assert!(matches!(
        EmailJob::decode(&body),
        Err(JobError::TooLarge { .. })
    ));
}

#[test]
fn bad_fields_are_named() {
    assert_eq!(
        field_of(job(with("job_id", "".into())).unwrap_err()),
        "job_id"
    );
    assert_eq!(
        field_of(job(with("kind", "../etc".into())).unwrap_err()),
        "kind"
    );
    assert_eq!(
        field_of(job(with("locale", "english please".into())).unwrap_err()),
        "locale"
    );
    assert_eq!(
        field_of(job(with("data", serde_json::json!([1]))).unwrap_err()),
        "data"
    );
    assert_eq!(
        field_of(job(with("to", serde_json::json!([]))).unwrap_err()),
        "to"
    );
    let bad_cc = with(
        "cc",
        serde_json::json!(["fine@example.com", "not an address"]),
    );
    assert_eq!(field_of(job(bad_cc).unwrap_err()), "cc[1]");
}

#[test]
fn crlf_in_a_display_name_is_header_injection() {
    let j = with(
        "to",
        serde_json::json!(["Ada\r\nBcc: evil@example.com <ada@example.com>"]),
    );
    let err = job(j).unwrap_err();
    assert!(err.to_string().contains("header injection"), "{err}");
}

#[test]
fn extra_headers_are_limited_to_x_and_list() {
    let ok = with(
        "headers",
        serde_json::json!({"X-Campaign": "spring", "List-Unsubscribe": "<https://x.example/u>"}),
    );
    assert!(job(ok).is_ok());
    for bad in [
        serde_json::json!({"Bcc": "evil@example.com"}),
        serde_json::json!({"X-Mailroom-Kind": "spoof"}),
        serde_json::json!({"X-Ok": "a\r\nBcc: evil@example.com"}),
    ] {
        assert!(job(with("headers", bad)).is_err());
    }
}

#[test]
fn mask_keeps_the_domain_only() {
    assert_eq!(mask_email("ada@example.com"), "a***@example.com");
    assert_eq!(mask_email("nonsense"), "***");
}

proptest! {
    /// Whatever a producer puts in a name or header value, a CR or LF never survives validation.
    #[test]
    fn no_crlf_survives_validation(prefix in ".*", suffix in ".*", cr in any::<bool>()) {
        let nl = if cr { "\r\n" } else { "\n" };
        let evil = format!("{prefix}{nl}Bcc: evil@example.com{suffix}");
        let name = with("to", serde_json::json!([format!("{evil} <ada@example.com>")]));
        prop_assert!(job(name).is_err());
        let header = with("headers", serde_json::json!({ "X-Note": evil }));
        prop_assert!(job(header).is_err());
    }
}

#[test]
fn clip_cuts_at_a_character_boundary_within_the_bound_and_marks_the_cut() {
    assert_eq!(clip("short", 10), "short");
    let cut = clip(&"注".repeat(10), 10);
    assert!(cut.len() <= 10, "{cut:?}");
    assert_eq!(cut, "注注…");
    assert_eq!(clip("abcdefghij", 10), "abcdefghij");
    assert_eq!(clip("abcdefghijk", 10), "abcdefg…");
}

#[test]
fn an_internationalised_domain_is_carried_in_ascii_and_its_local_part_as_given() {
    let j = job(with("to", serde_json::json!(["Jürgen <Ada@Müller.de>"]))).unwrap();
    assert_eq!(j.to[0].email.to_string(), "Ada@xn--mller-kva.de");
    assert_eq!(j.to[0].name.as_deref(), Some("Jürgen"));
    let cc = job(with("cc", serde_json::json!(["用户@例子.广告"]))).unwrap();
    assert_eq!(cc.cc[0].email.to_string(), "用户@xn--fsqu00a.xn--4rr70v");
    let ascii = job(with("to", serde_json::json!(["ada@Example.COM"]))).unwrap();
    assert_eq!(ascii.to[0].email.to_string(), "ada@Example.COM");
}

#[test]
fn every_spelling_of_a_domain_normalises_to_one_address() {
    for spelling in [
        "Ada@müller.de",
        "Ada@MÜLLER.DE",
        "Ada@xn--mller-kva.de",
        "Ada@XN--MLLER-KVA.DE",
    ] {
        assert_eq!(normalised_address(spelling), "Ada@müller.de", "{spelling}");
    }
    assert_eq!(normalised_address("ada@Example.COM"), "ada@example.com");
    assert_eq!(normalised_address("ada@[127.0.0.1]"), "ada@[127.0.0.1]");
    assert_ne!(
        normalised_address("Ada@x.de"),
        normalised_address("ada@x.de")
    );
}

#[test]
fn a_domain_whose_ascii_form_is_too_long_for_dns_is_refused_at_the_door() {
    // 30 different CJK characters: 90 bytes of UTF-8, over 63 bytes of punycode (DNS's limit
    // per label).
    let label: String = (0..30)
        .map(|i| char::from_u32(0x4e00 + i * 37).unwrap())
        .collect();
    let long = job(with("to", serde_json::json!([format!("ada@{label}.de")])));
    assert_eq!(field_of(long.unwrap_err()), "to[0]");
}

/// What the path-tracking deserializer alone makes of `body`: the reference the untracked
/// first pass of [`deserialize_job`] must agree with.
fn tracked(body: &[u8]) -> Result<EmailJob, String> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body)).map_err(
        |e: serde_path_to_error::Error<serde_json::Error>| format!("{}: {}", e.path(), e.inner()),
    )
}

fn untracked_first(body: &[u8]) -> Result<EmailJob, String> {
    deserialize_job(body).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

#[test]
fn parsing_untracked_first_accepts_and_refuses_what_the_tracked_parse_does() {
    let good = base().to_string();
    let bodies = [
        good.clone(),
        format!("{good} trailing bytes"),
        format!("  {good}"),
        with("to", serde_json::json!([1])).to_string(),
        with("data", serde_json::json!({"a": {"b": [1, {"c": null}]}})).to_string(),
        with("created_at", serde_json::json!("yesterday")).to_string(),
        with("headers", serde_json::json!({"X-A": 1})).to_string(),
        with("surprise", serde_json::json!(true)).to_string(),
        r#"{"job_id": "j", "kind": "k"}"#.to_string(),
        "not json".to_string(),
        String::new(),
        "[]".to_string(),
    ];
    for body in bodies {
        assert_eq!(
            untracked_first(body.as_bytes()),
            tracked(body.as_bytes()),
            "{body}"
        );
    }
}

proptest! {
    /// Every prefix of a job, and every single byte changed in it, reads the same both ways.
    #[test]
    fn parsing_untracked_first_agrees_on_cut_and_changed_jobs(at in 0usize..400, byte in any::<u8>()) {
        let good = base().to_string().into_bytes();
        let at = at % good.len();
        let cut = &good[..at];
        prop_assert_eq!(untracked_first(cut), tracked(cut));
        let mut changed = good.clone();
        changed[at] = byte;
        prop_assert_eq!(untracked_first(&changed), tracked(&changed));
    }
}
