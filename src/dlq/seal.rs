//! The seal on a replayed copy. `x-mailroom-replay` lets a worker claim a `dead` or `uncertain`
//! row once more and skip the poison guard; anyone who may publish to the exchange could set
//! it. So [`DeadLetters::replay`](super::DeadLetters::replay) also sets
//! `x-mailroom-replay-seal`: an HMAC-SHA256 over the replay count and the body, with a key only
//! mailroom's processes know. A worker honours the replay marker only when the seal matches;
//! otherwise the copy is an ordinary one (a `dead` row stays dead) and a WARN says so.
//!
//! The key is `MAILROOM_REPLAY_KEY` when set (the same on every worker and every process that
//! replays), else a random key stored in the database (`mailroom_secrets`) by whichever process
//! needs it first, so operators configure nothing. The body covers the job id, kind, recipients
//! and data; retries keep the headers, so a replayed copy keeps its seal through the tiers.

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, Mac};
use lapin::{BasicProperties, message::Delivery, types::AMQPValue};
use sha2::Sha256;
use tokio::sync::OnceCell;

use crate::broker;
use crate::db::Database;

/// The header holding the seal (lower-case hex).
pub const SEAL_HEADER: &str = "x-mailroom-replay-seal";
/// The name of the stored key in `mailroom_secrets`.
const KEY_NAME: &str = "replay_key";
/// A shorter configured key is refused: 32 characters of `openssl rand -hex 16` or more.
const MIN_KEY_LEN: usize = 32;
/// Separates this MAC from any other use of the same key.
const CONTEXT: &[u8] = b"mailroom replay seal v1\0";

/// The key that seals replayed copies. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ReplayKey(Vec<u8>);

impl ReplayKey {
    /// A new random key (256 bits, as 64 hex characters).
    pub fn generate() -> ReplayKey {
        let text = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        ReplayKey(text.into_bytes())
    }

    fn mac(&self, replays: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(CONTEXT);
        mac.update(&replays.to_be_bytes());
        mac.update(body);
        mac
    }

    /// The seal of a copy replayed `replays` times with this body.
    pub fn seal(&self, replays: i64, body: &[u8]) -> String {
        hex::encode(self.mac(replays, body).finalize().into_bytes())
    }

    /// Whether `seal` is this key's seal of (`replays`, `body`), compared in constant time.
    pub fn verify(&self, replays: i64, body: &[u8], seal: &str) -> bool {
        hex::decode(seal).is_ok_and(|tag| self.mac(replays, body).verify_slice(&tag).is_ok())
    }
}

impl FromStr for ReplayKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() < MIN_KEY_LEN {
            return Err(format!(
                "MAILROOM_REPLAY_KEY must be at least {MIN_KEY_LEN} characters (e.g. `openssl rand -hex 32`)"
            ));
        }
        Ok(ReplayKey(s.as_bytes().to_vec()))
    }
}

impl fmt::Debug for ReplayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReplayKey(***)")
    }
}

/// The configured key, else the database's (read once, created when missing).
pub async fn resolve(configured: Option<&ReplayKey>, db: &Database) -> anyhow::Result<ReplayKey> {
    if let Some(key) = configured {
        return Ok(key.clone());
    }
    let candidate = ReplayKey::generate();
    let candidate = std::str::from_utf8(&candidate.0).expect("hex is UTF-8");
    let stored = db
        .secret_or_insert(KEY_NAME, candidate)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "reading the replay key from the database: {e} (has `mailroom migrate` run?)"
            )
        })?;
    Ok(ReplayKey(stored.into_bytes()))
}

/// A worker's key: resolved on the first replayed copy it sees, then kept.
pub struct ReplayKeys {
    configured: Option<ReplayKey>,
    db: Database,
    resolved: OnceCell<ReplayKey>,
}

impl ReplayKeys {
    pub fn new(configured: Option<ReplayKey>, db: Database) -> ReplayKeys {
        ReplayKeys {
            configured,
            db,
            resolved: OnceCell::new(),
        }
    }

    async fn get(&self) -> anyhow::Result<&ReplayKey> {
        self.resolved
            .get_or_try_init(|| resolve(self.configured.as_ref(), &self.db))
            .await
    }
}

/// What the replay headers of a delivery say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No replay marker: an ordinary copy.
    NotReplay,
    /// Replayed by mailroom: its seal matches.
    Genuine,
    /// A replay marker without a valid seal: treated as an ordinary copy.
    Forged,
}

