//! A TCP fault proxy for tests (a small Toxiproxy): put it between a mailroom process and a
//! service (SMTP, RabbitMQ, PostgreSQL), then switch its [`Fault`] at runtime. The switch
//! applies to open connections as well as new ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards everything.
    Pass,
    /// Forwards every chunk after this delay.
    Delay(Duration),
    /// Forwards nothing and answers nothing, keeping every socket open: a network partition
    /// as the endpoints see it (TCP retransmits; nothing arrives). Bytes read meanwhile are
    /// held, and forwarded once the fault is lifted, as TCP would deliver them.
    Blackhole,
    /// Resets every connection (RST, no FIN) and every new one at once.
    Reset,
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    pub port: u16,
    fault: Arc<watch::Sender<Fault>>,
    open: Arc<AtomicUsize>,
    forwarded: Arc<AtomicUsize>,
    pings: Arc<AtomicUsize>,
    carried: Carried,
    holding: Holding,
    task: tokio::task::JoinHandle<()>,
}

/// What a partition holds in the proxy itself, beyond the kernel's queues: chunks read and not
/// yet forwarded, connections waiting to reach the service; and the local ports of the proxy's
/// connections to the service, whose queues hold the service's answers.
#[derive(Clone, Default)]
struct Holding {
    waiting: Arc<AtomicUsize>,
    upstream_ports: Arc<Mutex<Vec<u16>>>,
}

impl Holding {
    /// Counts one thing held until the guard is dropped.
    fn hold(&self) -> HoldGuard {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        HoldGuard(self.waiting.clone())
    }
}

struct HoldGuard(Arc<AtomicUsize>);

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The bytes of every direction of every connection, each in order (up to [`CARRIED_CAP`]).
type Carried = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// Bytes kept per direction of a connection for [`FaultProxy::carried`]: the start of each
/// stream, enough to hold the handshake and the first rows, bounded for the soak tests.
const CARRIED_CAP: usize = 1 << 20;

/// A database client's ping as it reaches the server on its own, the client waiting for the
/// answer: PostgreSQL's bare Sync message, MySQL's `COM_PING` packet (sequence 0).
const PINGS: [&[u8]; 2] = [b"S\0\0\0\x04", b"\x01\0\0\0\x0e"];

impl FaultProxy {
    /// A proxy in front of the service `url` names (its port, or its scheme's default); pass
    /// [`FaultProxy::url_through`] to the client.
    pub async fn in_front_of(url: &str) -> FaultProxy {
        let url = url::Url::parse(url).unwrap();
        FaultProxy::start(url.port_or_known_default().unwrap()).await
    }

    /// Listens on a free loopback port and forwards to `127.0.0.1:target_port`.
    pub async fn start(target_port: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let fault = Arc::new(watch::Sender::new(Fault::Pass));
        let rx = fault.subscribe();
        let open = Arc::new(AtomicUsize::new(0));
        let forwarded = Arc::new(AtomicUsize::new(0));
        let pings = Arc::new(AtomicUsize::new(0));
        let carried = Carried::default();
        let holding = Holding::default();
        let counts = (
            open.clone(),
            forwarded.clone(),
            pings.clone(),
            carried.clone(),
            holding.clone(),
        );
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(connection(client, target_port, rx.clone(), counts.clone()));
            }
        });
        FaultProxy {
            port,
            fault,
            open,
            forwarded,
            pings,
            carried,
            holding,
            task,
        }
    }

    /// Whether `text` crossed the proxy in the clear, either way, on any connection: a
    /// connection under TLS never shows it.
    pub fn carried(&self, text: &str) -> bool {
        let needle = text.as_bytes();
        self.carried.lock().unwrap().iter().any(|stream| {
            stream
                .lock()
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
        })
    }

    /// Database pings the clients sent through the proxy (on a plain connection; TLS hides
    /// them): each one a round trip of its own.
    pub fn pings(&self) -> usize {
        self.pings.load(Ordering::SeqCst)
    }

    /// The count behind [`FaultProxy::open`], for a task that watches it.
    pub fn opened_counter(&self) -> Arc<AtomicUsize> {
        self.open.clone()
    }

    /// Connections being forwarded now (a reset one no longer counts).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Connections forwarded to the service since the start: a client that reconnects after a
    /// fault makes it grow.
    pub fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }

    /// Switches the fault, for open connections and new ones.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Bytes the clients sent that wait unread in the proxy's sockets (the kernel's receive
    /// queues, from `/proc/net/tcp`): during a [`Fault::Blackhole`], more than 0 means a client
    /// has written into the partition (a statement, a frame) and waits for the answer.
    pub fn held_from_clients(&self) -> u64 {
        unread_on(&[self.port])
    }

    /// Everything a partition holds in flight, either way: bytes the clients sent or the
    /// service answered that wait unread in the proxy's sockets, chunks the proxy read as the
    /// fault landed, and connections opened during it (a MySQL client waits for the server's
    /// greeting and sends nothing). During a [`Fault::Blackhole`], more than 0 means a client
    /// waits on the partition, whichever step it was at when the fault came.
    pub fn held(&self) -> u64 {
        let upstream = self.holding.upstream_ports.lock().unwrap().clone();
        let waiting = self.holding.waiting.load(Ordering::SeqCst) as u64;
        self.held_from_clients() + unread_on(&upstream) + waiting
    }

    /// `url` with its port replaced by the proxy's.
    pub fn url_through(&self, url: &str) -> String {
        let mut u = url::Url::parse(url).unwrap();
        u.set_host(Some("127.0.0.1")).unwrap();
        u.set_port(Some(self.port)).unwrap();
        u.to_string()
    }
}

