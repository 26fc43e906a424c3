use super::*;

fn args() -> SelectionArgs {
    SelectionArgs::default()
}

#[test]
fn a_replay_or_purge_names_exactly_one_selection() {
    let jobs = || vec!["order-7".to_string()];
    let kind = || Filter {
        kind: Some("welcome".into()),
        ..Filter::default()
    };
    assert_eq!(
        Selection::one_of(SelectionArgs {
            jobs: jobs(),
            ..args()
        }),
        Ok(Selection::Jobs(jobs()))
    );
    assert_eq!(
        Selection::one_of(SelectionArgs {
            rows: vec![3, 4],
            ..args()
        }),
        Ok(Selection::Rows(vec![3, 4]))
    );
    assert_eq!(
        Selection::one_of(SelectionArgs {
            filter: kind(),
            ..args()
        }),
        Ok(Selection::Filter(kind()))
    );
    assert_eq!(
        Selection::one_of(SelectionArgs {
            group: Some("ab".into()),
            ..args()
        }),
        Ok(Selection::Group("ab".into()))
    );
    assert_eq!(
        Selection::one_of(SelectionArgs {
            all: true,
            ..args()
        }),
        Ok(Selection::All)
    );
    assert_eq!(Selection::one_of(args()), Err(NotOneSelection));
    assert_eq!(
        Selection::one_of(SelectionArgs {
            jobs: jobs(),
            filter: kind(),
            ..args()
        }),
        Err(NotOneSelection)
    );
    assert_eq!(
        Selection::one_of(SelectionArgs {
            filter: kind(),
            all: true,
            ..args()
        }),
        Err(NotOneSelection)
    );
}

#[test]
fn a_report_counts_as_left_only_the_selected_rows_that_stayed_dead() {
    let mut report = Report {
        examined: 4,
        moved: 3,
        ..Report::default()
    };
    report.skipped.insert("publish failed".into(), 1);
    assert_eq!(report.selected_left(), 1);
    assert!(!report.found_none_of(&Selection::Jobs(vec!["order-7".into()])));
    let nothing = Report::default();
    assert!(nothing.found_none_of(&Selection::Jobs(vec!["order-7".into()])));
    assert!(nothing.found_none_of(&Selection::Rows(vec![7])));
    assert!(!nothing.found_none_of(&Selection::All));
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
fn a_state_filter_takes_the_three_states_and_all() {
    assert_eq!("dead".parse(), Ok(States::Dead));
    assert_eq!("all".parse::<States>().unwrap().column(), None);
    assert_eq!("purged".parse::<States>().unwrap().column(), Some("purged"));
    assert!("gone".parse::<States>().unwrap_err().contains("replayed"));
}

#[test]
fn a_cursor_is_what_a_page_gave_and_nothing_else() {
    assert_eq!("42".parse::<Cursor>().unwrap().to_string(), "42");
    assert!("0".parse::<Cursor>().is_err());
    assert!("abc".parse::<Cursor>().is_err());
}

#[test]
fn a_like_pattern_takes_percent_and_underscore_literally_in_any_case() {
    use crate::db::dead_letters::like_pattern;
    assert_eq!(like_pattern("50%_Off!"), "%50!%!_off!!%");
}

fn entry(job_id: &str) -> Entry {
    let at = Utc::now();
    Entry {
        id: 1,
        job_id: job_id.into(),
        kind: "welcome".into(),
        recipient: "a***@example.com".into(),
        class: "rejected".into(),
        reason: "550".into(),
        group: "00".into(),
        attempts: Some(1),
        failed_at: Some(at),
        replays: 0,
        ingested_at: at,
        state: "dead".into(),
        replayed_at: None,
        replayed_by: None,
        replay_result: None,
        purged_at: None,
        purged_by: None,
        body_size: 10,
        truncated: false,
    }
}

#[test]
fn a_masked_detail_holds_no_full_address_anywhere() {
    let at = Utc::now();
    let detail = Detail {
        entry: entry("order-7"),
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
        exchange: "mailroom.dlx".into(),
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
