//! What wakes an idle relay, besides its own probes and an in-process enqueue:
//! - **notify** (PostgreSQL): `LISTEN` on the outbox channel, notified by the outbox trigger;
//! - **binlog** (MySQL/MariaDB): the binary log, followed as a replica ([`super::binlog`]);
//! - **poll**: nothing; the relay's probes back off up to `poll_max`.
//!
//! Every source is a hint: the claim is the same `SKIP LOCKED` scan whatever woke it, and a
//! source that loses its connection asks for one rescan once it is back ([`Woken::Resumed`]).
//! While a source runs, an idle relay probes only every `poll_interval` (a missed wake-up
//! costs that much latency, never a row); without one, every `poll_max`.
//! The source is opened before the session's first scan, so nothing committed in between is
//! missed.

use std::time::Duration;

use sqlx::postgres::PgListener;

use super::RelaySettings;
use super::binlog::{Follower, Unavailable};
use crate::db::Database;
use crate::db::outbox;

/// Which source wakes the relay, as `/metrics` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WakeupMode {
    Poll = 0,
    Notify = 1,
    Binlog = 2,
}

impl WakeupMode {
    pub const ALL: [WakeupMode; 3] = [WakeupMode::Binlog, WakeupMode::Notify, WakeupMode::Poll];

    pub fn as_str(self) -> &'static str {
        match self {
            WakeupMode::Poll => "poll",
            WakeupMode::Notify => "notify",
            WakeupMode::Binlog => "binlog",
        }
    }

    pub(super) fn from_u8(n: u8) -> WakeupMode {
        match n {
            1 => WakeupMode::Notify,
            2 => WakeupMode::Binlog,
            _ => WakeupMode::Poll,
        }
    }
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
    Poll,
}

impl Wakeup {
    /// Opens the engine's source. On MySQL/MariaDB a server or user that cannot follow the
    /// binary log falls back to polling, saying why and what to set or grant; a server that
    /// cannot be reached (down, restarting) is an error, so the session is retried and follows
    /// the log again once the server is back.
    pub async fn open(db: &Database, settings: &RelaySettings) -> anyhow::Result<Wakeup> {
        match db {
            Database::Postgres(pool) => {
                let mut listener = PgListener::connect_with(pool).await?;
                listener.listen(outbox::NOTIFY_CHANNEL).await?;
                Ok(Wakeup::Notify(Box::new(listener)))
            }
            Database::MySql(_) => {
                let Some(url) = &settings.database_url else {
                    return Ok(Wakeup::Poll);
                };
                match Follower::start(url).await {
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
            Wakeup::Poll => WakeupMode::Poll,
        }
    }

    /// The longest wait between probes of an idle outbox: long while a source is connected.
    pub fn ceiling(&self, settings: &RelaySettings) -> Duration {
        match self {
            Wakeup::Notify(_) => settings.poll_interval,
            Wakeup::Binlog(follower) if follower.live() => settings.poll_interval,
            Wakeup::Binlog(_) | Wakeup::Poll => settings.poll_max,
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
            Wakeup::Poll => std::future::pending().await,
        }
    }

    /// Closes the source's connection.
    pub async fn close(self) {
        match self {
            Wakeup::Notify(listener) => drop(listener),
            Wakeup::Binlog(follower) => follower.close().await,
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
