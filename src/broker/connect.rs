//! Connecting to RabbitMQ (failing over between the nodes of `AMQP_URL`), a failed connection
//! told as one sentence with its fix, and the reconnect schedule of every long-running loop.

use std::time::Duration;

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::{Connection, ConnectionProperties, ErrorKind};
use std::time::Instant;

use crate::config::{SecretUrl, UrlList};
use crate::exit::Fatal;

/// First wait before reconnecting after a lost session; doubled up to [`RECONNECT_MAX`].
pub const RECONNECT_MIN: Duration = Duration::from_millis(200);
/// Longest wait between reconnect attempts: short enough to resume soon after a broker restart.
pub const RECONNECT_MAX: Duration = Duration::from_secs(10);
/// How long a session must have run before its end resets the backoff to [`RECONNECT_MIN`]: a
/// session that fails soon after it connected (a database without the schema, a queue it may
/// not use) keeps backing off instead of reconnecting several times a second.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// How long one node may take to answer the AMQP handshake before the next node of `AMQP_URL` is
/// tried. A frozen node (SIGSTOP, a VM paused, a node stalled in GC) still accepts TCP
/// connections in its kernel but never answers; without a bound every reconnect waited on it for
/// as long as it stayed frozen, with the other nodes up. RabbitMQ gives a client the same 10 s
/// to complete the handshake (`handshake_timeout`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a node of `AMQP_URL` has to answer before the next one is tried beside it (each
/// still has [`CONNECT_TIMEOUT`]). A handshake takes milliseconds on a LAN and well under a
/// second with TLS across regions; after a session's node froze, a reconnect reaches a healthy
/// node this soon instead of after the frozen node's whole timeout.
pub const CONNECT_STAGGER: Duration = Duration::from_secs(2);

/// The heartbeat mailroom asks RabbitMQ for when `AMQP_URL` names none (`?heartbeat=N` in the
/// URL sets another; `0` turns it off where the server allows). A peer that stops answering
/// without closing anything (a partition, a frozen node or process) is noticed by both sides
/// after two missed beats: 20 s instead of the 120 s of RabbitMQ's default 60 s. So the
/// deliveries a cut-off worker holds go back to the queue, for the other workers, 100 s sooner,
/// and every wait on a dead connection ends as soon. RabbitMQ's guidance is 5 to 20 s.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// `url` with [`HEARTBEAT`] as its `heartbeat` parameter, unless it has one.
fn with_heartbeat(url: &url::Url) -> url::Url {
    let mut url = url.clone();
    if !url.query_pairs().any(|(key, _)| key == "heartbeat") {
        url.query_pairs_mut()
            .append_pair("heartbeat", &HEARTBEAT.as_secs().to_string());
    }
    url
}

/// The bare reconnect schedule: capped exponential with jitter, never giving up.
pub fn reconnect_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(RECONNECT_MIN)
        .with_max_delay(RECONNECT_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The reconnect schedule of a session loop: [`reconnect_backoff`], reset only by a session
/// that stayed up [`HEALTHY_AFTER`], not by every successful connect.
#[derive(Debug)]
pub struct Reconnect {
    backoff: backon::ExponentialBackoff,
    /// When the current session was established; `None` until it is.
    started: Option<Instant>,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect {
            backoff: reconnect_backoff(),
            started: None,
        }
    }
}

/// How the last session ended, for the log line and the next wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It never started: connecting (or setting it up) failed.
    NeverStarted,
    /// It started, and failed before it had been up [`HEALTHY_AFTER`].
    Soon,
    /// It had been up at least [`HEALTHY_AFTER`]: the backoff starts over.
    AfterHealthy,
}

impl Reconnect {
    /// The session is established (connected and set up).
    pub fn started(&mut self) {
        self.started_at(Instant::now());
    }

    /// The session ended with an error: how it ended, and the wait before the next attempt.
    pub fn next_wait(&mut self) -> (Ended, Duration) {
        self.next_wait_at(Instant::now())
    }

    fn started_at(&mut self, now: Instant) {
        self.started = Some(now);
    }

