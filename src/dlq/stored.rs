//! A dead letter as a row of `mailroom_dead_letters`: the columns computed from a delivery, the
//! AMQP properties in their wire encoding (so a replay republishes exactly what arrived), the
//! idempotency key, and the normalised reason that makes failure groups. Pure functions, unit
//! tested below.

use std::borrow::Cow;

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::protocol::basic::{gen_properties, parse_properties};
use sha2::{Digest, Sha256};

use super::letter;
use crate::db::dead_letters::NewDeadLetter;
use crate::job::MAX_JOB_BYTES;

/// Largest body stored whole: far below MariaDB's default `max_allowed_packet` (16 MiB) and the
/// share of the redo log one InnoDB transaction may write, while a job is at most 64 KiB. A
/// larger letter can never be a valid job; its row keeps the first [`OVERSIZE_KEPT`] bytes
/// (and `body_size`, the whole size), so the queue never sticks on it and the row says so.
pub const MAX_STORED_BODY: usize = 4 * 1024 * 1024;
/// How much of an oversize body is kept: enough to read the job it claims to be.
pub const OVERSIZE_KEPT: usize = MAX_JOB_BYTES;
/// Longest text stored in the short columns (job id, kind, routing key), in bytes.
const MAX_SHORT: usize = 200;
/// Longest reason stored; the whole text stays in the stored headers.
const MAX_REASON: usize = 2000;
/// Longest normalised reason: what a group is named by.
const MAX_GROUP_REASON: usize = 255;

/// The row of a delivery from `<ns>.dead`.
pub fn new_letter(d: &Delivery) -> NewDeadLetter {
    let f = letter::facts(d);
    let reason_group = normalise(&f.reason);
    let body_size = i64::try_from(d.data.len()).unwrap_or(i64::MAX);
    let body = if d.data.len() > MAX_STORED_BODY {
        d.data[..OVERSIZE_KEPT].to_vec()
    } else {
        d.data.clone()
    };
    NewDeadLetter {
        letter_key: letter_key(d),
        job_id: clean(&f.job_id, MAX_SHORT).into_owned(),
        kind: clean(&f.kind, MAX_SHORT).into_owned(),
        recipient: f.recipient.as_deref().map(|r| clean(r, 998).into_owned()),
        recipients: f.recipients,
        group_key: group_key(&f.class, &reason_group),
        class: clean(&f.class, 32).into_owned(),
        reason: clean(&f.reason, MAX_REASON).into_owned(),
        reason_group,
        attempts: f.attempts,
        failed_at: f.failed_at,
        replays: f.replays,
        exchange: clean(d.exchange.as_str(), 255).into_owned(),
        routing_key: clean(d.routing_key.as_str(), 255).into_owned(),
        properties: encode_properties(&crate::broker::without_redelivery(&d.properties)),
        body,
        body_size,
    }
}

/// The properties as on the wire (flags, then each property; headers as a field table).
pub fn encode_properties(props: &BasicProperties) -> Vec<u8> {
    cookie_factory::gen_simple(gen_properties(props), Vec::new())
        .expect("writing to a Vec cannot fail")
}

/// Properties stored by [`encode_properties`].
pub fn decode_properties(bytes: &[u8]) -> anyhow::Result<BasicProperties> {
    let (_, props) = parse_properties(bytes)
        .map_err(|e| anyhow::anyhow!("the stored AMQP properties do not parse: {e:?}"))?;
    Ok(props)
}

/// SHA-256 of the letter as published to the dead-letter exchange: exchange, routing key,
/// properties without the headers a redelivery changes ([`crate::broker::without_redelivery`]), and body, each
/// length-prefixed: a letter delivered twice is one row.
pub fn letter_key(d: &Delivery) -> Vec<u8> {
    let props = crate::broker::without_redelivery(&d.properties);
    let mut hash = Sha256::new();
    hash.update(b"mailroom dead letter v1\0");
    for part in [
        d.exchange.as_str().as_bytes(),
        d.routing_key.as_str().as_bytes(),
        &encode_properties(&props),
        &d.data,
    ] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.finalize().to_vec()
}

/// The key of a failure group: SHA-256 of the class and the normalised reason.
pub fn group_key(class: &str, reason_group: &str) -> Vec<u8> {
    let mut hash = Sha256::new();
    hash.update(class.as_bytes());
    hash.update([0]);
    hash.update(reason_group.as_bytes());
    hash.finalize().to_vec()
}

/// A reason with what differs from one letter to the next taken out: email addresses become
/// `<address>`, ids and numbers of four digits or more `#` (an SMTP code such as `550 5.1.1`
/// stays), whitespace collapsed.
pub fn normalise(reason: &str) -> String {
    let words: Vec<Cow<str>> = reason.split_whitespace().map(normal_word).collect();
    clip(&words.join(" "), MAX_GROUP_REASON).to_owned()
}

fn normal_word(word: &str) -> Cow<'_, str> {
    let Some(start) = word.find(char::is_alphanumeric) else {
        return word.into();
    };
    let end = word
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_alphanumeric())
        .map_or(word.len(), |(i, c)| i + c.len_utf8());
    let core = &word[start..end];
    let digits = core.chars().filter(char::is_ascii_digit).count();
    let letters = core.chars().any(char::is_alphabetic);
    let replaced = if core.contains('@') {
        "<address>"
    } else if digits >= 4 || (digits > 0 && letters && core.len() >= 8) {
        "#"
    } else {
        return word.into();
    };
    format!("{}{replaced}{}", &word[..start], &word[end..]).into()
}

/// `text` without NUL (PostgreSQL's text refuses it), clipped to `max` bytes on a character
/// boundary.
fn clean(text: &str, max: usize) -> Cow<'_, str> {
    let clipped = clip(text, max);
    if clipped.contains('\0') {
        clipped.replace('\0', "\u{fffd}").into()
    } else {
        clipped.into()
    }
}

fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests;
