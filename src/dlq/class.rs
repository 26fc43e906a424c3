//! Why a job is in the dead-letter queue, as a filter takes it: the classes the worker writes in
//! `x-mailroom-error-class` (its `ErrorClass`), and the ones read from the broker's own
//! dead-lettering when that header is absent ([`super::letter`]). A filter naming anything else
//! is refused with this list, on the CLI and over HTTP alike, instead of matching nothing.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// One class of dead letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Not a valid job: not JSON, wrong shape, a bad address, an unknown kind.
    Invalid,
    /// The template could not render the job's data (a missing variable, an unsafe subject).
    Template,
    /// The SMTP server refused it for good (5xx).
    Rejected,
    /// Transient failures until the attempts ran out.
    Exhausted,
    /// Perhaps sent: the policy is to let a person decide.
    Uncertain,
    /// Still unsent at its `expires_at`: never sent.
    Expired,
    /// RabbitMQ's delivery limit: a job that kept crashing or stalling workers.
    Poison,
    /// Dead-lettered by RabbitMQ for another reason (a worker's reject without requeue).
    Broker,
    /// Neither a class header nor an `x-death` record.
    Unknown,
}

impl Class {
    /// Every class, in the order help texts list them.
    pub const ALL: [Class; 9] = [
        Class::Invalid,
        Class::Template,
        Class::Rejected,
        Class::Exhausted,
        Class::Uncertain,
        Class::Expired,
        Class::Poison,
        Class::Broker,
        Class::Unknown,
    ];

    /// The name in headers, listings, filters and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Invalid => "invalid",
            Class::Template => "template",
            Class::Rejected => "rejected",
            Class::Exhausted => "exhausted",
            Class::Uncertain => "uncertain",
            Class::Expired => "expired",
            Class::Poison => "poison",
            Class::Broker => "broker",
            Class::Unknown => "unknown",
        }
    }

    /// One line on what the class means, for `--help`.
    pub fn describe(self) -> &'static str {
        match self {
            Class::Invalid => "not a valid job (shape, address, unknown kind)",
            Class::Template => "the template could not render the job's data",
            Class::Rejected => "refused for good by the SMTP server (5xx)",
            Class::Exhausted => "transient failures until the attempts ran out",
            Class::Uncertain => "perhaps sent; left for a person to decide",
            Class::Expired => "still unsent at its expires_at; never sent",
            Class::Poison => "over RabbitMQ's delivery limit (crashed or stalled workers)",
            Class::Broker => "dead-lettered by RabbitMQ for another reason",
            Class::Unknown => "no class header and no x-death record",
        }
    }

    /// The valid names, comma-separated, for error messages.
    pub fn names() -> String {
        Class::ALL.map(Class::as_str).join(", ")
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A class name that is none of [`Class::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown class {given:?}; the classes are: {}", Class::names())]
pub struct UnknownClass {
    pub given: String,
}

impl FromStr for Class {
    type Err = UnknownClass;

    fn from_str(s: &str) -> Result<Class, UnknownClass> {
        Class::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownClass {
                given: s.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_reads_back_from_its_name() {
        for class in Class::ALL {
            assert_eq!(class.as_str().parse(), Ok(class));
            assert_eq!(serde_json::to_value(class).unwrap(), class.as_str());
        }
    }

    #[test]
    fn an_unknown_class_is_refused_with_the_list_of_classes() {
        let err = "bogus".parse::<Class>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown class \"bogus\"; the classes are: invalid, template, rejected, exhausted, \
             uncertain, expired, poison, broker, unknown"
        );
        assert!("Template".parse::<Class>().is_err(), "names are exact");
    }
}
