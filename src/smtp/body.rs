//! A rendered part as a MIME body, encoded exactly as lettre's `Body::new` encodes it (the same
//! choice of 7bit, quoted-printable or base64, the same bytes) in one pass: lettre turns bare
//! line feeds into CRLF by inserting each `\r` in place, which moves the rest of the part once
//! per line, and its `String` argument costs the caller a copy of the rendered part.

use email_encoding::body::Encoding;
use lettre::message::Body;
use lettre::message::header::ContentTransferEncoding;

/// `text` as a body: the encoding lettre would choose for it (no 8BITMIME assumed), its line
/// endings made CRLF, then encoded.
pub fn encode(text: &str) -> Body {
    // lettre chooses on the text as given, before the line endings change; so does this.
    let encoding = Encoding::choose(text, false);
    let lines = crlf(text);
    match encoding {
        Encoding::SevenBit => Body::dangerous_pre_encoded(lines, ContentTransferEncoding::SevenBit),
        Encoding::EightBit => Body::dangerous_pre_encoded(lines, ContentTransferEncoding::EightBit),
        Encoding::QuotedPrintable => Body::dangerous_pre_encoded(
            quoted_printable::encode(&lines),
            ContentTransferEncoding::QuotedPrintable,
        ),
        Encoding::Base64 => {
            let mut out =
                String::with_capacity(email_encoding::body::base64::encoded_len(lines.len()));
            email_encoding::body::base64::encode(&lines, &mut out)
                .expect("base64 into a String cannot fail");
            Body::dangerous_pre_encoded(out.into_bytes(), ContentTransferEncoding::Base64)
        }
    }
}

/// Every `\n` not already preceded by `\r` gets one. Byte-wise is exact: neither byte ever
/// occurs inside a multi-byte UTF-8 sequence.
fn crlf(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let bare = bytes
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b == b'\n' && (i == 0 || bytes[i - 1] != b'\r'))
        .count();
    let mut out = Vec::with_capacity(bytes.len() + bare);
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' && (i == 0 || bytes[i - 1] != b'\r') {
            out.extend_from_slice(&bytes[start..i]);
            out.push(b'\r');
            start = i;
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What lettre makes of the same text: the reference this module must match.
    fn lettre(text: &str) -> (ContentTransferEncoding, Vec<u8>) {
        let body = Body::new(text.to_owned());
        (body.encoding(), body.into_vec())
    }

    fn ours(text: &str) -> (ContentTransferEncoding, Vec<u8>) {
        let body = encode(text);
        (body.encoding(), body.into_vec())
    }

    #[test]
    fn every_encoding_and_line_ending_matches_lettre() {
        let long = "x".repeat(75);
        let cases = [
            String::new(),
            "\n".into(),
            "\r\n".into(),
            "\r".into(),
            "\n\n\r\n\r\r\n\n".into(),
            "a\nb\r\nc\rd\n".into(),
            ".\n.leading dot\n..\n".into(),
            "trailing space \ntrailing tab\t\n".into(),
            format!("{long}\n{long}"),
            format!("{long}x\n{long}"),
            format!("{long}xx\r\n"),
            "Grüße, 名前\nnaïve café\n".into(),
            "日本語のテキスト".repeat(40),
            "\u{1}\u{2}\u{7f} control\n".into(),
            format!("<p style=\"margin:0\">{}</p>\n", "a".repeat(300)),
        ];
        for text in cases {
            assert_eq!(ours(&text), lettre(&text), "{text:?}");
        }
        // The cases above reach every encoding lettre has for text.
        let kinds: std::collections::BTreeSet<String> =
            ["a\n", &format!("{long}xx"), &"日本語".repeat(40)]
                .iter()
                .map(|t| ours(t).0.to_string())
                .collect();
        assert_eq!(kinds.len(), 3, "{kinds:?}");
    }

    proptest! {
        #[test]
        fn any_text_matches_lettre(text in "(?s)[a-z .=\t\r\n\u{e9}\u{65e5}\u{1}]{0,400}") {
            prop_assert_eq!(ours(&text), lettre(&text));
        }
    }
}