    fn next_wait_at(&mut self, now: Instant) -> (Ended, Duration) {
        let ended = match self.started.take() {
            None => Ended::NeverStarted,
            Some(at) if now.duration_since(at) < HEALTHY_AFTER => Ended::Soon,
            Some(_) => Ended::AfterHealthy,
        };
        if ended == Ended::AfterHealthy {
            self.backoff = reconnect_backoff();
        }
        (ended, self.backoff.next().unwrap_or(RECONNECT_MAX))
    }
}

/// Connects to a node of `urls`, naming the connection after `name` so operators see which
/// process it is in the management UI and `rabbitmqctl`. The nodes are tried in their order,
/// staggered: the next one starts when the previous refused, or after [`CONNECT_STAGGER`]
/// without an answer, and the first handshake to complete wins (a later answer is closed).
/// Each node has [`CONNECT_TIMEOUT`]. When every node failed, the error is that of the last
/// node, as [`refusal`] tells it.
pub async fn connect(urls: &UrlList, name: &str) -> anyhow::Result<Connection> {
    use futures_util::stream::{FuturesUnordered, StreamExt};

    let nodes = &urls.0;
    let attempt = |i: usize| {
        let (url, name): (SecretUrl, String) = (nodes[i].clone(), name.into());
        async move { (i, connect_one(&url, &name).await) }
    };
    let mut pending = FuturesUnordered::new();
    let mut errors: Vec<Option<Fatal>> = nodes.iter().map(|_| None).collect();
    let mut next = 0;
    while next < nodes.len() || !pending.is_empty() {
        if pending.is_empty() {
            pending.push(attempt(next));
            next += 1;
        }
        tokio::select! {
            Some((i, result)) = pending.next() => match result {
                Ok(conn) => {
                    close_late_answers(pending);
                    return Ok(conn);
                }
                Err(refused) => {
                    if nodes.len() > 1 {
                        tracing::warn!(error = %refused, "RabbitMQ node unavailable; trying the next");
                    }
                    errors[i] = Some(refused);
                    if next < nodes.len() {
                        pending.push(attempt(next));
                        next += 1;
                    }
                }
            },
            () = tokio::time::sleep(CONNECT_STAGGER), if next < nodes.len() => {
                tracing::info!(
                    "RabbitMQ at {} has not answered in {CONNECT_STAGGER:?}; trying the next node as well",
                    address(&nodes[next - 1])
                );
                pending.push(attempt(next));
                next += 1;
            }
        }
    }
    let last = errors.into_iter().rev().flatten().next();
    Err(last.map_or_else(|| anyhow::anyhow!("no AMQP_URL given"), anyhow::Error::from))
}

/// One node's handshake, bounded by [`CONNECT_TIMEOUT`].
async fn connect_one(url: &SecretUrl, name: &str) -> Result<Connection, Fatal> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    let uri = with_heartbeat(url.url());
    match tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(uri.as_str(), props)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(refusal(url, &e)),
        Err(_) => Err(Fatal::Unavailable(format!(
            "connecting to RabbitMQ at {}: no answer to the AMQP handshake within {CONNECT_TIMEOUT:?}",
            address(url)
        ))),
    }
}

/// Lets the handshakes still under way finish in the background and closes those that
/// complete: a connection nobody holds would otherwise stay open on its node.
fn close_late_answers<F>(pending: futures_util::stream::FuturesUnordered<F>)
where
    F: std::future::Future<Output = (usize, Result<Connection, Fatal>)> + Send + 'static,
{
    use futures_util::StreamExt;
    if pending.is_empty() {
        return;
    }
    tokio::spawn(async move {
        let mut pending = pending;
        while let Some((_, result)) = pending.next().await {
            if let Ok(conn) = result {
                let _ = conn.close(200, "another node answered first".into()).await;
            }
        }
    });
}

/// `host:port` of an AMQP URL, with the scheme's default port.
fn address(url: &SecretUrl) -> String {
    let u = url.url();
    let default = if u.scheme() == "amqps" { 5671 } else { 5672 };
    format!(
        "{}:{}",
        u.host_str().unwrap_or("localhost"),
        u.port().unwrap_or(default)
    )
}

