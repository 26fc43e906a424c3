//! Where and how to reach the SMTP server: `SMTP_URL` parsed into host, port, TLS mode, EHLO
//! name and credentials. The URL forms are lettre's (`AsyncSmtpTransport::from_url`), so
//! existing configurations keep their meaning:
//! - `smtp://host[:25]`: plaintext;
//! - `smtp://host[:587]?tls=required`: STARTTLS, refused if the server does not offer it;
//! - `smtp://host[:587]?tls=opportunistic`: STARTTLS when offered;
//! - `smtps://host[:465]`: implicit TLS;
//! - `user:password@` (percent-encoded) authenticates; a path `/name` is the EHLO name.
//!
//! Credentials travel only over TLS that cannot be stripped: `smtps://` or `tls=required`. With
//! plaintext or opportunistic STARTTLS (which a man in the middle removes by hiding the
//! STARTTLS capability) the URL is refused, unless the host is a loopback address
//! (`127.0.0.0/8`, `::1`, `localhost`), where nothing is on the wire.

use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::TlsParameters;
use lettre::transport::smtp::extension::ClientId;
use url::Url;

/// How the connection is encrypted.
#[derive(Clone)]
pub enum TlsMode {
    None,
    /// STARTTLS when the server offers it.
    Opportunistic(TlsParameters),
    /// STARTTLS, or no session at all.
    Required(TlsParameters),
    /// TLS from the first byte (`smtps://`).
    Implicit(TlsParameters),
}

/// A parsed `SMTP_URL`.
#[derive(Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: TlsMode,
    pub hello: ClientId,
    pub credentials: Option<Credentials>,
}

/// Never shows the password (lettre's `Credentials` Debug is redacted too).
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tls = match self.tls {
            TlsMode::None => "none",
            TlsMode::Opportunistic(_) => "opportunistic STARTTLS",
            TlsMode::Required(_) => "required STARTTLS",
            TlsMode::Implicit(_) => "implicit",
        };
        f.debug_struct("Endpoint")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &tls)
            .field("hello", &self.hello.to_string())
            .field("authenticates", &self.credentials.is_some())
            .finish()
    }
}

const SMTP_PORT: u16 = 25;
const SUBMISSION_PORT: u16 = 587;
const SUBMISSIONS_PORT: u16 = 465;

impl Endpoint {
    /// Parses an `smtp://` or `smtps://` URL. The error names the part that is wrong, never
    /// the password.
    pub fn parse(url: &Url) -> Result<Endpoint, String> {
        let host = url.host_str().ok_or("no host")?.to_string();
        let (default_port, tls) = port_and_tls(url, &host)?;
        let path = url.path().trim_matches('/');
        let hello = if path.is_empty() {
            ClientId::default()
        } else {
            ClientId::Domain(path.to_string())
        };
        if url.password().is_some() {
            check_auth_is_encrypted(&host, &tls)?;
        }
        Ok(Endpoint {
            port: url.port().unwrap_or(default_port),
            credentials: credentials(url)?,
            host,
            tls,
            hello,
        })
    }
}

/// The default port and the TLS mode of the URL's scheme and `tls` parameter.
fn port_and_tls(url: &Url, host: &str) -> Result<(u16, TlsMode), String> {
    let tls_param = url
        .query_pairs()
        .find(|(k, _)| k == "tls")
        .map(|(_, v)| v.into_owned());
    let params = || TlsParameters::new(host.to_owned()).map_err(|e| format!("TLS: {e}"));
    Ok(match (url.scheme(), tls_param.as_deref()) {
        ("smtp", None | Some("none")) => (SMTP_PORT, TlsMode::None),
        ("smtp", Some("required")) => (SUBMISSION_PORT, TlsMode::Required(params()?)),
        ("smtp", Some("opportunistic")) => (SUBMISSION_PORT, TlsMode::Opportunistic(params()?)),
        ("smtps", None | Some("implicit")) => (SUBMISSIONS_PORT, TlsMode::Implicit(params()?)),
        (scheme @ ("smtp" | "smtps"), Some(other)) => {
            return Err(format!(
                "tls={other:?} is not one of required, opportunistic (smtp://) or implicit (smtps://) for {scheme}://"
            ));
        }
        (scheme, _) => return Err(format!("unknown scheme {scheme:?}")),
    })
}

/// The user name and password of the URL, percent-decoded, when it has a password.
fn credentials(url: &Url) -> Result<Option<Credentials>, String> {
    Ok(match url.password() {
        Some(password) => Some(Credentials::new(
            percent_decode(url.username()).ok_or("user name is not valid UTF-8")?,
            percent_decode(password).ok_or("password is not valid UTF-8")?,
        )),
        None => None,
    })
}

