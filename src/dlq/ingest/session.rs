//! The long-running ingester of `worker`, `serve` and `run`: one consumer of `<ns>.dead`, its
//! reconnects, its pause while the database is down, and the retention that runs beside it.

use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::Connection;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use super::{NotStored, RETENTION_EVERY, group_is_full, take};
use crate::broker::{self, Topology};
use crate::config::UrlList;
use crate::db::Database;
use crate::dlq::DeadLetters;

/// Letters held unacked at once: enough that a burst of dead letters is stored in groups of
/// this many (one commit and one ack each), few enough that a pause or a crash hands back
/// little (and a letter handed back is one row still).
const PREFETCH: u16 = 64;

/// How a session of the ingester ended.
enum Ended {
    /// The database did not take a letter: pause until it answers.
    Database(anyhow::Error),
    /// The broker connection or channel failed: reconnect.
    Broker(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Ended {
    fn from(e: E) -> Ended {
        Ended::Broker(e.into())
    }
}

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
    /// [`RETENTION_EVERY`]. Never fails: an outage is waited out.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let retention = tokio::spawn(expire_loop(
            DeadLetters::new(self.db.clone()),
            self.retention,
            shutdown.clone(),
        ));
        let mut reconnect = broker::Reconnect::default();
        while !shutdown.is_cancelled() {
            match self.session(&shutdown, &mut reconnect).await {
                Ok(()) => break,
                Err(Ended::Database(e)) => {
                    tracing::warn!(
                        error = crate::exit::one_line(&e),
                        "dead-letter ingest paused: the database does not take rows; the letters stay in {} until it does",
                        self.topology.dead
                    );
                    if self.wait_for_database(&shutdown).await {
                        tracing::info!("dead-letter ingest resumed: the database answers again");
                    }
                }
                Err(Ended::Broker(e)) => {
                    let (_, wait) = reconnect.next_wait();
                    tracing::debug!(error = crate::exit::one_line(&e), retry_in = ?wait, "dead-letter ingest: broker session ended");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
        }
        retention.abort();
        Ok(())
    }

    async fn session(
        &self,
        shutdown: &CancellationToken,
        reconnect: &mut broker::Reconnect,
    ) -> Result<(), Ended> {
        let conn = broker::connect(&self.urls, &self.name).await?;
        let result = self.consume(&conn, shutdown, reconnect).await;
        // Closing hands every letter not acked back to the queue.
        let _ = conn.close(200, "dead-letter ingest stopped".into()).await;
        result
    }

    async fn consume(
        &self,
        conn: &Connection,
        shutdown: &CancellationToken,
        reconnect: &mut broker::Reconnect,
    ) -> Result<(), Ended> {
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
                _ = shutdown.cancelled() => return Ok(()),
                next = consumer.next() => next,
            };
            let delivery = match next {
                None => {
                    return Err(Ended::Broker(anyhow::anyhow!(
                        "the broker cancelled the consumer of {}",
                        self.topology.dead
                    )));
                }
                Some(d) => d?,
            };
            // With it, whatever else has arrived: one group, one commit, one ack.
            let mut bytes = delivery.data.len();
            let mut group = vec![delivery];
            while !group_is_full(group.len(), bytes) {
                let Some(Some(next)) = consumer.next().now_or_never() else {
                    break;
                };
                let next = next?;
                bytes += next.data.len();
                group.push(next);
            }
            if let Err(e) = take(&self.db, &group).await {
                return Err(if e.is::<NotStored>() {
                    Ended::Database(e)
                } else {
                    Ended::Broker(e)
                });
            }
        }
    }

    /// Probes the database with backoff until it answers (true) or `shutdown` (false).
    async fn wait_for_database(&self, shutdown: &CancellationToken) -> bool {
        let mut backoff = broker::reconnect_backoff();
        loop {
            let wait = backoff.next().unwrap_or(broker::RECONNECT_MAX);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return false,
            }
            if self.db.ping().await.is_ok() {
                return true;
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
