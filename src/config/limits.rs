//! Sending limits as configured: the account's global rate (`MAILROOM_SMTP_RATE`, `14/s`) and
//! the per-recipient-domain limits (`MAILROOM_DOMAIN_LIMITS`). Parsed once at start; every error
//! is one line that quotes the part it could not read.
//!
//! `MAILROOM_DOMAIN_LIMITS` is a comma-separated list of `DOMAIN=LIMIT`, where LIMIT is a rate
//! (`5/s`, `300/min`, `2000/h`), a concurrency (`max 4`), or both separated by a space; the
//! domain `*` is the default of every domain not listed. A listed domain takes what it leaves
//! out from `*`:
//!
//! ```text
//! *=20/s max 8, gmail.com=5/s, yahoo.com=2/s max 2
//! ```
//!
//! Each domain has its own limit (the default is per domain, not shared by all of them).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// A sending rate: `count` emails per `per`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

impl Rate {
    /// Emails per second.
    pub fn per_second(self) -> f64 {
        f64::from(self.count) / self.per.as_secs_f64()
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "min",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// Parses `14/s`, `600/min` or `2000/h`: a positive whole number per second, minute or hour.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let s = s.trim();
    let Some((count, unit)) = s.split_once('/') else {
        return Err(format!("{s:?} is not a rate like 14/s, 600/min or 2000/h"));
    };
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: {:?} is not a whole number", count.trim()))?;
    if count == 0 {
        return Err(format!("{s:?}: a rate must be at least 1"));
    }
    let per = match unit.trim() {
        "s" | "sec" => Duration::from_secs(1),
        "m" | "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        other => return Err(format!("{s:?}: unit {other:?} is not s, min or h")),
    };
    Ok(Rate { count, per })
}

/// One domain's limit; `None` parts are unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DomainLimit {
    pub rate: Option<Rate>,
    /// Sends in flight to the domain at once.
    pub concurrency: Option<u32>,
}

impl DomainLimit {
    pub fn is_unlimited(&self) -> bool {
        self.rate.is_none() && self.concurrency.is_none()
    }

    /// This limit with the parts it leaves out taken from `default`.
    fn or(self, default: DomainLimit) -> DomainLimit {
        DomainLimit {
            rate: self.rate.or(default.rate),
            concurrency: self.concurrency.or(default.concurrency),
        }
    }
}

/// `MAILROOM_DOMAIN_LIMITS`: the default (`*`) and the domains listed, in lower case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DomainLimits {
    pub default: DomainLimit,
    pub domains: BTreeMap<String, DomainLimit>,
}

impl DomainLimits {
    /// Whether anything is configured (then a slow-down reply throttles instead of retrying).
    pub fn is_set(&self) -> bool {
        !self.default.is_unlimited() || !self.domains.is_empty()
    }

    /// The limit of `domain` (lower case): its own, completed by the default.
    pub fn of(&self, domain: &str) -> DomainLimit {
        match self.domains.get(domain) {
            Some(own) => own.or(self.default),
            None => self.default,
        }
    }

    /// Whether `domain` is listed by name (and so has a metric label of its own).
    pub fn lists(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }
}

/// Parses `MAILROOM_DOMAIN_LIMITS` (see the module's documentation).
pub fn parse_domain_limits(s: &str) -> Result<DomainLimits, String> {
    let mut limits = DomainLimits::default();
    let mut seen_default = false;
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((domain, spec)) = entry.split_once('=') else {
            return Err(format!(
                "{entry:?}: expected DOMAIN=LIMIT, e.g. gmail.com=5/s or *=20/s max 8"
            ));
        };
        let domain = domain.trim().to_ascii_lowercase();
        let limit = parse_limit(entry, spec)?;
        if domain == "*" {
            if seen_default {
                return Err(format!("{entry:?}: the default * is given twice"));
            }
            seen_default = true;
            limits.default = limit;
            continue;
        }
        check_domain(entry, &domain)?;
        if limits.domains.insert(domain.clone(), limit).is_some() {
            return Err(format!("{entry:?}: {domain} is given twice"));
        }
    }
    Ok(limits)
}

