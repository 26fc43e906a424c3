//! mailroom's own SMTP connection pool. lettre's pooled transport opens its sockets without
//! TCP_NODELAY, and lettre writes the body and the final dot as two writes: Nagle then holds
//! the dot until the server's delayed ACK, about 40 ms per message (352 emails/s with 16
//! connections on loopback, 4,890/s with Nagle off). Here every socket is opened by tokio with
//! TCP_NODELAY and handed to lettre's `AsyncSmtpConnection`, which still speaks the protocol
//! (greeting, EHLO, STARTTLS, AUTH, replies); mailroom writes the body and the final dot as one
//! write ([`session::transaction`]).
//!
//! The pool keeps idle connections (LIFO, dropped after [`IDLE_TIMEOUT`]); the caller's
//! semaphore caps the connections open at once, since each send holds at most one.
//!
//! A send that waits for a connection can ride on one in use: it joins the pool's line of
//! waiting messages, and a send on a connection whose server pipelines, once told 354, takes
//! the first of them and writes its MAIL, RCPT and DATA behind its own body and final dot, in
//! the same write. When the server accepted the dot, the connection goes to that waiting send
//! with the permit it was held under ([`Handoff`]), and the waiting send reads the replies to
//! its commands and sends its body, perhaps with the next waiting message behind it. A message
//! on a busy connection then costs one write and one read instead of two of each. Nothing of
//! the waiting message is delivered before its own body's dot: if the first send fails, its
//! connection is dropped with the waiting message's commands on it, and that send goes on
//! waiting for a connection of its own.
//!
//! A pooled connection the server has closed meanwhile fails at MAIL FROM (no reply, or the 421
//! the server sent when it gave up on us), before anything was accepted: that send is retried
//! once on a fresh connection, which costs nothing on the common path (no NOOP before every
//! message).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::DEFAULT_MECHANISMS;
use lettre::transport::smtp::client::{AsyncSmtpConnection, AsyncTokioStream};
use lettre::transport::smtp::response::Response;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::Outgoing;
use super::endpoint::{Endpoint, TlsMode};
use super::session::{self, DotWatch, Failure, Phase, PhaseCell, Watched};
use super::tls;

/// Idle connections older than this are closed rather than reused: lettre's default, well
/// under the 5 minutes after which RFC 5321 servers may drop a silent client.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// An open session and what its server offers beyond what lettre tracks.
struct Conn {
    /// Boxed: lettre's connection is 1.2 KB inline (its stream, TLS state included), and a
    /// connection moves on every send (out of the idle list, into a handoff, back) and sits in
    /// every delivery's future inside its session.
    smtp: Box<AsyncSmtpConnection>,
    /// The server offered PIPELINING: MAIL, RCPT and DATA go out in one write.
    pipelining: bool,
    /// Sees the connection's reads and writes: when the final dot is all written.
    watch: Arc<DotWatch>,
}

impl Conn {
    async fn transaction(
        &mut self,
        ahead: bool,
        message: &Outgoing,
        phase: &Arc<PhaseCell>,
        next: &mut (dyn FnMut(&AsyncSmtpConnection) -> Option<String> + Send),
    ) -> Result<Response, Failure> {
        let (watch, pipelining) = (&self.watch, self.pipelining);
        session::transaction(
            &mut self.smtp,
            watch,
            pipelining,
            ahead,
            message,
            phase,
            next,
        )
        .await
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// A connection passed to the send whose MAIL, RCPT and DATA went out on it behind the previous
/// message's final dot, with the permit of the cap on open connections it was held under.
pub struct Handoff {
    conn: Conn,
    permit: OwnedSemaphorePermit,
}

/// What one session holds of the pool: its permit of the cap on open connections, and the
/// connection handed to it with its commands already sent. Dropped, it gives both up.
#[derive(Default)]
pub struct Held {
    permit: Option<OwnedSemaphorePermit>,
    handed: Option<Conn>,
}

impl Held {
    pub fn permit(permit: OwnedSemaphorePermit) -> Held {
        Held {
            permit: Some(permit),
            handed: None,
        }
    }

    /// Holds a connection handed over, not yet used.
    pub fn is_handed(&self) -> bool {
        self.handed.is_some()
    }

    pub fn handed(handoff: Handoff) -> Held {
        Held {
            permit: Some(handoff.permit),
            handed: Some(handoff.conn),
        }
    }
}

/// A message waiting for a connection, for a send in progress to take along.
struct Waiting {
    id: u64,
    envelope: Envelope,
    eight_bit: bool,
    handoff: oneshot::Sender<Handoff>,
}

#[derive(Default)]
struct Line {
    next_id: u64,
    waiting: VecDeque<Waiting>,
}

/// How many messages wait in a pool's line for a connection; always 0 without a pool.
#[derive(Clone, Default)]
pub struct WaitingGauge(Option<Arc<Mutex<Line>>>);

impl WaitingGauge {
    pub fn get(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |line| line.lock().unwrap().waiting.len())
    }
}

impl std::fmt::Debug for WaitingGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WaitingGauge({})", self.get())
    }
}

