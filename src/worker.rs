//! The worker: consumes `<ns>.email` with a bounded number of deliveries in flight, and for each
//! one computes an [`Outcome`] (`process`) and acts on it (`settle`): ack, publish to a retry
//! tier then ack, or dead-letter then ack. The connection is supervised here: a lost
//! connection, a closed channel or a consumer cancelled by the broker all lead to a reconnect
//! with capped exponential backoff, never to an idle process.
//!
//! When the SMTP server is unreachable, a circuit breaker (`breaker`) pauses consumption and
//! probes until it answers, so an outage does not dead-letter the backlog.
//!
//! Shutdown (SIGTERM/SIGINT): stop taking deliveries, let those in flight finish within the
//! grace period and settle on the still-open channel, then close channel and connection.
//!
//! Retries and dead letters are published on a second connection ([`broker::Publisher`]): a
//! resource alarm blocks a connection that publishes, and its acks with it. On its own
//! connection a blocked publish holds only the delivery it settles, which stays unacked in the
//! queue until the alarm clears; the other deliveries are still sent and acked.

mod breaker;
pub mod heartbeat;
pub mod histogram;
pub mod lease;
mod limit;
#[cfg(test)]
mod model;
mod outcome;
mod process;
mod refuse;
pub mod retention;
mod send;
mod settle;
pub mod stats;
mod suppress;
pub mod throttle;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use lapin::{
    Channel, Connection, Consumer,
    options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions},
    types::FieldTable,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;

use crate::broker::{self, Acks, Topology};
use crate::config::{OnUncertain, UrlList};
use crate::db::Database;
use crate::db::group::Ledger;
use crate::dlq::seal::{ReplayKey, ReplayKeys};
use crate::render::LiveTemplates;
use crate::smtp::Mailer;
use heartbeat::Heartbeat;

pub use outcome::{ErrorClass, Outcome};
pub use stats::{KindStats, OTHER_KIND, Snapshot, Stats};

/// How long a worker may take to exit beyond its shutdown grace, whatever RabbitMQ and the
/// database do: the publisher's and the consuming connection's closes, the last heartbeat and
/// the pool's close, each bounded. The dead-letter ingester and the metrics listener stop
/// beside these, each within a shorter patience of its own (asserted where they are wired
/// together, in `startup`).
pub const STOP_BEYOND_GRACE: Duration = broker::GOODBYE_TIMEOUT
    .saturating_add(broker::GOODBYE_TIMEOUT)
    .saturating_add(heartbeat::LAST_BEAT_PATIENCE)
    .saturating_add(crate::db::CLOSE_PATIENCE);

/// Everything the worker needs to know, resolved from the CLI/environment.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    pub amqp: UrlList,
    pub topology: Topology,
    /// Deliveries processed at once.
    pub concurrency: usize,
    /// Deliveries the broker sends ahead (basic.qos); at least `concurrency`.
    pub prefetch: u16,
    pub lease: Duration,
    pub on_uncertain: OnUncertain,
    pub max_attempts: i32,
    /// Suppress the address of a one-recipient job refused as an unknown mailbox or domain.
    pub suppress_bounces: bool,
    /// Settled ledger rows older than this are deleted ([`retention`]); `None` keeps them.
    pub ledger_retention: Option<Duration>,
    /// Claims and records written per group commit at most; 1 writes each alone.
    pub ledger_group: usize,
    pub shutdown_grace: Duration,
    /// Connection name shown by `rabbitmqctl list_connections`.
    pub name: String,
    /// `MAILROOM_REPLAY_KEY`; `None` reads (or creates) the key stored in the database.
    pub replay_key: Option<ReplayKey>,
    /// `MAILROOM_SMTP_RATE`: the account's send rate, shared by the fleet.
    pub smtp_rate: Option<crate::config::limits::Rate>,
    /// `MAILROOM_DOMAIN_LIMITS`.
    pub domain_limits: crate::config::limits::DomainLimits,
}

