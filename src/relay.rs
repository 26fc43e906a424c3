//! The relay: outbox → broker. It claims batches of unpublished rows with
//! `FOR UPDATE SKIP LOCKED` (so several relays can run), publishes each persistent and
//! `mandatory` with publisher confirms, and commits the published mark of only the rows whose
//! confirm was a clean ack (the claim marks every row it locks, in the same statement on
//! PostgreSQL; refused rows are un-marked before the commit). A crash between confirm and
//! commit publishes those rows again; the worker's claim makes the duplicate harmless.
//!
//! Wake-ups: after a batch the relay probes the outbox (one lock-free query) every `poll_min`,
//! doubling while nothing comes, up to a ceiling. While a wake-up source runs the ceiling is
//! the fallback `poll_interval` and the source wakes an idle relay at once: on PostgreSQL the
//! WAL (a temporary logical slot, no trigger in producers' commits) or, where the server does
//! not allow that, `LISTEN/NOTIFY` from the outbox trigger, which notifies only when no other
//! row is waiting, because NOTIFY serialises commits; on MySQL/MariaDB the binary log. Without
//! a source, the probes alone, up to `poll_max` ([`wakeup`]). Every source is opened before
//! the first scan, so nothing committed in between is missed. Either stream pauses while
//! outbox commits come faster than it pays ([`wal::PAUSE_ABOVE`] a second): the relay probes
//! every `poll_min` meanwhile, and opens the stream again once probes find nothing.
//! On both engines an enqueue made in the same process (the HTTP API of `mailroom run`) wakes
//! the relay at once through [`Relay::waker`].
//!
//! Validation: every row passes the one validation ([`crate::door`]) before it is published,
//! and what goes out is the job's canonical serialisation, the very bytes that were checked
//! (never the database's spelling of the payload). A row that fails (a producer that wrote raw
//! SQL) is not published as a job: it is dead-lettered with class `invalid` and recorded
//! `dead` in the ledger (unless a row exists), in the batch's transaction, so nothing is lost
//! and `status` tells the truth. The relay has no templates: the kind is the worker's check.
//!
//! Batches are bounded by rows (`batch_size`) and by bytes (`batch_bytes`): a batch is cut
//! where its bodies would pass the byte bound (one row always goes), and the next scan takes
//! the rest at once. Two batches overlap: the next is claimed and written while the broker
//! confirms the previous one and its marks commit ([`Relay::drain`]).
//!
//! Marks that wait for company: at moderate rates every wake-up finds a row or two, and a
//! durable commit per wake-up was a large part of what the relay cost the database. The batch
//! that drains the outbox is published and marked at once, but its transaction stays open for
//! up to [`RelaySettings::commit_hold`]: the next wake-ups' rows are claimed and marked in it,
//! and one commit takes them all. Publishing never waits for it. Rows whose marks are held stay locked, so
//! no relay publishes them again; a crash or a failed batch in that time rolls the held marks
//! back, and those rows (at most `commit_hold`'s worth) are published again, which the
//! worker's claim makes harmless, as after a crash between confirm and commit. Each session
//! holds at most half the limit the database server puts on a transaction left open
//! ([`hold_within`]), so the server never ends a held transaction's session itself.
//!
//! Resource alarms: RabbitMQ blocks a publishing connection while it is low on memory or disk,
//! and lapin then writes nothing on it. The confirm timeout covers writing the batch too, so a
//! blocked batch is rolled back within it (its rows stay unpublished, its locks released); the
//! relay then keeps the connection and waits for the broker to unblock it before claiming
//! again. Messages of the rolled-back batch that lapin still holds go out once unblocked, as
//! duplicates of the rows' next publish, which the worker's claim makes harmless.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures_util::future::join_all;
use lapin::{Channel, Confirmation, PublisherConfirm, options::BasicPublishOptions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::broker::{self, Topology};
use crate::config::{SecretUrl, UrlList};
use crate::db::Database;
use crate::db::outbox::{OutboxBatch, PendingRow};
use crate::failpoint;

mod batch;
mod binlog;
pub mod floor;
pub mod follower;
mod wakeup;
pub mod wal;
mod wal_tls;

use wakeup::Wakeup;
pub use wakeup::{WakeupChoice, WakeupMode, Woken};

/// Default bound on the bytes of one batch: 64 jobs at the 64 KiB job limit, all written and
/// confirmed within the confirm timeout even on a slow link.
pub const DEFAULT_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Refused publishes (unroutable, nacked) before a row is parked for an operator.
pub const MAX_PUBLISH_ATTEMPTS: i32 = 10;
/// Longest wait before retrying a refused row.
const MAX_ROW_BACKOFF: Duration = Duration::from_secs(300);
/// How often published rows past the retention age are deleted: every half retention age,
/// within these bounds.
const RETENTION_EVERY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));
/// Rows deleted per retention statement: bounded so it never holds long locks.
const RETENTION_BATCH: i64 = 1000;
/// The longest `commit_hold` ([`RelaySettings::commit_hold`]): held marks keep their rows
/// locked, their transaction open, and a crash publishes their rows again.
pub const MAX_COMMIT_HOLD: Duration = Duration::from_secs(10);

