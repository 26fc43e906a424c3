//! Logging with `tracing`, to stderr: human-readable text by default, one flat JSON object per
//! line with `--log-format json` (`MAILROOM_LOG_FORMAT=json`; the field names are in [`json`]
//! and docs/LOGGING.md).
//!
//! - The filter comes from `RUST_LOG` (default `info`). PostgreSQL's notices ("relation … already
//!   exists, skipping" on a second `migrate`) are kept to WARN unless `RUST_LOG` names `sqlx`.
//! - Colour only when stderr is a terminal and `NO_COLOR` is unset or empty: a log file or a
//!   pipe never gets escape codes.
//!
//! Nothing here ever formats a URL with its password or a full recipient address; the callers
//! log masked values only.

pub mod json;

use std::ffi::OsString;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::JsonFields;

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The filter when `RUST_LOG` is unset or cannot be parsed.
const DEFAULT_FILTER: &str = "info";

/// Directives added to every filter that does not mention sqlx: PostgreSQL reports harmless
/// notices (an `IF NOT EXISTS` that found the table) at INFO through sqlx.
const QUIET_SQLX: &str = "sqlx::postgres::notice=warn";

/// Installs the global subscriber, writing to stderr. Calling it twice is harmless.
pub fn init(format: LogFormat) {
    let filter = filter(std::env::var("RUST_LOG").ok().as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(use_colour());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(json::FlatJson)
            .try_init(),
    };
}

/// Whether lines written to stderr may carry ANSI colour: stderr is a terminal and `NO_COLOR`
/// is unset or empty (<https://no-color.org>).
pub fn use_colour() -> bool {
    colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    )
}

fn colour(terminal: bool, no_color: Option<OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The filter for `rust_log` (the value of `RUST_LOG`, if any).
fn filter(rust_log: Option<&str>) -> EnvFilter {
    EnvFilter::try_new(directives(rust_log)).unwrap_or_else(|_| EnvFilter::new(directives(None)))
}

fn directives(rust_log: Option<&str>) -> String {
    let chosen = rust_log
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_FILTER);
    if chosen.contains("sqlx") {
        chosen.to_string()
    } else {
        format!("{chosen},{QUIET_SQLX}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_needs_a_terminal_and_no_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None), "a file or pipe never gets colour");
    }

    #[test]
    fn postgres_notices_are_quiet_unless_the_filter_names_sqlx() {
        assert_eq!(directives(None), "info,sqlx::postgres::notice=warn");
        assert_eq!(directives(Some("  ")), "info,sqlx::postgres::notice=warn");
        assert_eq!(
            directives(Some("debug")),
            "debug,sqlx::postgres::notice=warn"
        );
        assert_eq!(directives(Some("info,sqlx=debug")), "info,sqlx=debug");
    }

    #[test]
    fn a_filter_that_does_not_parse_falls_back_to_info() {
        let f = filter(Some("info,=[bad"));
        assert!(f.to_string().contains("info"), "{f}");
    }
}
