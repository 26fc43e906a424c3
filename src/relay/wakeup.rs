//! What wakes an idle relay, besides its own probes and an in-process enqueue:
//! - **wal** (PostgreSQL): the write-ahead log, streamed from a temporary logical slot
//!   ([`super::wal`]); producers' commits carry no trigger;
//! - **notify** (PostgreSQL, where the WAL cannot be followed): `LISTEN` on the outbox
//!   channel, notified by the outbox trigger while it is enabled (the migrations disable it
//!   where the WAL can be followed);
//! - **binlog** (MySQL/MariaDB): the binary log, followed as a replica ([`super::binlog`]);
//! - **poll**: nothing; the relay's probes back off up to `poll_max`.
//!
//! Each session opens the best source the server allows (or the one `--relay-wakeup` names)
//! and says in one log line which one runs and why not a better one.
//!
//! Every source is a hint: the claim is the same `SKIP LOCKED` scan whatever woke it, and a
//! source that loses its connection asks for one rescan once it is back ([`Woken::Resumed`]).
//! While a source runs, an idle relay probes only every `poll_interval` (a missed wake-up
//! costs that much latency, never a row); without one, every `poll_max`.
//! The source is opened before the session's first scan, so nothing committed in between is
//! missed.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;

use super::RelaySettings;
use super::binlog::{self, Unavailable};
use super::follower::Follower;
use super::wal;
use crate::db::Database;
use crate::db::outbox;

/// Which source wakes the relay, as `/metrics` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WakeupMode {
    Poll = 0,
    Notify = 1,
    Binlog = 2,
    Wal = 3,
}

impl WakeupMode {
    pub const ALL: [WakeupMode; 4] = [
        WakeupMode::Wal,
        WakeupMode::Binlog,
        WakeupMode::Notify,
        WakeupMode::Poll,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WakeupMode::Poll => "poll",
            WakeupMode::Notify => "notify",
            WakeupMode::Binlog => "binlog",
            WakeupMode::Wal => "wal",
        }
    }

    pub(super) fn from_u8(n: u8) -> WakeupMode {
        match n {
            1 => WakeupMode::Notify,
            2 => WakeupMode::Binlog,
            3 => WakeupMode::Wal,
            _ => WakeupMode::Poll,
        }
    }
}

/// The best wake-up a relay may use (`--relay-wakeup`); it falls back from there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WakeupChoice {
    /// The best the server allows: the WAL or the binary log, then NOTIFY, then polling.
    #[default]
    Auto,
    /// PostgreSQL: NOTIFY (then polling), never the WAL. MySQL/MariaDB: polling.
    Notify,
    /// Probes only.
    Poll,
}

/// Why a source woke the relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken {
    /// Rows were committed.
    Event,
    /// The source reconnected: wake-ups may have been lost, rescan once.
    Resumed,
}

/// The session's wake-up source.
pub(super) enum Wakeup {
    Notify(Box<PgListener>),
    Binlog(Follower),
    Wal(Follower),
    Poll,
}

impl Wakeup {
    /// Opens the engine's source. On MySQL/MariaDB a server or user that cannot follow the
    /// binary log falls back to polling, saying why and what to set or grant; a server that
    /// cannot be reached (down, restarting) is an error, so the session is retried and follows
    /// the log again once the server is back. A WAL or binary log stream keeps `paused` to
    /// whether it is paused ([`super::RelayStats::wakeup_paused`]).
    pub async fn open(
        db: &Database,
        settings: &RelaySettings,
        paused: &Arc<AtomicBool>,
    ) -> anyhow::Result<Wakeup> {
        if settings.wakeup == WakeupChoice::Poll {
            tracing::info!(poll_max = ?settings.poll_max, "relay wake-up: polling the outbox (--relay-wakeup poll)");
            return Ok(Wakeup::Poll);
        }
        match db {
            Database::Postgres(pool) => open_postgres(pool, settings, paused).await,
            Database::MySql(_) => {
                let Some(url) = settings
                    .database_url
                    .as_ref()
                    .filter(|_| settings.wakeup == WakeupChoice::Auto)
                else {
                    return Ok(Wakeup::Poll);
                };
                match binlog::start(url, settings.stream_pause_above, paused.clone()).await {
                    Ok(follower) => Ok(Wakeup::Binlog(follower)),
                    Err(why @ Unavailable::Unreachable(_)) => Err(why.into()),
                    Err(why) => {
                        log_fallback(&why, settings.poll_max);
                        Ok(Wakeup::Poll)
                    }
                }
            }
        }
    }

    pub fn mode(&self) -> WakeupMode {
        match self {
            Wakeup::Notify(_) => WakeupMode::Notify,
            Wakeup::Binlog(_) => WakeupMode::Binlog,
            Wakeup::Wal(_) => WakeupMode::Wal,
            Wakeup::Poll => WakeupMode::Poll,
        }
    }

    /// The longest wait between probes of an idle outbox: long while a source is connected,
    /// `poll_min` while its stream is paused because rows come faster than it pays.
    pub fn ceiling(&self, settings: &RelaySettings) -> Duration {
        if self.paused() {
            return settings.poll_min;
        }
        match self {
            Wakeup::Notify(_) => settings.poll_interval,
            Wakeup::Binlog(follower) if follower.live() => settings.poll_interval,
            Wakeup::Wal(follower) if follower.live() => settings.poll_interval,
            Wakeup::Binlog(_) | Wakeup::Wal(_) | Wakeup::Poll => settings.poll_max,
        }
    }

