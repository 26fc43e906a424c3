//! MySQL/MariaDB: the binary log as the relay's wake-up. The relay registers as a replica (a
//! random `server_id` in a high range, so several relays and real replicas never collide) and
//! follows the binary log from the server's current position. A committed transaction that
//! inserted into `mailroom_outbox` (a write-rows event on the table, followed by its commit)
//! wakes the relay; nothing else is read from the rows. The claim stays the `SKIP LOCKED`
//! query, so no row depends on the stream: after a lost connection the follower resumes from
//! the server's *current* position and asks the relay for one rescan, which finds anything
//! committed in between. An idle stream costs no round trip; the server sends a heartbeat every
//! [`HEARTBEAT`] while nothing is written, so a connection that died silently is noticed.
//!
//! The stream is a wake-up for a relay that waits, and it is not free: the server's dump
//! thread reads and sends every event of the binary log, every table's, on the cores the
//! producers commit on. So when outbox commits come faster than `--relay-stream-pause-above`
//! ([`super::follower::PAUSE_ABOVE`] a second) the relay closes it and probes the outbox every
//! `poll_min`, which then finds rows nearly every time; once the outbox has been quiet for a
//! few probes it opens the stream again at the current position ([`follow`]).
//!
//! What it needs (checked at startup, see [`Unavailable`]): the binary log on, in `ROW`
//! format, and the privileges `REPLICATION SLAVE` plus `REPLICATION CLIENT` (MySQL) or
//! `BINLOG MONITOR` (MariaDB 10.5+). Without them the relay polls, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, OptsBuilder, SslOpts};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

use crate::config::SecretUrl;

use super::follower::{CommitRate, Ended, Feed, Follower, reopen};
use super::wakeup::Woken;

/// The table whose inserts wake the relay.
const OUTBOX_TABLE: &str = "mailroom_outbox";
/// How often the server sends a heartbeat over an idle stream.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// A stream silent this long (no event, no heartbeat) is taken for dead and reopened.
const SILENCE_LIMIT: Duration = Duration::from_secs(45);
/// The longest wait for the server to accept the dump and send its first event.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Replica ids are drawn from [BASE, BASE + SPAN): above the small ids people give servers.
const SERVER_ID_BASE: u32 = 0x4000_0000;
const SERVER_ID_SPAN: u32 = 0x3fff_ffff;

/// Why the binary log cannot wake the relay: the server's setting or the user's privileges.
/// The message says what to set or grant.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("the binary log is off (set log_bin and binlog_format=ROW on the server)")]
    Off,
    #[error(
        "binlog_format is {0}, not ROW (set binlog_format=ROW; only row events name the table)"
    )]
    NotRow(String),
    #[error(
        "the database user may not {action} ({cause}); grant {grant} to it (MariaDB: {mariadb})"
    )]
    Privilege {
        action: &'static str,
        grant: &'static str,
        mariadb: &'static str,
        cause: String,
    },
    #[error("cannot follow the binary log: {0}")]
    Failed(String),
    /// The server could not be reached (down, restarting): not a reason to stop following
    /// the log, but to retry the session like any lost connection.
    #[error("cannot reach the database to follow the binary log: {0}")]
    Unreachable(String),
}

/// An error of the binary log connection: unreachable (I/O) or a failure of the setup.
fn failed(e: mysql_async::Error) -> Unavailable {
    match e {
        // A TLS failure is the setup's (a server without TLS, a certificate), not the network's.
        mysql_async::Error::Io(e @ mysql_async::IoError::Io(_)) => {
            Unavailable::Unreachable(e.to_string())
        }
        e => Unavailable::Failed(e.to_string()),
    }
}

/// Where and how to connect: the relay's database URL, read as the pool reads it.
#[derive(Clone)]
struct Source {
    opts: Opts,
    server_id: u32,
}

