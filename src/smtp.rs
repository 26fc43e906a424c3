//! Sending: builds the MIME message from a job and its rendering, with the deterministic
//! Message-ID `<job_id.kind@domain>`, and sends it through lettre's pooled async SMTP transport
//! (or writes `.eml` files for `file://` URLs). Every send runs under a semaphore (lettre's
//! pool caps idle connections, not concurrent ones) and a whole-send timeout (lettre's async
//! transport has no I/O timeout of its own).

use std::time::Duration;

use lettre::{
    AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
    message::{
        Mailbox, MultiPart, SinglePart,
        header::{HeaderName, HeaderValue},
    },
    transport::smtp::PoolConfig,
};
use tokio::sync::Semaphore;

use crate::config::SecretUrl;
use crate::job::ValidJob;
use crate::render::RenderedEmail;

/// Largest rendered email we hand to the SMTP server; common relays refuse more than 10 MB, and
/// a transactional email near this size is a template bug.
pub const MAX_MESSAGE_BYTES: usize = 5 * 1024 * 1024;

/// How an attempt ended, from the point of view of "was it delivered?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Not accepted, may succeed later: 4xx replies, refused connections, TLS handshakes.
    Transient { reason: String },
    /// Not accepted, never will be: 5xx replies, a message the client cannot send.
    Permanent { reason: String },
    /// Maybe accepted: the connection broke or timed out where the server may already have
    /// taken the message. See `MAILROOM_ON_UNCERTAIN`.
    Uncertain { reason: String },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Transient { reason } => write!(f, "transient SMTP failure: {reason}"),
            SendError::Permanent { reason } => write!(f, "permanent SMTP failure: {reason}"),
            SendError::Uncertain { reason } => write!(f, "SMTP outcome unknown: {reason}"),
        }
    }
}

/// Why a message could not be built; always permanent.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot build the email: {0}")]
    Email(#[from] lettre::error::Error),
    #[error("header {name}: {reason}")]
    Header { name: String, reason: String },
    #[error("rendered email is {size} bytes, more than the {max} allowed")]
    TooLarge { size: usize, max: usize },
}

enum Transport {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    File(AsyncFileTransport<Tokio1Executor>),
}

/// Sender settings.
#[derive(Clone, Debug)]
pub struct MailerSettings {
    pub url: SecretUrl,
    pub from: Mailbox,
    pub message_id_domain: String,
    pub timeout: Duration,
    pub max_connections: u32,
}

/// Builds and sends emails.
pub struct Mailer {
    transport: Transport,
    from: Mailbox,
    message_id_domain: String,
    timeout: Duration,
    permits: Semaphore,
}

impl Mailer {
    pub fn new(s: &MailerSettings) -> anyhow::Result<Mailer> {
        let transport = match s.url.scheme() {
            "file" => {
                let dir =
                    s.url.url().to_file_path().map_err(|()| {
                        anyhow::anyhow!("SMTP_URL {}: not a local directory", s.url)
                    })?;
                std::fs::create_dir_all(&dir)?;
                Transport::File(AsyncFileTransport::new(dir))
            }
            _ => {
                let pool = PoolConfig::new().max_size(s.max_connections);
                let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(s.url.expose())
                    .map_err(|e| anyhow::anyhow!("SMTP_URL {}: {e}", s.url))?
                    .timeout(Some(s.timeout))
                    .pool_config(pool)
                    .build();
                Transport::Smtp(transport)
            }
        };
        Ok(Mailer {
            transport,
            from: s.from.clone(),
            message_id_domain: s.message_id_domain.clone(),
            timeout: s.timeout,
            permits: Semaphore::new(s.max_connections as usize),
        })
    }

    /// The Message-ID of a job: the same on every attempt, so a duplicate in the documented
    /// window is recognisable by receivers and by our tests.
    pub fn message_id(&self, job_id: &str, kind: &str) -> String {
        message_id(job_id, kind, &self.message_id_domain)
    }

    /// Builds the MIME message: text and HTML alternatives, the job's headers.
    pub fn build(&self, job: &ValidJob, email: &RenderedEmail) -> Result<Message, BuildError> {
        build_message(&self.from, &self.message_id_domain, job, email)
    }

    /// Whether the SMTP server answers (connect, greeting, NOOP) within the send timeout; the
    /// worker's circuit breaker probes with it during an outage.
    pub async fn probe(&self) -> bool {
        match &self.transport {
            Transport::Smtp(t) => matches!(
                tokio::time::timeout(self.timeout, t.test_connection()).await,
                Ok(Ok(true))
            ),
            Transport::File(_) => true,
        }
    }