/// A message's place in the pool's line of waiting messages; dropped, it leaves the line.
pub struct Ticket<'p> {
    pool: &'p Pool,
    id: u64,
}

impl Ticket<'_> {
    /// Leaves the line; `false` when a send already took the message along (its handoff, or
    /// the news that it failed, is on its way).
    pub fn withdraw(&self) -> bool {
        let mut line = self.pool.line.lock().unwrap();
        let at = line.waiting.iter().position(|w| w.id == self.id);
        at.and_then(|at| line.waiting.remove(at)).is_some()
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.withdraw();
    }
}

pub struct Pool {
    endpoint: Endpoint,
    idle: Mutex<Vec<Idle>>,
    line: Arc<Mutex<Line>>,
    /// Messages whose commands a send took along behind its dot.
    taken_along: AtomicU64,
}

impl Pool {
    pub fn new(endpoint: Endpoint) -> Pool {
        Pool {
            endpoint,
            idle: Mutex::new(vec![]),
            line: Arc::default(),
            taken_along: AtomicU64::new(0),
        }
    }

    /// Puts `message` in the line of messages waiting for a connection; the receiver gets a
    /// connection with its commands sent, or is dropped when that send failed.
    pub fn line_up(&self, message: &Outgoing) -> (Ticket<'_>, oneshot::Receiver<Handoff>) {
        let (handoff, handed) = oneshot::channel();
        let mut line = self.line.lock().unwrap();
        let id = line.next_id;
        line.next_id += 1;
        line.waiting.push_back(Waiting {
            id,
            envelope: message.envelope.clone(),
            eight_bit: !message.bytes.is_ascii(),
            handoff,
        });
        (Ticket { pool: self, id }, handed)
    }

    /// Sends one message on the connection handed to `held`, a pooled or a new one; `phase`
    /// tells where a failure happened, also after a timeout dropped this future.
    pub async fn send(
        &self,
        message: &Outgoing,
        phase: &Arc<PhaseCell>,
        held: &Mutex<Held>,
    ) -> Result<Response, Failure> {
        let handed = held.lock().unwrap().handed.take();
        let ahead = handed.is_some();
        if let Some(mut conn) = handed.or_else(|| self.take_idle()) {
            let mut taken = None;
            let sent = conn
                .transaction(ahead, message, phase, &mut |c| {
                    self.take_along(c, &mut taken)
                })
                .await;
            match sent {
                Ok(reply) => {
                    self.pass_on(conn, taken, held);
                    return Ok(reply);
                }
                // Closed while idle: nothing was accepted, try once more on a new connection.
                Err(f) if phase.get() == Phase::Mail && (f.is_no_reply() || f.is_closing()) => {
                    tracing::debug!(error = %f, "pooled SMTP connection was stale; reconnecting");
                }
                Err(f) => return Err(f),
            }
        }
        phase.set(Phase::Connect);
        let mut conn = self.open().await?;
        let mut taken = None;
        let reply = conn
            .transaction(false, message, phase, &mut |c| {
                self.take_along(c, &mut taken)
            })
            .await?;
        self.pass_on(conn, taken, held);
        Ok(reply)
    }