/// Checks the server's settings and the user's privileges, opens the stream at the current
/// position and starts following it. Anything committed before this returns is the first
/// scan's to find. Outbox commits faster than `pause_above` a second pause the stream (0:
/// never), and the stream keeps `paused` to whether it is.
pub(super) async fn start(
    url: &SecretUrl,
    pause_above: u32,
    paused: Arc<AtomicBool>,
) -> Result<Follower, Unavailable> {
    let source = Source::new(url)?;
    let (stream, schema) = source.open().await?;
    let server_id = source.server_id;
    let follower = Follower::spawn("the binary log", paused, |feed| {
        let writes = OutboxWrites::new(schema);
        follow(source, stream, writes, CommitRate::new(pause_above), feed)
    });
    tracing::info!(server_id, "following the binary log for outbox inserts");
    Ok(follower)
}

impl Source {
    fn new(url: &SecretUrl) -> Result<Source, Unavailable> {
        let mut text = url.expose().to_string();
        if let Some(rest) = text.strip_prefix("mariadb:") {
            text = format!("mysql:{rest}");
        }
        let parsed: MySqlConnectOptions = text
            .parse()
            .map_err(|e| Unavailable::Failed(format!("cannot read the database URL: {e}")))?;
        let password = url.url().password().map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        });
        let ssl = ssl_opts(parsed.get_ssl_mode(), url);
        let mut builder = OptsBuilder::default()
            .ip_or_hostname(parsed.get_host())
            .tcp_port(parsed.get_port())
            .user(Some(parsed.get_username()))
            .pass(password)
            .db_name(parsed.get_database())
            .prefer_socket(false)
            .ssl_opts(ssl);
        if let Some(socket) = parsed.get_socket() {
            builder = builder.socket(Some(socket.to_string_lossy()));
        }
        let server_id =
            SERVER_ID_BASE + (uuid::Uuid::new_v4().as_u128() % SERVER_ID_SPAN as u128) as u32;
        Ok(Source {
            opts: builder.into(),
            server_id,
        })
    }

    /// Connects, checks the setup and starts the dump at the current position; returns the
    /// stream and the schema whose outbox it watches.
    async fn open(&self) -> Result<(BinlogStream, String), Unavailable> {
        let mut conn = Conn::new(self.opts.clone()).await.map_err(failed)?;
        let (log_bin, format, schema): (i64, String, Option<String>) = conn
            .query_first("SELECT @@GLOBAL.log_bin, @@GLOBAL.binlog_format, DATABASE()")
            .await
            .map_err(failed)?
            .ok_or_else(|| Unavailable::Failed("no answer to the settings query".into()))?;
        if log_bin == 0 {
            return Err(Unavailable::Off);
        }
        if !format.eq_ignore_ascii_case("ROW") {
            return Err(Unavailable::NotRow(format));
        }
        let schema = schema
            .ok_or_else(|| Unavailable::Failed("the database URL names no database".into()))?;
        let (file, position) = current_position(&mut conn).await?;
        let heartbeat = format!("SET @master_heartbeat_period = {}", HEARTBEAT.as_nanos());
        conn.query_drop(heartbeat).await.map_err(failed)?;
        let request = BinlogStreamRequest::new(self.server_id)
            .with_filename(file.as_bytes())
            .with_pos(position);
        let mut stream = conn
            .get_binlog_stream(request)
            .await
            .map_err(dump_refused)?;
        // The server answers the dump with a rotate event, or with the refusal.
        match tokio::time::timeout(OPEN_TIMEOUT, stream.next()).await {
            Ok(Some(Ok(_))) => Ok((stream, schema)),
            Ok(Some(Err(e))) => Err(dump_refused(e)),
            Ok(None) => Err(Unavailable::Failed(
                "the server ended the dump at once".into(),
            )),
            Err(_) => Err(Unavailable::Failed(format!(
                "no answer to the dump within {OPEN_TIMEOUT:?}"
            ))),
        }
    }
}