    /// Sends one message; the `Ok` text is the server's reply, kept in the ledger.
    pub async fn send(&self, message: &Message) -> Result<String, SendError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SendError::Transient {
                reason: "mailer is shutting down".into(),
            })?;
        let sending = async {
            match &self.transport {
                Transport::Smtp(t) => t
                    .send(message.clone())
                    .await
                    .map(|r| {
                        let text: Vec<&str> = r.message().collect();
                        format!("{} {}", r.code(), text.join(" "))
                    })
                    .map_err(|e| classify(&e)),
                Transport::File(t) => t
                    .send(message.clone())
                    .await
                    .map(|id| format!("written {id}.eml"))
                    .map_err(|e| SendError::Transient {
                        reason: e.to_string(),
                    }),
            }
        };
        match tokio::time::timeout(self.timeout, sending).await {
            Ok(result) => result,
            Err(_) => Err(SendError::Uncertain {
                reason: format!("no answer within {:?}", self.timeout),
            }),
        }
    }
}

/// Builds the MIME message of a job: sender, deterministic Message-ID, subject, recipients, the
/// job's extra headers, and text and HTML alternatives (HTML alone without a text part). Pure:
/// `templates preview --format eml` uses it without any SMTP server.
pub fn build_message(
    from: &Mailbox,
    message_id_domain: &str,
    job: &ValidJob,
    email: &RenderedEmail,
) -> Result<Message, BuildError> {
    let mut b = Message::builder()
        .from(from.clone())
        .message_id(Some(message_id(
            &job.job.job_id,
            &job.job.kind,
            message_id_domain,
        )))
        .subject(email.subject.clone());
    for to in &job.to {
        b = b.to(to.clone());
    }
    for cc in &job.cc {
        b = b.cc(cc.clone());
    }
    for bcc in &job.bcc {
        b = b.bcc(bcc.clone());
    }
    if let Some(reply_to) = &job.reply_to {
        b = b.reply_to(reply_to.clone());
    }
    for (name, value) in &job.job.headers {
        let header = HeaderName::new_from_ascii(name.clone()).map_err(|e| BuildError::Header {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        b = b.raw_header(HeaderValue::new(header, value.clone()));
    }
    let message = match &email.text {
        Some(text) => b.multipart(MultiPart::alternative_plain_html(
            text.clone(),
            email.html.clone(),
        ))?,
        None => b.singlepart(SinglePart::html(email.html.clone()))?,
    };
    let size = message.formatted().len();
    if size > MAX_MESSAGE_BYTES {
        return Err(BuildError::TooLarge {
            size,
            max: MAX_MESSAGE_BYTES,
        });
    }
    Ok(message)
}

/// Sorts a lettre error by what it says about delivery. A reply code means the server refused
/// (4xx transient, 5xx permanent). A failure to connect happened before any mail command.
/// A broken connection or malformed reply may have come after the final dot: uncertain.
///
/// 503 (bad sequence of commands) is the exception among 5xx: it says the session was out of
/// step, not that the message was refused (seen when a send timed out mid-session and the
/// server then read the rest of it), so it is retried.
pub fn classify(e: &lettre::transport::smtp::Error) -> SendError {
    let reason = e.to_string();
    let out_of_sequence = e.status().is_some_and(|code| code.to_string() == "503");
    if e.is_transient() || out_of_sequence {
        SendError::Transient { reason }
    } else if e.is_permanent() || e.is_client() {
        SendError::Permanent { reason }
    } else if e.is_tls() || reason.starts_with("Connection error") {
        SendError::Transient { reason }
    } else {
        SendError::Uncertain { reason }
    }
}

/// `<job_id.kind@domain>`, with every byte outside `[A-Za-z0-9_-]` written as `=XX` so any job
/// id yields a valid msg-id that is still readable for ordinary ids.
pub fn message_id(job_id: &str, kind: &str, domain: &str) -> String {
    let mut left = String::with_capacity(job_id.len() + kind.len() + 1);
    for part in [job_id, kind] {
        if !left.is_empty() {
            left.push('.');
        }
        for b in part.bytes() {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                left.push(b as char);
            } else {
                left.push_str(&format!("={b:02X}"));
            }
        }
    }
    format!("<{left}@{domain}>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_id_is_deterministic_and_valid() {
        assert_eq!(
            message_id(
                "order-1042-confirmation",
                "order_confirmation",
                "shop.example"
            ),
            "<order-1042-confirmation.order_confirmation@shop.example>"
        );
        assert_eq!(
            message_id("a b<@>.c", "welcome", "x.example"),
            "<a=20b=3C=40=3E=2Ec.welcome@x.example>"
        );
    }
}