/// Refuses credentials over a connection an eavesdropper could read or downgrade.
fn check_auth_is_encrypted(host: &str, tls: &TlsMode) -> Result<(), String> {
    let why = match tls {
        TlsMode::Required(_) | TlsMode::Implicit(_) => return Ok(()),
        _ if crate::config::is_loopback(host) => return Ok(()),
        TlsMode::None => "in clear text",
        TlsMode::Opportunistic(_) => {
            "in clear text whenever STARTTLS is stripped (tls=opportunistic)"
        }
    };
    Err(format!(
        "refusing to send the password to {host} {why}; use smtps:// or ?tls=required"
    ))
}

/// `%XX` escapes of URL userinfo to bytes, as UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Endpoint, String> {
        Endpoint::parse(&Url::parse(s).unwrap())
    }

    fn mode(e: &Endpoint) -> &'static str {
        match e.tls {
            TlsMode::None => "none",
            TlsMode::Opportunistic(_) => "opportunistic",
            TlsMode::Required(_) => "required",
            TlsMode::Implicit(_) => "implicit",
        }
    }

    #[test]
    fn each_url_form_keeps_lettres_meaning_and_default_port() {
        let cases = [
            ("smtp://mail.example", "none", 25),
            ("smtp://mail.example:2525", "none", 2525),
            ("smtp://mail.example?tls=required", "required", 587),
            (
                "smtp://mail.example:25?tls=opportunistic",
                "opportunistic",
                25,
            ),
            ("smtps://mail.example", "implicit", 465),
            ("smtps://mail.example:4650", "implicit", 4650),
        ];
        for (url, tls, port) in cases {
            let e = parse(url).unwrap();
            assert_eq!(
                (mode(&e), e.port, e.host.as_str()),
                (tls, port, "mail.example"),
                "{url}"
            );
            assert!(e.credentials.is_none());
        }
    }

    #[test]
    fn credentials_are_percent_decoded_and_never_printed() {
        let e = parse("smtp://ada%40shop:p%40ss%3Aw0rd@mail.example:587?tls=required").unwrap();
        let c = e.credentials.clone().unwrap();
        assert_eq!(c, Credentials::new("ada@shop".into(), "p@ss:w0rd".into()));
        let shown = format!("{e:?}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("w0rd"),
            "{shown}"
        );
        assert!(shown.contains("authenticates: true"), "{shown}");
        // A user name alone (no password) does not authenticate, as with lettre.
        assert!(
            parse("smtp://ada@mail.example")
                .unwrap()
                .credentials
                .is_none()
        );
    }

    #[test]
    fn a_password_is_refused_without_tls_that_cannot_be_stripped() {
        for url in [
            "smtp://ada:pw@mail.example",
            "smtp://ada:pw@mail.example:587?tls=none",
            "smtp://ada:pw@mail.example:587?tls=opportunistic",
            "smtp://ada:pw@10.0.0.7:25",
            "smtp://ada:pw@[2001:db8::1]:25",
            "smtp://ada:pw@localhost.evil.example",
        ] {
            let err = parse(url).unwrap_err();
            assert!(
                err.contains("refusing to send the password"),
                "{url}: {err}"
            );
            assert!(!err.contains("pw@"), "{url}: {err}");
        }
        assert!(
            parse("smtp://ada:pw@mail.example?tls=opportunistic")
                .unwrap_err()
                .contains("tls=opportunistic")
        );
    }

    #[test]
    fn a_password_is_accepted_over_tls_or_on_loopback() {
        for url in [
            "smtp://ada:pw@mail.example:587?tls=required",
            "smtps://ada:pw@mail.example",
            "smtp://ada:pw@127.0.0.1:2525",
            "smtp://ada:pw@127.8.9.10:2525?tls=opportunistic",
            "smtp://ada:pw@[::1]:2525",
            "smtp://ada:pw@LOCALHOST:2525",
        ] {
            assert!(parse(url).unwrap().credentials.is_some(), "{url}");
        }
        // Without a password nothing is sent, so plaintext stays allowed anywhere.
        assert!(parse("smtp://ada@mail.example").is_ok());
        assert!(parse("smtp://mail.example").is_ok());
    }

    #[test]
    fn the_path_is_the_ehlo_name() {
        let e = parse("smtp://mail.example/client.shop.example").unwrap();
        assert_eq!(e.hello, ClientId::Domain("client.shop.example".into()));
    }

    #[test]
    fn unknown_schemes_and_tls_options_are_refused() {
        assert!(
            parse("smtp://mail.example?tls=maybe")
                .unwrap_err()
                .contains("maybe")
        );
        assert!(parse("smtps://mail.example?tls=required").is_err());
        assert!(parse("http://mail.example").unwrap_err().contains("http"));
    }

    #[test]
    fn percent_decode_leaves_stray_percent_signs() {
        assert_eq!(percent_decode("a%20b%zz%4").unwrap(), "a b%zz%4");
    }
}
