//! Property: whatever string reaches the subject, the result is a clean one-line subject or a
//! `HeaderInjection` refusal, never a subject carrying a control character.

use proptest::prelude::*;
use serde_json::json;

use super::{sample_with, shipped};
use crate::render::RenderError;

/// Arbitrary text, weighted towards the characters that matter in a header.
fn hostile_text() -> impl Strategy<Value = String> {
    let header_char = prop_oneof![
        Just('\r'),
        Just('\n'),
        Just('\0'),
        Just('\t'),
        Just('\u{85}'),
        Just(':'),
        Just(' '),
        any::<char>(),
    ];
    prop_oneof![
        any::<String>(),
        proptest::collection::vec(header_char, 0..32).prop_map(String::from_iter),
        any::<String>().prop_map(|s| format!("{s}\r\nBcc: x@evil.example")),
    ]
}

proptest! {
    #[test]
    fn subject_is_clean_or_refused_for_any_value(name in hostile_text()) {
        let data = sample_with("welcome", "/user/name", json!(name));
        match shipped().render("welcome", None, &data) {
            Ok(email) => {
                prop_assert!(!email.subject.chars().any(char::is_control));
                prop_assert!(!name.chars().any(char::is_control));
                prop_assert_eq!(email.subject.trim(), email.subject.as_str());
            }
            Err(RenderError::HeaderInjection { .. }) => {
                prop_assert!(name.chars().any(char::is_control));
            }
            Err(other) => prop_assert!(false, "unexpected error: {}", other),
        }
    }
}
