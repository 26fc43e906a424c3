//! One SMTP transaction on an open connection, step by step (MAIL, RCPT, DATA, body, final
//! dot), so that a failure is known with its phase. That phase decides what a failure means
//! (RFC 5321 §4.5.3.2.6, RFC 1047): nothing is delivered before the final dot is sent, so a
//! broken connection or a timeout up to then is a safe retry; only a break after the dot leaves
//! the outcome unknown. A reply code is an answer whatever the phase: 4xx transient, 5xx
//! permanent (a 4xx/5xx to the final dot means "not accepted").

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use lettre::address::Envelope;
use lettre::transport::smtp::client::{AsyncSmtpConnection, AsyncTokioStream};
use lettre::transport::smtp::commands::{Data, Ehlo, Mail, Rcpt};
use lettre::transport::smtp::extension::{Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::{Response, Severity};

use super::{Outgoing, SendError};

/// Where a send is. Ordered: a later phase has a larger value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// TCP, TLS, greeting, EHLO, STARTTLS, AUTH.
    Connect = 0,
    Mail = 1,
    Rcpt = 2,
    Data = 3,
    /// Writing the message body (DATA was answered 354).
    Body = 4,
    /// The body and the final dot are written (one write) and the reply is awaited. From here
    /// on the server may have taken the message.
    FinalDot = 5,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Connect,
            1 => Phase::Mail,
            2 => Phase::Rcpt,
            3 => Phase::Data,
            4 => Phase::Body,
            _ => Phase::FinalDot,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Phase::Connect => "while connecting",
            Phase::Mail => "at MAIL FROM",
            Phase::Rcpt => "at RCPT TO",
            Phase::Data => "at DATA",
            Phase::Body => "while sending the message body",
            Phase::FinalDot => "after the final dot",
        }
    }
}

/// The phase of one send, readable after its future was dropped by a timeout.
#[derive(Debug, Default)]
pub struct PhaseCell(AtomicU8);

impl PhaseCell {
    pub fn set(&self, p: Phase) {
        self.0.store(p as u8, Ordering::Release);
    }

    pub fn get(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::Acquire))
    }
}

/// Why a send failed, before classification.
#[derive(Debug)]
pub enum Failure {
    /// lettre's error: a reply code, or a network, TLS or protocol error.
    Smtp(lettre::transport::smtp::Error),
    /// A reply refusing one recipient at RCPT TO, with that recipient's domain.
    Rcpt(String, lettre::transport::smtp::Error),
    /// Opening the TCP connection.
    Io(std::io::Error),
    /// The message cannot be sent to this server, whatever the retry.
    Refused(String),
    /// The whole-send deadline passed.
    Timeout(Duration),
}

impl Failure {
    /// lettre's error, when lettre had one.
    fn smtp(&self) -> Option<&lettre::transport::smtp::Error> {
        match self {
            Failure::Smtp(e) | Failure::Rcpt(_, e) => Some(e),
            _ => None,
        }
    }

    /// No answer from the server: the connection broke, timed out or spoke nonsense.
    pub fn is_no_reply(&self) -> bool {
        match self {
            Failure::Smtp(e) | Failure::Rcpt(_, e) => {
                !(e.is_transient() || e.is_permanent() || e.is_client())
            }
            Failure::Io(_) | Failure::Timeout(_) => true,
            Failure::Refused(_) => false,
        }
    }

    /// The server said it is closing the connection (421), e.g. after an idle timeout.
    pub fn is_closing(&self) -> bool {
        self.smtp()
            .is_some_and(|e| e.status().is_some_and(|c| c.to_string() == "421"))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Smtp(e) => write!(f, "{e}"),
            Failure::Rcpt(domain, e) => write!(f, "{e} ({}{domain})", super::RCPT_DOMAIN),
            Failure::Io(e) => write!(f, "connection error: {e}"),
            Failure::Refused(why) => write!(f, "{why}"),
            Failure::Timeout(d) => write!(f, "no answer within {d:?}"),
        }
    }
}

impl From<lettre::transport::smtp::Error> for Failure {
    fn from(e: lettre::transport::smtp::Error) -> Failure {
        Failure::Smtp(e)
    }
}

