//! Sending: builds the MIME message from a job and its rendering, with the deterministic
//! Message-ID `<job_id.kind@domain>`, and sends it through mailroom's SMTP connection pool
//! ([`pool`]: lettre's protocol client on sockets with TCP_NODELAY), or writes `.eml` files for
//! `file://` URLs. Every send needs a [`Session`]: a permit of the cap on open connections,
//! taken through a [`Reservation`] that the worker holds before it claims a job, so that at
//! most one connection's worth of claims ever waits for a connection (the wait after a claim
//! is bounded, see `worker::lease`). A send runs under a whole-send timeout (lettre's
//! connection has no I/O timeout of its own); a failure is classified by the SMTP phase it
//! happened in ([`session`]).

mod body;
pub mod dkim;
mod endpoint;
pub mod line;
mod pool;
mod session;
#[cfg(test)]
mod tests;
mod tls;

pub use pool::WaitingGauge;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lettre::{
    AsyncFileTransport, AsyncTransport, Message, Tokio1Executor,
    address::Envelope,
    message::{
        Mailbox, MessageBuilder, MultiPart, SinglePart,
        header::{HeaderName, HeaderValue},
    },
};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::config::SecretUrl;
use crate::job::ValidJob;
use crate::render::RenderedEmail;

pub use endpoint::{Endpoint, TlsMode};
pub use pool::IDLE_TIMEOUT;
pub use session::{Failure, Phase, PhaseCell, classify};

/// Largest rendered email we hand to the SMTP server; common relays refuse more than 10 MB, and
/// a transactional email near this size is a template bug.
pub const MAX_MESSAGE_BYTES: usize = 5 * 1024 * 1024;

/// The log target of the uncertain window's markers, all at DEBUG (`window` = `sending` when
/// the final dot goes out, then `accepted`, `closed`, `failed`, `uncertain`, `taken-over` or
/// `unrecorded`): `RUST_LOG=info,mailroom::window=debug` shows them (docs/LOGGING.md).
pub const WINDOW_TARGET: &str = "mailroom::window";

/// How an attempt ended, from the point of view of "was it delivered?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Not accepted, may succeed later: 4xx replies, and any failure before the final dot of
    /// DATA was sent (refused connections, TLS handshakes, timeouts, dropped connections).
    Transient { reason: String },
    /// Not accepted, and the server never answered: no connection, no TLS, no greeting in time.
    /// Retried like `Transient`; the worker's circuit breaker counts these.
    Unreachable { reason: String },
    /// Not accepted, never will be: 5xx replies, a message the client cannot send.
    Permanent { reason: String },
    /// Maybe accepted: the connection broke or timed out after the final dot was sent, before
    /// the server's reply. See `MAILROOM_ON_UNCERTAIN`.
    Uncertain { reason: String },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Transient { reason } => write!(f, "transient SMTP failure: {reason}"),
            SendError::Unreachable { reason } => write!(f, "SMTP server unreachable: {reason}"),
            SendError::Permanent { reason } => write!(f, "permanent SMTP failure: {reason}"),
            SendError::Uncertain { reason } => write!(f, "SMTP outcome unknown: {reason}"),
        }
    }
}

/// Marks the domain of the recipient a RCPT TO reply refused, in a failure's text.
pub const RCPT_DOMAIN: &str = "refused at RCPT TO for domain ";

/// What a slow-down reply is about, and so what it slows (docs/OPERATING.md, "Sending limits").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlowDown {
    /// A 4.7.x reply to one RCPT TO: that recipient's domain (lower case).
    Recipient(String),
    /// A 4.7.x reply to MAIL FROM, DATA or the message: every recipient domain of the job.
    Message,
    /// A 421 without a 4.7.x status: the server closes the session, whatever the recipients.
    Server,
}

impl SendError {
    /// Whether the server asked to slow down: a 421 reply, or a 4xx reply whose enhanced status
    /// is 4.7.x (`421 4.7.28` from Gmail, `450 4.7.1` rate limits).
    pub fn is_slow_down(&self) -> bool {
        self.slow_down().is_some()
    }

