//! The session cookie: what it says ([`Claims`]), how it is sealed and opened ([`Keys`]), and
//! the CSRF token derived from it. `auth` decides who gets one.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderValue, header};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const COOKIE: &str = "mailroom_console";
/// How long a login lasts: a working day, then the token again.
pub(super) const SESSION_SECS: i64 = 12 * 3600;
/// The longest name kept for the revision history.
const MAX_NAME_CHARS: usize = 64;

type HmacSha256 = Hmac<Sha256>;

/// The signing key, and the token logins are checked against.
pub(super) struct Keys {
    pub(super) token: Option<String>,
    key: [u8; 32],
}

impl Keys {
    /// With a token, the key is derived from it (the same on every process); without, random.
    pub(super) fn new(token: Option<&str>) -> Keys {
        let key = match token {
            Some(t) => mac_of(t.as_bytes(), b"mailroom console session key v1"),
            None => {
                let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
                mac_of(a.as_bytes(), b.as_bytes())
            }
        };
        Keys {
            token: token.map(str::to_owned),
            key,
        }
    }

    fn sign(&self, payload: &str) -> String {
        hex::encode(mac_of(&self.key, payload.as_bytes()))
    }

    pub(super) fn seal(&self, claims: &Claims) -> String {
        let payload = format!(
            "v1.{}.{}.{}.{}",
            claims.expires,
            claims.nonce,
            u8::from(claims.authenticated),
            hex::encode(claims.name.as_bytes())
        );
        let mac = self.sign(&payload);
        format!("{payload}.{mac}")
    }

    pub(super) fn open(&self, value: &str) -> Option<Claims> {
        let (payload, mac) = value.rsplit_once('.')?;
        if !constant_time_eq(self.sign(payload).as_bytes(), mac.as_bytes()) {
            return None;
        }
        let mut parts = payload.split('.');
        let (v, expires, nonce) = (parts.next()?, parts.next()?, parts.next()?);
        let (authenticated, name) = (parts.next()?, parts.next()?);
        let expires: i64 = expires.parse().ok()?;
        if v != "v1" || expires < now() {
            return None;
        }
        let name = String::from_utf8(hex::decode(name).ok()?).ok()?;
        Some(Claims {
            expires,
            nonce: nonce.to_owned(),
            authenticated: authenticated == "1",
            name,
        })
    }

    pub(super) fn csrf(&self, claims: &Claims) -> String {
        self.sign(&format!("csrf.{}", claims.nonce))
    }
}

fn mac_of(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn now() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

/// What a session cookie says.
pub(super) struct Claims {
    pub(super) expires: i64,
    pub(super) nonce: String,
    pub(super) authenticated: bool,
    pub(super) name: String,
}

impl Claims {
    pub(super) fn fresh(authenticated: bool, name: &str) -> Claims {
        Claims {
            expires: now() + SESSION_SECS,
            nonce: uuid::Uuid::new_v4().simple().to_string(),
            authenticated,
            name: name.chars().take(MAX_NAME_CHARS).collect(),
        }
    }
}

pub(super) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find_map(|(k, v)| (k == COOKIE).then_some(v))
}

/// Whether the request reached the TLS proxy in front of mailroom over HTTPS.
fn over_https(headers: &HeaderMap) -> bool {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    value("x-forwarded-proto").is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
        || value("forwarded").is_some_and(|f| f.to_ascii_lowercase().contains("proto=https"))
}

pub(super) fn set_cookie(headers: &HeaderMap, value: &str, max_age: i64) -> HeaderValue {
    let secure = if over_https(headers) { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    );
    HeaderValue::from_str(&cookie).expect("a cookie of hex digits and dots")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_session_opens_with_the_same_token_only() {
        let claims = Claims::fresh(true, "Ada");
        let sealed = Keys::new(Some("t1")).seal(&claims);
        let opened = Keys::new(Some("t1")).open(&sealed).unwrap();
        assert!(opened.authenticated);
        assert_eq!(opened.name, "Ada");
        assert!(Keys::new(Some("t2")).open(&sealed).is_none());
        assert!(Keys::new(None).open(&sealed).is_none());
    }

    #[test]
    fn a_tampered_or_expired_session_is_refused() {
        let keys = Keys::new(Some("t"));
        let sealed = keys.seal(&Claims::fresh(false, "x"));
        let forged = sealed.replacen(".0.", ".1.", 1);
        assert!(keys.open(&forged).is_none());
        let mut old = Claims::fresh(true, "x");
        old.expires = now() - 1;
        assert!(keys.open(&keys.seal(&old)).is_none());
    }

    #[test]
    fn the_csrf_token_belongs_to_one_session() {
        let keys = Keys::new(Some("t"));
        let (a, b) = (Claims::fresh(true, "a"), Claims::fresh(true, "a"));
        assert_ne!(keys.csrf(&a), keys.csrf(&b));
        assert_eq!(
            keys.csrf(&a),
            keys.csrf(&keys.open(&keys.seal(&a)).unwrap())
        );
    }
}