/// The server's current binary log file and position (MySQL 8.2+ and MariaDB spell the
/// statement differently; the old spelling works on both up to MySQL 8.4).
async fn current_position(conn: &mut Conn) -> Result<(String, u64), Unavailable> {
    let mut last = None;
    for statement in ["SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"] {
        match conn.query_first::<mysql_async::Row, _>(statement).await {
            Ok(Some(row)) => {
                let file: Option<String> = row.get(0);
                let position: Option<u64> = row.get(1);
                if let (Some(file), Some(position)) = (file, position) {
                    return Ok((file, position));
                }
                return Err(Unavailable::Off);
            }
            Ok(None) => return Err(Unavailable::Off),
            Err(mysql_async::Error::Server(e)) if e.code == ER_PARSE_ERROR => last = Some(e),
            Err(mysql_async::Error::Server(e)) if is_denied(e.code) => {
                return Err(Unavailable::Privilege {
                    action: "read the binary log position",
                    grant: "REPLICATION CLIENT",
                    mariadb: "BINLOG MONITOR",
                    cause: e.to_string(),
                });
            }
            Err(e) => return Err(failed(e)),
        }
    }
    Err(Unavailable::Failed(format!(
        "neither SHOW BINARY LOG STATUS nor SHOW MASTER STATUS: {last:?}"
    )))
}

const ER_PARSE_ERROR: u16 = 1064;

/// Access denied: 1045 (user), 1142/1143 (table/column), 1227 (a global privilege).
fn is_denied(code: u16) -> bool {
    matches!(code, 1045 | 1142 | 1143 | 1227)
}

fn dump_refused(e: mysql_async::Error) -> Unavailable {
    match &e {
        mysql_async::Error::Server(s) if is_denied(s.code) => Unavailable::Privilege {
            action: "read the binary log as a replica",
            grant: "REPLICATION SLAVE",
            mariadb: "REPLICATION SLAVE",
            cause: s.to_string(),
        },
        _ => failed(e),
    }
}

/// TLS as the pool's `ssl-mode` asks: verified for `verify_ca`/`verify_identity` (with the
/// URL's `ssl-ca`), unverified for `required`, and for the default `preferred` unless the
/// server is on loopback; none when disabled.
fn ssl_opts(mode: MySqlSslMode, url: &SecretUrl) -> Option<SslOpts> {
    let ca = url
        .url()
        .query_pairs()
        .find(|(k, _)| k == "ssl-ca" || k == "ssl_ca")
        .map(|(_, v)| std::path::PathBuf::from(v.as_ref()).into());
    let opts = SslOpts::default().with_root_certs(ca.into_iter().collect());
    match mode {
        MySqlSslMode::Disabled => None,
        // The stream carries every table's changes on the server, not only mailroom's: off
        // the machine it is encrypted (as the pool's `preferred` encrypts when it can), and a
        // server without TLS is not followed (the relay polls) unless TLS is disabled by name.
        MySqlSslMode::Preferred => {
            let host = url.url().host_str().unwrap_or("localhost");
            (!crate::config::is_loopback(host)).then(|| opts.with_danger_accept_invalid_certs(true))
        }
        MySqlSslMode::Required => Some(opts.with_danger_accept_invalid_certs(true)),
        MySqlSslMode::VerifyCa => Some(opts.with_danger_skip_domain_validation(true)),
        MySqlSslMode::VerifyIdentity => Some(opts),
    }
}