/// How long a stopping relay has to finish: a batch waiting for its confirms (at most
/// [`broker::CONFIRM_TIMEOUT`]) is marked, the held marks commit, the connections close, all
/// in milliseconds when the database and the broker answer. A statement sent into a network
/// partition waits for TCP to give up, which takes minutes (a relay stopped during a database
/// partition was still running 210 s later): past this the relay exits without it.
pub const STOP_PATIENCE: Duration = Duration::from_secs(15);

// A batch stopped while it waits for its confirms can still be marked.
const _: () = assert!(STOP_PATIENCE.as_millis() > broker::CONFIRM_TIMEOUT.as_millis());

/// The hold a session uses: `wanted`, but at most half the server's `limit` on a transaction
/// left open ([`Database::transaction_idle_limit`]), so that held marks always commit well
/// before the server would end their session (and publish their rows again). The bound is
/// the code's, whatever the two settings say.
pub fn hold_within(wanted: Duration, limit: Option<Duration>) -> Duration {
    match limit {
        Some(limit) => wanted.min(limit / 2),
        None => wanted,
    }
}

/// Relay settings.
#[derive(Clone, Debug)]
pub struct RelaySettings {
    pub amqp: UrlList,
    pub topology: Topology,
    /// Rows per claim, publish and mark.
    pub batch_size: i64,
    /// Bytes of message bodies per batch at most (one row always goes).
    pub batch_bytes: usize,
    /// PostgreSQL: the longest wait between probes of an idle outbox (notifications wake it).
    pub poll_interval: Duration,
    /// The wait between probes while rows keep coming, doubling while none do.
    pub poll_min: Duration,
    /// MySQL: the longest wait between probes of an idle outbox.
    pub poll_max: Duration,
    /// Published rows older than this are deleted.
    pub retention: Duration,
    pub name: String,
    /// The URL the WAL or binary log follower connects with (`None`: no follower).
    pub database_url: Option<SecretUrl>,
    /// The best wake-up source to try (it falls back from there).
    pub wakeup: WakeupChoice,
    /// Outbox commits a second from which the WAL or binary log stream pauses (0: never);
    /// [`wal::PAUSE_ABOVE`] by default.
    pub stream_pause_above: u32,
    /// How long the marks of the batch that drained the outbox may wait, uncommitted, for the
    /// next wake-ups' rows to share their commit (10 ms by default; zero commits at once).
    pub commit_hold: Duration,
    /// PostgreSQL: how often a scan starts from the outbox's first row instead of the floor
    /// ([`floor::ScanFloor`]); zero: always.
    pub full_scan_every: Duration,
}

/// What the relay did, for tests, the benchmark and metrics.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub published: AtomicU64,
    /// Commits of marked batches: with [`RelaySettings::commit_hold`], several wake-ups' rows
    /// share one.
    pub commits: AtomicU64,
    pub refused: AtomicU64,
    pub parked: AtomicU64,
    /// Scans of the outbox (claim statements), busy or idle.
    pub scans: AtomicU64,
    /// Scans that claimed rows.
    pub batches: AtomicU64,
    /// Lock-free "is there work?" probes between scans.
    pub probes: AtomicU64,
    /// Published rows deleted past the retention age.
    pub deleted: AtomicU64,
    /// Batches rolled back because the broker blocked publishing (a resource alarm).
    pub blocked: AtomicU64,
    /// Rows that failed validation, dead-lettered and recorded `dead` instead of published.
    pub invalid: AtomicU64,
    /// Batches cut short by the byte bound.
    pub cut: AtomicU64,
    /// Wake-ups by the database itself: a notification, a WAL or binary log commit.
    pub woken: AtomicU64,
    /// Rescans after the wake-up source reconnected.
    pub resumed: AtomicU64,
    /// PostgreSQL: the id the relay's scans start from ([`floor::ScanFloor`]; 0: the first row).
    pub scan_floor: AtomicI64,
    /// Steps the floor took (each one or two statements), risen or not.
    pub floor_steps: AtomicU64,
    /// Sessions started (broker connected, wake-up source open).
    pub sessions: AtomicU64,
    /// The [`WakeupMode`] of the current session.
    pub wakeup_mode: AtomicU8,
    /// Whether the session's WAL or binary log stream is paused: outbox rows come faster than it
    /// pays, and the relay probes instead (`--relay-stream-pause-above`). The stream's own task
    /// sets it as it closes and reopens the stream, so it holds while the relay drains a backlog.
    pub wakeup_paused: Arc<AtomicBool>,
}