/// Judges the replay headers of a message with this body.
pub fn judge(key: &ReplayKey, props: &BasicProperties, body: &[u8]) -> Verdict {
    let Some(replays) = broker::int_header(props, broker::REPLAY_HEADER).filter(|n| *n > 0) else {
        return Verdict::NotReplay;
    };
    let seal = props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(SEAL_HEADER))
        .and_then(|v| match v {
            AMQPValue::LongString(s) => Some(s.to_string()),
            AMQPValue::ShortString(s) => Some(s.to_string()),
            _ => None,
        });
    match seal {
        Some(seal) if key.verify(replays, body, &seal) => Verdict::Genuine,
        _ => Verdict::Forged,
    }
}

impl ReplayKeys {
    /// Whether a delivery may use replay privileges: only a copy sealed by mailroom's own
    /// replay. A forged or missing seal is logged (once: this runs once per delivery) and gives
    /// `false`. An error only when the key cannot be read (the database is down): try later.
    pub async fn honour(&self, delivery: &Delivery) -> anyhow::Result<bool> {
        let props = &delivery.properties;
        if broker::int_header(props, broker::REPLAY_HEADER).is_none_or(|n| n <= 0) {
            return Ok(false);
        }
        match judge(self.get().await?, props, &delivery.data) {
            Verdict::Genuine => Ok(true),
            Verdict::NotReplay => Ok(false),
            Verdict::Forged => {
                tracing::warn!(
                    "replay marker without a valid seal (not published by `mailroom dlq replay`, or with another MAILROOM_REPLAY_KEY): handled as an ordinary copy"
                );
                Ok(false)
            }
        }
    }
}

/// `props` with the seal of a copy that carries this body (the replay count must be set).
pub fn sealed(props: BasicProperties, body: &[u8], key: &ReplayKey) -> BasicProperties {
    let replays = broker::int_header(&props, broker::REPLAY_HEADER).unwrap_or(0);
    let seal = key.seal(replays, body);
    broker::with_headers(&props, &[(SEAL_HEADER, broker::text_value(&seal))])
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldTable;

    use super::*;

    fn key(c: char) -> ReplayKey {
        c.to_string().repeat(MIN_KEY_LEN).parse().unwrap()
    }

    fn replayed(n: i64) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(broker::REPLAY_HEADER.into(), AMQPValue::LongLongInt(n));
        BasicProperties::default().with_headers(h)
    }

    const BODY: &[u8] = br#"{"job_id":"j1","kind":"welcome","to":["ada@example.com"]}"#;

    #[test]
    fn a_copy_sealed_with_the_key_is_a_genuine_replay() {
        let props = sealed(replayed(2), BODY, &key('a'));
        assert_eq!(judge(&key('a'), &props, BODY), Verdict::Genuine);
    }

    #[test]
    fn a_replay_marker_without_a_seal_is_forged() {
        assert_eq!(judge(&key('a'), &replayed(1), BODY), Verdict::Forged);
        let junk = broker::with_headers(&replayed(1), &[(SEAL_HEADER, broker::text_value("zz"))]);
        assert_eq!(judge(&key('a'), &junk, BODY), Verdict::Forged);
    }

    #[test]
    fn a_seal_does_not_carry_over_to_another_body_count_or_key() {
        let props = sealed(replayed(1), BODY, &key('a'));
        assert_eq!(judge(&key('b'), &props, BODY), Verdict::Forged);
        assert_eq!(judge(&key('a'), &props, b"{}"), Verdict::Forged);
        let bumped = broker::with_headers(
            &props,
            &[(broker::REPLAY_HEADER, AMQPValue::LongLongInt(2))],
        );
        assert_eq!(judge(&key('a'), &bumped, BODY), Verdict::Forged);
    }

    #[test]
    fn a_copy_without_a_positive_replay_count_is_no_replay() {
        assert_eq!(
            judge(&key('a'), &BasicProperties::default(), BODY),
            Verdict::NotReplay
        );
        let zero = sealed(replayed(0), BODY, &key('a'));
        assert_eq!(judge(&key('a'), &zero, BODY), Verdict::NotReplay);
    }

    #[test]
    fn a_short_configured_key_is_refused_and_no_key_is_ever_printed() {
        let err = "short".parse::<ReplayKey>().unwrap_err();
        assert!(err.contains("MAILROOM_REPLAY_KEY"), "{err}");
        assert_eq!(format!("{:?}", key('s')), "ReplayKey(***)");
        let a = ReplayKey::generate();
        assert_eq!(a.0.len(), 64);
        assert_ne!(a, ReplayKey::generate());
    }
}
