//! How a run of `mailroom` ends when it fails: the exit code (one mapping, here) and the one
//! line printed on stderr.
//!
//! | code | meaning | example |
//! | --- | --- | --- |
//! | 0 | success | |
//! | 1 | runtime failure | a command that failed while running |
//! | 2 | usage | an unknown flag, a value clap cannot parse (clap's own exit) |
//! | 69 | a dependency is unavailable (`EX_UNAVAILABLE`) | database or broker down, schema not migrated yet |
//! | 78 | configuration (`EX_CONFIG`) | a wrong password, a refused option, a schema newer than the binary |
//!
//! A caller marks an error with [`Fatal`] where it knows the class; anything unmarked is a
//! runtime failure. [`one_line`] joins an error's causes once each, so a library that repeats
//! its source in its own message is not printed twice (and a database error without the C
//! source line PostgreSQL appends).

use std::fmt::Write as _;

/// The exit codes of `mailroom` (sysexits.h where one fits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Success = 0,
    /// A failure while running.
    Runtime = 1,
    /// A command line clap refused (clap exits with it by itself).
    Usage = 2,
    /// A service mailroom needs cannot be reached or is not ready: retrying later may succeed.
    Unavailable = 69,
    /// The configuration is wrong: retrying without changing it fails the same way.
    Config = 78,
}

/// An error whose class is known: the exit code it ends the process with.
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    /// The configuration is wrong ([`Code::Config`]).
    #[error("{0}")]
    Config(String),
    /// A dependency is unavailable ([`Code::Unavailable`]).
    #[error("{0}")]
    Unavailable(String),
}

impl Fatal {
    pub fn code(&self) -> Code {
        match self {
            Fatal::Config(_) => Code::Config,
            Fatal::Unavailable(_) => Code::Unavailable,
        }
    }
}

/// The exit code of a failed run: that of the outermost [`Fatal`] in the chain, else runtime.
pub fn code_of(error: &anyhow::Error) -> Code {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<Fatal>())
        .map_or(Code::Runtime, Fatal::code)
}

/// The error and its causes on one line, joined by `: `, each cause once: a cause whose text
/// the line already holds (a library that prints its source in its own message) is skipped.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let (text, last) = cause_text(cause);
        let text = text.trim();
        if !text.is_empty() && !line.contains(text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            let _ = write!(line, "{text}");
        }
        if last {
            break;
        }
    }
    line.replace('\n', " ")
}

/// One cause's own text, and whether it says all its sources say: an error the database
/// returned is its message alone, without its source, which repeats it with the line of the
/// server's C code that PostgreSQL appends (`… at line 334`).
fn cause_text(cause: &(dyn std::error::Error + 'static)) -> (String, bool) {
    match cause.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Database(db)) => (db.message().to_string(), true),
        _ => (cause.to_string(), false),
    }
}

/// What `mailroom` prints on stderr when it fails: `error: ` and [`one_line`], the prefix in
/// red only when `colour` (`telemetry::use_colour`: the same rule as the log lines).
pub fn report(error: &anyhow::Error, colour: bool) -> String {
    let prefix = if colour {
        "\x1b[1;31merror\x1b[0m"
    } else {
        "error"
    };
    format!("{prefix}: {}", one_line(error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[derive(Debug, thiserror::Error)]
    #[error("error returned from database: {0}")]
    struct Repeats(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("password authentication failed")]
    struct Inner;

    #[test]
    fn a_cause_repeated_by_its_wrapper_is_printed_once() {
        let e = anyhow::Error::new(Repeats(Inner)).context("applying migrations");
        assert_eq!(
            one_line(&e),
            "applying migrations: error returned from database: password authentication failed"
        );
    }

    #[test]
    fn the_report_has_no_colour_unless_asked() {
        let e = anyhow::anyhow!("boom").context("starting");
        assert_eq!(report(&e, false), "error: starting: boom");
        assert!(report(&e, true).contains("\x1b["));
        assert!(!report(&e, false).contains('\n'));
    }

    #[test]
    fn the_exit_code_is_that_of_the_fatal_in_the_chain() {
        let unmarked = anyhow::anyhow!("boom");
        assert_eq!(code_of(&unmarked), Code::Runtime);
        let config = Err::<(), _>(Fatal::Config("bad password".into()))
            .context("starting the worker")
            .unwrap_err();
        assert_eq!(code_of(&config), Code::Config);
        assert_eq!(one_line(&config), "starting the worker: bad password");
        let down = anyhow::Error::new(Fatal::Unavailable("refused".into()));
        assert_eq!(code_of(&down) as u8, 69);
    }
}