/// A worker: settings plus the database, templates and mailer it sends with.
pub struct Worker {
    settings: WorkerSettings,
    db: Database,
    /// Claims and records; grouped once `run` starts (the group writer is a task).
    ledger: Ledger,
    templates: Arc<LiveTemplates>,
    mailer: Mailer,
    stats: Arc<Stats>,
    breaker: breaker::Breaker,
    /// Checks the seal of replayed copies.
    replay_keys: ReplayKeys,
    /// The sending limits, this worker's share of them.
    throttle: Arc<throttle::Throttle>,
    /// The consuming connection of the session that is up, `None` between sessions
    /// (`/readyz`).
    live: tokio::sync::watch::Sender<Option<lapin::ConnectionStatus>>,
}

impl Worker {
    pub fn new(
        settings: WorkerSettings,
        db: Database,
        templates: Arc<LiveTemplates>,
        mailer: Mailer,
    ) -> Worker {
        let stats = Arc::new(Stats::default());
        let breaker = breaker::Breaker::default();
        stats.follow_circuit(breaker.subscribe());
        let throttle = Arc::new(throttle::Throttle::new(
            settings.smtp_rate,
            settings.domain_limits.clone(),
        ));
        stats.follow_throttle(throttle.clone());
        stats.follow_smtp_line(mailer.waiting_gauge());
        Worker {
            throttle,
            replay_keys: ReplayKeys::new(settings.replay_key.clone(), db.clone()),
            settings,
            ledger: Ledger::direct(db.clone(), stats.ledger.clone()),
            db,
            templates,
            mailer,
            stats,
            breaker,
            live: tokio::sync::watch::Sender::new(None),
        }
    }

    /// The templates this worker renders with (each delivery takes one snapshot).
    pub fn templates(&self) -> Arc<LiveTemplates> {
        self.templates.clone()
    }

    /// The worker's counters, live.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The connection of the broker session consuming the work queue, `None` between sessions
    /// (`/readyz`).
    pub fn live(&self) -> tokio::sync::watch::Receiver<Option<lapin::ConnectionStatus>> {
        self.live.subscribe()
    }

    /// The worker's database (its pool), for `/readyz`.
    pub fn database(&self) -> Database {
        self.db.clone()
    }

