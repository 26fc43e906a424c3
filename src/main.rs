//! The `mailroom` binary: parse the command line, start logging, run the command. A failure is
//! printed once, as one line on stderr, and ends the process with the exit code of its class
//! ([`mailroom::exit`]).

use clap::Parser;
use mailroom::exit;

/// jemalloc instead of the C library's malloc: a delivery allocates and frees many small
/// buffers (the job, the rendered parts, the message, frames), and glibc's allocator spent
/// about a seventh of the worker's and the relay's CPU on them (docs/PERFORMANCE.md, "The
/// allocator"). mimalloc was as fast and raised the worker's peak memory from 47 to 65 MiB.
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = mailroom::cli::Cli::parse();
    let runtime = match cli.runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime's threads: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: mailroom::cli::Cli) -> std::process::ExitCode {
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
