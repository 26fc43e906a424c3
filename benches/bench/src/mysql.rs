//! MySQL/MariaDB for the relay rows: the server's version and a counting proxy that tells how
//! many commands one relay process sends.
//!
//! Why a proxy: MariaDB counts `Questions` per server (`SHOW GLOBAL STATUS`) or per session
//! only for the session itself, and its per-connection counters need `performance_schema`
//! (off by default, settable only at server start). Other clients of a shared server (other
//! tests) would count in a global figure, so the relay alone is sent through a loopback proxy
//! that counts every command packet it writes: exact, and independent of the server's settings.
//! The server-wide `Questions` delta is read as well, as a cross-check on a quiet server.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use sqlx::{Connection as _, MySqlConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The server's version string, e.g. `10.11.19-MariaDB-0+deb12u1`.
pub async fn version(admin_url: &str) -> anyhow::Result<String> {
    let mut admin = MySqlConnection::connect(admin_url).await?;
    let v: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut admin)
        .await?;
    let _ = admin.close().await;
    Ok(v)
}

/// The server-wide `Questions` counter (every client's statements, this read included).
pub async fn global_questions(admin: &mut MySqlConnection) -> anyhow::Result<i64> {
    let (_, value): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
        .fetch_one(admin)
        .await
        .context("reading SHOW GLOBAL STATUS")?;
    Ok(value.parse()?)
}

/// Commands by name (`COM_QUERY`, `COM_STMT_EXECUTE`, `COM_PING`, …) sent through a proxy.
pub type Commands = BTreeMap<&'static str, u64>;

/// A loopback TCP proxy in front of the MySQL server that counts client commands.
pub struct CountingProxy {
    pub port: u16,
    counts: Arc<Mutex<Commands>>,
    task: JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream` (host:port).
    pub async fn start(upstream: String) -> anyhow::Result<CountingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let counts = Arc::new(Mutex::new(Commands::new()));
        let shared = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, counts) = (upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        // Without TCP_NODELAY a command written in two pieces waits for the
                        // peer's delayed ACK (40 ms on Linux): every statement the relay sent
                        // through the proxy was slowed by it, and so were its figures.
                        let nodelay = client.set_nodelay(true).and(server.set_nodelay(true));
                        if nodelay.is_ok() {
                            let _ = forward(client, server, counts).await;
                        }
                    }
                });
            }
        });
        Ok(CountingProxy { port, counts, task })
    }

    /// `url` (a MySQL URL) pointed at this proxy, without TLS so that commands can be read.
    pub fn url_for(&self, url: &str) -> anyhow::Result<String> {
        let mut url = url::Url::parse(url)?;
        url.set_host(Some("127.0.0.1"))?;
        url.set_port(Some(self.port)).ok().context("URL port")?;
        url.query_pairs_mut().append_pair("ssl-mode", "disabled");
        Ok(url.to_string())
    }

    pub fn snapshot(&self) -> Commands {
        self.counts.lock().expect("counts lock").clone()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The commands sent between two snapshots, and their total.
pub fn delta(before: &Commands, after: &Commands) -> (Commands, u64) {
    let d: Commands = after
        .iter()
        .map(|(k, v)| (*k, v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let total = d.values().sum();
    (d, total)
}

/// Copies server → client as is, and client → server packet by packet, counting each packet
/// that starts a command (sequence id 0; the handshake's packets have ids ≥ 1).
async fn forward(
    client: TcpStream,
    server: TcpStream,
    counts: Arc<Mutex<Commands>>,
) -> std::io::Result<()> {
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let down = tokio::spawn(async move { tokio::io::copy(&mut server_rd, &mut client_wr).await });
    let mut header = [0u8; 4];
    let mut payload = vec![];
    let mut packet = vec![];
    let up = async {
        loop {
            client_rd.read_exact(&mut header).await?;
            let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
            payload.resize(len, 0);
            client_rd.read_exact(&mut payload).await?;
            if header[3] == 0
                && let Some(&command) = payload.first()
            {
                *counts
                    .lock()
                    .expect("counts lock")
                    .entry(command_name(command))
                    .or_default() += 1;
            }
            // One write per packet, as the client sent it.
            packet.clear();
            packet.extend_from_slice(&header);
            packet.extend_from_slice(&payload);
            server_wr.write_all(&packet).await?;
        }
    };
    let result: std::io::Result<()> = up.await;
    down.abort();
    result
}

fn command_name(byte: u8) -> &'static str {
    match byte {
        0x01 => "COM_QUIT",
        0x02 => "COM_INIT_DB",
        0x03 => "COM_QUERY",
        0x0e => "COM_PING",
        0x11 => "COM_CHANGE_USER",
        0x16 => "COM_STMT_PREPARE",
        0x17 => "COM_STMT_EXECUTE",
        0x19 => "COM_STMT_CLOSE",
        0x1a => "COM_STMT_RESET",
        0x1f => "COM_RESET_CONNECTION",
        _ => "other",
    }
}
