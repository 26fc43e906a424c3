//! The one decision a delivery ends in ([`Outcome`]), and why a job is given up on
//! ([`ErrorClass`]). `process` computes it; `settle` is the only place that acts on it.

use std::time::Duration;

/// What to do with a delivery. Computed once; `settle` is the only place that acts on it.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Done: the email was sent now, or earlier (a duplicate delivery).
    Ack { duplicate: bool },
    /// Try again later through the retry tier covering `delay`.
    Retry { delay: Duration, reason: String },
    /// Not sent on purpose: every `to` address is suppressed (recorded, acked, no dead letter).
    Suppressed { reason: String },
    /// Not due yet (`send_at` is `until`): parked in the tier of `delay`, unclaimed, with no
    /// attempt counted.
    Defer {
        delay: Duration,
        until: chrono::DateTime<chrono::Utc>,
    },
    /// Held back by a sending limit (a rate, a domain's concurrency, a domain that asked to slow
    /// down): parked in the tier of `delay`, unclaimed (or its claim given back), with no
    /// attempt counted.
    Held { delay: Duration, reason: String },
    /// Give up: to the dead-letter queue with a reason an operator can act on.
    DeadLetter {
        class: ErrorClass,
        reason: String,
        attempts: i64,
    },
}

/// Why a job was dead-lettered (the `x-mailroom-error-class` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The message is not a valid job: not JSON, wrong shape, bad address, unknown kind.
    Invalid,
    /// The template could not render this job's data (missing variable, unsafe subject).
    Template,
    /// The SMTP server refused it for good (5xx).
    Rejected,
    /// Transient failures until `MAILROOM_MAX_ATTEMPTS` ran out.
    Exhausted,
    /// It may have been sent, and the policy is to let a human decide.
    Uncertain,
    /// Still unsent at its `expires_at`: given up, never sent.
    Expired,
}

impl ErrorClass {
    /// Every class the worker writes.
    pub const ALL: [ErrorClass; 6] = [
        ErrorClass::Invalid,
        ErrorClass::Template,
        ErrorClass::Rejected,
        ErrorClass::Exhausted,
        ErrorClass::Uncertain,
        ErrorClass::Expired,
    ];

    pub fn parse(s: &str) -> Option<ErrorClass> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Invalid => "invalid",
            ErrorClass::Template => "template",
            ErrorClass::Rejected => "rejected",
            ErrorClass::Exhausted => "exhausted",
            ErrorClass::Uncertain => "uncertain",
            ErrorClass::Expired => "expired",
        }
    }
}

/// The outcome that gives up on a job (`settle` logs it with its reason).
pub(super) fn dead(class: ErrorClass, reason: String, attempts: i64) -> Outcome {
    Outcome::DeadLetter {
        class,
        reason,
        attempts,
    }
}
