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
    match Encoding::choose(text, false) {
        Encoding::SevenBit => {
            Body::dangerous_pre_encoded(crlf(text), ContentTransferEncoding::SevenBit)
        }
        Encoding::EightBit => {
            Body::dangerous_pre_encoded(crlf(text), ContentTransferEncoding::EightBit)
        }
        Encoding::QuotedPrintable => Body::dangerous_pre_encoded(
            quoted_printable_crlf(text.as_bytes()),
            ContentTransferEncoding::QuotedPrintable,
        ),
        Encoding::Base64 => {
            let lines = crlf(text);
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
    crlf_bytes(text.as_bytes())
}

fn crlf_bytes(bytes: &[u8]) -> Vec<u8> {
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

/// Longest encoded line, soft line break included (RFC 2045, 6.7).
const QP_LINE: usize = 76;

/// `quoted_printable::encode` (text mode) of `input` with its line endings made CRLF ([`crlf`]),
/// byte for byte: the same soft line breaks in the same places, so a body is what lettre would
/// send. In one pass over the bytes, copying each run that needs no encoding at once: the crate
/// builds a `String` a `char` at a time, and with the CRLF pass before it took a quarter of
/// composing an HTML email (`compose_cost`). The output is ASCII.
fn quoted_printable_crlf(input: &[u8]) -> Vec<u8> {
    let mut qp = Qp {
        out: Vec::with_capacity(input.len() + input.len() / 16 + 8),
        on_line: 0,
        backup: 0,
    };
    let mut was_cr = false;
    let mut i = 0;
    while i < input.len() {
        let byte = input[i];
        i += 1;
        if was_cr {
            was_cr = false;
            if byte == b'\n' {
                qp.line_break();
                continue;
            }
            qp.append(b"=0D");
        }
        if byte == b'\r' {
            was_cr = true;
            continue;
        }
        if byte == b'\n' {
            // A bare line feed: [`crlf`] would have put a CR before it.
            qp.line_break();
            continue;
        }
        if QP_LINE - qp.on_line >= 3 && !qp_needs_encoding(byte) {
            // A run of bytes that stand for themselves, up to two short of the line's end.
            let max_run = QP_LINE - qp.on_line - 2;
            let start = i - 1;
            let mut end = i;
            while end < input.len() && end - start < max_run && !qp_needs_encoding(input[end]) {
                end += 1;
            }
            qp.out.extend_from_slice(&input[start..end]);
            qp.on_line += end - start;
            qp.backup = qp.out.len();
            i = end;
            continue;
        }
        match byte {
            b'=' => qp.append(b"=3D"),
            b'\t' | b' '..=b'~' => qp.append(&[byte]),
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                qp.append(&[
                    b'=',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 15)],
                ]);
            }
        }
    }
    if was_cr {
        qp.append(b"=0D");
    } else {
        qp.encode_trailing_blank();
    }
    qp.out
}

fn qp_needs_encoding(byte: u8) -> bool {
    !matches!(byte, b'\t' | b' '..=b'<' | b'>'..=b'~')
}

/// The encoder's output and where its current line stands.
struct Qp {
    out: Vec<u8>,
    /// Bytes on the current line.
    on_line: usize,
    /// Where the last thing appended starts: a soft break that would not fit after it goes
    /// before it.
    backup: usize,
}

impl Qp {
    fn append(&mut self, bytes: &[u8]) {
        if self.on_line + bytes.len() > QP_LINE {
            if self.on_line == QP_LINE {
                self.on_line = self.out.len() - self.backup;
                self.out.splice(self.backup..self.backup, *b"=\r\n");
            } else {
                self.out.extend_from_slice(b"=\r\n");
                self.on_line = 0;
            }
        }
        self.out.extend_from_slice(bytes);
        self.on_line += bytes.len();
        self.backup = self.out.len() - bytes.len();
    }

    /// A hard line break (the text's own), after a blank that would end the line is encoded.
    fn line_break(&mut self) {
        self.encode_trailing_blank();
        self.out.extend_from_slice(b"\r\n");
        self.on_line = 0;
    }

    /// A space or tab may not end an encoded line: the last one is encoded instead.
    fn encode_trailing_blank(&mut self) {
        let encoded: &[u8] = match self.out.last() {
            Some(b' ') => b"=20",
            Some(b'\t') => b"=09",
            _ => return,
        };
        self.on_line -= 1;
        self.out.pop();
        self.append(encoded);
    }
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
        fn quoted_printable_matches_the_crate_byte_for_byte(
            bytes in proptest::collection::vec(
                prop_oneof![
                    4 => Just(b'a'),
                    2 => Just(b' '),
                    1 => Just(b'\t'),
                    1 => Just(b'='),
                    1 => Just(b'\r'),
                    1 => Just(b'\n'),
                    1 => any::<u8>(),
                ],
                0..600,
            ),
        ) {
            prop_assert_eq!(
                quoted_printable_crlf(&bytes),
                quoted_printable::encode(crlf_bytes(&bytes))
            );
        }

        #[test]
        fn quoted_printable_matches_the_crate_on_any_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            prop_assert_eq!(
                quoted_printable_crlf(&bytes),
                quoted_printable::encode(crlf_bytes(&bytes))
            );
        }

        #[test]
        fn any_text_matches_lettre(text in "(?s)[a-z .=\t\r\n\u{e9}\u{65e5}\u{1}]{0,400}") {
            prop_assert_eq!(ours(&text), lettre(&text));
        }
    }
}
