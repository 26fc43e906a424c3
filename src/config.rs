//! Configuration: every option is a CLI flag and an environment variable (clap `env`), parsed
//! and validated once at start into typed settings. Durations read as `500ms`, `15s`, `2m`.
//!
//! | variable | meaning |
//! | --- | --- |
//! | `DATABASE_URL` | `postgres://…` |
//! | `AMQP_URL` | `amqp://…` / `amqps://…`; a comma-separated list fails over between nodes |
//! | `SMTP_URL` | `smtp://`, `smtps://`, `smtp://…?tls=required`, with credentials; `file:///dir` |
//! | `MAILROOM_NAMESPACE` | prefix of every exchange and queue name (`mailroom`) |
//! | `MAILROOM_TEMPLATES` | template directory |
//! | `MAILROOM_FROM` | sender mailbox |
//! | `MAILROOM_MESSAGE_ID_DOMAIN` | right-hand side of the Message-ID |
//! | `MAILROOM_ON_UNCERTAIN` | `resend` or `dead-letter` |
//! | `MAILROOM_LEASE`, `MAILROOM_SMTP_TIMEOUT`, `MAILROOM_RETRY_DELAYS`, `MAILROOM_MAX_ATTEMPTS` | see `mailroom worker --help` |
//! | `MAILROOM_CONCURRENCY`, `MAILROOM_PREFETCH`, `MAILROOM_SMTP_CONNECTIONS`, `MAILROOM_SHUTDOWN_GRACE` | see `mailroom worker --help` |
//! | `MAILROOM_TEMPLATE_RELOAD_INTERVAL` | how often `worker`, `run` and `serve` check the template directory for edits |
//! | `MAILROOM_METRICS_ADDR` | an own `/metrics` listener for `worker` or `relay` |
//!
//! URLs are held in [`SecretUrl`], whose `Display` and `Debug` never show a password, and
//! `--help` never prints the values found in the environment.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use url::Url;

/// A URL that may carry credentials. Formatting masks the password; only [`SecretUrl::expose`]
/// gives the full text, for the one call that connects.
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
            let _ = shown.set_password(Some("***"));
        }
        f.write_str(shown.as_str())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_url_never_formats_its_password() {
        let url: SecretUrl = "amqp://user:hunter2@broker:5672/%2f".parse().unwrap();
        assert!(!url.to_string().contains("hunter2"));
        assert!(!format!("{url:?}").contains("hunter2"));
        assert!(url.expose().contains("hunter2"));
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