/// Reads the stream until `stop`, waking the relay after each committed outbox insert, and
/// reopens it at the current position (then asks for one rescan) when it is lost.
///
/// When outbox commits come faster than `rate`'s threshold the stream is closed and the relay
/// probes at its fastest until [`super::follower::QUIET_PROBES`] empty probes in a row; the
/// stream is then opened again at the current position, and the next probe finds whatever was
/// committed in between. No row depends on the stream in either state.
async fn follow(
    source: Source,
    mut stream: BinlogStream,
    mut writes: OutboxWrites,
    rate: CommitRate,
    feed: Feed,
) {
    let Feed {
        tx: woken,
        live,
        stop,
        ..
    } = &feed;
    loop {
        let mut rate = rate.restart();
        let ended = loop {
            let next = tokio::select! {
                _ = stop.cancelled() => {
                    let _ = tokio::time::timeout(OPEN_TIMEOUT, stream.close()).await;
                    return;
                }
                next = tokio::time::timeout(SILENCE_LIMIT, stream.next()) => next,
            };
            match next {
                Ok(Some(Ok(event))) => {
                    if writes.on_event(&stream, &event) {
                        let _ = woken.try_send(Woken::Event);
                        if rate.commit(Instant::now()) {
                            break Ended::Busy;
                        }
                    }
                }
                Ok(Some(Err(e))) => break Ended::Lost(e.to_string()),
                Ok(None) => break Ended::Lost("the server ended the stream".to_string()),
                Err(_) => {
                    let silence = format!("nothing, not even a heartbeat, for {SILENCE_LIMIT:?}");
                    break Ended::Lost(silence);
                }
            }
        };
        let lost = match ended {
            Ended::Busy => {
                let close = async {
                    let _ = tokio::time::timeout(OPEN_TIMEOUT, stream.close()).await;
                };
                let stream_name = "the binary log stream";
                let pause = feed.pause(stream_name, rate.pause_above, close, source.open());
                match pause.await {
                    None => return,
                    Some(Ok((opened, _))) => {
                        stream = opened;
                        writes.reset();
                        continue;
                    }
                    Some(Err(cause)) => cause,
                }
            }
            Ended::Lost(cause) => cause,
        };
        live.store(false, Ordering::Relaxed);
        tracing::warn!(
            cause = lost,
            "binary log stream lost; reopening it at the current position"
        );
        let Some((reopened, _)) = reopen("the binary log stream", stop, || source.open()).await
        else {
            return;
        };
        stream = reopened;
        writes.reset();
        live.store(true, Ordering::Relaxed);
        tracing::info!("binary log stream reopened; rescanning the outbox");
        let _ = woken.try_send(Woken::Resumed);
    }
}

/// Which events mean "a transaction that inserted outbox rows has committed": a write-rows
/// event on the outbox table arms it, and the next event that is not a table map or a rows
/// event (the commit's XID, a `COMMIT` query, the next transaction's GTID, a rotation) fires.
/// Waking at the commit rather than at the rows gives InnoDB the moment it needs to make the
/// rows visible; if a probe still misses them, the relay probes again `poll_min` later.
pub(super) struct OutboxWrites {
    schema: String,
    armed: bool,
}

/// Binary log event type codes (MySQL's and MariaDB's).
mod event {
    pub const TABLE_MAP: u8 = 0x13;
    /// Write, update and delete rows events, v0 (pre-GA) to v2, and MySQL's partial update.
    pub const ROWS: [u8; 10] = [0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1e, 0x1f, 0x20, 0x27];
    /// Write rows: v1, v2 and MariaDB's compressed v1 and v2.
    pub const WRITE_ROWS: [u8; 4] = [0x17, 0x1e, 0xa6, 0xa9];
    /// MariaDB's compressed update and delete rows events.
    pub const MARIADB_COMPRESSED_ROWS: [u8; 4] = [0xa7, 0xa8, 0xaa, 0xab];
    /// MySQL's rows query and MariaDB's annotate rows events, written inside a transaction.
    pub const ANNOTATIONS: [u8; 2] = [0x1d, 0xa0];
}

impl OutboxWrites {
    pub fn new(schema: String) -> OutboxWrites {
        OutboxWrites {
            schema,
            armed: false,
        }
    }

    fn reset(&mut self) {
        self.armed = false;
    }

    fn on_event(
        &mut self,
        stream: &BinlogStream,
        event: &mysql_async::binlog::events::Event,
    ) -> bool {
        let kind = event.header().event_type_raw();
        let outbox = if event::WRITE_ROWS.contains(&kind) {
            table_id(event.data())
                .and_then(|id| stream.get_tme(id))
                .is_some_and(|map| self.is_outbox(&map.database_name(), &map.table_name()))
        } else {
            false
        };
        self.step(kind, outbox)
    }

    fn is_outbox(&self, schema: &str, table: &str) -> bool {
        table.eq_ignore_ascii_case(OUTBOX_TABLE) && schema.eq_ignore_ascii_case(&self.schema)
    }