/// Bytes waiting unread in the receive queues of the sockets whose local port is one of `ports`
/// (from `/proc/net/tcp`; listening sockets aside).
fn unread_on(ports: &[u16]) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let ports: Vec<String> = ports.iter().map(|p| format!(":{p:04X}")).collect();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, then tx_queue:rx_queue in the fifth column.
            let local = fields.get(1)?;
            let (_, rx) = fields.get(4)?.split_once(':')?;
            let listening = fields.get(3) == Some(&"0A");
            let ours = ports.iter().any(|p| local.ends_with(p.as_str()));
            (ours && !listening).then(|| u64::from_str_radix(rx, 16).ok())?
        })
        .sum()
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.fault.send_replace(Fault::Reset);
    }
}

async fn connection(
    client: TcpStream,
    target_port: u16,
    mut fault: watch::Receiver<Fault>,
    (open, forwarded, pings, carried, holding): (
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        Carried,
        Holding,
    ),
) {
    let _ = client.set_nodelay(true);
    // A new connection during a partition waits for it to end before reaching the service.
    loop {
        let now = *fault.borrow_and_update();
        match now {
            Fault::Reset => return reset(&client),
            Fault::Blackhole => {}
            Fault::Pass | Fault::Delay(_) => break,
        }
        let _held = holding.hold();
        if fault.changed().await.is_err() {
            return;
        }
    }
    let Ok(upstream) = TcpStream::connect(("127.0.0.1", target_port)).await else {
        return reset(&client);
    };
    let _ = upstream.set_nodelay(true);
    if let Ok(local) = upstream.local_addr() {
        holding.upstream_ports.lock().unwrap().push(local.port());
    }
    open.fetch_add(1, Ordering::SeqCst);
    forwarded.fetch_add(1, Ordering::SeqCst);
    let (client_r, client_w) = client.into_split();
    let (upstream_r, upstream_w) = upstream.into_split();
    let [sent, received] = [(); 2].map(|_| Arc::new(Mutex::new(Vec::new())));
    carried
        .lock()
        .unwrap()
        .extend([sent.clone(), received.clone()]);
    tokio::join!(
        pump(
            client_r,
            upstream_w,
            fault.clone(),
            Some(pings),
            sent,
            holding.clone()
        ),
        pump(upstream_r, client_w, fault, None, received, holding),
    );
    open.fetch_sub(1, Ordering::SeqCst);
}

/// Copies one direction until EOF, an error, or a reset, counting the chunks that are a ping
/// alone in `pings` (the client's direction) and keeping what it copied in `carried`.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    pings: Option<Arc<AtomicUsize>>,
    carried: Arc<Mutex<Vec<u8>>>,
    holding: Holding,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // While partitioned, stop reading: bytes stay in the kernel buffers, as if in flight.
        loop {
            let now = *fault.borrow_and_update();
            match now {
                Fault::Reset => {
                    reset(from.as_ref());
                    reset(to.as_ref());
                    return;
                }
                Fault::Blackhole => {
                    if fault.changed().await.is_err() {
                        return;
                    }
                }
                Fault::Pass | Fault::Delay(_) => break,
            }
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            changed = fault.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        loop {
            let now = *fault.borrow_and_update();
            match now {
                Fault::Reset => {
                    reset(from.as_ref());
                    reset(to.as_ref());
                    return;
                }
                Fault::Blackhole => {
                    // A chunk read as the fault landed: held here, not in the kernel.
                    let _held = holding.hold();
                    if fault.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                Fault::Delay(d) => tokio::time::sleep(d).await,
                Fault::Pass => {}
            }
            break;
        }
        if let Some(pings) = &pings
            && PINGS.contains(&&buf[..n])
        {
            pings.fetch_add(1, Ordering::SeqCst);
        }
        {
            let mut kept = carried.lock().unwrap();
            let room = CARRIED_CAP.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Makes the socket's close send RST instead of FIN; the caller then drops it (both pumps of
/// a connection see the same fault and drop their halves).
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}
