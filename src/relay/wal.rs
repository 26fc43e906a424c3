//! PostgreSQL: the write-ahead log as the relay's wake-up, so producers' commits carry no
//! trigger. The relay opens a replication connection, creates a **temporary** logical slot on
//! it (`pgoutput`) and streams the publication [`PUBLICATION`]: inserts into `mailroom_outbox`,
//! the `id` column only (PostgreSQL 15+), so the stream carries no email. A committed
//! transaction that inserted outbox rows (a pgoutput insert followed by its commit) wakes the
//! relay; nothing else is read. The claim stays the `SKIP LOCKED` query, so no row depends on
//! the stream: after a lost connection the follower opens a new slot at the server's current
//! position and asks the relay for one rescan, which finds anything committed in between.
//!
//! The slot lives as long as the connection: when the relay stops, crashes or loses it, the
//! server drops the slot and retains nothing. While it runs, every position received is
//! confirmed at once, so the slot holds back no WAL either.
//!
//! The stream is a wake-up for a relay that waits, and it is not free: the server decodes
//! every transaction of the database for the slot, on the cores the producers commit on. So
//! when outbox commits come faster than `--relay-stream-pause-above` ([`PAUSE_ABOVE`] a second)
//! the relay closes it and probes the outbox every `poll_min`, which then finds rows nearly
//! every time; once the outbox has been quiet for a few probes it opens a new slot
//! ([`follow`]).
//!
//! What it needs (checked at startup, see [`Unavailable`]): `wal_level = logical`, a free
//! replication slot and WAL sender (`max_replication_slots`, `max_wal_senders`), a user with
//! the `REPLICATION` attribute (on Amazon RDS: a member of `rds_replication`) that
//! `pg_hba.conf` lets in for replication, and the publication
//! (the migrations create it). The stream is protected as the URL's `sslmode` and
//! `sslrootcert` say, like the relay's own pool ([`super::wal_tls`]); a server on this machine
//! is streamed from in the clear unless the URL requires TLS. Without any of these the relay
//! falls back to NOTIFY, then to polling ([`super::wakeup`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgwire_replication::{
    PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig,
};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::config::SecretUrl;

pub use super::follower::PAUSE_ABOVE;
use super::follower::{CommitRate, Ended, Feed, Follower, reopen};
use super::wakeup::Woken;
use super::wal_tls::{self, Policy};

/// The publication the relay streams: inserts into `mailroom_outbox` (a migration creates it).
pub const PUBLICATION: &str = "mailroom_outbox_wakeup";
/// The longest wait for the slot (it waits for transactions running at its creation) and for
/// the server to accept the stream.
pub(super) const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the position is confirmed to the server, also on an idle stream.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// Why the WAL cannot wake the relay: the server's setting, the user's role or the schema.
/// The message says what to set or grant.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("wal_level is {0}, not logical (set wal_level = logical on the server and restart it)")]
    NotLogical(String),
    #[error(
        "the database user {0:?} may not stream the WAL (ALTER ROLE {0} REPLICATION, and a \
         `replication` line for it in pg_hba.conf)"
    )]
    NoReplication(String),
    #[error(
        "the publication {PUBLICATION} is missing (run `mailroom migrate` as the outbox's owner)"
    )]
    NoPublication,
    /// The URL asks for TLS the stream cannot give (a client certificate).
    #[error("the WAL stream cannot use the database URL's TLS settings: {0}")]
    Tls(String),
    #[error("cannot follow the WAL: {0}")]
    Failed(String),
    /// The server could not be reached: retry the session like any lost connection.
    #[error("cannot reach the database to follow the WAL: {0}")]
    Unreachable(String),
}

fn failed(e: PgWireError) -> Unavailable {
    match e {
        PgWireError::Io(e) => Unavailable::Unreachable(e.to_string()),
        e => Unavailable::Failed(e.to_string()),
    }
}