    /// What a slow-down reply is about, if this is one. lettre words a 4xx reply as
    /// `transient error (CODE): TEXT`.
    pub fn slow_down(&self) -> Option<SlowDown> {
        let SendError::Transient { reason } = self else {
            return None;
        };
        let (_, rest) = reason.split_once("transient error (")?;
        let (code, text) = rest.split_once(')')?;
        let enhanced = text.trim_start_matches(':').trim_start();
        if !code.starts_with('4') {
            return None;
        }
        if enhanced.starts_with("4.7.") {
            let domain = reason
                .split_once(RCPT_DOMAIN)
                .and_then(|(_, rest)| rest.split_once(')'))
                .map(|(domain, _)| domain.to_owned());
            return Some(domain.map_or(SlowDown::Message, SlowDown::Recipient));
        }
        (code == "421").then_some(SlowDown::Server)
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
    #[error("cannot sign the email: {0}")]
    Sign(String),
}

enum Transport {
    Smtp(Box<pool::Pool>),
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
    /// Reservations beyond `max_connections`: deliveries that may claim their job while every
    /// connection is busy, and wait for one after the claim (0: a delivery waits for its
    /// connection before it claims). At most `max_connections` (a longer queue would wait
    /// longer than one send).
    pub reserved_ahead: u32,
    /// Places deeper in line, taken only while sends are fast ([`line`]).
    pub deeper: Option<line::Deeper>,
    /// Sign every message with this DKIM key.
    pub dkim: Option<dkim::DkimSettings>,
}

/// A place in the line for an SMTP session, taken before a claim: at most `max_connections +
/// reserved_ahead` deliveries hold one, so a delivery that claimed its job and then waits for a
/// connection has at most `max_connections - 1` others ahead of it (the semaphore is fair), and
/// gets a connection before every send in progress has ended: within one whole-send timeout.
pub struct Reservation<'a> {
    place: SemaphorePermit<'a>,
    connections: &'a Arc<Semaphore>,
    pool: Option<&'a pool::Pool>,
    deeper: bool,
}

impl<'a> Reservation<'a> {
    /// Whether this is one of the deeper places, taken while sends were fast ([`line`]).
    pub fn is_deeper(&self) -> bool {
        self.deeper
    }

    /// Waits for a free connection for `message`, at most `within`; `None` if none came free
    /// in time (the reservation is then given up) or the mailer is closed. While it waits, a
    /// send in progress may take `message`'s commands along and hand its connection over
    /// ([`pool`]).
    pub async fn session(self, message: &Outgoing, within: Duration) -> Option<Session<'a>> {
        tokio::time::timeout(within, self.take(Some(message)))
            .await
            .ok()?
    }

    /// Waits for a free connection, or (with a `message`) for one handed over with its
    /// commands on it.
    async fn take(self, message: Option<&Outgoing>) -> Option<Session<'a>> {
        let held = match (self.connections.clone().try_acquire_owned(), message) {
            (Ok(permit), _) => pool::Held::permit(permit),
            (Err(tokio::sync::TryAcquireError::Closed), _) => return None,
            (Err(_), Some(message)) => self.wait(message).await?,
            (Err(_), None) => {
                let permit = self.connections.clone().acquire_owned().await.ok()?;
                pool::Held::permit(permit)
            }
        };
        Some(Session {
            _place: self.place,
            held: Mutex::new(held),
        })
    }

    /// Waits for a permit, or for a connection handed over with `message`'s commands on it.
    async fn wait(&self, message: &Outgoing) -> Option<pool::Held> {
        let acquire = self.connections.clone().acquire_owned();
        let Some(pool) = self.pool else {
            return acquire.await.ok().map(pool::Held::permit);
        };
        let (ticket, mut handed) = pool.line_up(message);
        tokio::pin!(acquire);
        tokio::select! {
            handoff = &mut handed => {
                if let Ok(handoff) = handoff {
                    return Some(pool::Held::handed(handoff));
                }
            }
            permit = &mut acquire => {
                let permit = permit.ok()?;
                if ticket.withdraw() {
                    return Some(pool::Held::permit(permit));
                }
                // A send took this message along: its connection comes with its permit.
                drop(permit);
                if let Ok(handoff) = handed.await {
                    return Some(pool::Held::handed(handoff));
                }
                let permit = self.connections.clone().acquire_owned().await.ok()?;
                return Some(pool::Held::permit(permit));
            }
        }
        // The send that took this message along failed: wait for a connection of its own.
        acquire.await.ok().map(pool::Held::permit)
    }
}

/// The right to one SMTP session: a permit of the cap on open connections, held until the send
/// returns (or handed on with its connection to a waiting send), with the reservation it was
/// taken through.
pub struct Session<'a> {
    _place: SemaphorePermit<'a>,
    held: Mutex<pool::Held>,
}

impl Session<'_> {
    /// Whether this session's connection was handed over by the send before it, with this
    /// session's MAIL, RCPT and DATA already written behind that send's final dot.
    pub fn rode_along(&self) -> bool {
        self.held.lock().unwrap().is_handed()
    }
}

