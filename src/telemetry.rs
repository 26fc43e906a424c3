//! Logging with `tracing`: human-readable by default, JSON lines with `--log-format json`.
//! The level comes from `RUST_LOG` (default `info`). Nothing here ever formats a URL with its
//! password or a full recipient address; the callers log masked values only.

use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber, writing to stderr. Calling it twice is harmless.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
