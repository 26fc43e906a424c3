//! What mailroom's integration tests (`tests/integration`) and its benchmark (`benches/bench`)
//! share, the way crates.io shares `crates_io_test_db`: the URLs of the services that
//! `scripts/services` runs ([`services`]), a database of one's own on either engine
//! ([`database`]), RabbitMQ virtual hosts ([`vhost`]), the SMTP recorder ([`smtp`]), free
//! loopback ports, closed ports no other test can take, and waiting by polling ([`waits`]). It knows nothing of mailroom's own types.

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

/// A loopback port that refuses connections for as long as this value lives: the port is bound
/// but never listens, so a connect gets `ECONNREFUSED`, and no server started by another test
/// running in parallel can take the port (a port from [`free_port`] can be taken, and a test of
/// a server that is down would then talk to someone else's server). The socket sets
/// SO_REUSEADDR, so a server that comes back can bind the port while it is still held (the
/// SMTP recorder and tokio's listeners set it too, and Linux allows it while this socket does
/// not listen); drop this value once that server listens. A port picked by the kernel, for a
/// `:0` bind or an outgoing connection, is never one held here.
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl ClosedPort {
    /// Binds a fresh loopback port without listening on it.
    pub fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket
            .bind("127.0.0.1:0".parse().unwrap())
            .expect("bind a loopback port");
        let port = socket.local_addr().unwrap().port();
        Self {
            _socket: socket,
            port,
        }
    }

    /// The port's number.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Default for ClosedPort {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::ClosedPort;

    #[tokio::test]
    async fn a_closed_port_refuses_connections_and_is_never_picked_by_the_kernel() {
        let closed = ClosedPort::new();
        let addr = format!("127.0.0.1:{}", closed.port());
        let refused = tokio::net::TcpStream::connect(&addr).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        // Ports the kernel picks (a `:0` bind, an outgoing connection's) pass it by.
        let picked: Vec<_> = (0..200)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let outgoing: Vec<_> = (0..50)
            .map(|_| std::net::TcpStream::connect(picked[0].local_addr().unwrap()).unwrap())
            .collect();
        assert!(
            picked
                .iter()
                .map(|l| l.local_addr().unwrap().port())
                .chain(outgoing.iter().map(|c| c.local_addr().unwrap().port()))
                .all(|p| p != closed.port())
        );
        // The server that comes back binds it while it is still held, and is reached.
        let back = tokio::net::TcpListener::bind(&addr).await.unwrap();
        drop(closed);
        let (client, accepted) = tokio::join!(tokio::net::TcpStream::connect(&addr), back.accept());
        client.unwrap();
        accepted.unwrap();
    }
}
