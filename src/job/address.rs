//! Addresses as mailroom carries, compares and logs them.
//!
//! An internationalised domain (`ada@müller.de`) is carried in its ASCII form
//! (`ada@xn--mller-kva.de`) in the envelope and headers, so it reaches any SMTP server: only a
//! non-ASCII local part needs the server's SMTPUTF8. Addresses are compared (suppression list,
//! recipient search) with the domain in its Unicode form in lower case, so every spelling of
//! one domain is one domain; the local part is compared exactly (RFC 5321: it may be
//! case-sensitive).

use lettre::Address;
use lettre::message::Mailbox;

use super::{JobError, check_no_control, invalid};

/// The longest normalised address the ledger keeps for the recipient search (MariaDB's column
/// is `VARBINARY(1000)`); a longer one is not kept, and its job is found by other filters.
pub const MAX_RECIPIENT_BYTES: usize = 1000;

pub(super) fn parse_mailboxes(field: &str, raw: &[String]) -> Result<Vec<Mailbox>, JobError> {
    raw.iter()
        .enumerate()
        .map(|(i, value)| parse_mailbox(&format!("{field}[{i}]"), value))
        .collect()
}

/// Parses an RFC 5322 mailbox and carries an internationalised domain in its ASCII form.
pub(super) fn parse_mailbox(field: &str, raw: &str) -> Result<Mailbox, JobError> {
    check_no_control(field, raw)?;
    let mailbox = raw
        .parse::<Mailbox>()
        .map_err(|e| invalid(field, format!("not a valid RFC 5322 mailbox ({e})")))?;
    with_ascii_domain(mailbox).map_err(|why| invalid(field, why))
}

/// The mailbox with its domain in ASCII form (`müller.de` → `xn--mller-kva.de`), which every
/// SMTP server takes; its name and local part unchanged.
pub fn with_ascii_domain(mailbox: Mailbox) -> Result<Mailbox, String> {
    let domain = mailbox.email.domain();
    if domain.is_ascii() {
        return Ok(mailbox);
    }
    let ascii = idna::domain_to_ascii(domain)
        .map_err(|_| "not a valid internationalised domain name".to_string())?;
    let email = Address::new(mailbox.email.user(), ascii)
        .map_err(|e| format!("not a valid address ({e})"))?;
    Ok(Mailbox::new(mailbox.name, email))
}

/// An address as the suppression list and the recipient search compare it: the domain in its
/// Unicode form in lower case (`ADA@XN--MLLER-KVA.DE` and `ADA@Müller.de` are both
/// `ADA@müller.de`), the local part exactly as given.
pub fn normalised_address(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) => format!("{local}@{}", normalised_domain(domain)),
        None => address.to_string(),
    }
}

/// A domain in lower case and in its Unicode form; one that is no valid domain name (an IP
/// literal such as `[127.0.0.1]`) only in lower case.
fn normalised_domain(domain: &str) -> String {
    match idna::domain_to_unicode(domain) {
        (unicode, Ok(())) => unicode,
        (_, Err(_)) => domain.to_lowercase(),
    }
}

/// [`normalised_address`] when it fits the ledger's column, for the claim to store.
pub fn recipient_to_store(address: &str) -> Option<String> {
    Some(normalised_address(address)).filter(|a| a.len() <= MAX_RECIPIENT_BYTES)
}

/// Masks an address for logs: `ada@example.com` → `a***@example.com`.
pub fn mask_email(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) => {
            let first = local.chars().next().map(String::from).unwrap_or_default();
            format!("{first}***@{domain}")
        }
        None => "***".to_string(),
    }
}

/// Masks every email address in `text` (SMTP replies often quote the recipient).
pub fn mask_addresses(text: &str) -> String {
    let is_addr_char = |c: char| c.is_alphanumeric() || "._%+-@".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let looks_like_address = word
            .split_once('@')
            .is_some_and(|(l, d)| !l.is_empty() && d.contains('.') && !d.contains('@'));
        if looks_like_address {
            out.push_str(&mask_email(word));
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if is_addr_char(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}
