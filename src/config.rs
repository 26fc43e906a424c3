//! Configuration: every option is a CLI flag and an environment variable (clap `env`), parsed
//! and validated once at start into typed settings. Durations read as `500ms`, `15s`, `2m`.
//!
//! | variable | meaning |
//! | --- | --- |
//! | `DATABASE_URL` | `postgres://…` |
//! | `AMQP_URL` | `amqp://…` / `amqps://…`; a comma-separated list fails over between nodes |
//! | `SMTP_URL` | `smtp://`, `smtps://`, `smtp://…?tls=required`, with credentials (only over `smtps://` or `tls=required`, or on loopback); `file:///dir` |
//! | `MAILROOM_NAMESPACE` | prefix of every exchange and queue name (`mailroom`) |
//! | `MAILROOM_TEMPLATES` | template directory |
//! | `MAILROOM_FROM` | sender mailbox, an address such as `Shop <shop@example.com>` |
//! | `MAILROOM_ALLOW_PLAIN_SMTP` | `true`: allow a plain `smtp://` URL to a host that is not loopback (a relay on a private network) |
//! | `MAILROOM_MESSAGE_ID_DOMAIN` | right-hand side of the Message-ID |
//! | `MAILROOM_ON_UNCERTAIN` | `resend` or `dead-letter` |
//! | `MAILROOM_LEASE`, `MAILROOM_SMTP_TIMEOUT`, `MAILROOM_RETRY_DELAYS`, `MAILROOM_MAX_ATTEMPTS` | see `mailroom worker --help` |
//! | `MAILROOM_CONCURRENCY`, `MAILROOM_PREFETCH`, `MAILROOM_SMTP_CONNECTIONS`, `MAILROOM_SHUTDOWN_GRACE` | see `mailroom worker --help`; the prefetch is at least the concurrency (default twice it) |
//! | `MAILROOM_TEMPLATE_RELOAD_INTERVAL` | how often `worker`, `run` and `serve` check the template directory for edits |
//! | `MAILROOM_METRICS_ADDR` | an own `/metrics` listener for `worker` or `relay` |
//! | `MAILROOM_REPLAY_KEY` | seals replayed dead letters (default: a random key kept in the database) |
//! | `MAILROOM_SMTP_RATE`, `MAILROOM_DOMAIN_LIMITS` | the account's send rate and the per-domain limits ([`limits`]) |
//!
//! URLs are held in [`SecretUrl`], whose `Display` and `Debug` never show a password (neither
//! the one before `@` nor one in the query string, `?password=`, `?sslpassword=`, `?token=`, …),
//! and `--help` never prints the values found in the environment.

pub mod limits;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lettre::message::Mailbox;
use url::Url;

use crate::exit::Fatal;

/// A URL that may carry credentials. Formatting masks the password and every secret query
/// parameter ([`is_secret_key`]); only [`SecretUrl::expose`] gives the full text, for the one
/// call that connects.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(Url);

impl SecretUrl {
    pub fn expose(&self) -> &str {
        self.0.as_str()
    }

    pub fn scheme(&self) -> &str {
        self.0.scheme()
    }

    pub fn url(&self) -> &Url {
        &self.0
    }
}

impl FromStr for SecretUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The parse error names the problem, never the input (which may hold a password).
        Url::parse(s.trim())
            .map(SecretUrl)
            .map_err(|e| format!("not a valid URL: {e}"))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.clone();
        if shown.password().is_some() {
            let _ = shown.set_password(Some(MASK));
        }
        if let Some(query) = shown.query() {
            let masked = mask_query(query);
            shown.set_query(Some(&masked));
        }
        f.write_str(shown.as_str())
    }
}

/// What a masked secret shows.
const MASK: &str = "***";

/// The raw query with the value of every secret parameter replaced by [`MASK`]; the other
/// parameters keep their exact text (no re-encoding).
fn mask_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_secret_key(key) => format!("{key}={MASK}"),
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A query parameter that holds a credential: `pass`, `pwd`, `passwd`, or any key containing
/// `password`, `secret`, `token` or `apikey`/`api_key` (case-insensitive, after decoding, so
/// `sslpassword`, `client_secret`, `access_token` and `pass%77ord` are all masked).
pub fn is_secret_key(raw_key: &str) -> bool {
    // The key holds no `=` or `&` here, so it parses as one pair with an empty value.
    let key: String = url::form_urlencoded::parse(raw_key.as_bytes())
        .map(|(k, _)| k.to_ascii_lowercase())
        .collect();
    matches!(key.as_str(), "pass" | "pwd" | "passwd")
        || ["password", "secret", "token", "apikey", "api_key"]
            .iter()
            .any(|word| key.contains(word))
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({self})")
    }
}