impl RelayStats {
    /// Which source wakes the relay in its current session.
    pub fn wakeup_mode(&self) -> WakeupMode {
        WakeupMode::from_u8(self.wakeup_mode.load(Ordering::Relaxed))
    }
}

/// The wait between probes of the outbox: `min` after a busy scan, doubling while idle, up to
/// `max`, where it starts (a relay that found nothing has no reason to hurry). Pure, so its
/// schedule is unit-tested.
#[derive(Clone, Debug)]
pub struct AdaptivePoll {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl AdaptivePoll {
    pub fn new(min: Duration, max: Duration) -> AdaptivePoll {
        let max = max.max(min);
        AdaptivePoll {
            min,
            max,
            next: max,
        }
    }

    /// Rows came in: poll fast again.
    pub fn busy(&mut self) {
        self.next = self.min;
    }

    /// A new ceiling (the wake-up source connected or lost).
    pub fn set_max(&mut self, max: Duration) {
        self.max = max.max(self.min);
        self.next = self.next.min(self.max);
    }

    /// The wait before the next poll, backing off for the one after.
    pub fn idle(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }
}

/// The relay process.
pub struct Relay {
    settings: RelaySettings,
    db: Database,
    stats: Arc<RelayStats>,
    wake: Arc<Notify>,
    /// The broker connection of the session that is up (confirm channel and database wake-up
    /// source open), `None` between sessions (`/readyz`).
    live: tokio::sync::watch::Sender<Option<lapin::ConnectionStatus>>,
    /// This session's `commit_hold` in microseconds, bounded by the server ([`hold_within`]).
    hold_us: AtomicU64,
    /// Where scans start (PostgreSQL); only `wait_for_work` moves it, between drains.
    floor: tokio::sync::Mutex<floor::ScanFloor>,
}

/// A batch claimed and written to the channel: its transaction holds the rows' locks until
/// [`Relay::settle`] un-marks the refused ones (the claim marked them all) and commits.
struct Written<'a> {
    batch: OutboxBatch,
    outgoing: Vec<batch::Outgoing<'a>>,
    confirms: Vec<PublisherConfirm>,
    /// Rows the claim returned (more than `outgoing` when the byte bound cut the batch).
    claimed: usize,
    cut: bool,
    /// The marks already waiting in `batch`'s transaction, when it was a [`Held`] one.
    held: Option<HeldMarks>,
}

/// Marks made in a transaction that is not committed yet ([`RelaySettings::commit_hold`]).
#[derive(Clone, Copy, Debug)]
struct HeldMarks {
    /// Commit by then, whatever comes.
    until: tokio::time::Instant,
    /// Rows marked published in it.
    published: u64,
}

/// The transaction of the batch that drained the outbox, its marks made and not committed: the
/// next wake-up claims in it, or it commits at its deadline ([`RelaySettings::commit_hold`]).
struct Held {
    batch: OutboxBatch,
    marks: HeldMarks,
}

impl Relay {
    pub fn new(settings: RelaySettings, db: Database) -> Relay {
        Relay {
            db,
            stats: Arc::default(),
            wake: Arc::default(),
            live: tokio::sync::watch::Sender::new(None),
            hold_us: AtomicU64::new(0),
            floor: tokio::sync::Mutex::new(floor::ScanFloor::new(settings.full_scan_every)),
            settings,
        }
    }

    /// Notify this after committing outbox rows in the same process to skip the wait.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// The broker connection of the session that is up (its confirm channel and the database's
    /// wake-up source open), `None` between sessions (`/readyz`).
    pub fn live(&self) -> tokio::sync::watch::Receiver<Option<lapin::ConnectionStatus>> {
        self.live.subscribe()
    }