    /// Whether the source is paused: the WAL or binary log stream, closed while outbox rows
    /// come faster than it pays ([`super::follower::PAUSE_ABOVE`]).
    pub fn paused(&self) -> bool {
        matches!(self, Wakeup::Wal(f) | Wakeup::Binlog(f) if f.paused())
    }

    /// What a probe of the idle outbox found: empty probes in a row reopen a paused stream.
    pub fn probed(&mut self, found: bool) {
        if let Wakeup::Wal(follower) | Wakeup::Binlog(follower) = self {
            follower.probed(found);
        }
    }

    /// The next wake-up (buffered ones coalesced); never, when polling. Cancel-safe.
    pub async fn next(&mut self) -> anyhow::Result<Woken> {
        match self {
            Wakeup::Notify(listener) => {
                let note = listener.try_recv().await?;
                while listener.next_buffered().is_some() {}
                Ok(if note.is_some() {
                    Woken::Event
                } else {
                    Woken::Resumed
                })
            }
            Wakeup::Binlog(follower) => follower.next().await,
            Wakeup::Wal(follower) => follower.next().await,
            Wakeup::Poll => std::future::pending().await,
        }
    }

    /// Closes the source's connection.
    pub async fn close(self) {
        match self {
            Wakeup::Notify(listener) => drop(listener),
            Wakeup::Binlog(follower) => follower.close().await,
            Wakeup::Wal(follower) => follower.close().await,
            Wakeup::Poll => {}
        }
    }
}

fn log_fallback(why: &Unavailable, poll_max: Duration) {
    let hint = match why {
        Unavailable::Failed(_) | Unavailable::Unreachable(_) => "",
        _ => " (docs/OPERATING.md: \"Waking the relay on MySQL/MariaDB\")",
    };
    tracing::warn!(
        poll_max = ?poll_max,
        "relay wake-up: polling the outbox, not following the binary log: {why}{hint}"
    );
}

/// PostgreSQL: the WAL, else NOTIFY while the outbox trigger is enabled, else polling; one log
/// line says which and why. A server that cannot be reached is an error (the session is
/// retried), not a reason to settle for less.
async fn open_postgres(
    pool: &PgPool,
    settings: &RelaySettings,
    paused: &Arc<AtomicBool>,
) -> anyhow::Result<Wakeup> {
    let why_not_wal = match (&settings.database_url, settings.wakeup) {
        (Some(url), WakeupChoice::Auto) => {
            match wal::start(pool, url, settings.stream_pause_above, paused.clone()).await {
                Ok(follower) => {
                    log_wal_with_trigger(pool).await;
                    return Ok(Wakeup::Wal(follower));
                }
                Err(why @ wal::Unavailable::Unreachable(_)) => return Err(why.into()),
                Err(why) => why.to_string(),
            }
        }
        (None, _) => "no database URL to stream with".to_string(),
        (_, choice) => format!("--relay-wakeup {}", choice_name(choice)),
    };
    if !trigger_enabled(pool).await? {
        tracing::warn!(
            poll_max = ?settings.poll_max,
            "relay wake-up: polling the outbox: not following the WAL ({why_not_wal}), and the \
             outbox trigger that would NOTIFY is disabled (ALTER TABLE mailroom_outbox ENABLE \
             TRIGGER mailroom_outbox_notify) (docs/OPERATING.md: \"Waking the relay on PostgreSQL\")"
        );
        return Ok(Wakeup::Poll);
    }
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(outbox::NOTIFY_CHANNEL).await?;
    tracing::info!("relay wake-up: NOTIFY from the outbox trigger, not the WAL: {why_not_wal}");
    Ok(Wakeup::Notify(Box::new(listener)))
}

fn choice_name(choice: WakeupChoice) -> &'static str {
    match choice {
        WakeupChoice::Auto => "auto",
        WakeupChoice::Notify => "notify",
        WakeupChoice::Poll => "poll",
    }
}

/// Whether the outbox trigger that NOTIFYs is there and enabled.
async fn trigger_enabled(pool: &PgPool) -> anyhow::Result<bool> {
    let state: Option<String> = sqlx::query_scalar(
        "SELECT tgenabled::text FROM pg_trigger
         WHERE tgrelid = 'mailroom_outbox'::regclass AND tgname = 'mailroom_outbox_notify'",
    )
    .fetch_optional(pool)
    .await?;
    Ok(state.is_some_and(|s| s != "D"))
}

/// The WAL runs; a trigger still enabled costs producers a NOTIFY check this relay does not
/// need (other relays that cannot follow the WAL may: the relay leaves it alone).
async fn log_wal_with_trigger(pool: &PgPool) {
    if trigger_enabled(pool).await.unwrap_or(false) {
        tracing::info!(
            "relay wake-up: the WAL (a temporary logical slot); the outbox trigger is still \
             enabled: once every relay follows the WAL, ALTER TABLE mailroom_outbox DISABLE \
             TRIGGER mailroom_outbox_notify spares producers its cost"
        );
    } else {
        tracing::info!("relay wake-up: the WAL (a temporary logical slot); no outbox trigger");
    }
}
