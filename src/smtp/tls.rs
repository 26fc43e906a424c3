//! Implicit TLS (`smtps://`) on a socket we opened ourselves. lettre's connection takes any
//! tokio stream (`connect_with_transport`), but does the TLS handshake itself only for STARTTLS
//! or on sockets it opens (without TCP_NODELAY). So the handshake runs on lettre's own network
//! stream with lettre's own `TlsParameters` (same verification and roots as STARTTLS), and this
//! adapter hands the encrypted stream back to lettre as a plain tokio stream.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::io::{AsyncRead as FuturesRead, AsyncWrite as FuturesWrite};
#[allow(deprecated)] // public since 0.11.14 "by mistake"; the only way to wrap TLS ourselves.
use lettre::transport::smtp::client::AsyncNetworkStream;
use lettre::transport::smtp::client::{AsyncTokioStream, TlsParameters};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TLS session over `tcp`, ready for `AsyncSmtpConnection::connect_with_transport`.
#[allow(deprecated)]
pub async fn implicit(
    tcp: TcpStream,
    params: TlsParameters,
) -> Result<ImplicitTls, lettre::transport::smtp::Error> {
    let mut stream = AsyncNetworkStream::use_existing_tokio1(Box::new(tcp));
    stream.upgrade_tls(params).await?;
    Ok(ImplicitTls(stream))
}

#[allow(deprecated)]
#[derive(Debug)]
pub struct ImplicitTls(AsyncNetworkStream);

impl AsyncRead for ImplicitTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let unfilled = buf.initialize_unfilled();
        match Pin::new(&mut self.get_mut().0).poll_read(cx, unfilled) {
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for ImplicitTls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_close(cx)
    }
}

impl AsyncTokioStream for ImplicitTls {
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.0.peer_addr()
    }
}