    /// Relays until `shutdown` is cancelled, reconnecting to the broker and the database with
    /// capped exponential backoff ([`broker::Reconnect`]: reset only after a healthy session).
    /// Returns at most [`STOP_PATIENCE`] after `shutdown`, whatever the database and the broker
    /// do.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let sessions = self.sessions(&shutdown);
        if crate::shutdown::within_patience(&shutdown, STOP_PATIENCE, sessions)
            .await
            .is_none()
        {
            tracing::warn!(
                "the relay did not stop within {STOP_PATIENCE:?} of the shutdown (the database or the broker does not answer); it exits without finishing: rows it published and did not mark are published again by the next relay, and each is still sent once"
            );
        }
        let stats = &self.stats;
        tracing::info!(
            published = stats.published.load(Ordering::Relaxed),
            batches = stats.batches.load(Ordering::Relaxed),
            commits = stats.commits.load(Ordering::Relaxed),
            scans = stats.scans.load(Ordering::Relaxed),
            probes = stats.probes.load(Ordering::Relaxed),
            woken = stats.woken.load(Ordering::Relaxed),
            "relay stopped"
        );
        Ok(())
    }

    /// Sessions one after the other until `shutdown`.
    async fn sessions(&self, shutdown: &CancellationToken) {
        let mut reconnect = broker::Reconnect::default();
        while !shutdown.is_cancelled() {
            let ended = self.session(shutdown, &mut reconnect).await;
            self.live.send_replace(None);
            match ended {
                Ok(()) => break,
                Err(e) => {
                    let (ended, wait) = reconnect.next_wait();
                    let error = crate::exit::one_line(&e);
                    match ended {
                        broker::Ended::NeverStarted => {
                            tracing::warn!(error, retry_in = ?wait, "relay cannot start a session; retrying")
                        }
                        _ => {
                            tracing::error!(error, retry_in = ?wait, "relay session ended; reconnecting")
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
        }
    }

    /// One session: a broker connection, a wake-up source, then batches until the outbox is
    /// drained and waits for work, until `shutdown`.
    async fn session(
        &self,
        shutdown: &CancellationToken,
        reconnect: &mut broker::Reconnect,
    ) -> anyhow::Result<()> {
        let s = &self.settings;
        self.bound_hold().await?;
        let conn = broker::connect(&s.amqp, &s.name).await?;
        broker::declare_and_repair(&conn, &s.amqp, &s.topology, &s.name).await?;
        let channel = broker::confirm_channel(&conn).await?;
        // Opened before the first scan, so nothing committed in between is missed.
        let mut wakeup = Wakeup::open(&self.db, s, &self.stats.wakeup_paused).await?;
        self.stats
            .wakeup_mode
            .store(wakeup.mode() as u8, Ordering::Relaxed);
        let mut poll = AdaptivePoll::new(s.poll_min, wakeup.ceiling(s));
        self.live.send_replace(Some(conn.status().clone()));
        reconnect.started();
        self.stats.sessions.fetch_add(1, Ordering::Relaxed);
        tracing::info!(exchange = %s.topology.exchange, wakeup = wakeup.mode().as_str(), "relaying");
        let (every_min, every_max) = RETENTION_EVERY;
        let every = (s.retention / 2).clamp(every_min, every_max);
        let mut retention = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut held = None;
        let relayed = async {
            loop {
                let Some(claimed) = self.drain(&conn, &channel, &mut held, shutdown).await? else {
                    break;
                };
                if claimed > 0 {
                    poll.busy();
                }
                let waited = self.wait_for_work(
                    &conn,
                    &mut wakeup,
                    &mut poll,
                    &mut retention,
                    &mut held,
                    shutdown,
                );
                if !waited.await? {
                    break;
                }
            }
            anyhow::Ok(())
        }
        .await;
        // Held marks are of confirmed publishes: they commit whatever ended the session.
        let committed = self.commit_if_held(&mut held).await;
        relayed?;
        committed?;
        wakeup.close().await;
        broker::close_within(&conn, Some(&channel), "relay shutting down").await;
        Ok(())
    }

    /// Relays batches until a scan comes back short (the outbox is drained); returns the rows
    /// claimed, or `None` on shutdown. A batch the broker blocked is rolled back and retried
    /// once it unblocks. The first claim is made in the `held` transaction, if any; the batch
    /// that drains the outbox leaves its own there, marked and not committed
    /// ([`RelaySettings::commit_hold`]).
    ///
    /// Two batches overlap: the next one is claimed and written to the channel while the
    /// broker confirms the previous one and its marks commit, so the database's work and the
    /// broker's run side by side instead of taking turns. The next claim skips the previous
    /// batch's rows, whose locks its open transaction still holds (`SKIP LOCKED`, as between
    /// two relays). After a batch the byte bound cut, the next claim waits for its commit:
    /// its unpublished tail is locked until then and would be skipped.
    async fn drain(
        &self,
        conn: &lapin::Connection,
        channel: &Channel,
        held: &mut Option<Held>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Option<usize>> {
        let mut claimed = 0;
        let mut in_flight: Option<Written> = None;
        loop {
            let next = match self.next_batch(channel, in_flight.take(), held).await {
                Ok(next) => next,
                Err(e) => match self.wait_if_blocked(conn, e, shutdown).await? {
                    true => continue,
                    false => return Ok(None),
                },
            };
            let Some(written) = next else {
                return Ok(Some(claimed));
            };
            let short = written.claimed < self.settings.batch_size as usize && !written.cut;
            if short || shutdown.is_cancelled() {
                // A whole batch can be written before the broker blocks the connection: then
                // its confirms are what never come.
                let rows = written.claimed;
                match self.settle(written, !shutdown.is_cancelled()).await {
                    Ok(hold) => {
                        *held = hold;
                        return Ok(Some(claimed + rows));
                    }
                    Err(e) => match self.wait_if_blocked(conn, e, shutdown).await? {
                        true => continue,
                        false => return Ok(None),
                    },
                }
            }
            claimed += written.claimed;
            in_flight = Some(written);
        }
    }

    /// After a batch failed: when the broker blocks the connection (a resource alarm), the
    /// batch's transactions were dropped, so its rows are free again, and this waits for the
    /// broker to unblock the connection (true) or for `shutdown` (false); any other failure is
    /// the session's.
    async fn wait_if_blocked(
        &self,
        conn: &lapin::Connection,
        e: anyhow::Error,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<bool> {
        if !conn.status().blocked() {
            return Err(e);
        }
        self.stats.blocked.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            error = format!("{e:#}"),
            "batch rolled back: RabbitMQ blocks publishing (resource alarm)"
        );
        tokio::select! {
            _ = broker::wait_while_blocked(conn.status()) => Ok(true),
            _ = shutdown.cancelled() => Ok(false),
        }
    }

    /// Claims and writes the next batch while `previous` is confirmed and committed; `None`
    /// when the scan found nothing. The claim takes the `held` transaction, if any (there is
    /// none while a batch is in flight), and puts it back when it found nothing.
    async fn next_batch<'s>(
        &'s self,
        channel: &Channel,
        previous: Option<Written<'s>>,
        held: &mut Option<Held>,
    ) -> anyhow::Result<Option<Written<'s>>> {
        match previous {
            None => self.claim_and_write(channel, held).await,
            Some(previous) if previous.cut => {
                self.settle(previous, false).await?;
                self.claim_and_write(channel, held).await
            }
            Some(previous) => {
                let (next, _) = tokio::try_join!(
                    self.claim_and_write(channel, held),
                    self.settle(previous, false)
                )?;
                Ok(next)
            }
        }
    }

    /// Claims one batch (in the `held` transaction, if any) and writes its messages to the
    /// channel, in order; its confirms are awaited by [`Relay::settle`].
    async fn claim_and_write(
        &self,
        channel: &Channel,
        held: &mut Option<Held>,
    ) -> anyhow::Result<Option<Written<'_>>> {
        self.stats.scans.fetch_add(1, Ordering::Relaxed);
        let limit = self.settings.batch_size;
        let from = self.floor.lock().await.scan_from();
        let (mut batch, marks) = match held.take() {
            Some(Held { mut batch, marks }) => {
                batch.claim_more(limit, from).await?;
                (batch, Some(marks))
            }
            None => (self.db.claim_outbox_batch(limit, from).await?, None),
        };
        if batch.rows.is_empty() {
            match marks {
                Some(marks) => *held = Some(Held { batch, marks }),
                None => batch.commit().await?,
            }
            return Ok(None);
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let rows = std::mem::take(&mut batch.rows);
        let claimed = rows.len();
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        let plan = batch::plan(rows, &self.settings.topology, self.settings.batch_bytes);
        if plan.cut {
            self.stats.cut.fetch_add(1, Ordering::Relaxed);
            // The claim marked the whole batch; the tail past the byte bound goes next time.
            batch.unmark(&ids[plan.outgoing.len()..]).await?;
        }
        let confirms = self.write_all(channel, &plan.outgoing).await?;
        Ok(Some(Written {
            batch,
            outgoing: plan.outgoing,
            confirms,
            claimed,
            cut: plan.cut,
            held: marks,
        }))
    }

    /// Waits for a written batch's confirms, un-marks the rows the broker refused, and commits; or,
    /// when `hold` and the transaction's deadline has not passed, returns it uncommitted
    /// ([`RelaySettings::commit_hold`]).
    async fn settle(&self, written: Written<'_>, hold: bool) -> anyhow::Result<Option<Held>> {
        let Written {
            mut batch,
            outgoing,
            confirms,
            held,
            ..
        } = written;
        let confirms = self.await_confirms(confirms).await?;
        failpoint::hit("relay.after_confirm").await;
        // The claim marked every row; a refused one is un-marked by `settle_row`.
        let mut published = 0;
        for (out, confirm) in outgoing.iter().zip(confirms) {
            if self.settle_row(&mut batch, out, confirm).await? {
                published += 1;
            }
        }
        let marks = HeldMarks {
            until: held.map_or_else(|| tokio::time::Instant::now() + self.hold(), |h| h.until),
            published: held.map_or(0, |h| h.published) + published,
        };
        let held = Held { batch, marks };
        if hold && tokio::time::Instant::now() < marks.until {
            return Ok(Some(held));
        }
        self.commit_held(held).await?;
        Ok(None)
    }

    /// Reads the server's limit on open transactions and bounds this session's hold by it
    /// ([`hold_within`]), saying so when that shortens `commit_hold`.
    async fn bound_hold(&self) -> anyhow::Result<()> {
        let wanted = self.settings.commit_hold;
        let hold = if wanted.is_zero() {
            wanted
        } else {
            let limit = self
                .db
                .transaction_idle_limit()
                .await
                .context("reading the database server's transaction timeouts")?;
            let hold = hold_within(wanted, limit);
            if let Some(limit) = limit.filter(|_| hold < wanted) {
                tracing::warn!(
                    commit_hold = ?wanted,
                    held_at_most = ?hold,
                    server_limit = ?limit,
                    "relay holds its marks for less than --relay-commit-hold: at most half the database server's limit on a transaction left open"
                );
            }
            hold
        };
        self.hold_us
            .store(hold.as_micros() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// How long the batch that drains the outbox may keep its marks uncommitted this session.
    fn hold(&self) -> Duration {
        Duration::from_micros(self.hold_us.load(Ordering::Relaxed))
    }

    /// Commits the held marks, if any.
    async fn commit_if_held(&self, held: &mut Option<Held>) -> anyhow::Result<()> {
        match held.take() {
            Some(held) => self.commit_held(held).await,
            None => Ok(()),
        }
    }

    /// Commits marked rows.
    async fn commit_held(&self, held: Held) -> anyhow::Result<()> {
        held.batch.commit().await?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats
            .published
            .fetch_add(held.marks.published, Ordering::Relaxed);
        Ok(())
    }

    /// Waits for a wake-up, an in-process wake or a probe that finds work (true), or for
    /// `shutdown` (false); applies retention when it is due.
    async fn wait_for_work(
        &self,
        conn: &lapin::Connection,
        wakeup: &mut Wakeup,
        poll: &mut AdaptivePoll,
        retention: &mut tokio::time::Interval,
        held: &mut Option<Held>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<bool> {
        self.raise_floor().await;
        // When the next probe is due: a held commit in between does not postpone it.
        let mut probe_at = None;
        loop {
            poll.set_max(wakeup.ceiling(&self.settings));
            let deadline = held.as_ref().map(|h| h.marks.until);
            let probe = *probe_at.get_or_insert_with(|| tokio::time::Instant::now() + poll.idle());
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(false),
                woken = wakeup.next() => {
                    match woken? {
                        Woken::Event => self.stats.woken.fetch_add(1, Ordering::Relaxed),
                        Woken::Resumed => {
                            tracing::warn!("wake-up source reconnected; rescanning the outbox");
                            self.stats.resumed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                    poll.busy();
                    return Ok(true);
                }
                _ = self.wake.notified() => {
                    poll.busy();
                    return Ok(true);
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                    if deadline.is_some() =>
                {
                    self.commit_if_held(held).await?;
                    continue;
                }
                _ = tokio::time::sleep_until(probe) => {
                    // The probe reads what is committed: held rows would look unpublished.
                    self.commit_if_held(held).await?;
                    probe_at = None;
                }
                _ = retention.tick() => {
                    // Retention may take a while: the held marks do not wait past their deadline.
                    self.commit_if_held(held).await?;
                    self.apply_retention().await;
                    probe_at = None;
                    continue;
                }
            }
            // An idle relay publishes nothing that would notice a lost broker connection.
            if !conn.status().connected() {
                anyhow::bail!("the broker connection closed while the relay was idle");
            }
            self.stats.probes.fetch_add(1, Ordering::Relaxed);
            self.raise_floor().await;
            let from = self.floor.lock().await.probe_from();
            let found = self.db.outbox_has_work(from).await?;
            wakeup.probed(found);
            if found {
                poll.busy();
                return Ok(true);
            }
        }
    }

    /// Takes a step of the scans' floor when one is due. A server that refuses the statements
    /// (the relay's user may not read the outbox's id sequence) leaves every scan starting at
    /// the first row, as before the floor, and says so once; a step that failed otherwise (a
    /// dropped connection) is taken again by the next round, the floor where it was.
    async fn raise_floor(&self) {
        let mut floor = self.floor.lock().await;
        let published = self.stats.published.load(Ordering::Relaxed);
        match floor.step(&self.db, published).await {
            Ok(false) => {}
            Ok(true) => {
                self.stats.floor_steps.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .scan_floor
                    .store(floor.value(), Ordering::Relaxed);
            }
            Err(e) if floor::ScanFloor::refused(&e) => {
                tracing::warn!(
                    error = %e,
                    "the relay cannot tell which outbox ids are settled; its scans start from the first row"
                );
                floor.disable();
                self.stats.scan_floor.store(0, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, "a step of the outbox scans' floor failed"),
        }
    }

    /// Acts on one row's confirm inside the batch's transaction; true when the row is published
    /// (a job, or the dead letter of a row refused at the door).
    async fn settle_row(
        &self,
        batch: &mut OutboxBatch,
        out: &batch::Outgoing<'_>,
        confirm: Confirmation,
    ) -> anyhow::Result<bool> {
        let row = &out.row;
        match confirm {
            Confirmation::Ack(None) => {
                if let Some(reason) = &out.refused {
                    self.dead_lettered(batch, row, reason).await?;
                }
                Ok(true)
            }
            Confirmation::Ack(Some(_)) => {
                let why = format!(
                    "unroutable: no queue bound for kind {:?} on exchange {:?}",
                    row.kind, out.exchange
                );
                self.refuse(batch, row, &why).await?;
                Ok(false)
            }
            Confirmation::Nack(_) => {
                self.refuse(batch, row, "the broker refused the message (nack)")
                    .await?;
                Ok(false)
            }
            Confirmation::NotRequested => {
                anyhow::bail!("the relay channel is not in confirm mode")
            }
        }
    }

    /// A refused row's dead letter was confirmed: record it `dead` in the ledger.
    async fn dead_lettered(
        &self,
        batch: &mut OutboxBatch,
        row: &PendingRow,
        reason: &str,
    ) -> anyhow::Result<()> {
        batch.record_refused(row, reason).await?;
        self.stats.invalid.fetch_add(1, Ordering::Relaxed);
        tracing::error!(job_id = %row.job_id, kind = %row.kind, reason = crate::job::mask_addresses(reason), "outbox row failed validation; dead-lettered as invalid");
        Ok(())
    }

    /// Writes every message to the channel, in order, within one confirm timeout: lapin
    /// resolves `basic_publish` once the message is written, which never happens on a
    /// connection the broker blocks. A channel error or a timeout fails the whole batch:
    /// nothing is marked, everything is retried.
    ///
    /// The whole batch is handed to lapin before any write is awaited ([`in_order`]): awaited
    /// one by one, every message was a round trip to lapin's I/O thread and back, four
    /// context switches per row, most of the relay's CPU. lapin then holds a copy of the
    /// batch's bodies until they are written, so `batch_bytes` bounds that copy too.
    async fn write_all(
        &self,
        channel: &Channel,
        outgoing: &[batch::Outgoing<'_>],
    ) -> anyhow::Result<Vec<PublisherConfirm>> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let write = async {
            let publishes = outgoing.iter().map(|out| {
                channel.basic_publish(
                    out.exchange.into(),
                    out.row.kind.as_str().into(),
                    options,
                    &out.body,
                    out.properties.clone(),
                )
            });
            broker::in_order(publishes.collect())
                .await
                .into_iter()
                .collect::<Result<Vec<_>, lapin::Error>>()
        };
        let timeout = broker::CONFIRM_TIMEOUT;
        Ok(tokio::time::timeout(timeout, write).await.map_err(|_| {
            anyhow::anyhow!("{} messages not written within {timeout:?}", outgoing.len())
        })??)
    }

    /// Waits for every confirm of a written batch, within one confirm timeout.
    async fn await_confirms(
        &self,
        pending: Vec<PublisherConfirm>,
    ) -> anyhow::Result<Vec<Confirmation>> {
        let n = pending.len();
        let timeout = broker::CONFIRM_TIMEOUT;
        let confirms = tokio::time::timeout(timeout, join_all(pending))
            .await
            .map_err(|_| anyhow::anyhow!("{n} messages not confirmed within {timeout:?}"))?;
        Ok(confirms.into_iter().collect::<Result<Vec<_>, _>>()?)
    }

    async fn refuse(
        &self,
        batch: &mut OutboxBatch,
        row: &PendingRow,
        why: &str,
    ) -> anyhow::Result<()> {
        let attempts = row.publish_attempts + 1;
        let park = attempts >= MAX_PUBLISH_ATTEMPTS;
        let retry_in = Duration::from_secs(1u64 << attempts.clamp(0, 16)).min(MAX_ROW_BACKOFF);
        batch
            .mark_publish_failed(row.id, why, retry_in, park)
            .await?;
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        if park {
            self.stats.parked.fetch_add(1, Ordering::Relaxed);
            tracing::error!(job_id = %row.job_id, kind = %row.kind, attempts, reason = why, "outbox row parked after repeated refusals; clear parked_at to retry it");
        } else {
            tracing::warn!(job_id = %row.job_id, kind = %row.kind, attempts, reason = why, ?retry_in, "publish refused; will retry");
        }
        Ok(())
    }

    /// Deletes published rows past the retention age, one bounded statement at a time.
    async fn apply_retention(&self) {
        let mut deleted = 0;
        let outcome = loop {
            match self
                .db
                .delete_published_before(self.settings.retention, RETENTION_BATCH)
                .await
            {
                Ok(n) => {
                    deleted += n;
                    self.stats.deleted.fetch_add(n, Ordering::Relaxed);
                    if n < RETENTION_BATCH as u64 {
                        break Ok(());
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if deleted > 0 {
            tracing::info!(deleted, "deleted published outbox rows past retention");
        }
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "outbox retention failed; trying again later");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_poll_backs_off_while_idle_and_snaps_back_when_busy() {
        let ms = Duration::from_millis;
        let mut poll = AdaptivePoll::new(ms(10), ms(1000));
        assert_eq!(poll.idle(), ms(1000), "idle from the start");
        poll.busy();
        let waits: Vec<_> = (0..9).map(|_| poll.idle()).collect();
        assert_eq!(
            waits,
            [10, 20, 40, 80, 160, 320, 640, 1000, 1000].map(ms).to_vec()
        );
        poll.busy();
        assert_eq!(poll.idle(), ms(10));
    }

    #[test]
    fn adaptive_poll_never_waits_longer_than_its_ceiling() {
        let mut poll = AdaptivePoll::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(poll.idle(), Duration::from_secs(2));
        assert_eq!(poll.idle(), Duration::from_secs(2));
    }

    #[test]
    fn a_hold_stays_within_half_the_servers_limit_on_open_transactions() {
        let ms = Duration::from_millis;
        assert_eq!(hold_within(ms(10), None), ms(10), "no limit");
        assert_eq!(hold_within(ms(10), Some(ms(60_000))), ms(10));
        assert_eq!(hold_within(ms(10_000), Some(ms(400))), ms(200));
        assert_eq!(hold_within(ms(10), Some(ms(20))), ms(10), "exactly half");
        assert_eq!(hold_within(ms(10), Some(ms(1))), Duration::from_micros(500));
    }
}