/// Checks the server and the user, opens a slot and its stream, and starts following it.
/// Anything committed before this returns is the first scan's to find.
pub async fn start(
    pool: &PgPool,
    url: &SecretUrl,
    pause_above: u32,
    paused: Arc<AtomicBool>,
) -> Result<Follower, Unavailable> {
    let source = Source::new(url)?;
    preflight(pool).await?;
    let client = source.open().await?;
    Ok(Follower::spawn("the WAL", paused, |feed| {
        follow(source, client, CommitRate::new(pause_above), feed)
    }))
}

/// The server's setting, the user's role and the publication, read over the relay's pool.
async fn preflight(pool: &PgPool) -> Result<(), Unavailable> {
    let row: Result<(String, bool, bool, String), sqlx::Error> = sqlx::query_as(
        "SELECT current_setting('wal_level'),
                COALESCE((SELECT rolreplication OR rolsuper FROM pg_roles
                          WHERE rolname = current_user), false)
                OR EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication'
                           AND pg_has_role(current_user, oid, 'member')),
                EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
                current_user::text",
    )
    .bind(PUBLICATION)
    .fetch_one(pool)
    .await;
    let (level, replication, publication, user) = row.map_err(|e| match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => Unavailable::Unreachable(e.to_string()),
        e => Unavailable::Failed(e.to_string()),
    })?;
    if level != "logical" {
        return Err(Unavailable::NotLogical(level));
    }
    if !replication {
        return Err(Unavailable::NoReplication(user));
    }
    if !publication {
        return Err(Unavailable::NoPublication);
    }
    Ok(())
}

/// Where and how to connect: the relay's database URL, read as the pool reads it.
#[derive(Clone)]
struct Source {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    /// `None`: the stream is plain (`sslmode=disable`, a Unix socket, or a server on this
    /// machine that the URL does not require TLS of).
    tls: Option<Policy>,
    /// The stream's `application_name`: the pool's sessions' name, marked as the WAL stream.
    name: String,
}

impl Source {
    fn new(url: &SecretUrl) -> Result<Source, Unavailable> {
        let parsed: PgConnectOptions = url
            .expose()
            .parse()
            .map_err(|e| Unavailable::Failed(format!("cannot read the database URL: {e}")))?;
        let query = |key: &str| {
            url.url()
                .query_pairs()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        };
        if query("sslcert").is_some() || query("sslkey").is_some() {
            return Err(Unavailable::Tls(
                "client certificates (sslcert, sslkey) are not supported on it".into(),
            ));
        }
        let tls = match parsed.get_ssl_mode() {
            _ if parsed.get_socket().is_some() => None,
            PgSslMode::Allow | PgSslMode::Prefer
                if crate::config::is_loopback(parsed.get_host()) =>
            {
                None
            }
            mode => Policy::of(mode, query("sslrootcert").map(PathBuf::from)),
        };
        let password = url.url().password().map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        });
        let host = match parsed.get_socket() {
            Some(dir) => dir.to_string_lossy().into_owned(),
            None => parsed.get_host().to_string(),
        };
        Ok(Source {
            host,
            port: parsed.get_port(),
            user: parsed.get_username().to_string(),
            password: password.unwrap_or_default(),
            database: parsed.get_database().unwrap_or("postgres").to_string(),
            tls,
            name: format!(
                "{} (WAL wake-up)",
                crate::db::session_name(parsed.get_application_name())
            ),
        })
    }

    /// Connects, creates a temporary slot and starts streaming from it.
    async fn open(&self) -> Result<ReplicationClient, Unavailable> {
        let slot = slot_name();
        // With TLS the client connects to this process's end of the encrypted link.
        let (host, port) = match &self.tls {
            None => (self.host.clone(), self.port),
            Some(policy) => {
                let local = wal_tls::open(&self.host, self.port, policy).await?;
                (local.ip().to_string(), local.port())
            }
        };
        let config = ReplicationConfig::new(
            &host,
            &self.user,
            &self.password,
            &self.database,
            &slot,
            PUBLICATION,
        )
        .with_port(port)
        .with_tls(TlsConfig::disabled())
        .with_status_interval(STATUS_INTERVAL)
        .with_buffer_size(64)
        .with_application_name(&self.name);
        let opening = async {
            let mut client = ReplicationClient::connect_gated(config)
                .await
                .map_err(failed)?;
            let create = format!(
                "CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT"
            );
            client.simple_query(&create).await.map_err(refused)?;
            client.start().await.map_err(failed)?;
            client.wait_started().await.map_err(refused)?;
            Ok(client)
        };
        match tokio::time::timeout(OPEN_TIMEOUT, opening).await {
            Ok(opened) => opened,
            Err(_) => Err(Unavailable::Failed(format!(
                "no slot and stream within {OPEN_TIMEOUT:?} (a long transaction delays a new slot)"
            ))),
        }
    }
}

