use super::*;

fn entry(job_id: &str, kind: &str, class: &str, reason: &str, hour: u32) -> Entry {
    Entry {
        position: 1,
        job_id: job_id.into(),
        kind: kind.into(),
        recipient: "a***@example.com".into(),
        class: class.into(),
        reason: reason.into(),
        attempts: Some(1),
        failed_at: Some(
            DateTime::parse_from_rfc3339(&format!("2026-11-30T{hour:02}:00:00Z"))
                .unwrap()
                .with_timezone(&Utc),
        ),
        replays: 0,
    }
}

#[test]
fn a_filter_matches_only_when_every_field_it_sets_matches() {
    let e = entry(
        "order-7",
        "welcome",
        "template",
        "variable \"user\" missing",
        12,
    );
    assert!(Filter::default().matches(&e));
    let at = |h| Some(entry("", "", "", "", h).failed_at.unwrap());
    let f = Filter {
        kind: Some("welcome".into()),
        class: Some(Class::Template),
        since: at(12),
        grep: Some("order-".into()),
    };
    assert!(f.matches(&e));
    assert!(
        !Filter {
            since: at(13),
            ..f.clone()
        }
        .matches(&e)
    );
    assert!(
        !Filter {
            kind: Some("x".into()),
            ..f.clone()
        }
        .matches(&e)
    );
    assert!(
        Filter {
            grep: Some("\"user\"".into()),
            ..f.clone()
        }
        .matches(&e)
    );
    assert!(
        !Filter {
            grep: Some("nope".into()),
            ..f
        }
        .matches(&e)
    );
}

#[test]
fn a_selection_by_ids_kind_or_class_takes_only_those() {
    let e = entry("a", "welcome", "rejected", "550", 1);
    assert!(Selection::Ids(vec!["b".into(), "a".into()]).matches(&e));
    assert!(!Selection::Ids(vec!["b".into()]).matches(&e));
    assert!(Selection::Kind("welcome".into()).matches(&e));
    assert!(!Selection::Class(Class::Template).matches(&e));
    assert!(Selection::All.matches(&e));
}

#[test]
fn a_summary_counts_by_kind_and_by_reason_most_frequent_first() {
    let entries = [
        entry("1", "welcome", "rejected", "550", 1),
        entry("2", "welcome", "template", "missing", 1),
        entry("3", "order", "template", "missing", 1),
    ];
    let s = summarize(&entries);
    assert_eq!(s.total, 3);
    assert_eq!(s.by_kind["welcome"], 2);
    assert_eq!(s.by_kind["order"], 1);
    assert_eq!(s.by_reason[0].reason, "missing");
    assert_eq!(s.by_reason[0].count, 2);
    assert_eq!(s.by_reason[1].class, "rejected");
}

#[test]
fn since_reads_a_duration_ago_or_an_rfc3339_time() {
    let two_hours_ago = parse_since("2h").unwrap();
    let delta = Utc::now() - two_hours_ago;
    assert!((delta.num_seconds() - 7200).abs() < 5, "{delta}");
    assert_eq!(
        parse_since("2026-11-30T12:00:00+01:00")
            .unwrap()
            .to_rfc3339(),
        "2026-11-30T11:00:00+00:00"
    );
    assert!(parse_since("yesterday").is_err());
}

#[test]
fn a_replay_or_purge_names_exactly_one_selection() {
    let ids = || vec!["order-7".to_string()];
    let kind = || Some("welcome".to_string());
    assert_eq!(
        Selection::one_of(ids(), None, None, false),
        Ok(Selection::Ids(ids()))
    );
    assert_eq!(
        Selection::one_of(vec![], kind(), None, false),
        Ok(Selection::Kind("welcome".into()))
    );
    assert_eq!(
        Selection::one_of(vec![], None, Some(Class::Template), false),
        Ok(Selection::Class(Class::Template))
    );
    assert_eq!(
        Selection::one_of(vec![], None, None, true),
        Ok(Selection::All)
    );
    assert_eq!(
        Selection::one_of(vec![], None, None, false),
        Err(NotOneSelection)
    );
    assert_eq!(
        Selection::one_of(ids(), kind(), None, false),
        Err(NotOneSelection)
    );
    assert_eq!(
        Selection::one_of(vec![], kind(), None, true),
        Err(NotOneSelection)
    );
}

#[test]
fn a_report_counts_as_left_only_the_selected_dead_letters_that_stayed() {
    let mut report = Report {
        examined: 4,
        moved: 1,
        ..Report::default()
    };
    report.skipped.insert("not selected".into(), 2);
    report.skipped.insert("publish failed: closed".into(), 1);
    assert_eq!(report.selected_left(), 1);
    assert!(!report.found_none_of(&Selection::Ids(vec!["order-7".into()])));
    let nothing = Report::default();
    assert!(nothing.found_none_of(&Selection::Ids(vec!["order-7".into()])));
    assert!(!nothing.found_none_of(&Selection::All));
}

#[test]
fn a_masked_detail_holds_no_full_address_anywhere() {
    let at = Utc::now();
    let detail = Detail {
        entry: entry("order-7", "welcome", "rejected", "550", 1),
        job: serde_json::json!({
            "to": ["Ada Lovelace <ada@example.com>"],
            "cc": ["bob@example.org"],
            "data": {"support": "help@shop.example", "items": [{"by": "carol@example.net"}], "n": 3}
        }),
        headers: serde_json::json!({"x-mailroom-error": "550 <ada@example.com> unknown"})
            .as_object()
            .unwrap()
            .clone(),
        deaths: vec![],
        routing_key: "welcome".into(),
        notification: Some(Row {
            status: "dead".into(),
            attempts: 1,
            message_id: "<order-7.welcome@shop.example>".into(),
            smtp_reply: Some("550 ada@example.com: no such user".into()),
            last_error: Some("rejected ada@example.com".into()),
            created_at: at,
            updated_at: at,
            sent_at: None,
            template_revision: None,
        }),
    };
    let masked = serde_json::to_string(&detail.clone().masked()).unwrap();
    for address in [
        "ada@example.com",
        "bob@example.org",
        "help@shop.example",
        "carol@example.net",
    ] {
        assert!(!masked.contains(address), "{address} in {masked}");
    }
    assert!(
        masked.contains("Ada Lovelace <a***@example.com>"),
        "{masked}"
    );
    assert!(
        masked.contains("550 a***@example.com: no such user"),
        "{masked}"
    );
    assert!(masked.contains("\"n\":3"), "other values stay: {masked}");
    let raw = serde_json::to_string(&detail).unwrap();
    assert!(raw.contains("ada@example.com"), "unmasked until asked");
}
