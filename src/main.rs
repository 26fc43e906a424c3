//! The `mailroom` binary: parse the command line, start logging, run the command. A failure is
//! printed once, as one line on stderr, and ends the process with the exit code of its class
//! ([`mailroom::exit`]).

use clap::Parser;
use mailroom::exit;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = mailroom::cli::Cli::parse();
    mailroom::telemetry::init(cli.log_format);
    mailroom::failpoint::warn_if_ignored();
    match cli.run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Not through the logger: one plain line, whatever the log format and level.
            eprintln!("{}", exit::report(&e, mailroom::telemetry::use_colour()));
            std::process::ExitCode::from(exit::code_of(&e) as u8)
        }
    }
}
