//! The long-running ingester of `worker`, `serve` and `run`: one consumer of `<ns>.dead`, its
//! reconnects, its pause while the database is down, and the retention that runs beside it.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::Connection;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use super::{RETENTION_EVERY, ack_stored, group_with, hand_back, rows_of, store_all};
use crate::broker::{self, Topology};
use crate::config::UrlList;
use crate::db::Database;
use crate::db::dead_letters::NewDeadLetter;
use crate::dlq::DeadLetters;
use crate::shutdown::within_patience;

/// Letters held unacked at once: enough that a burst of dead letters is stored in groups of
/// this many (one commit and one ack each), few enough that a pause or a crash hands back
/// little (and a letter handed back is one row still).
const PREFETCH: u16 = 64;

/// How long an ingester has, once told to stop, to hand its letters back and close its
/// connection, which takes milliseconds (each bounded by [`broker::GOODBYE_TIMEOUT`]). Past it
/// the session is dropped: its connection closes without the goodbye and the broker requeues
/// what it held. A broker call that never returns cannot keep `worker`, `serve` or `run` from
/// exiting.
pub const STOP_PATIENCE: Duration = Duration::from_secs(7);

// The hand-back and the close, each given up after the goodbye's bound, fit in the patience.
const _: () = assert!(STOP_PATIENCE.as_millis() > 2 * broker::GOODBYE_TIMEOUT.as_millis());

/// A consumer of `<ns>.dead` that stores the letters that have arrived, then acks them.
pub struct Ingester {
    urls: UrlList,
    topology: Topology,
    db: Database,
    /// Replayed and purged rows older than this are deleted.
    retention: Duration,
    /// The connection's name in `rabbitmqctl list_connections`.
    name: String,
}

impl Ingester {
    pub fn new(urls: UrlList, topology: Topology, db: Database, retention: Duration) -> Ingester {
        Ingester {
            urls,
            topology,
            db,
            retention,
            name: format!("mailroom dead-letter ingest (pid {})", std::process::id()),
        }
    }

    /// Ingests until `shutdown`, reconnecting as needed; runs the retention every
    /// [`RETENTION_EVERY`]. Never fails: an outage is waited out. Returns at most
    /// [`STOP_PATIENCE`] after `shutdown`, whatever the broker does.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let retention = tokio::spawn(expire_loop(
            DeadLetters::new(self.db.clone()),
            self.retention,
            shutdown.clone(),
        ));
        let sessions = self.sessions(&shutdown);
        if within_patience(&shutdown, STOP_PATIENCE, sessions)
            .await
            .is_none()
        {
            tracing::warn!(
                "dead-letter ingest did not stop within {STOP_PATIENCE:?} of the shutdown; its broker connection is dropped, and the letters it held go back to {}",
                self.topology.dead
            );
        }
        retention.abort();
        Ok(())
    }

    /// Sessions one after the other until `shutdown`.
    async fn sessions(&self, shutdown: &CancellationToken) {
        let mut reconnect = broker::Reconnect::default();
        while !shutdown.is_cancelled() {
            match self.session(shutdown, &mut reconnect).await {
                Ok(()) => break,
                Err(e) => {
                    let (_, wait) = reconnect.next_wait();
                    tracing::debug!(error = crate::exit::one_line(&e), retry_in = ?wait, "dead-letter ingest: broker session ended");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
        }
    }

    async fn session(
        &self,
        shutdown: &CancellationToken,
        reconnect: &mut broker::Reconnect,
    ) -> anyhow::Result<()> {
        let conn = broker::connect(&self.urls, &self.name).await?;
        let result = self.consume(&conn, shutdown, reconnect).await;
        // Closing hands every letter not acked back to the queue.
        broker::close_within(&conn, None, "dead-letter ingest stopped").await;
        result
    }

    async fn consume(
        &self,
        conn: &Connection,
        shutdown: &CancellationToken,
        reconnect: &mut broker::Reconnect,
    ) -> anyhow::Result<()> {
        broker::declare_and_repair(conn, &self.urls, &self.topology, &self.name).await?;
        let ch = conn.create_channel().await?;
        ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
        let mut consumer = ch
            .basic_consume(
                self.topology.dead.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        reconnect.started();
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => {
                    hand_back(&ch).await;
                    return Ok(());
                }
                next = consumer.next() => next,
            };
            let delivery = match next {
                None => anyhow::bail!(
                    "the broker cancelled the consumer of {}",
                    self.topology.dead
                ),
                Some(d) => d?,
            };
            let group = group_with(delivery, &mut consumer)?;
            if !self.store(&rows_of(&group), shutdown).await {
                hand_back(&ch).await;
                return Ok(());
            }
            if let Err(e) = ack_stored(&group).await {
                tracing::warn!(
                    error = crate::exit::one_line(&e),
                    "dead-letter ingest: reconnecting"
                );
                return Err(e);
            }
        }
    }

    /// Stores a group's rows, and while the database does not take them holds the letters (not
    /// acked, not handed back) and tries again with backoff: true once stored, false on
    /// `shutdown`. A letter handed back is a delivery spent, and on RabbitMQ 4 a quorum queue
    /// drops a letter after its delivery limit (20 unless a policy says otherwise; `<ns>.dead`
    /// has nowhere to dead-letter it), so an outage, or a database that answers but refuses
    /// the rows, must not hand the same letters back again and again.
    async fn store(&self, rows: &[NewDeadLetter], shutdown: &CancellationToken) -> bool {
        let Err(e) = store_all(&self.db, rows).await else {
            return true;
        };
        tracing::warn!(
            error = %e,
            letters = rows.len(),
            "dead-letter ingest paused: the database does not take rows; the letters taken from {} are held, not acked, and stored once it does",
            self.topology.dead
        );
        let mut backoff = broker::reconnect_backoff();
        let mut tries = 1u64;
        loop {
            let wait = backoff.next().unwrap_or(broker::RECONNECT_MAX);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return false,
            }
            tries += 1;
            let stored = tokio::select! {
                stored = store_all(&self.db, rows) => stored,
                _ = shutdown.cancelled() => return false,
            };
            match stored {
                Ok(_) => {
                    tracing::info!(
                        letters = rows.len(),
                        tries,
                        "dead-letter ingest resumed: the database took the held letters"
                    );
                    return true;
                }
                Err(e) => tracing::debug!(error = %e, tries, "dead letters still not stored"),
            }
        }
    }
}

/// Deletes expired replayed and purged rows now and every [`RETENTION_EVERY`].
async fn expire_loop(dlq: DeadLetters, retention: Duration, shutdown: CancellationToken) {
    loop {
        match dlq.expire(retention).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                deleted = n,
                "dead-letter retention: deleted replayed and purged rows"
            ),
            Err(e) => tracing::debug!(
                error = crate::exit::one_line(&e),
                "dead-letter retention did not run"
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