/// A comma-separated list of URLs (AMQP nodes to fail over between).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlList(pub Vec<SecretUrl>);

impl FromStr for UrlList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let urls = s
            .split(',')
            .filter(|part| !part.trim().is_empty())
            .map(SecretUrl::from_str)
            .collect::<Result<Vec<_>, _>>()?;
        if urls.is_empty() {
            return Err("needs at least one URL".into());
        }
        Ok(UrlList(urls))
    }
}

impl fmt::Display for UrlList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, url) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{url}")?;
        }
        Ok(())
    }
}

/// Parses `500ms`, `15s`, `2m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("not a duration like 500ms, 15s or 2m: {e}"))
}

/// Parses a comma-separated list of durations, strictly increasing: the retry tiers.
pub fn parse_delays(s: &str) -> Result<Delays, String> {
    let delays = s
        .split(',')
        .map(parse_duration)
        .collect::<Result<Vec<_>, _>>()?;
    if delays.is_empty() || delays.iter().any(|d| d.is_zero()) {
        return Err("needs one or more non-zero delays".into());
    }
    if delays.windows(2).any(|w| w[0] >= w[1]) {
        return Err("delays must be strictly increasing".into());
    }
    Ok(Delays(delays))
}

/// Retry tiers, shortest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delays(pub Vec<Duration>);

/// What to do when an email may have been accepted by the SMTP server but the result was not
/// recorded (the reply to the final dot was lost, or the worker died before recording).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnUncertain {
    /// Send again with the same Message-ID: at-least-once, a rare duplicate.
    Resend,
    /// Dead-letter it for a human: at-most-once, a rare loss.
    DeadLetter,
}

/// `localhost`, `127.0.0.0/8` or `::1` (a URL host keeps IPv6 in brackets): a host whose
/// traffic never leaves the machine, the only place a plaintext link is allowed.
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Parses the sender mailbox (`--from`): `shop@example.com` or `Shop <shop@example.com>`.
/// An internationalised domain is kept in its ASCII form, as the jobs' addresses are.
pub fn parse_from(s: &str) -> Result<Mailbox, String> {
    let mailbox = s.trim().parse().map_err(|_| {
        format!(
            "{s:?} is not an email address: --from must be an email address such as \
             `Shop <shop@example.com>` or `shop@example.com`"
        )
    })?;
    crate::job::with_ascii_domain(mailbox).map_err(|why| format!("--from {s:?}: {why}"))
}

/// Refuses a plain `smtp://` URL (no `tls=`, or `tls=none`) to a host that is not loopback,
/// where every email would cross the network readable: unless `allow_plain` (a relay on a
/// private network, said with `--allow-plain-smtp`).
pub fn check_smtp_url(url: &SecretUrl, allow_plain: bool) -> Result<(), Fatal> {
    let u = url.url();
    let tls = u.query_pairs().find(|(k, _)| k == "tls").map(|(_, v)| v);
    let plain = u.scheme() == "smtp" && tls.as_deref().is_none_or(|t| t == "none");
    let host = u.host_str().unwrap_or_default();
    if !plain || allow_plain || is_loopback(host) {
        return Ok(());
    }
    Err(Fatal::Config(format!(
        "SMTP_URL {url} is plain text to {host}, which is not loopback: use smtps:// or \
         ?tls=required, or pass --allow-plain-smtp (MAILROOM_ALLOW_PLAIN_SMTP=true) for a relay \
         on a network you trust"
    )))
}