/// What a failure in `phase` says about delivery; the reason names the phase and the
/// `server` (`host:port`).
///
/// 503 (bad sequence of commands) is the exception among 5xx: it says the session was out of
/// step, not that the message was refused, so it is retried. No answer at all while connecting
/// (refused, unreachable, no greeting in time) is `Unreachable`: the server, not the job.
pub fn classify(phase: Phase, failure: &Failure, server: &str) -> SendError {
    let reason = format!("{failure} ({}, SMTP server {server})", phase.describe());
    let out_of_sequence = failure
        .smtp()
        .is_some_and(|e| e.status().is_some_and(|code| code.to_string() == "503"));
    match failure.smtp() {
        Some(e) if e.is_transient() || out_of_sequence => return SendError::Transient { reason },
        Some(e) if e.is_permanent() || e.is_client() => return SendError::Permanent { reason },
        _ => {}
    }
    match failure {
        Failure::Refused(_) => SendError::Permanent { reason },
        _ if phase >= Phase::FinalDot => SendError::Uncertain { reason },
        _ if phase == Phase::Connect && failure.is_no_reply() => SendError::Unreachable { reason },
        _ => SendError::Transient { reason },
    }
}

/// MAIL FROM, RCPT TO each recipient, DATA, the body and the final dot, updating `phase`
/// before each step. Returns the reply to the final dot. `watch` is the connection's
/// ([`Watched`]): it marks the moment the body and the dot are all written.
///
/// With `pipelining` (the server offered PIPELINING, RFC 2920) MAIL, every RCPT and DATA leave
/// in one write and their replies are read in order: two round trips per message (the
/// commands, then the body) instead of four. Each reply is still judged in its own phase, so a
/// refused recipient is a refusal at RCPT TO as without pipelining. After any failure the
/// caller drops the connection, so replies left unread never answer a later message.
///
/// `ahead`: this message's MAIL, RCPT and DATA already went out, behind the previous message's
/// final dot on this connection, and only their replies are read. `next` is asked, once the
/// server said 354, for the commands of a message waiting for a connection: they leave in the
/// same write as this body and its dot (RFC 2920 §3.1 allows a message's content to start a
/// group), so that waiting message needs no round trip of its own for its commands.
///
/// The body goes out dot-stuffed with the final dot in the same write: one send instead of
/// lettre's two, and one pass over the body that copies it line by line instead of byte by
/// byte (the same bytes on the wire).
pub async fn transaction(
    conn: &mut AsyncSmtpConnection,
    watch: &DotWatch,
    pipelining: bool,
    ahead: bool,
    message: &Outgoing,
    phase: &Arc<PhaseCell>,
    next: &mut (dyn FnMut(&AsyncSmtpConnection) -> Option<String> + Send),
) -> Result<Response, Failure> {
    phase.set(Phase::Mail);
    let envelope = &message.envelope;
    // mailroom builds every message from text; anything else is refused before MAIL FROM.
    let text = std::str::from_utf8(&message.bytes).map_err(|e| {
        Failure::Refused(format!(
            "the message is not UTF-8 text (byte {}), and mailroom sends text only",
            e.valid_up_to()
        ))
    })?;
    let rcpt_failure = |to: &lettre::Address, e| Failure::Rcpt(to.domain().to_ascii_lowercase(), e);
    if ahead || pipelining {
        if ahead {
            conn.read_response().await?;
        } else {
            // Writes the whole group, then reads MAIL's reply.
            conn.command(commands(conn, envelope, !message.bytes.is_ascii())?)
                .await?;
        }
        phase.set(Phase::Rcpt);
        for to in envelope.to() {
            conn.read_response()
                .await
                .map_err(|e| rcpt_failure(to, e))?;
        }
        phase.set(Phase::Data);
        conn.read_response().await?;
    } else {
        let params = mail_parameters(conn, envelope, !message.bytes.is_ascii())?;
        conn.command(Mail::new(envelope.from().cloned(), params))
            .await?;
        phase.set(Phase::Rcpt);
        for to in envelope.to() {
            conn.command(Rcpt::new(to.clone(), vec![]))
                .await
                .map_err(|e| rcpt_failure(to, e))?;
        }
        phase.set(Phase::Data);
        conn.command(Data).await?;
    }
    phase.set(Phase::Body);
    let next = if pipelining { next(conn) } else { None };
    let reply = body_and_dot(conn, watch, text, next, phase).await?;
    // lettre accepts any positive reply; only a 2xx means the server took the message. Anything
    // else after the final dot (a 354 read out of step, say) leaves its fate unknown.
    if reply.code().severity != Severity::PositiveCompletion {
        return Err(Failure::Io(std::io::Error::other(format!(
            "unexpected reply to the final dot: {} {}",
            reply.code(),
            reply.message().collect::<Vec<_>>().join(" ")
        ))));
    }
    Ok(reply)
}

