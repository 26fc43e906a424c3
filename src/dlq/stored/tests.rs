use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::*;
use crate::broker;

fn delivery(body: &[u8], headers: &[(&str, AMQPValue)]) -> Delivery {
    let mut d = Delivery::mock(
        1,
        "mailroom.dlx".into(),
        "welcome".into(),
        false,
        body.to_vec(),
    );
    let mut table = FieldTable::default();
    for (k, v) in headers {
        table.insert(ShortString::from(*k), v.clone());
    }
    d.properties = broker::job_properties("job-1", "welcome", 3).with_headers(table);
    d
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

#[test]
fn stored_properties_read_back_equal_with_every_header() {
    let d = delivery(
        b"\xff\x00not utf-8",
        &[
            ("x-mailroom-error", text("550 <ada@example.com>")),
            ("bytes", AMQPValue::ByteArray(vec![0u8, 255, 10].into())),
            ("n", AMQPValue::LongLongInt(-7)),
        ],
    );
    let stored = encode_properties(&d.properties);
    assert_eq!(decode_properties(&stored).unwrap(), d.properties);
    assert!(decode_properties(b"\xff").is_err());
}

#[test]
fn a_redelivered_letter_has_the_same_key_and_a_new_death_another() {
    let first = delivery(b"{}", &[("x-mailroom-error", text("550"))]);
    let again = delivery(
        b"{}",
        &[
            ("x-mailroom-error", text("550")),
            ("x-delivery-count", AMQPValue::LongLongInt(1)),
        ],
    );
    assert_eq!(letter_key(&first), letter_key(&again));
    let replayed_and_dead_again = delivery(
        b"{}",
        &[
            ("x-mailroom-error", text("550")),
            (broker::REPLAY_HEADER, AMQPValue::LongLongInt(1)),
        ],
    );
    assert_ne!(letter_key(&first), letter_key(&replayed_and_dead_again));
    assert_ne!(letter_key(&first), letter_key(&delivery(b"{ }", &[])));
}

#[test]
fn reasons_that_differ_only_by_address_or_id_normalise_alike() {
    let a = normalise("550 5.1.1 <ada@example.com>: no such user (id 8f3a9c2e11)");
    let b = normalise("550  5.1.1 <bob@example.org>: no such user (id 77aa00bb99)");
    assert_eq!(a, b);
    assert_eq!(a, "550 5.1.1 <<address>>: no such user (id #)");
    assert_ne!(a, normalise("552 5.2.2 <ada@example.com>: mailbox full"));
    assert_eq!(normalise("failed at 2026-11-30T12:00:00Z"), "failed at #");
}

#[test]
fn an_oversize_body_keeps_its_head_and_its_size() {
    let big = vec![b'x'; MAX_STORED_BODY + 1];
    let row = new_letter(&delivery(&big, &[]));
    assert_eq!(row.body.len(), OVERSIZE_KEPT);
    assert_eq!(row.body_size, big.len() as i64);
    let whole = new_letter(&delivery(&big[..MAX_STORED_BODY], &[]));
    assert_eq!(whole.body.len(), MAX_STORED_BODY);
}

#[test]
fn text_columns_hold_no_nul_and_fit_their_column() {
    assert_eq!(clean("a\0b", 10), "a\u{fffd}b");
    assert_eq!(clean("ééé", 3), "é");
}
