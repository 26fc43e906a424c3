//! What mailroom's integration tests (`tests/integration`) and its benchmark (`benches/bench`)
//! share, the way crates.io shares `crates_io_test_db`: the URLs of the services that
//! `scripts/services` runs ([`services`]), a database of one's own on either engine
//! ([`database`]), RabbitMQ virtual hosts ([`vhost`]), the SMTP recorder ([`smtp`]), free
//! loopback ports, and waiting by polling ([`waits`]). It knows nothing of mailroom's own types.

pub mod database;
pub mod services;
pub mod smtp;
pub mod vhost;
pub mod waits;

/// A loopback port nothing listens on (free when this returns; a test may start a server on it
/// later, to play a server that is down and comes back).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