/// MAIL FROM (with the parameters the message needs), RCPT TO each recipient and DATA, as
/// they go on the wire in one pipelined write. `eight_bit`: the message has non-ASCII bytes.
pub fn commands(
    conn: &AsyncSmtpConnection,
    envelope: &Envelope,
    eight_bit: bool,
) -> Result<String, Failure> {
    let params = mail_parameters(conn, envelope, eight_bit)?;
    let mut commands = Mail::new(envelope.from().cloned(), params).to_string();
    for to in envelope.to() {
        commands.push_str(&Rcpt::new(to.clone(), vec![]).to_string());
    }
    commands.push_str(&Data.to_string());
    Ok(commands)
}

/// Writes the dot-stuffed body and the final dot in one write, followed by `next` (the next
/// message's commands) when there is one, and reads the reply to the dot.
///
/// The phase stays [`Phase::Body`] until the dot is all written: a write that fails or times
/// out before it has not handed the dot to the network, so nothing can have been accepted.
/// Alone in its write, the dot is its last bytes, and lettre reads the reply only after the
/// write and its flush returned, so the connection's first read after this write started is
/// when the phase becomes [`Phase::FinalDot`]. With `next` behind it, the dot is out once the
/// connection has written as many bytes as the body and the dot take, and `watch` counts them
/// (under TLS it counts what TLS took or wrote, which can only be sooner). `watch` moves the
/// phase, also when a timeout then drops this future.
async fn body_and_dot(
    conn: &mut AsyncSmtpConnection,
    watch: &DotWatch,
    body: &str,
    next: Option<String>,
    phase: &Arc<PhaseCell>,
) -> Result<Response, Failure> {
    let mut data = data_phase(body);
    let dot_end = next.as_ref().map(|commands| {
        let end = data.len();
        data.push_str(commands);
        end
    });
    // Before the write starts: a process killed after this line may have sent the dot.
    tracing::debug!(target: super::WINDOW_TARGET, window = "sending", "uncertain window opens: the final dot goes out");
    watch.arm(phase, dot_end);
    let reply = conn.command(data).await;
    watch.disarm();
    match reply {
        Ok(reply) => {
            phase.set(Phase::FinalDot);
            Ok(reply)
        }
        // A reply, or bytes that are none: the write was done and the reply read.
        Err(e) if e.is_response() || e.is_transient() || e.is_permanent() => {
            phase.set(Phase::FinalDot);
            Err(e.into())
        }
        // The network: the watch says whether it broke before or after the dot was written.
        Err(e) => Err(e.into()),
    }
}

/// The DATA phase as it goes on the wire: `body` with a `.` doubled at the start of every line
/// (RFC 5321 §4.5.2: a line starts the body or follows a CRLF, as lettre's codec has it), then
/// CRLF, the final dot and CRLF.
fn data_phase(body: &str) -> String {
    let mut out = String::with_capacity(body.len() + body.len() / 256 + 8);
    if body.starts_with('.') {
        out.push('.');
    }
    let mut rest = body;
    while let Some(at) = rest.find("\r\n.") {
        let (line, after) = rest.split_at(at + 3);
        out.push_str(line);
        out.push('.');
        rest = after;
    }
    out.push_str(rest);
    out.push_str("\r\n.\r\n");
    out
}

