//! TLS for the WAL stream. The replication client speaks PostgreSQL's protocol over a plain
//! socket; for a server reached over a network, [`open`] hands it one on loopback whose other
//! end is this process's TLS connection to the server, negotiated as libpq does (an
//! `SSLRequest`, the server's `S`, then the handshake) and verified as the URL's `sslmode`
//! and `sslrootcert` say. Nothing else crosses the loopback socket than what the client
//! would have sent to the server, and the server still authenticates the client itself (SCRAM):
//! a local process that connected to the listener first would hold a link on which it must
//! log in like any other client, and the relay's own open would fail and be retried.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sqlx::postgres::PgSslMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

use super::wal::Unavailable;

/// PostgreSQL's `SSLRequest`: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// How the link to the server is protected, from the URL's `sslmode` and `sslrootcert`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Policy {
    /// No link without TLS (`require` and stricter); otherwise a server that answers `N` is
    /// streamed from in the clear, as the relay's own pool then is.
    pub required: bool,
    pub verify: Verify,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verify {
    /// Any certificate (`prefer`, `allow`, and `require` without `sslrootcert`), as libpq.
    Nothing,
    /// The chain, against `sslrootcert` or the web's roots; not the name (`verify-ca`, and
    /// `require` with `sslrootcert`).
    Chain(Option<PathBuf>),
    /// The chain and the host name (`verify-full`).
    ChainAndName(Option<PathBuf>),
}

impl Policy {
    /// `None`: no TLS at all (`disable`).
    pub fn of(mode: PgSslMode, root: Option<PathBuf>) -> Option<Policy> {
        let (required, verify) = match mode {
            PgSslMode::Disable => return None,
            PgSslMode::Allow | PgSslMode::Prefer => (false, Verify::Nothing),
            PgSslMode::Require if root.is_none() => (true, Verify::Nothing),
            PgSslMode::Require | PgSslMode::VerifyCa => (true, Verify::Chain(root)),
            PgSslMode::VerifyFull => (true, Verify::ChainAndName(root)),
        };
        Some(Policy { required, verify })
    }
}

/// Connects to `host:port`, negotiates TLS as `policy` says, and returns a loopback address
/// whose first connection is spliced onto that link. Errors are one line: what failed, where.
pub(super) async fn open(
    host: &str,
    port: u16,
    policy: &Policy,
) -> Result<SocketAddr, Unavailable> {
    let unreachable = |what: &str, e: std::io::Error| {
        Unavailable::Unreachable(format!("{what} {host}:{port}: {e}"))
    };
    let mut server = TcpStream::connect((host, port))
        .await
        .map_err(|e| unreachable("connecting to", e))?;
    let _ = server.set_nodelay(true);
    server
        .write_all(&SSL_REQUEST)
        .await
        .map_err(|e| unreachable("asking for TLS at", e))?;
    let mut answer = [0u8; 1];
    server
        .read_exact(&mut answer)
        .await
        .map_err(|e| unreachable("asking for TLS at", e))?;
    let loopback = |e: std::io::Error| {
        Unavailable::Failed(format!("opening a loopback socket for the WAL stream: {e}"))
    };
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(loopback)?;
    let local = listener.local_addr().map_err(loopback)?;
    match answer[0] {
        b'S' => {
            let config = client_config(&policy.verify).map_err(Unavailable::Tls)?;
            let name = ServerName::try_from(host.to_string()).map_err(|e| {
                Unavailable::Tls(format!("{host} is not a name TLS can check: {e}"))
            })?;
            let tls = TlsConnector::from(Arc::new(config))
                .connect(name, server)
                .await
                .map_err(|e| Unavailable::Tls(format!("TLS to {host}:{port} failed: {e}")))?;
            tokio::spawn(splice(listener, tls));
        }
        b'N' if !policy.required => {
            tokio::spawn(splice(listener, server));
        }
        b'N' => {
            return Err(Unavailable::Tls(format!(
                "{host}:{port} does not offer TLS, and sslmode requires it"
            )));
        }
        other => {
            return Err(Unavailable::Failed(format!(
                "{host}:{port} answered the TLS request with {:?}, not S or N",
                other as char
            )));
        }
    }
    Ok(local)
}

/// Accepts one connection on `listener` (closing it then) and copies bytes both ways between
/// it and `server` until either side closes.
async fn splice<S>(listener: TcpListener, mut server: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let accepted = tokio::time::timeout(super::wal::OPEN_TIMEOUT, listener.accept()).await;
    drop(listener);
    let Ok(Ok((mut client, _))) = accepted else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

fn client_config(verify: &Verify) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (root, check_name) = match verify {
        Verify::Nothing => (None, false),
        Verify::Chain(root) => (Some(root), false),
        Verify::ChainAndName(root) => (Some(root), true),
    };
    let chain = match root {
        None => None,
        Some(root) => {
            let roots = Arc::new(root_store(root.as_deref())?);
            let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("building the certificate check: {e}"))?;
            Some(verifier)
        }
    };
    let verifier = Arc::new(Verifier {
        chain,
        check_name,
        provider: provider.clone(),
    });
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// The certificates of `sslrootcert`, or the web's roots without one.
fn root_store(file: Option<&std::path::Path>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    let Some(file) = file else {
        store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(store);
    };
    let shown = file.display();
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| format!("reading sslrootcert {shown}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("reading sslrootcert {shown}: {e}"))?;
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("sslrootcert {shown} holds no usable certificate"));
    }
    Ok(store)
}

/// The chain check (when asked for) with or without the name, and the handshake's signatures
/// always checked.
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            checked => checked,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_decide_what_is_required_and_checked() {
        let root = || Some(PathBuf::from("/ca.pem"));
        assert_eq!(Policy::of(PgSslMode::Disable, root()), None);
        let loose = |required| Policy {
            required,
            verify: Verify::Nothing,
        };
        assert_eq!(Policy::of(PgSslMode::Prefer, None), Some(loose(false)));
        assert_eq!(Policy::of(PgSslMode::Allow, root()), Some(loose(false)));
        assert_eq!(Policy::of(PgSslMode::Require, None), Some(loose(true)));
        let chain = Some(Policy {
            required: true,
            verify: Verify::Chain(root()),
        });
        assert_eq!(
            Policy::of(PgSslMode::Require, root()),
            chain,
            "libpq: like verify-ca"
        );
        assert_eq!(Policy::of(PgSslMode::VerifyCa, root()), chain);
        assert_eq!(
            Policy::of(PgSslMode::VerifyFull, None),
            Some(Policy {
                required: true,
                verify: Verify::ChainAndName(None)
            })
        );
    }

    #[test]
    fn a_missing_or_empty_root_file_is_said_by_name() {
        let missing = root_store(Some(std::path::Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
        let empty = std::env::temp_dir().join(format!("mailroom-empty-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let said = root_store(Some(&empty)).unwrap_err();
        std::fs::remove_file(&empty).unwrap();
        assert!(said.contains("no usable certificate"), "{said}");
    }
}