/// What a failed connection to `url` means, as one sentence with its fix: a refused login or
/// virtual host is the configuration's fault, anything else an unavailable broker.
pub fn refusal(url: &SecretUrl, e: &lapin::Error) -> Fatal {
    let addr = address(url);
    let user = match url.url().username() {
        "" => "guest",
        user => user,
    };
    let vhost = url.url().path().trim_start_matches('/');
    match e.kind() {
        ErrorKind::IOError(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Fatal::Unavailable(format!(
                "connecting to RabbitMQ at {addr}: connection refused: is it running, and is the port in AMQP_URL right?"
            ))
        }
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => Fatal::Config(format!(
                "RabbitMQ at {addr} refused the login for user {user}: check AMQP_URL's user and password"
            )),
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) => Fatal::Config(format!(
                "RabbitMQ at {addr} refused user {user} the virtual host {vhost:?}: check the vhost in AMQP_URL (%2f is the default `/`) and the user's permissions"
            )),
            _ => Fatal::Unavailable(format!(
                "connecting to RabbitMQ at {addr}: {}",
                amqp.get_message()
            )),
        },
        _ if url.scheme() == "amqps" => Fatal::Unavailable(format!(
            "connecting to RabbitMQ at {addr} over TLS: {e}: check that the port speaks TLS (5671) and that its certificate names {addr}"
        )),
        _ => Fatal::Unavailable(format!("connecting to RabbitMQ at {addr}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_a_heartbeat_asks_for_mailrooms_and_one_with_keeps_its_own() {
        let uri = |s: &str| {
            let url = url::Url::parse(s).unwrap();
            let uri: lapin::uri::AMQPUri = with_heartbeat(&url).as_str().parse().unwrap();
            (
                uri.query.heartbeat,
                uri.vhost,
                uri.authority.userinfo.password,
            )
        };
        let (beat, vhost, password) = uri("amqp://u:p%40ss@host:5672/%2f");
        assert_eq!(beat, Some(10));
        assert_eq!(vhost, "/");
        assert_eq!(password, "p@ss");
        assert_eq!(uri("amqps://host/v?heartbeat=30").0, Some(30));
        assert_eq!(uri("amqp://host/v?heartbeat=0").0, Some(0));
        let (beat, vhost, _) = uri("amqp://host/mail?frame_max=8192");
        assert_eq!((beat, vhost.as_str()), (Some(10), "mail"));
    }

    #[test]
    fn a_session_that_fails_soon_keeps_backing_off() {
        let mut reconnect = Reconnect::default();
        let mut waits = Vec::new();
        let mut now = Instant::now();
        for _ in 0..5 {
            reconnect.started_at(now);
            now += Duration::from_secs(1);
            let (ended, wait) = reconnect.next_wait_at(now);
            assert_eq!(ended, Ended::Soon);
            waits.push(wait);
        }
        // Doubling from 200 ms (jitter adds up to one delay on top): the fifth wait is at
        // least 16 × 200 ms, where a reset after each connect would stay below 400 ms.
        assert!(waits[4] >= RECONNECT_MIN * 16, "{waits:?}");
    }

    #[test]
    fn a_session_healthy_for_a_while_starts_the_backoff_over() {
        let mut reconnect = Reconnect::default();
        for _ in 0..6 {
            reconnect.next_wait();
        }
        let now = Instant::now();
        reconnect.started_at(now);
        let (ended, wait) = reconnect.next_wait_at(now + HEALTHY_AFTER);
        assert_eq!(ended, Ended::AfterHealthy);
        assert!(wait < RECONNECT_MIN * 2, "{wait:?}");
    }

    #[test]
    fn a_session_that_never_started_says_so() {
        let mut reconnect = Reconnect::default();
        assert_eq!(reconnect.next_wait().0, Ended::NeverStarted);
    }

    #[test]
    fn a_refused_port_names_the_address() {
        let url: SecretUrl = "amqp://guest:guest@127.0.0.1:5673/%2f".parse().unwrap();
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = lapin::Error::from(io);
        let fatal = refusal(&url, &e);
        assert!(matches!(fatal, Fatal::Unavailable(_)));
        assert!(
            fatal
                .to_string()
                .starts_with("connecting to RabbitMQ at 127.0.0.1:5673: connection refused"),
            "{fatal}"
        );
    }
}
