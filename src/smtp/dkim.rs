//! DKIM signing (RFC 6376; Ed25519 per RFC 8463), for users who send straight to a relay that
//! does not sign for them: `MAILROOM_DKIM_KEY` (a key file), `MAILROOM_DKIM_SELECTOR`, and
//! `MAILROOM_DKIM_DOMAIN` (default: the domain of `MAILROOM_FROM`).
//!
//! The key file may be what `openssl genpkey` writes (PKCS#8 PEM, RSA or Ed25519), an RSA key
//! in PKCS#1 PEM (`BEGIN RSA PRIVATE KEY`), or an Ed25519 seed in base64 (32 bytes); its
//! algorithm is read from it. Headers and body are canonicalised `relaxed/relaxed`, which
//! survives the re-folding and whitespace changes relays make. An error never quotes the key.

use std::path::PathBuf;
use std::sync::Arc;

use lettre::Message;
use lettre::message::dkim::{
    DkimCanonicalization, DkimCanonicalizationType, DkimConfig, DkimSigningAlgorithm,
    DkimSigningKey,
};
use lettre::message::header::HeaderName;

/// The headers every signature covers (a header absent from a message is signed as absent, so
/// it cannot be added later). Not Content-Type: lettre writes it with the body, after signing.
const SIGNED: &[&str] = &[
    "From",
    "Reply-To",
    "To",
    "Cc",
    "Subject",
    "Date",
    "Message-ID",
    "MIME-Version",
];

/// The DER prefix of an Ed25519 private key in PKCS#8 (RFC 8410): the 32-byte seed follows.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Where the key is and whom it signs for.
#[derive(Clone, Debug)]
pub struct DkimSettings {
    pub key: PathBuf,
    pub selector: String,
    pub domain: String,
}

/// Why a DKIM key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DkimError {
    #[error("MAILROOM_DKIM_KEY {path}: cannot read it: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "MAILROOM_DKIM_KEY {path}: not a private key mailroom can sign with ({why}); expected PKCS#8 PEM (`openssl genpkey -algorithm ed25519` or `-algorithm rsa`), RSA PKCS#1 PEM, or a base64 Ed25519 seed"
    )]
    Key { path: PathBuf, why: &'static str },
    #[error("MAILROOM_DKIM_SELECTOR {0:?} is not a DNS name (letters, digits, `-`, `.`)")]
    Selector(String),
    #[error(
        "MAILROOM_DKIM_DOMAIN {0:?} is not a DNS name (letters, digits, `-`, `.`); set it when the domain of MAILROOM_FROM is not one"
    )]
    Domain(String),
}

/// A loaded key with its selector and domain.
pub struct Dkim {
    config: DkimConfig,
    algorithm: &'static str,
}

impl std::fmt::Debug for Dkim {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dkim")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl Dkim {
    /// Reads and checks the key.
    pub fn load(s: &DkimSettings) -> Result<Dkim, DkimError> {
        // Both go verbatim into the DKIM-Signature header: anything else could add a tag.
        if !dns_name(&s.selector) {
            return Err(DkimError::Selector(s.selector.clone()));
        }
        if !dns_name(&s.domain) {
            return Err(DkimError::Domain(s.domain.clone()));
        }
        let text = std::fs::read_to_string(&s.key).map_err(|error| DkimError::Read {
            path: s.key.clone(),
            error,
        })?;
        let bad = |why| DkimError::Key {
            path: s.key.clone(),
            why,
        };
        let (key, algorithm) = signing_key(&text).map_err(bad)?;
        let headers = SIGNED
            .iter()
            .map(|h| HeaderName::new_from_ascii_str(h))
            .collect();
        let relaxed = DkimCanonicalization {
            header: DkimCanonicalizationType::Relaxed,
            body: DkimCanonicalizationType::Relaxed,
        };
        let config = DkimConfig::new(s.selector.clone(), s.domain.clone(), key, headers, relaxed);
        Ok(Dkim { config, algorithm })
    }

    /// `rsa` or `ed25519`.
    pub fn algorithm(&self) -> &'static str {
        self.algorithm
    }

    /// Adds the DKIM-Signature header, in place.
    pub fn sign(&self, message: &mut Message) {
        message.sign(&self.config);
    }

    /// Adds the DKIM-Signature header without holding up the process's other tasks. An RSA
    /// signature is milliseconds of CPU (2.2 ms with a 2048-bit key on the reference machine,
    /// `compose_cost`), which on the one runtime thread would stall every delivery, ack and
    /// claim of the process meanwhile: it is made on the blocking pool. An Ed25519 signature
    /// (about 40 µs, like building the message) is made in place.
    ///
    /// `Err` says why there is no signature: the signer panicked (a fault in the signing
    /// code, not in the job). The attempt fails with that reason and is retried, as a send
    /// that failed before its first byte, instead of the delivery dying with the panic.
    pub async fn sign_owned(self: &Arc<Self>, message: Message) -> Result<Message, String> {
        if self.algorithm != "rsa" {
            return caught(|| self.signed(message));
        }
        let dkim = Arc::clone(self);
        tokio::task::spawn_blocking(move || caught(|| dkim.signed(message)))
            .await
            .unwrap_or_else(|e| Err(format!("the signing task did not finish: {e}")))
    }

    fn signed(&self, mut message: Message) -> Message {
        self.sign(&mut message);
        message
    }
}