/// `5/s`, `max 4`, or `5/s max 4`.
fn parse_limit(entry: &str, spec: &str) -> Result<DomainLimit, String> {
    let mut limit = DomainLimit::default();
    let mut words = spec.split_whitespace();
    while let Some(word) = words.next() {
        if word == "max" {
            let n = words
                .next()
                .ok_or_else(|| format!("{entry:?}: `max` needs a number of sends at once"))?;
            let n: u32 = n
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{entry:?}: max {n:?} is not a number of at least 1"))?;
            if limit.concurrency.replace(n).is_some() {
                return Err(format!("{entry:?}: two concurrencies"));
            }
        } else {
            let rate = parse_rate(word).map_err(|e| format!("{entry:?}: {e}"))?;
            if limit.rate.replace(rate).is_some() {
                return Err(format!("{entry:?}: two rates"));
            }
        }
    }
    if limit.is_unlimited() {
        return Err(format!(
            "{entry:?}: no limit given; expected a rate (5/s) and/or max N"
        ));
    }
    Ok(limit)
}

fn check_domain(entry: &str, domain: &str) -> Result<(), String> {
    let valid = !domain.is_empty()
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{entry:?}: {domain:?} is not a domain (letters, digits, dots and dashes, or *)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(count: u32, secs: u64) -> Option<Rate> {
        Some(Rate {
            count,
            per: Duration::from_secs(secs),
        })
    }

    #[test]
    fn rates_read_per_second_minute_and_hour() {
        assert_eq!(parse_rate("14/s").ok(), rate(14, 1));
        assert_eq!(parse_rate(" 600/min ").ok(), rate(600, 60));
        assert_eq!(parse_rate("2000/h").ok(), rate(2000, 3600));
        assert!((parse_rate("600/min").unwrap().per_second() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_bad_rate_is_refused_with_the_part_that_is_wrong() {
        assert_eq!(
            parse_rate("14").unwrap_err(),
            "\"14\" is not a rate like 14/s, 600/min or 2000/h"
        );
        assert_eq!(
            parse_rate("14/d").unwrap_err(),
            "\"14/d\": unit \"d\" is not s, min or h"
        );
        assert_eq!(
            parse_rate("x/s").unwrap_err(),
            "\"x/s\": \"x\" is not a whole number"
        );
        assert_eq!(
            parse_rate("0/s").unwrap_err(),
            "\"0/s\": a rate must be at least 1"
        );
    }

    #[test]
    fn domain_limits_take_what_they_leave_out_from_the_default() {
        let l = parse_domain_limits("*=20/s max 8, Gmail.com=5/s, yahoo.com=2/s max 2").unwrap();
        assert!(l.is_set());
        assert_eq!(
            l.of("gmail.com"),
            DomainLimit {
                rate: rate(5, 1),
                concurrency: Some(8)
            }
        );
        assert_eq!(
            l.of("yahoo.com"),
            DomainLimit {
                rate: rate(2, 1),
                concurrency: Some(2)
            }
        );
        assert_eq!(l.of("example.org"), l.default);
        assert!(l.lists("gmail.com") && !l.lists("example.org"));
    }

    #[test]
    fn a_domain_may_limit_only_its_concurrency() {
        let l = parse_domain_limits("outlook.com=max 4").unwrap();
        assert_eq!(
            l.of("outlook.com"),
            DomainLimit {
                rate: None,
                concurrency: Some(4)
            }
        );
        assert!(l.of("gmail.com").is_unlimited());
    }

    #[test]
    fn nothing_configured_is_no_limit() {
        let l = parse_domain_limits("").unwrap();
        assert!(!l.is_set());
        assert!(l.of("gmail.com").is_unlimited());
    }

    #[test]
    fn bad_domain_limits_are_refused_in_one_line_naming_the_entry() {
        let cases = [
            (
                "gmail.com",
                "\"gmail.com\": expected DOMAIN=LIMIT, e.g. gmail.com=5/s or *=20/s max 8",
            ),
            (
                "gmail.com=",
                "\"gmail.com=\": no limit given; expected a rate (5/s) and/or max N",
            ),
            (
                "gmail.com=5/x",
                "\"gmail.com=5/x\": \"5/x\": unit \"x\" is not s, min or h",
            ),
            (
                "gmail.com=max",
                "\"gmail.com=max\": `max` needs a number of sends at once",
            ),
            (
                "gmail.com=max 0",
                "\"gmail.com=max 0\": max \"0\" is not a number of at least 1",
            ),
            ("gmail.com=5/s 6/s", "\"gmail.com=5/s 6/s\": two rates"),
            (
                "a.com=1/s, A.com=2/s",
                "\"A.com=2/s\": a.com is given twice",
            ),
            ("*=1/s,*=2/s", "\"*=2/s\": the default * is given twice"),
            (
                "gm ail.com=1/s",
                "\"gm ail.com=1/s\": \"gm ail.com\" is not a domain (letters, digits, dots and dashes, or *)",
            ),
        ];
        for (input, error) in cases {
            assert_eq!(parse_domain_limits(input).unwrap_err(), error, "{input}");
        }
    }
}