    /// One event of type `kind` (`outbox`: it writes rows into the outbox); true: wake now.
    pub fn step(&mut self, kind: u8, outbox: bool) -> bool {
        if event::WRITE_ROWS.contains(&kind) {
            self.armed |= outbox;
            return false;
        }
        let in_transaction = kind == event::TABLE_MAP
            || event::ROWS.contains(&kind)
            || event::MARIADB_COMPRESSED_ROWS.contains(&kind)
            || event::ANNOTATIONS.contains(&kind);
        if in_transaction {
            return false;
        }
        std::mem::take(&mut self.armed)
    }
}

/// The table id at the start of a rows event's post-header: six bytes, little-endian.
pub(super) fn table_id(data: &[u8]) -> Option<u64> {
    let bytes = data.get(..6)?;
    let mut id = [0u8; 8];
    id[..6].copy_from_slice(bytes);
    Some(u64::from_le_bytes(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls_for(url: &str) -> bool {
        let url: SecretUrl = url.parse().unwrap();
        let mode = url
            .expose()
            .parse::<MySqlConnectOptions>()
            .unwrap()
            .get_ssl_mode();
        ssl_opts(mode, &url).is_some()
    }

    #[test]
    fn the_stream_is_encrypted_off_the_machine_unless_tls_is_disabled_by_name() {
        assert!(tls_for("mysql://u:p@db.internal:3306/mailroom"));
        assert!(tls_for("mysql://u:p@10.0.0.5/mailroom?ssl-mode=required"));
        assert!(!tls_for("mysql://u:p@127.0.0.1:3306/mailroom"));
        assert!(!tls_for("mysql://u:p@localhost/mailroom"));
        assert!(!tls_for(
            "mysql://u:p@db.internal/mailroom?ssl-mode=disabled"
        ));
    }

    const XID: u8 = 0x10;
    const QUERY: u8 = 0x02;
    const WRITE_V2: u8 = 0x1e;
    const UPDATE_V2: u8 = 0x1f;

    #[test]
    fn an_outbox_insert_wakes_the_relay_at_its_commit_not_before() {
        let mut w = OutboxWrites::new("mailroom".into());
        assert!(!w.step(QUERY, false), "BEGIN");
        assert!(!w.step(event::TABLE_MAP, false));
        assert!(!w.step(WRITE_V2, true));
        assert!(!w.step(WRITE_V2, true), "more rows of the same insert");
        assert!(w.step(XID, false), "the commit wakes");
        assert!(!w.step(XID, false), "once");
    }

    #[test]
    fn other_tables_and_the_relays_own_updates_do_not_wake_it() {
        let mut w = OutboxWrites::new("mailroom".into());
        for kind in [QUERY, event::TABLE_MAP, WRITE_V2, UPDATE_V2, XID] {
            assert!(!w.step(kind, false));
        }
        assert!(!w.step(UPDATE_V2, false));
        assert!(!w.step(XID, false));
    }

    #[test]
    fn an_armed_insert_fires_on_whatever_ends_its_transaction() {
        let mut w = OutboxWrites::new("mailroom".into());
        assert!(!w.step(0xa9, true), "MariaDB's compressed write rows");
        assert!(!w.step(0xa0, false), "an annotation inside the transaction");
        assert!(w.step(0x04, false), "a rotation");
    }

    #[test]
    fn only_the_outbox_of_the_relays_own_schema_counts() {
        let w = OutboxWrites::new("mailroom".into());
        assert!(w.is_outbox("mailroom", "mailroom_outbox"));
        assert!(!w.is_outbox("other", "mailroom_outbox"));
        assert!(!w.is_outbox("mailroom", "mailroom_ledger"));
    }

    #[test]
    fn the_table_id_is_the_first_six_bytes_little_endian() {
        assert_eq!(table_id(&[0x2a, 1, 0, 0, 0, 0, 0xff, 0xff]), Some(0x12a));
        assert_eq!(table_id(&[1, 2, 3]), None);
    }
}