/// A server's refusal of the slot or the stream, with the usual cause named.
fn refused(e: PgWireError) -> Unavailable {
    match e {
        PgWireError::Server(m) if m.contains("replication slots are in use") => {
            Unavailable::Failed(format!("{m} (raise max_replication_slots)"))
        }
        e => failed(e),
    }
}

/// A slot name of its own per connection: several relays never share one.
fn slot_name() -> String {
    format!("mailroom_relay_{}", uuid::Uuid::new_v4().simple())
}

/// Reads the stream until `stop`, waking the relay after each committed outbox insert, and
/// reopens it (then asks for one rescan) when it is lost.
///
/// When outbox commits come faster than `rate`'s threshold ([`PAUSE_ABOVE`] a second by
/// default), the stream is closed: its slot made the server decode every transaction of the
/// database, a cost the producers' own commits shared the cores with, while a relay that busy
/// finds rows at every probe anyway.
/// The relay then probes at its fastest (see [`super::wakeup::Wakeup::ceiling`]) and reports
/// each probe ([`Follower::probed`]); after [`super::follower::QUIET_PROBES`] empty ones in a
/// row the stream is opened again at the server's current position, and one rescan finds
/// whatever was committed in between. No row depends on the stream in either state.
async fn follow(source: Source, mut client: ReplicationClient, rate: CommitRate, feed: Feed) {
    let Feed {
        tx: woken,
        live,
        stop,
        ..
    } = &feed;
    tracing::info!("following the WAL for outbox inserts (a temporary logical slot)");
    loop {
        let mut commits = OutboxCommits::default();
        let mut rate = rate.restart();
        let ended = loop {
            let event = tokio::select! {
                _ = stop.cancelled() => {
                    let _ = tokio::time::timeout(OPEN_TIMEOUT, client.shutdown()).await;
                    return;
                }
                event = client.recv() => event,
            };
            match event {
                Ok(Some(event)) => {
                    if commits.on_event(&client, &event) {
                        let _ = woken.try_send(Woken::Event);
                        if rate.commit(Instant::now()) {
                            break Ended::Busy;
                        }
                    }
                }
                Ok(None) => break Ended::Lost("the server ended the stream".to_string()),
                Err(e) => break Ended::Lost(e.to_string()),
            }
        };
        let lost = match ended {
            Ended::Busy => {
                let close = async {
                    let _ = tokio::time::timeout(OPEN_TIMEOUT, client.shutdown()).await;
                    client.abort();
                };
                let pause = feed.pause("the WAL stream", rate.pause_above, close, source.open());
                match pause.await {
                    None => return,
                    Some(Ok(opened)) => {
                        client = opened;
                        continue;
                    }
                    Some(Err(cause)) => cause,
                }
            }
            Ended::Lost(cause) => {
                client.abort();
                cause
            }
        };
        live.store(false, Ordering::Relaxed);
        tracing::warn!(cause = lost, "WAL stream lost; opening a new slot");
        let Some(reopened) = reopen("the WAL stream", stop, || source.open()).await else {
            return;
        };
        client = reopened;
        live.store(true, Ordering::Relaxed);
        tracing::info!("WAL stream reopened; rescanning the outbox");
        let _ = woken.try_send(Woken::Resumed);
    }
}