/// What `sign` returns, or the text of its panic.
fn caught(sign: impl FnOnce() -> Message) -> Result<Message, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(sign)).map_err(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        format!("the DKIM signer failed: {text}")
    })
}

/// Letters, digits, `-` and `.` only: a selector or a domain as DNS spells it.
fn dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// The key in `text`, with its algorithm's name.
fn signing_key(text: &str) -> Result<(DkimSigningKey, &'static str), &'static str> {
    let text = text.trim();
    if text.contains("-----BEGIN RSA PRIVATE KEY-----") {
        let key = DkimSigningKey::new(text, DkimSigningAlgorithm::Rsa)
            .map_err(|_| "an unreadable RSA PKCS#1 key")?;
        return Ok((key, "rsa"));
    }
    if text.contains("-----BEGIN PRIVATE KEY-----") {
        let der = pem_body(text).ok_or("an unreadable PEM block")?;
        if let Some(seed) = der.strip_prefix(&ED25519_PKCS8_PREFIX[..]) {
            return ed25519(seed);
        }
        let pkcs1 =
            rsa_pkcs8_to_pkcs1(&der).ok_or("a PKCS#8 key that is neither RSA nor Ed25519")?;
        let key = DkimSigningKey::new(&pkcs1, DkimSigningAlgorithm::Rsa)
            .map_err(|_| "an unreadable RSA key")?;
        return Ok((key, "rsa"));
    }
    if text.contains("-----BEGIN") {
        return Err("an encrypted or unknown PEM block");
    }
    let seed = base64_decode(text).ok_or("neither PEM nor base64")?;
    ed25519(&seed)
}

fn ed25519(seed: &[u8]) -> Result<(DkimSigningKey, &'static str), &'static str> {
    if seed.len() != 32 {
        return Err("an Ed25519 key must be 32 bytes");
    }
    let key = DkimSigningKey::new(&base64_encode(seed), DkimSigningAlgorithm::Ed25519)
        .map_err(|_| "an unreadable Ed25519 key")?;
    Ok((key, "ed25519"))
}

/// The DER bytes of the first PEM block in `text`.
fn pem_body(text: &str) -> Option<Vec<u8>> {
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64_decode(&body)
}

/// An RSA key in PKCS#8 DER as PKCS#1 PEM, which is what lettre reads.
fn rsa_pkcs8_to_pkcs1(der: &[u8]) -> Option<String> {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::pkcs8::DecodePrivateKey;
    let key = rsa::RsaPrivateKey::from_pkcs8_der(der).ok()?;
    let pem = key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).ok()?;
    Some(pem.to_string())
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .ok()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ed25519_seed_in_base64_and_in_pkcs8_pem_are_read_as_ed25519() {
        let seed = [7u8; 32];
        assert_eq!(signing_key(&base64_encode(&seed)).unwrap().1, "ed25519");
        let der = [&ED25519_PKCS8_PREFIX[..], &seed[..]].concat();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64_encode(&der)
        );
        assert_eq!(signing_key(&pem).unwrap().1, "ed25519");
    }

    #[test]
    fn a_selector_or_domain_that_could_add_a_tag_is_refused() {
        assert!(dns_name("mr2026.eu") && dns_name("mail-1.shop.example"));
        for bad in [
            "",
            "shop.example; l=0",
            "[192.0.2.1]",
            "shop example",
            "ex\u{e4}mple.de",
        ] {
            assert!(!dns_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_signer_that_panics_is_an_error_with_its_message_not_a_panic() {
        let e = caught(|| panic!("key too short for this digest")).unwrap_err();
        assert_eq!(e, "the DKIM signer failed: key too short for this digest");
        let e = caught(|| panic!("{} bits", 512)).unwrap_err();
        assert_eq!(e, "the DKIM signer failed: 512 bits");
        let message = Message::builder()
            .from("a@shop.example".parse().unwrap())
            .to("b@shop.example".parse().unwrap())
            .body(String::from("hi"))
            .unwrap();
        assert!(caught(|| message).is_ok());
    }

    #[test]
    fn keys_mailroom_cannot_sign_with_say_why() {
        assert_eq!(
            signing_key(&base64_encode(&[1u8; 31])).err(),
            Some("an Ed25519 key must be 32 bytes")
        );
        assert_eq!(
            signing_key(
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----"
            )
            .err(),
            Some("an encrypted or unknown PEM block")
        );
        assert_eq!(
            signing_key("not a key at all!").err(),
            Some("neither PEM nor base64")
        );
    }
}