/// The prefetch a worker uses: `prefetch` when given (at least `concurrency`, or slots would
/// sit idle waiting for deliveries the broker never sends ahead), else twice `concurrency`.
pub fn prefetch_for(concurrency: usize, prefetch: Option<u16>) -> Result<u16, Fatal> {
    let concurrency16 = u16::try_from(concurrency).unwrap_or(u16::MAX);
    match prefetch {
        None => Ok(concurrency16.saturating_mul(2)),
        Some(p) if p >= concurrency16 => Ok(p),
        Some(p) => Err(Fatal::Config(format!(
            "--prefetch {p} is below --concurrency {concurrency}: RabbitMQ would send at most {p} \
             deliveries ahead and {} slots would stay idle; raise --prefetch to at least \
             {concurrency}, or lower --concurrency to {p}",
            concurrency - usize::from(p)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_from_without_an_address_says_what_one_looks_like() {
        let e = parse_from("Shop").unwrap_err();
        assert!(
            e.contains("--from must be an email address such as `Shop <shop@example.com>`"),
            "{e}"
        );
        assert_eq!(
            parse_from("Shop <shop@example.com>")
                .unwrap()
                .email
                .to_string(),
            "shop@example.com"
        );
        let idn = parse_from("Bäckerei <laden@bäckerei.de>").unwrap();
        assert_eq!(idn.email.to_string(), "laden@xn--bckerei-5wa.de");
    }

    #[test]
    fn plain_smtp_is_allowed_on_loopback_only_unless_opted_out() {
        let url = |s: &str| s.parse::<SecretUrl>().unwrap();
        for ok in [
            "smtp://127.0.0.1:2525",
            "smtp://localhost",
            "smtp://[::1]:25",
            "smtps://mail.example",
            "smtp://mail.example:587?tls=required",
            "smtp://mail.example:587?tls=opportunistic",
            "file:///tmp/mail",
        ] {
            assert!(check_smtp_url(&url(ok), false).is_ok(), "{ok}");
        }
        for plain in ["smtp://mail.example:25", "smtp://10.0.0.7?tls=none"] {
            let e = check_smtp_url(&url(plain), false).unwrap_err();
            assert!(matches!(e, Fatal::Config(_)), "{plain}");
            assert!(e.to_string().contains("--allow-plain-smtp"), "{e}");
            assert!(check_smtp_url(&url(plain), true).is_ok(), "{plain}");
        }
    }

    #[test]
    fn prefetch_defaults_to_twice_the_concurrency_and_is_never_below_it() {
        assert_eq!(prefetch_for(32, None).unwrap(), 64);
        assert_eq!(prefetch_for(8, Some(8)).unwrap(), 8);
        assert_eq!(prefetch_for(40_000, None).unwrap(), u16::MAX);
        let e = prefetch_for(32, Some(4)).unwrap_err().to_string();
        assert!(
            e.starts_with("--prefetch 4 is below --concurrency 32"),
            "{e}"
        );
    }

    #[test]
    fn secret_url_never_formats_its_password() {
        let url: SecretUrl = "amqp://user:hunter2@broker:5672/%2f".parse().unwrap();
        assert!(!url.to_string().contains("hunter2"));
        assert!(!format!("{url:?}").contains("hunter2"));
        assert!(url.expose().contains("hunter2"));
    }

    #[test]
    fn secret_url_masks_passwords_in_the_query_string() {
        let cases = [
            "postgres://db/app?password=hunter2",
            "postgres://db/app?sslmode=require&sslpassword=hunter2",
            "mysql://db/app?PASSWORD=hunter2&ssl-mode=REQUIRED",
            "amqps://broker/%2f?pass=hunter2",
            "amqp://broker/%2f?token=hunter2",
            "https://x/?client_secret=hunter2",
            "https://x/?access_token=hunter2#frag",
            "postgres://db/app?pass%77ord=hunter2",
            "postgres://u:hunter2@db/app?password=hunter2&password=hunter2",
        ];
        for text in cases {
            let url: SecretUrl = text.parse().unwrap();
            let (shown, debug) = (url.to_string(), format!("{url:?}"));
            assert!(!shown.contains("hunter2"), "{text} → {shown}");
            assert!(!debug.contains("hunter2"), "{text} → {debug}");
            assert!(shown.contains("=***"), "{text} → {shown}");
            assert_eq!(url.expose(), text, "connecting uses the real URL");
        }
    }

    #[test]
    fn secret_url_leaves_other_query_parameters_as_written() {
        let text = "postgres://u@db:5432/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=a+b";
        let url: SecretUrl = text.parse().unwrap();
        assert_eq!(url.to_string(), text);
        let url: SecretUrl = "smtp://mail.example:587?tls=required&password=p%26w&x"
            .parse()
            .unwrap();
        assert_eq!(
            url.to_string(),
            "smtp://mail.example:587?tls=required&password=***&x"
        );
    }

    #[test]
    fn secret_keys_are_recognised_whatever_their_case() {
        for key in [
            "password",
            "sslpassword",
            "pass",
            "PWD",
            "passwd",
            "token",
            "auth_token",
            "secret",
            "Client-Secret",
            "apikey",
            "api_key",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "sslmode",
            "user",
            "tls",
            "passive",
            "heartbeat",
            "sslrootcert",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
    }

    #[test]
    fn url_list_splits_on_commas() {
        let list: UrlList = "amqp://a:1/%2f, amqp://b:2/%2f".parse().unwrap();
        assert_eq!(list.0.len(), 2);
        assert!("".parse::<UrlList>().is_err());
    }

    #[test]
    fn delays_must_increase() {
        assert_eq!(
            parse_delays("5s,30s,2m").unwrap().0,
            vec![
                Duration::from_secs(5),
                Duration::from_secs(30),
                Duration::from_secs(120)
            ]
        );
        assert!(parse_delays("30s,5s").is_err());
        assert!(parse_delays("0s").is_err());
        assert!(parse_delays("soon").is_err());
    }
}