/// Which events mean "a transaction that inserted outbox rows has committed": a pgoutput
/// insert (the publication has no other table, no other operation) arms it, its commit fires.
/// Every position received is confirmed, so the slot retains nothing.
#[derive(Default)]
pub(super) struct OutboxCommits {
    armed: bool,
}

impl OutboxCommits {
    fn on_event(&mut self, client: &ReplicationClient, event: &ReplicationEvent) -> bool {
        match event {
            ReplicationEvent::KeepAlive { wal_end, .. } => client.update_applied_lsn(*wal_end),
            ReplicationEvent::Commit { end_lsn, .. } => client.update_applied_lsn(*end_lsn),
            _ => {}
        }
        self.step(Step::of(event))
    }

    /// One step of the stream; true: wake now.
    pub fn step(&mut self, step: Step) -> bool {
        match step {
            Step::Begin => {
                self.armed = false;
                false
            }
            Step::Insert => {
                self.armed = true;
                false
            }
            Step::Commit => std::mem::take(&mut self.armed),
            Step::Other => false,
        }
    }
}

/// What a stream event is, for [`OutboxCommits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    Begin,
    Insert,
    Commit,
    Other,
}

impl Step {
    fn of(event: &ReplicationEvent) -> Step {
        match event {
            ReplicationEvent::Begin { .. } => Step::Begin,
            ReplicationEvent::Commit { .. } => Step::Commit,
            // pgoutput's insert message starts with 'I'; relation ('R') and type messages do not.
            ReplicationEvent::XLogData { data, .. } if data.first() == Some(&b'I') => Step::Insert,
            _ => Step::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_insert_wakes_the_relay_at_its_commit_not_before() {
        let mut c = OutboxCommits::default();
        assert!(!c.step(Step::Begin));
        assert!(!c.step(Step::Other), "the relation message");
        assert!(!c.step(Step::Insert));
        assert!(!c.step(Step::Insert), "more rows of the same transaction");
        assert!(c.step(Step::Commit), "the commit wakes");
        assert!(!c.step(Step::Commit), "once");
    }

    #[test]
    fn a_transaction_without_outbox_inserts_does_not_wake_it() {
        let mut c = OutboxCommits::default();
        for step in [Step::Begin, Step::Other, Step::Commit] {
            assert!(!c.step(step));
        }
    }

    #[test]
    fn the_stream_is_encrypted_where_the_url_asks_for_tls_or_the_server_is_elsewhere() {
        let source = |url: &str| Source::new(&url.parse().unwrap()).unwrap();
        for encrypted in [
            "postgres://u:p@127.0.0.1/mailroom?sslmode=require",
            "postgres://u:p@db/mailroom",
            "postgres://u:p@db/mailroom?sslmode=prefer",
            "postgres://u:p@10.0.0.5/mailroom?sslmode=allow",
            "postgres://u:p@db/mailroom?sslmode=verify-full&sslrootcert=/ca.pem",
        ] {
            assert!(source(encrypted).tls.is_some(), "{encrypted}");
        }
        let ok = source("postgres://u:p%40ss@127.0.0.1:5433/mailroom");
        assert_eq!(
            (ok.host.as_str(), ok.port, ok.password.as_str()),
            ("127.0.0.1", 5433, "p@ss")
        );
        for plain in [
            "postgres://u:p@localhost/mailroom?sslmode=prefer",
            "postgres://u:p@[::1]/mailroom",
            "postgres://u:p@db/mailroom?sslmode=disable",
        ] {
            assert!(source(plain).tls.is_none(), "{plain}");
        }
        let with_cert =
            "postgres://u:p@db/mailroom?sslmode=verify-full&sslcert=/c.pem&sslkey=/k.pem";
        assert!(matches!(
            Source::new(&with_cert.parse().unwrap()),
            Err(Unavailable::Tls(_))
        ));
    }

    #[test]
    fn each_slot_has_a_name_of_its_own_that_postgres_accepts() {
        let (a, b) = (slot_name(), slot_name());
        assert_ne!(a, b);
        assert!(a.len() <= 63);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        );
    }
}