    /// Consumes until `shutdown` is cancelled, reconnecting as needed; returns at most the
    /// shutdown grace plus [`STOP_BEYOND_GRACE`] after the shutdown, whatever its peers do.
    /// Every step of the stop has a bound of its own; past their sum (which none should reach)
    /// the worker gives up and says so, and what it still held goes back to the queue with its
    /// connection, as after a crash.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let patience = self
            .settings
            .shutdown_grace
            .saturating_add(STOP_BEYOND_GRACE);
        let run = self.run_until_stopped(shutdown.clone());
        match crate::shutdown::within_patience(&shutdown, patience, run).await {
            Some(result) => result,
            None => {
                tracing::warn!(
                    "the worker did not stop within {patience:?} of the shutdown (the grace and {STOP_BEYOND_GRACE:?}); exiting with what it holds unsettled, which the broker redelivers"
                );
                Ok(())
            }
        }
    }

    async fn run_until_stopped(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let stop = StopClock::start(&shutdown);
        self.ledger = self.ledger.grouped(self.settings.ledger_group);
        let worker = Arc::new(self);
        let slots = Arc::new(Semaphore::new(worker.settings.concurrency.max(1)));
        let tracker = TaskTracker::new();
        let mut reconnect = broker::Reconnect::default();
        let beats = CancellationToken::new();
        let heartbeat = Heartbeat::new(
            worker.db.clone(),
            worker.stats.clone(),
            &worker.settings.topology.exchange,
        )
        .sharing(worker.throttle.clone());
        let mut heartbeat = tokio::spawn(heartbeat.run(beats.clone()));
        if let Some(retention) = worker.settings.ledger_retention {
            let (db, stats) = (worker.db.clone(), worker.stats.clone());
            tokio::spawn(retention::run(db, retention, stats, beats.clone()));
        }
        while !shutdown.is_cancelled() {
            let ended = worker
                .session(&slots, &tracker, &shutdown, &stop, &mut reconnect)
                .await;
            worker.live.send_replace(None);
            match ended {
                Ok(()) => break,
                Err(e) => {
                    let (ended, wait) = reconnect.next_wait();
                    log_session_end(ended, &e, wait);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
        }
        let grace_left = stop
            .deadline(worker.settings.shutdown_grace)
            .saturating_duration_since(tokio::time::Instant::now());
        if grace_left.is_zero() {
            // A graceful finish drained until this moment, and said what it left.
            tracker.close();
        } else {
            drain(&tracker, grace_left).await;
        }
        crate::failpoint::hit("worker.stopping").await;
        // The last beat counts the drained deliveries and marks the worker stopped; a database
        // that does not answer (a partition) must not hold the exit for TCP's minutes.
        beats.cancel();
        if tokio::time::timeout(heartbeat::LAST_BEAT_PATIENCE, &mut heartbeat)
            .await
            .is_err()
        {
            heartbeat.abort();
            tracing::warn!(
                "the last heartbeat was not written within {:?}; the console shows this worker silent, not stopped",
                heartbeat::LAST_BEAT_PATIENCE
            );
        }
        worker.db.close().await;
        tracing::info!("worker stopped");
        Ok(())
    }

    /// One connection's life: declare, consume, dispatch. `Ok` only after a graceful shutdown.
    async fn session(
        self: &Arc<Self>,
        slots: &Arc<Semaphore>,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
        stop: &StopClock,
        reconnect: &mut broker::Reconnect,
    ) -> anyhow::Result<()> {
        // A stop while connecting (a declaration waiting on a broker cut off) drops what is
        // half open: nothing was taken from the queue yet.
        let mut session = tokio::select! {
            session = self.connect() => session?,
            () = shutdown.cancelled() => return Ok(()),
        };
        self.live.send_replace(Some(session.conn.status().clone()));
        reconnect.started();
        let s = &self.settings;
        tracing::info!(queue = %s.topology.queue, concurrency = s.concurrency, prefetch = s.prefetch, "consuming");
        self.dispatch(&mut session, slots, tracker, shutdown)
            .await?;
        self.finish(session, slots, tracker, stop).await;
        Ok(())
    }

    /// Connects, declares the topology, opens the publisher connection and starts consuming
    /// with the prefetch set.
    async fn connect(&self) -> anyhow::Result<BrokerSession> {
        let s = &self.settings;
        let conn = broker::connect(&s.amqp, &s.name).await?;
        broker::declare_and_repair(&conn, &s.amqp, &s.topology, &s.name).await?;
        let publisher = broker::Publisher::connect(&s.amqp, &format!("{} publisher", s.name))
            .await
            .context("opening the publisher connection")?;
        let publisher = Arc::new(publisher);
        let channel = conn.create_channel().await?;
        channel
            .basic_qos(s.prefetch.max(1), BasicQosOptions::default())
            .await
            .context("setting prefetch")?;
        let consumer = channel
            .basic_consume(
                s.topology.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consuming {}", s.topology.queue))?;
        Ok(BrokerSession {
            conn,
            channel,
            consumer,
            link: Link {
                publisher,
                acks: Acks::new(broker::AckPolicy::for_consumer(s.prefetch, s.concurrency)),
            },
        })
    }

    /// Takes deliveries, each once a concurrency slot is free, and hands each to a task of its
    /// own, until `shutdown` (`Ok`) or until the connection fails (`Err`). While the circuit
    /// breaker is open, takes none.
    async fn dispatch(
        self: &Arc<Self>,
        session: &mut BrokerSession,
        slots: &Arc<Semaphore>,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        loop {
            if self.breaker.is_open() {
                // Deliveries stay with the broker while the SMTP server is down.
                self.breaker.wait_until_closed(&self.mailer, shutdown).await;
            }
            if !session.link.publisher.is_usable() {
                anyhow::bail!("the publisher connection or its channel closed");
            }
            let permit = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                permit = slots.clone().acquire_owned() => permit?,
            };
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                next = session.consumer.next() => next,
            };
            let delivery = match next {
                None => anyhow::bail!(
                    "the broker cancelled the consumer of {}",
                    self.settings.topology.queue
                ),
                Some(Err(e)) => return Err(e).context("consumer stream failed"),
                Some(Ok(delivery)) => delivery,
            };
            self.spawn_handle(tracker, &session.link, delivery, permit);
        }
    }

    /// Handles `delivery` in a task of its own, in its span; the slot is free once its outcome is
    /// decided, before it is settled.
    fn spawn_handle(
        self: &Arc<Self>,
        tracker: &TaskTracker,
        link: &Link,
        delivery: lapin::message::Delivery,
        permit: OwnedSemaphorePermit,
    ) {
        let worker = self.clone();
        let link = link.clone();
        let span = process::delivery_span(&delivery);
        // Boxed: a task keeps its future in its own cell, which tokio copies whole when the
        // task is created and again when it finishes; a delivery's future is kilobytes.
        let handling = Box::pin(async move {
            worker.handle(&link, delivery, permit).await;
        });
        tracker.spawn(handling.instrument(span));
    }

    /// After a shutdown: stops consuming, takes the deliveries the broker sent before it heard
    /// so, lets them and those in flight settle on the still-open channel within the grace
    /// period, then closes both connections.
    async fn finish(
        self: &Arc<Self>,
        mut session: BrokerSession,
        slots: &Arc<Semaphore>,
        tracker: &TaskTracker,
        stop: &StopClock,
    ) {
        let deadline = stop.deadline(self.settings.shutdown_grace);
        let cancel = session
            .channel
            .basic_cancel(session.consumer.tag(), BasicCancelOptions::default());
        let heard = tokio::time::timeout(broker::GOODBYE_TIMEOUT, cancel)
            .await
            .is_ok();
        // Unheard, the cancel ends no stream: waiting for the rest would spend the grace of
        // the deliveries in flight. The broker requeues the rest when the connection goes.
        let taken = if heard {
            self.take_the_rest(&mut session, slots, tracker, deadline)
                .await
        } else {
            tracing::warn!(
                "the broker did not answer the consumer's cancel within {:?}; the deliveries it sent and this worker has not taken go back to the queue",
                broker::GOODBYE_TIMEOUT
            );
            0
        };
        tracing::info!(
            in_flight = tracker.len(),
            taken_after_cancel = taken,
            "stopped consuming; finishing deliveries in flight"
        );
        drain(
            tracker,
            deadline.saturating_duration_since(tokio::time::Instant::now()),
        )
        .await;
        let (frames, acks) = session.link.acks.written();
        tracing::info!(acks, frames, "acks of this session written");
        let ledger = self.ledger.stats();
        tracing::info!(
            groups = ledger.groups.load(std::sync::atomic::Ordering::Relaxed),
            writes = ledger.writes.load(std::sync::atomic::Ordering::Relaxed),
            record_waits = ledger.waits.load(std::sync::atomic::Ordering::Relaxed),
            record_waits_alone = ledger
                .waits_alone
                .load(std::sync::atomic::Ordering::Relaxed),
            "ledger groups of this process written"
        );
        tracing::info!(
            steps = %self.stats.steps.means(self.stats.mean_send()),
            "mean time of a delivery's steps around its send in this process"
        );
        session.link.publisher.close("worker shutting down").await;
        broker::close_within(
            &session.conn,
            Some(&session.channel),
            "worker shutting down",
        )
        .await;
    }

    /// The deliveries prefetched before the consumer was cancelled (up to the prefetch less
    /// those in flight), each taken once a slot is free, until the stream ends with the
    /// broker's Cancel-Ok or `deadline`; returns how many. Closing the channel would hand them
    /// back, and each hand-back is a delivery spent: a queue's delivery limit (10) dead-letters
    /// a job handed back that often, as repeated restarts or scale-downs over a backlog would
    /// do to the jobs at its head. While the circuit breaker is open (the SMTP server is
    /// down) they go back instead.
    async fn take_the_rest(
        self: &Arc<Self>,
        session: &mut BrokerSession,
        slots: &Arc<Semaphore>,
        tracker: &TaskTracker,
        deadline: tokio::time::Instant,
    ) -> usize {
        let mut taken = 0;
        while !self.breaker.is_open() {
            let next = async {
                let permit = slots.clone().acquire_owned().await.ok()?;
                match session.consumer.next().await {
                    Some(Ok(delivery)) => Some((delivery, permit)),
                    _ => None,
                }
            };
            match tokio::time::timeout_at(deadline, next).await {
                Ok(Some((delivery, permit))) => {
                    self.spawn_handle(tracker, &session.link, delivery, permit);
                    taken += 1;
                }
                _ => break,
            }
        }
        taken
    }

    async fn handle(
        &self,
        link: &Link,
        delivery: lapin::message::Delivery,
        permit: OwnedSemaphorePermit,
    ) {
        Stats::bump(&self.stats.received);
        self.stats.in_flight_add(1);
        let outcome = self.process(&delivery).await;
        // The slot bounds the work on SMTP and the database, which is done: settling is the
        // broker's (an ack that may wait for others to share its frame, or a confirmed
        // republish), and the prefetch bounds the deliveries waiting for it.
        drop(permit);
        self.settle(link, &delivery, outcome).await;
        self.stats.in_flight_add(-1);
        self.stats.settled();
    }
}