/// Tells a send when its body and final dot are all written: [`Watched`] reports each read and
/// each write of the connection; the first read after [`DotWatch::arm`], or the write that
/// brings the bytes written since to the armed count, moves the armed phase to
/// [`Phase::FinalDot`].
#[derive(Debug)]
pub struct DotWatch {
    /// The armed send's phase; `None` while disarmed.
    armed: Mutex<Option<Arc<PhaseCell>>>,
    /// Bytes written on the connection so far.
    written: AtomicU64,
    /// The count of `written` at which the armed send's dot is all written (`u64::MAX`: only
    /// a read tells).
    dot_at: AtomicU64,
}

impl Default for DotWatch {
    fn default() -> DotWatch {
        DotWatch {
            armed: Mutex::new(None),
            written: AtomicU64::new(0),
            dot_at: AtomicU64::new(u64::MAX),
        }
    }
}

impl DotWatch {
    /// Arms the watch for a send whose dot ends `dot_end` bytes into its next write, when
    /// more follows it in that write; `None` when the dot ends it.
    fn arm(&self, phase: &Arc<PhaseCell>, dot_end: Option<usize>) {
        *self.armed.lock().unwrap() = Some(phase.clone());
        let at = dot_end.map_or(u64::MAX, |end| {
            self.written.load(Ordering::Relaxed) + end as u64
        });
        self.dot_at.store(at, Ordering::Relaxed);
    }

    fn disarm(&self) {
        self.dot_at.store(u64::MAX, Ordering::Relaxed);
        self.armed.lock().unwrap().take();
    }

    fn read(&self) {
        self.dot_at.store(u64::MAX, Ordering::Relaxed);
        if let Some(phase) = self.armed.lock().unwrap().take() {
            phase.set(Phase::FinalDot);
        }
    }

    fn wrote(&self, n: usize) {
        let written = self.written.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if written >= self.dot_at.load(Ordering::Relaxed) {
            self.read();
        }
    }
}

/// A connection's stream (TCP, or TLS over it) that tells its [`DotWatch`] of every read.
/// Under STARTTLS lettre's TLS sits above it: a read of the reply still reaches it, because
/// nothing the server sends can be waiting before the dot is answered.
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    watch: Arc<DotWatch>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, watch: Arc<DotWatch>) -> Watched<S> {
        Watched { inner, watch }
    }
}

