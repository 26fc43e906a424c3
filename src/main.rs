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
    let code = runtime.block_on(run(cli));
    // Every command's own stop is bounded before this. Blocking work still running (a
    // template check on a hung mount, a DNS lookup against a silent resolver) must not hold
    // the exit after it: dropping the runtime would wait for it without end.
    let stopping = std::time::Instant::now();
    runtime.shutdown_timeout(BLOCKING_PATIENCE);
    if stopping.elapsed() >= BLOCKING_PATIENCE {
        tracing::warn!(
            "blocking work (a template check, a DNS lookup, a DKIM signature) did not end within {BLOCKING_PATIENCE:?} of the stop; exiting without it"
        );
    }
    code
}

/// How long an exit waits for blocking work that outlived the command.
const BLOCKING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

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