/// Builds and sends emails.
pub struct Mailer {
    transport: Transport,
    from: Mailbox,
    message_id_domain: String,
    timeout: Duration,
    permits: Arc<Semaphore>,
    reservations: Semaphore,
    deeper: Option<line::DeeperLine>,
    dkim: Option<Arc<dkim::Dkim>>,
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
                let endpoint = Endpoint::parse(s.url.url())
                    .map_err(|e| anyhow::anyhow!("SMTP_URL {}: {e}", s.url))?;
                Transport::Smtp(Box::new(pool::Pool::new(endpoint)))
            }
        };
        let dkim = s
            .dkim
            .as_ref()
            .map(dkim::Dkim::load)
            .transpose()?
            .map(Arc::new);
        if let (Some(d), Some(s)) = (&dkim, &s.dkim) {
            tracing::info!(algorithm = d.algorithm(), selector = %s.selector, domain = %s.domain, "signing with DKIM");
        }
        Ok(Mailer {
            dkim,
            transport,
            from: s.from.clone(),
            message_id_domain: s.message_id_domain.clone(),
            timeout: s.timeout,
            permits: Arc::new(Semaphore::new(s.max_connections as usize)),
            reservations: Semaphore::new(
                (s.max_connections + s.reserved_ahead.min(s.max_connections)) as usize,
            ),
            // The line deepens after a connection's worth of fast sends, twice over.
            deeper: s
                .deeper
                .map(|d| line::DeeperLine::new(d, 2 * s.max_connections)),
        })
    }

    /// The Message-ID of a job: the same on every attempt, so a duplicate in the documented
    /// window is recognisable by receivers and by our tests.
    pub fn message_id(&self, job_id: &str, kind: &str) -> String {
        message_id(job_id, kind, &self.message_id_domain)
    }

    /// Builds the MIME message (text and HTML alternatives, the job's headers), signs it when
    /// DKIM is configured, and formats it, once, for the size check and the wire.
    pub async fn build(
        &self,
        job: &ValidJob,
        email: &RenderedEmail,
    ) -> Result<Outgoing, BuildError> {
        let mut message = build_message(&self.from, &self.message_id_domain, job, email)?;
        if let Some(dkim) = &self.dkim {
            message = dkim.sign_owned(message).await.map_err(BuildError::Sign)?;
        }
        Outgoing::format(&message)
    }

    /// The whole-send timeout: connecting, the SMTP dialogue and the reply to the final dot.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Waits for a place in the line for an SMTP session (see [`Reservation`]). `None` once
    /// the mailer is closed.
    pub async fn reserve(&self) -> Option<Reservation<'_>> {
        let (place, deeper) = match &self.deeper {
            Some(deeper) => deeper.place(&self.reservations).await?,
            None => (self.reservations.acquire().await.ok()?, false),
        };
        let pool = match &self.transport {
            Transport::Smtp(pool) => Some(&**pool),
            Transport::File(_) => None,
        };
        Some(Reservation {
            place,
            connections: &self.permits,
            pool,
            deeper,
        })
    }

    /// Waits for a free SMTP session (a reservation, then a connection). `None` once the
    /// mailer is closed.
    pub async fn session(&self) -> Option<Session<'_>> {
        self.reserve().await?.take(None).await
    }

    /// Whether the SMTP server answers (connect, TLS, greeting, EHLO, AUTH) within the send
    /// timeout; the worker's circuit breaker probes with it during an outage. The probe is a
    /// session like any send (it counts against the cap), and its connection joins the pool.
    pub async fn probe(&self) -> bool {
        let Some(_session) = self.session().await else {
            return false;
        };
        match &self.transport {
            Transport::Smtp(pool) => matches!(
                tokio::time::timeout(self.timeout, pool.probe()).await,
                Ok(Ok(()))
            ),
            Transport::File(_) => true,
        }
    }

    /// Waits for a session (in which a send in progress may take `message` along, as for a
    /// worker's delivery), then sends one message in it ([`Mailer::send_in`]).
    pub async fn send(&self, message: &Outgoing) -> Result<String, SendError> {
        let reservation = self.reserve().await;
        let session = match reservation {
            Some(r) => r.take(Some(message)).await,
            None => None,
        };
        let session = session.ok_or_else(|| SendError::Transient {
            reason: "mailer is shutting down".into(),
        })?;
        self.send_in(&session, message).await
    }

    /// Sends one message in `session`, within [`Mailer::timeout`]; the `Ok` text is the
    /// server's reply, kept in the ledger.
    pub async fn send_in(
        &self,
        session: &Session<'_>,
        message: &Outgoing,
    ) -> Result<String, SendError> {
        let _running = self.deeper.as_ref().map(|d| d.depth.start());
        match &self.transport {
            Transport::Smtp(pool) => {
                let phase = Arc::new(PhaseCell::default());
                let sending = pool.send(message, &phase, &session.held);
                let failure = match tokio::time::timeout(self.timeout, sending).await {
                    Ok(Ok(reply)) => {
                        let text: Vec<&str> = reply.message().collect();
                        return Ok(format!("{} {}", reply.code(), text.join(" ")));
                    }
                    Ok(Err(failure)) => failure,
                    Err(_) => Failure::Timeout(self.timeout),
                };
                Err(classify(phase.get(), &failure, &pool.server()))
            }
            Transport::File(t) => {
                tracing::debug!(target: WINDOW_TARGET, window = "sending", "writing the .eml");
                let writing = t.send_raw(&message.envelope, &message.bytes);
                match tokio::time::timeout(self.timeout, writing).await {
                    Ok(Ok(id)) => Ok(format!("written {id}.eml")),
                    Ok(Err(e)) => Err(SendError::Transient {
                        reason: e.to_string(),
                    }),
                    Err(_) => Err(SendError::Uncertain {
                        reason: format!("writing the .eml took more than {:?}", self.timeout),
                    }),
                }
            }
        }
    }

    /// Messages whose MAIL, RCPT and DATA a send took along behind its final dot, so far (0 for
    /// `file://`).
    pub fn taken_along(&self) -> u64 {
        match &self.transport {
            Transport::Smtp(pool) => pool.taken_along(),
            Transport::File(_) => 0,
        }
    }

    /// Messages waiting for an SMTP connection that a send may take along (0 for `file://`).
    pub fn waiting(&self) -> usize {
        match &self.transport {
            Transport::Smtp(pool) => pool.waiting(),
            Transport::File(_) => 0,
        }
    }

    /// Follows [`Mailer::waiting`] from elsewhere (the worker's metrics).
    pub fn waiting_gauge(&self) -> WaitingGauge {
        match &self.transport {
            Transport::Smtp(pool) => pool.waiting_gauge(),
            Transport::File(_) => WaitingGauge::default(),
        }
    }

    /// Idle SMTP connections kept for reuse (0 for `file://`).
    pub fn idle_connections(&self) -> usize {
        match &self.transport {
            Transport::Smtp(pool) => pool.idle_count(),
            Transport::File(_) => 0,
        }
    }
}

