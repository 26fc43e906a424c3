//! The suite's helpers, by concern: [`app`] (`TestApp`, one isolated world per test),
//! [`processes`] (workers and relays in-process or as real processes), [`database`], [`broker`],
//! [`smtp`] (the SMTP recorder), [`cli`] (the built binary), [`api`] (the HTTP API),
//! [`templates`], [`fault_proxy`] (a TCP proxy that breaks connections) and [`waits`]. Test
//! modules take everything from here (`use crate::helpers::*`), never from each other.

mod api;
mod app;
mod broker;
mod cli;
mod database;
mod fault_proxy;
mod processes;
mod smtp;
mod templates;
mod waits;

pub use api::*;
pub use app::*;
pub use broker::*;
pub use cli::*;
pub use database::*;
pub use fault_proxy::*;
pub use processes::*;
pub use smtp::*;
pub use templates::*;
pub use waits::*;

/// A loopback port nothing listens on (free when this returns; a test may start a server on it
/// later, to play a server that is down and comes back).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
