//! Ingesting `<ns>.dead` into `mailroom_dead_letters`: a consumer with manual acks that stores
//! each letter ([`stored::new_letter`]) and acks it only after its row commits. A crash
//! between the two redelivers the letter, and the idempotent insert (the letter's key) makes it
//! one row still; nothing is lost between the queue and the table.
//!
//! Where it runs: every `mailroom worker` process, and `serve` and `run`, as competing
//! consumers of `<ns>.dead` ([`Ingester::run`]): wherever dead letters are made or browsed,
//! with no extra process to deploy, and any one of them is enough. `mailroom dlq ingest`
//! ([`drain`]) takes what is there once and exits, for cron, operators and tests.
//!
//! A database outage pauses ingesting: the letter in hand is not acked, the channel closes (the
//! broker keeps every letter), one WARN line says so, and the database is probed with backoff
//! until it answers; then ingesting resumes (one INFO line). An oversize letter (body above
//! [`stored::MAX_STORED_BODY`]) is stored with the head of its body and its size, logged as an
//! ERROR, and acked: the queue never sticks on it and its row says what was cut.

mod session;

use std::time::Duration;

use anyhow::Context;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde::Serialize;

use super::{DeadLetters, stored};
use crate::broker::{self, Topology};
use crate::config::UrlList;
use crate::db::Database;

pub use session::Ingester;

/// The failpoint between a letter's committed row and its ack (the kill test's point).
pub const AFTER_INSERT: &str = "dlq.after_insert";

/// What storing one letter did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// A new row.
    New,
    /// Its row was there already (a redelivery).
    Again,
}

/// Why a letter could not be stored: the database did not take it. The letter stays in the
/// queue.
#[derive(Debug, thiserror::Error)]
#[error("storing dead letter {job_id}: {source}")]
pub struct NotStored {
    pub job_id: String,
    #[source]
    pub source: sqlx::Error,
}

/// What a [`drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Drained {
    /// New rows.
    pub ingested: usize,
    /// Letters whose row was there already.
    pub duplicates: usize,
}

/// Stores one letter (not acking it). A value the database refuses (a data error) is stored
/// again with only the head of the body, so one odd letter never blocks the queue.
pub async fn store(db: &Database, d: &Delivery) -> Result<Stored, NotStored> {
    let mut row = stored::new_letter(d);
    if row.body_size > row.body.len() as i64 {
        tracing::error!(job_id = %row.job_id, kind = %row.kind, size = row.body_size,
            "oversize dead letter: its row keeps only the first {} bytes of the body", row.body.len());
    }
    let mut result = db.insert_dead_letter(&row).await;
    if let Err(e) = &result
        && crate::db::is_data_error(e)
    {
        tracing::error!(job_id = %row.job_id, error = %e,
            "dead letter refused by the database; storing it with only the head of its body");
        row.body.truncate(stored::OVERSIZE_KEPT.min(row.body.len()));
        row.body_size = row.body_size.max(stored::MAX_STORED_BODY as i64 + 1);
        result = db.insert_dead_letter(&row).await;
    }
    match result {
        Ok((_, true)) => Ok(Stored::New),
        Ok((_, false)) => Ok(Stored::Again),
        Err(source) => Err(NotStored {
            job_id: row.job_id,
            source,
        }),
    }
}

/// Stores one letter, then acks it.
async fn take(db: &Database, d: &Delivery) -> anyhow::Result<Stored> {
    let stored = store(db, d).await?;
    crate::failpoint::hit(AFTER_INSERT).await;
    match d.ack(BasicAckOptions::default()).await {
        Ok(true) => Ok(stored),
        Ok(false) => anyhow::bail!(
            "the channel closed before the ack (the letter is stored; its redelivery is one row)"
        ),
        Err(e) => Err(e).context("acking a stored dead letter"),
    }
}

/// Takes every letter that is in `<ns>.dead` now into the table, then returns: the one-shot
/// `mailroom dlq ingest`. Letters arriving meanwhile may be left for the next run.
pub async fn drain(urls: &UrlList, topology: &Topology, db: &Database) -> anyhow::Result<Drained> {
    let conn = broker::connect(urls, "mailroom dlq ingest").await?;
    let result = async {
        let ch = conn.create_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let queue = topology.dead.as_str();
        let ready = ch
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .with_context(|| format!("reading queue {queue}"))?
            .message_count();
        let mut done = Drained::default();
        for _ in 0..ready {
            let got = ch
                .basic_get(queue.into(), BasicGetOptions { no_ack: false })
                .await
                .with_context(|| format!("reading from {queue}"))?;
            let Some(message) = got else { break };
            match take(db, &message.delivery).await? {
                Stored::New => done.ingested += 1,
                Stored::Again => done.duplicates += 1,
            }
        }
        // The acks are frames on this channel: its Close-Ok comes after the broker handled
        // them. Closing the connection at once could overtake the last ack, and the letter
        // would go back to the queue (stored, but still counted there as dead).
        let _ = ch.close(200, "ingested".into()).await;
        anyhow::Ok(done)
    }
    .await;
    let _ = conn.close(200, "ingested".into()).await;
    result
}

impl DeadLetters {
    /// [`drain`] into this table.
    pub async fn ingest_once(
        &self,
        urls: &UrlList,
        topology: &Topology,
    ) -> anyhow::Result<Drained> {
        drain(urls, topology, &self.db).await
    }
}

/// How often the retention runs in a long-running ingester.
pub const RETENTION_EVERY: Duration = Duration::from_secs(3600);