impl<S: AsyncTokioStream> AsyncTokioStream for Watched<S> {
    fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.inner.peer_addr()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.watch.read();
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let wrote = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = wrote {
            this.watch.wrote(n);
        }
        wrote
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let wrote = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = wrote {
            this.watch.wrote(n);
        }
        wrote
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Whether the server offers PIPELINING: asks EHLO again (after STARTTLS, before AUTH, so the
/// answer is the one a protected session gets) and reads its keywords, which lettre's
/// `ServerInfo` does not keep.
pub async fn offers_pipelining(
    conn: &mut AsyncSmtpConnection,
    hello: &lettre::transport::smtp::extension::ClientId,
) -> Result<bool, Failure> {
    let reply = match conn.command(Ehlo::new(hello.clone())).await {
        Ok(reply) => reply,
        // A server that refuses EHLO once more (RFC 5321 allows it) is spoken to one command
        // at a time; the session it accepted stands.
        Err(e) if e.is_transient() || e.is_permanent() => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    Ok(reply.message().any(|line| {
        line.split_whitespace()
            .next()
            .is_some_and(|keyword| keyword.eq_ignore_ascii_case("PIPELINING"))
    }))
}

/// SMTPUTF8 and 8BITMIME when the envelope or the message need them (as lettre's own `send`),
/// or a refusal when the server lacks them.
fn mail_parameters(
    conn: &AsyncSmtpConnection,
    envelope: &Envelope,
    eight_bit: bool,
) -> Result<Vec<MailParameter>, Failure> {
    let info = conn.server_info();
    let mut params = vec![];
    let non_ascii = envelope
        .from()
        .into_iter()
        .chain(envelope.to())
        .any(|a| !AsRef::<str>::as_ref(a).is_ascii());
    if non_ascii {
        if !info.supports_feature(Extension::SmtpUtfEight) {
            return Err(Failure::Refused(
                "non-ASCII address but the server does not offer SMTPUTF8".into(),
            ));
        }
        params.push(MailParameter::SmtpUtfEight);
    }
    if eight_bit {
        if !info.supports_feature(Extension::EightBitMime) {
            return Err(Failure::Refused(
                "non-ASCII message but the server does not offer 8BITMIME".into(),
            ));
        }
        params.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> Failure {
        Failure::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    fn classify_at(phase: Phase, failure: &Failure) -> SendError {
        classify(phase, failure, "smtp.example:25")
    }

    fn class(e: &SendError) -> &'static str {
        match e {
            SendError::Transient { .. } => "transient",
            SendError::Unreachable { .. } => "unreachable",
            SendError::Permanent { .. } => "permanent",
            SendError::Uncertain { .. } => "uncertain",
        }
    }

    #[test]
    fn a_break_is_a_safe_retry_until_the_body_is_written_and_uncertain_after() {
        // While connecting, no answer means the server is unreachable (the breaker counts it).
        assert_eq!(class(&classify_at(Phase::Connect, &io())), "unreachable");
        let t = Failure::Timeout(Duration::from_secs(1));
        assert_eq!(class(&classify_at(Phase::Connect, &t)), "unreachable");
        for p in [Phase::Mail, Phase::Rcpt, Phase::Data, Phase::Body] {
            assert_eq!(class(&classify_at(p, &io())), "transient", "{p:?}");
            let t = Failure::Timeout(Duration::from_secs(1));
            assert_eq!(class(&classify_at(p, &t)), "transient", "{p:?}");
        }
        assert_eq!(class(&classify_at(Phase::FinalDot, &io())), "uncertain");
        let t = Failure::Timeout(Duration::from_secs(1));
        let e = classify_at(Phase::FinalDot, &t);
        assert_eq!(class(&e), "uncertain");
        assert!(e.to_string().contains("after the final dot"), "{e}");
    }

    #[test]
    fn refusals_are_permanent_whatever_the_phase() {
        let r = Failure::Refused("no SMTPUTF8".into());
        assert_eq!(class(&classify_at(Phase::Mail, &r)), "permanent");
    }

    #[test]
    fn phases_survive_the_cell() {
        let cell = PhaseCell::default();
        assert_eq!(cell.get(), Phase::Connect);
        for p in [Phase::Mail, Phase::Body, Phase::FinalDot] {
            cell.set(p);
            assert_eq!(cell.get(), p);
        }
    }

    /// lettre's dot-stuffing (its `ClientCodec`), byte by byte, then the final dot.
    fn lettre_data_phase(body: &[u8]) -> Vec<u8> {
        #[derive(Clone, Copy, PartialEq)]
        enum At {
            Middle,
            AfterCr,
            LineStart,
        }
        let mut at = At::LineStart;
        let mut out = vec![];
        for &b in body {
            out.push(b);
            at = match (b, at) {
                (b'\r', _) => At::AfterCr,
                (b'\n', At::AfterCr) => At::LineStart,
                (b'.', At::LineStart) => {
                    out.push(b'.');
                    At::Middle
                }
                (_, At::AfterCr | At::LineStart) => At::Middle,
                (_, At::Middle) => At::Middle,
            };
        }
        out.extend_from_slice(b"\r\n.\r\n");
        out
    }

    #[test]
    fn the_data_phase_is_the_bytes_lettre_would_write() {
        for body in [
            "",
            ".",
            "..",
            ".hidden\r\n",
            "a\r\n.\r\nb",
            "a\r\n..\r\n.",
            "a\n.b\r.c\r\r\n.d",
            "ends with\r\n",
            "ends with a dot\r\n.",
            "caf\u{e9}\r\n.\u{e9}t\u{e9}\r\n",
        ] {
            assert_eq!(
                data_phase(body).as_bytes(),
                lettre_data_phase(body.as_bytes()),
                "{body:?}"
            );
        }
        // Every string of up to 7 of the characters that matter.
        let alphabet = ['\r', '\n', '.', 'x'];
        for len in 0..=7u32 {
            for n in 0..4usize.pow(len) {
                let body: String = (0..len).map(|i| alphabet[n / 4usize.pow(i) % 4]).collect();
                assert_eq!(
                    data_phase(&body).as_bytes(),
                    lettre_data_phase(body.as_bytes()),
                    "{body:?}"
                );
            }
        }
    }

    #[test]
    fn with_the_next_commands_behind_it_the_dot_is_out_when_its_last_byte_is_written() {
        let watch = DotWatch::default();
        // What the connection wrote before this send's body.
        watch.wrote(1000);
        let phase = Arc::new(PhaseCell::default());
        phase.set(Phase::Body);
        watch.arm(&phase, Some(500));
        watch.wrote(300);
        assert_eq!(phase.get(), Phase::Body);
        watch.wrote(199);
        assert_eq!(
            phase.get(),
            Phase::Body,
            "one byte of the dot is not written"
        );
        watch.wrote(1);
        assert_eq!(phase.get(), Phase::FinalDot);
        // One write that carries the dot and the next message's commands.
        let next = Arc::new(PhaseCell::default());
        next.set(Phase::Body);
        watch.arm(&next, Some(10));
        watch.wrote(40);
        assert_eq!(next.get(), Phase::FinalDot);
        // Disarmed, writes move nothing; armed without a count, only a read does.
        let later = Arc::new(PhaseCell::default());
        later.set(Phase::Body);
        watch.arm(&later, Some(10));
        watch.disarm();
        watch.wrote(100);
        assert_eq!(later.get(), Phase::Body);
        watch.arm(&later, None);
        watch.wrote(1 << 20);
        assert_eq!(later.get(), Phase::Body);
        watch.read();
        assert_eq!(later.get(), Phase::FinalDot);
    }

    #[tokio::test]
    async fn a_watched_stream_counts_the_bytes_the_write_handed_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A peer that takes 16 bytes at a time: the write of the body, the dot and the next
        // message's commands goes out in pieces, and the dot is out once its last piece is.
        let (near, mut far) = tokio::io::duplex(16);
        let watch = Arc::new(DotWatch::default());
        let mut stream = Watched::new(near, watch.clone());
        let phase = Arc::new(PhaseCell::default());
        phase.set(Phase::Body);
        let data = format!(
            "{}{}",
            data_phase("x".repeat(100).as_str()),
            "MAIL FROM:<a@b>\r\n"
        );
        let dot_end = data.find(".\r\nMAIL").unwrap() + 3;
        watch.arm(&phase, Some(dot_end));
        let writing = tokio::spawn(async move { stream.write_all(data.as_bytes()).await });
        // The peer took all but 17 bytes of the body and the dot: the writer handed on 16
        // more at most, short of the dot's last byte.
        let mut taken = vec![0u8; dot_end - 17];
        far.read_exact(&mut taken).await.unwrap();
        tokio::task::yield_now().await;
        assert_eq!(
            phase.get(),
            Phase::Body,
            "the dot's last byte is not written"
        );
        // The peer took the dot: the write is still under way (the 17 bytes of MAIL do not fit
        // in what the peer holds), and the dot is out.
        let mut taken = vec![0u8; 17];
        far.read_exact(&mut taken).await.unwrap();
        assert_eq!(phase.get(), Phase::FinalDot);
        assert!(!writing.is_finished());
        let mut rest = vec![];
        far.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"MAIL FROM:<a@b>\r\n");
        writing.await.unwrap().unwrap();
    }

    #[test]
    fn the_watch_moves_only_the_armed_send_to_the_final_dot_at_the_first_read() {
        let watch = DotWatch::default();
        let phase = Arc::new(PhaseCell::default());
        phase.set(Phase::Body);
        // Reads before the body's write (the replies to MAIL, RCPT, DATA) change nothing.
        watch.read();
        assert_eq!(phase.get(), Phase::Body);
        watch.arm(&phase, None);
        assert_eq!(phase.get(), Phase::Body);
        watch.read();
        assert_eq!(phase.get(), Phase::FinalDot);
        // Disarmed, a later send's phase is left alone.
        watch.disarm();
        let next = Arc::new(PhaseCell::default());
        next.set(Phase::Body);
        watch.read();
        assert_eq!(next.get(), Phase::Body);
        watch.arm(&next, None);
        watch.disarm();
        watch.read();
        assert_eq!(next.get(), Phase::Body);
    }
}