/// One broker session: the consuming connection and channel, and what deliveries settle
/// through.
struct BrokerSession {
    conn: Connection,
    channel: Channel,
    consumer: Consumer,
    link: Link,
}

/// What a delivery settles through: the publisher for retries and dead letters, and the acks
/// of the channel it came on. Each delivery's task holds its own, so a delivery still in
/// flight when its session ends settles on the channel it came on.
#[derive(Clone)]
struct Link {
    publisher: Arc<broker::Publisher>,
    acks: Arc<Acks>,
}

/// Logs the end of a broker session: a warning while none could start (the broker is down or
/// refuses), an error when one that ran failed.
fn log_session_end(ended: broker::Ended, e: &anyhow::Error, wait: Duration) {
    let error = crate::exit::one_line(e);
    match ended {
        broker::Ended::NeverStarted => {
            tracing::warn!(error, retry_in = ?wait, "cannot start a broker session; retrying")
        }
        _ => tracing::error!(error, retry_in = ?wait, "broker session ended; reconnecting"),
    }
}

/// Waits up to `grace` for the deliveries in flight; those left are redelivered by the broker.
/// When the shutdown came, fixed once: the deliveries in flight get one grace from then,
/// however the session ended, and a graceful finish and the stop after it drain until the same
/// moment.
struct StopClock(Arc<std::sync::OnceLock<tokio::time::Instant>>);

impl StopClock {
    /// Notes the moment `shutdown` is cancelled.
    fn start(shutdown: &CancellationToken) -> StopClock {
        let at = Arc::new(std::sync::OnceLock::new());
        let (shutdown, noted) = (shutdown.clone(), at.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            noted.get_or_init(tokio::time::Instant::now);
        });
        StopClock(at)
    }

    /// `grace` after the shutdown (after now, if the clock has not noted it yet).
    fn deadline(&self, grace: Duration) -> tokio::time::Instant {
        *self.0.get_or_init(tokio::time::Instant::now) + grace
    }
}

async fn drain(tracker: &TaskTracker, grace: Duration) {
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            in_flight = tracker.len(),
            "shutdown grace period over; unsettled deliveries will be redelivered"
        );
    }
}
