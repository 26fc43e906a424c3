//! A loopback TCP proxy that delays every byte by a fixed time in each direction: an SMTP
//! server "far away" on a machine whose loopback has no delay of its own. Each direction reads
//! what arrives and writes it on once its delay has passed, in order, so the round trip through
//! the proxy is twice the delay and bytes sent back to back stay back to back.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub struct DelayProxy {
    pub port: u16,
    task: JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (host:port), each way `delay` later.
    pub async fn start(upstream: String, delay: Duration) -> anyhow::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    if client
                        .set_nodelay(true)
                        .and(server.set_nodelay(true))
                        .is_err()
                    {
                        return;
                    }
                    let (client_rd, client_wr) = client.into_split();
                    let (server_rd, server_wr) = server.into_split();
                    tokio::join!(
                        delayed(client_rd, server_wr, delay),
                        delayed(server_rd, client_wr, delay)
                    );
                });
            }
        });
        Ok(DelayProxy { port, task })
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, each piece `delay` after it arrived; ends when either side closes.
async fn delayed(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let writing = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}
