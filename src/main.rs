//! The `mailroom` binary: parse the command line, start logging, run the command.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = mailroom::cli::Cli::parse();
    mailroom::telemetry::init(cli.log_format);
    mailroom::failpoint::warn_if_ignored();
    match cli.run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "mailroom failed");
            eprintln!("mailroom: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