/// A message ready for the wire: its envelope and its bytes, formatted once.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub envelope: Envelope,
    pub bytes: Vec<u8>,
}

impl Outgoing {
    /// Formats `message`, refusing one larger than [`MAX_MESSAGE_BYTES`].
    pub fn format(message: &Message) -> Result<Outgoing, BuildError> {
        let bytes = message.formatted();
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(BuildError::TooLarge {
                size: bytes.len(),
                max: MAX_MESSAGE_BYTES,
            });
        }
        Ok(Outgoing {
            envelope: message.envelope().clone(),
            bytes,
        })
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
    let b = Message::builder()
        .from(from.clone())
        .message_id(Some(message_id(
            &job.job.job_id,
            &job.job.kind,
            message_id_domain,
        )))
        .subject(email.subject.clone());
    let b = extra_headers(recipients(b, job), job)?.envelope(envelope(from, job)?);
    Ok(match &email.text {
        Some(text) => b.multipart(MultiPart::alternative_plain_html(
            body::encode(text),
            body::encode(&email.html),
        ))?,
        None => b.singlepart(SinglePart::html(body::encode(&email.html)))?,
    })
}

/// The envelope lettre would derive from the From, To, Cc and Bcc headers (the sender, then
/// every recipient in that order), made from the mailboxes themselves: lettre's own derivation
/// parses each header back from its encoded text, once per email.
fn envelope(from: &Mailbox, job: &ValidJob) -> Result<Envelope, BuildError> {
    let to = (job.to.iter().chain(&job.cc).chain(&job.bcc))
        .map(|m| m.email.clone())
        .collect();
    Ok(Envelope::new(Some(from.email.clone()), to)?)
}

/// The job's To, Cc, Bcc and Reply-To.
fn recipients(mut b: MessageBuilder, job: &ValidJob) -> MessageBuilder {
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
    b
}

/// The job's own headers; a name that is not a valid header name fails the build.
fn extra_headers(mut b: MessageBuilder, job: &ValidJob) -> Result<MessageBuilder, BuildError> {
    for (name, value) in &job.job.headers {
        let header = HeaderName::new_from_ascii(name.clone()).map_err(|e| BuildError::Header {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        b = b.raw_header(HeaderValue::new(header, value.clone()));
    }
    Ok(b)
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