    /// The commands of the first message waiting for a connection, for `conn` to write behind
    /// its body, which `taken` then keeps; `None` when no message waits, or when this server
    /// cannot take the first one (it then waits for a connection of its own).
    fn take_along(
        &self,
        conn: &AsyncSmtpConnection,
        taken: &mut Option<Waiting>,
    ) -> Option<String> {
        let first = self.line.lock().unwrap().waiting.pop_front()?;
        let commands = session::commands(conn, &first.envelope, first.eight_bit).ok()?;
        *taken = Some(first);
        self.taken_along.fetch_add(1, Ordering::Relaxed);
        Some(commands)
    }

    /// Messages whose commands a send took along behind its dot, since the pool was made.
    pub fn taken_along(&self) -> u64 {
        self.taken_along.load(Ordering::Relaxed)
    }

    /// Messages waiting for a connection right now.
    pub fn waiting(&self) -> usize {
        self.line.lock().unwrap().waiting.len()
    }

    /// Reads the length of this pool's line from elsewhere (the worker's metrics).
    pub fn waiting_gauge(&self) -> WaitingGauge {
        WaitingGauge(Some(self.line.clone()))
    }

    /// After an accepted message: the connection goes to the message taken along, with the
    /// permit `held` had, or back to the pool.
    fn pass_on(&self, conn: Conn, taken: Option<Waiting>, held: &Mutex<Held>) {
        let Some(taken) = taken else {
            return self.put_back(conn);
        };
        let Some(permit) = held.lock().unwrap().permit.take() else {
            return;
        };
        // The waiting send gave up meanwhile: its commands are answered on a connection
        // nobody will finish, so it is closed.
        if let Err(back) = taken.handoff.send(Handoff { conn, permit }) {
            held.lock().unwrap().permit = Some(back.permit);
        }
    }

    /// The server as `host:port`, for error messages (never the credentials).
    pub fn server(&self) -> String {
        format!("{}:{}", self.endpoint.host, self.endpoint.port)
    }

    /// Opens a connection (the whole handshake) and keeps it for the next send.
    pub async fn probe(&self) -> Result<(), Failure> {
        let conn = self.open().await?;
        self.put_back(conn);
        Ok(())
    }

    /// Idle connections kept right now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap().len()
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap();
        while let Some(i) = idle.pop() {
            if i.since.elapsed() < IDLE_TIMEOUT && !i.conn.smtp.has_broken() {
                return Some(i.conn);
            }
        }
        None
    }

    fn put_back(&self, conn: Conn) {
        if !conn.smtp.has_broken() {
            self.idle.lock().unwrap().push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// TCP with TCP_NODELAY, TLS as the URL says, greeting and EHLO, whether the server
    /// pipelines, AUTH with the URL's credentials.
    async fn open(&self) -> Result<Conn, Failure> {
        let e = &self.endpoint;
        let tcp = connect_tcp(&e.host, e.port).await.map_err(Failure::Io)?;
        let watch = Arc::new(DotWatch::default());
        let stream: Box<dyn AsyncTokioStream> = match &e.tls {
            TlsMode::Implicit(params) => Box::new(Watched::new(
                tls::implicit(tcp, params.clone()).await?,
                watch.clone(),
            )),
            _ => Box::new(Watched::new(tcp, watch.clone())),
        };
        let mut conn = AsyncSmtpConnection::connect_with_transport(stream, &e.hello).await?;
        match &e.tls {
            TlsMode::Required(params) => conn.starttls(params.clone(), &e.hello).await?,
            TlsMode::Opportunistic(params) if conn.can_starttls() => {
                conn.starttls(params.clone(), &e.hello).await?
            }
            _ => {}
        }
        let pipelining = session::offers_pipelining(&mut conn, &e.hello).await?;
        if let Some(credentials) = &e.credentials {
            conn.auth(DEFAULT_MECHANISMS, credentials).await?;
        }
        Ok(Conn {
            smtp: Box::new(conn),
            pipelining,
            watch,
        })
    }
}

/// A TCP connection with Nagle's algorithm off: every SMTP command and the final dot leave at
/// once instead of waiting for the ACK of the previous write.
pub async fn connect_tcp(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}
